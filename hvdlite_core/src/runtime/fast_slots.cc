#include "runtime/fast_slots.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

namespace hvdlite {

namespace {
constexpr int kSequenceShift = 20, kEpochShift = 52;
constexpr uint64_t kSlotMark = uint64_t{1} << 62, kEpochMask = (uint64_t{1} << 10) - 1;
static_assert(FastSlots::kMostSlots <= (size_t{1} << kSequenceShift), "slot places outgrow their bits");

// Whether the slot's armed request describes a submission: what check_request would have written, compared. Under
// busy, by the submitting thread.
bool describes(FastSlot& slot, const hvdlite_request& q) {
  if (slot.dtype != q.dtype || slot.reduce_op != q.reduce_op || slot.prescale != q.prescale_factor ||
      slot.postscale != q.postscale_factor || slot.layout != q.layout || slot.ndim != q.ndim ||
      slot.process_set != q.process_set_id)
    return false;
  if (slot.shape_key != kUnknownShapeKey) {
    if (key_of_shape(q.shape, static_cast<size_t>(q.ndim)) != slot.shape_key) return false;
  } else if (!std::equal(q.shape, q.shape + q.ndim, slot.entry.request.shape.begin())) {
    return false;
  }
  if (q.name != slot.known_name) {
    if (std::strcmp(q.name, slot.entry.request.name.c_str()) != 0) return false;
    slot.known_name = q.name;
  }
  // check_request refuses null buffers of a tensor with elements.
  if (q.input && q.output) return true;
  int64_t elements = 1;
  for (int32_t d = 0; d < q.ndim; ++d) elements *= q.shape[d];
  return elements == 0;
}

}  // namespace

FastSlots::FastSlots() = default;

FastSlots::~FastSlots() {
  for (auto& chunk : chunks_) delete chunk.load(std::memory_order_relaxed);
}

int64_t FastSlots::handle_of(uint32_t index, uint32_t sequence) const {
  return static_cast<int64_t>(kSlotMark | (epoch_.load(std::memory_order_relaxed) & kEpochMask) << kEpochShift |
                              uint64_t{sequence} << kSequenceShift | index);
}

FastSlot* FastSlots::find(uint32_t index) const {
  if (index >= kMostSlots) return nullptr;
  Chunk* chunk = chunks_[index / kChunkSlots].load(std::memory_order_acquire);
  return chunk ? &chunk->slots[index % kChunkSlots] : nullptr;
}

FastSlot* FastSlots::make(uint32_t index) {
  if (index >= kMostSlots) return nullptr;
  std::atomic<Chunk*>& place = chunks_[index / kChunkSlots];
  Chunk* chunk = place.load(std::memory_order_acquire);
  if (!chunk) {
    chunk = new Chunk();
    for (size_t i = 0; i < kChunkSlots; ++i) {
      FastSlot& slot = chunk->slots[i];
      slot.index = static_cast<uint32_t>(index / kChunkSlots * kChunkSlots + i);
      slot.entry.fast_slot = &slot;
    }
    place.store(chunk, std::memory_order_release);
    const size_t end = index / kChunkSlots + 1;
    if (chunk_end_.load(std::memory_order_relaxed) < end) chunk_end_.store(end, std::memory_order_release);
  }
  return &chunk->slots[index % kChunkSlots];
}

bool FastSlots::arm(FastSlot& slot, const TensorEntry& entry, uint64_t token) {
  const int32_t set = entry.request.process_set;
  if (set < 0 || set > std::numeric_limits<int16_t>::max()) return false;  // beyond the slot's field
  uint32_t idle = FastSlot::kIdle;
  if (!slot.state.compare_exchange_strong(idle, FastSlot::kBusy, std::memory_order_seq_cst)) return false;
  const Request& q = entry.request;
  slot.dtype = static_cast<int8_t>(q.dtype);
  slot.reduce_op = static_cast<int8_t>(q.reduce_op);
  slot.ndim = static_cast<uint8_t>(q.shape.size());
  slot.process_set = static_cast<int16_t>(q.process_set);
  slot.known_name = nullptr;
  slot.shape_key = q.shape_key;
  slot.prescale = q.prescale;
  slot.postscale = q.postscale;
  slot.layout = q.layout;
  TensorEntry& armed = slot.entry;
  armed.request = q;
  armed.key = entry.key;
  armed.name_record = entry.name_record;
  armed.name_slot = token;
  armed.matched_stamp = 0;  // a new request (perhaps in a new runtime): it has matched nothing yet,
  armed.recent_seq = 0;     // nor been recorded
  slot.token.store(token, std::memory_order_relaxed);
  slot.state.store(FastSlot::kIdle, std::memory_order_release);
  return true;
}

bool FastSlots::disarm(FastSlot& slot) {
  uint32_t idle = FastSlot::kIdle;
  if (!slot.state.compare_exchange_strong(idle, FastSlot::kBusy, std::memory_order_seq_cst)) return false;
  slot.token.store(0, std::memory_order_relaxed);
  slot.ordinary.store(0, std::memory_order_relaxed);  // a refused push's mark, if its record is swept meanwhile
  slot.entry.name_record = nullptr;
  slot.state.store(FastSlot::kIdle, std::memory_order_release);
  return true;
}

FastSlot* FastSlots::reserve(const hvdlite_request& q) {
  const uint64_t token = q.name_slot;
  if (token == 0 || q.op != HVDLITE_OP_ALLREDUCE || q.memory != HVDLITE_HOST_MEMORY || !q.name || q.ndim < 0 ||
      q.ndim > 255 || (q.ndim > 0 && !q.shape))
    return nullptr;
  FastSlot* slot = find(static_cast<uint32_t>((token & 0xffffffffu) - 1));
  if (!slot || slot->token.load(std::memory_order_relaxed) != token) return nullptr;
  uint32_t idle = FastSlot::kIdle;
  if (!slot->state.compare_exchange_strong(idle, FastSlot::kBusy, std::memory_order_seq_cst)) return nullptr;
  // The slot is this thread's now. An ordinary operation of the name that went in flight meanwhile, or a close,
  // is seen here: each side writes its mark before it reads the other's.
  if (closed_.load(std::memory_order_seq_cst) || slot->ordinary.load(std::memory_order_seq_cst) != 0 ||
      slot->token.load(std::memory_order_relaxed) != token || !describes(*slot, q)) {
    slot->state.store(FastSlot::kIdle, std::memory_order_release);
    return nullptr;
  }
  return slot;
}

int64_t FastSlots::publish(FastSlot& slot, const hvdlite_request& q) {
  // The bit before the slot is filled in: a locked instruction waits for every store before it, and the slot's
  // lines were last written by the thread that ran its previous operation, so each of those stores would be a
  // transfer between cores to wait for. A drain that finds the bit while the slot is still busy leaves it for the
  // next one. Then the flag: a drain clears it before it reads the bits, so it either sees this bit or the flag is
  // set again for the next cycle.
  const uint32_t index =
      static_cast<uint32_t>((q.name_slot & 0xffffffffu) - 1);  // slot.index (reserve), on a cold line
  chunks_[index / kChunkSlots]
      .load(std::memory_order_relaxed)
      ->submitted[index % kChunkSlots / 64]
      .fetch_or(uint64_t{1} << (index % 64), std::memory_order_seq_cst);
  if (!pending_.load(std::memory_order_seq_cst)) pending_.store(true, std::memory_order_seq_cst);
  TensorEntry& entry = slot.entry;
  entry.input = q.input;
  entry.output = q.output;
  slot.outcome.done.store(0, std::memory_order_relaxed);  // its status is ok: release() reset a failure's
  slot.orphaned.store(false, std::memory_order_relaxed);
  const uint32_t sequence = slot.sequence.load(std::memory_order_relaxed) + 1;
  slot.sequence.store(sequence, std::memory_order_relaxed);
  slot.state.store(FastSlot::kSubmitted, std::memory_order_release);
  return handle_of(index, sequence);
}

bool FastSlots::submit(const hvdlite_request& q, int64_t* handle) {
  FastSlot* slot = reserve(q);
  if (!slot) return false;
  *handle = publish(*slot, q);
  return true;
}

bool FastSlots::submit_many(const hvdlite_request* requests, int count, int64_t* handles,
                            std::vector<FastSlot*>& reserved) {
  reserved.clear();
  for (int i = 0; i < count; ++i) {
    FastSlot* slot = reserve(requests[i]);
    if (!slot) {  // none then: the ordinary way takes them all, or refuses them all
      for (FastSlot* taken : reserved) taken->state.store(FastSlot::kIdle, std::memory_order_release);
      return false;
    }
    reserved.push_back(slot);
  }
  for (int i = 0; i < count; ++i) handles[i] = publish(*reserved[i], requests[i]);
  return true;
}

size_t FastSlots::take(std::vector<TensorEntry*>& out, bool closing, Clock::time_point now) {
  size_t taken = 0;
  const size_t end = chunk_end_.load(std::memory_order_acquire);
  for (size_t c = 0; c < end; ++c) {
    Chunk* chunk = chunks_[c].load(std::memory_order_acquire);
    if (!chunk) continue;
    if (closing) {
      // A submission that saw the queue open is still filling its slot in: it sets its bit when done.
      for (FastSlot& slot : chunk->slots) {
        while (slot.state.load(std::memory_order_seq_cst) == FastSlot::kBusy) std::this_thread::yield();
      }
    }
    for (size_t w = 0; w < chunk->submitted.size(); ++w) {
      if (chunk->submitted[w].load(std::memory_order_relaxed) == 0) continue;
      uint64_t busy = 0;
      for (uint64_t bits = chunk->submitted[w].exchange(0, std::memory_order_seq_cst); bits; bits &= bits - 1) {
        FastSlot& slot = chunk->slots[w * 64 + static_cast<size_t>(__builtin_ctzll(bits))];
        // Only its submission moves a slot on from busy, and only a drain from submitted: no exchange needed.
        if (slot.state.load(std::memory_order_acquire) != FastSlot::kSubmitted) {
          busy |= bits & -bits;  // still being filled in (submit sets the bit first)
          continue;
        }
        slot.state.store(FastSlot::kClaimed, std::memory_order_relaxed);
        slot.entry.enqueued = now;
        out.push_back(&slot.entry);
        ++taken;
      }
      if (busy) {
        chunk->submitted[w].fetch_or(busy, std::memory_order_seq_cst);
        pending_.store(true, std::memory_order_seq_cst);
      }
    }
  }
  return taken;
}

size_t FastSlots::claim(std::vector<TensorEntry*>& out) {
  if (!pending_.load(std::memory_order_seq_cst)) return 0;
  pending_.store(false, std::memory_order_seq_cst);
  return take(out, false, coarse_now() + coarse_tick());
}

void FastSlots::close(std::vector<TensorEntry*>& out) {
  closed_.store(true, std::memory_order_seq_cst);
  pending_.store(false, std::memory_order_seq_cst);
  take(out, true, coarse_now());
}

void FastSlots::complete(FastSlot& slot, const Status& status) {
  // The state before the handle's: a waiter that sees the operation finished finds the slot done, to release it.
  // An operation's status starts ok (release() resets a failure's), so a success writes no status.
  HandleState& outcome = slot.outcome;
  if (!status.ok()) outcome.status = status;
  slot.state.store(status.ok() ? FastSlot::kDone : FastSlot::kFailed, std::memory_order_seq_cst);
  outcome.done.store(1, std::memory_order_release);
  if (outcome.waiters.load(std::memory_order_relaxed) > 0) futex_wake_all(&outcome.done);
  if (slot.orphaned.load(std::memory_order_seq_cst)) to_idle(slot, status.ok() ? FastSlot::kDone : FastSlot::kFailed);
}

bool FastSlots::to_idle(FastSlot& slot, uint32_t finished) {
  if (finished == FastSlot::kDone)
    return slot.state.compare_exchange_strong(finished, FastSlot::kIdle, std::memory_order_seq_cst);
  // Busy while a failure's status is reset, so that no submission finds it (complete() writes only failures).
  if (!slot.state.compare_exchange_strong(finished, FastSlot::kBusy, std::memory_order_seq_cst)) return false;
  if (finished == FastSlot::kFailed) slot.outcome.status = Status();
  slot.state.store(FastSlot::kIdle, std::memory_order_release);
  return true;
}

FastSlot* FastSlots::owner(int64_t id) const {
  const uint64_t bits = static_cast<uint64_t>(id);
  if (!names_slot(id) || (bits >> kEpochShift & kEpochMask) != (epoch_.load(std::memory_order_relaxed) & kEpochMask))
    return nullptr;
  FastSlot* slot = find(static_cast<uint32_t>(bits & (kMostSlots - 1)));
  if (!slot) return nullptr;
  // The state first: a newer operation's sequence is written before its slot leaves busy.
  if (slot->state.load(std::memory_order_seq_cst) < FastSlot::kSubmitted) return nullptr;
  const uint32_t sequence = static_cast<uint32_t>(bits >> kSequenceShift);
  return slot->sequence.load(std::memory_order_seq_cst) == sequence ? slot : nullptr;
}

bool FastSlots::release(int64_t id) {
  FastSlot* slot = owner(id);
  if (!slot) return false;
  release(*slot);
  return true;
}

void FastSlots::release(FastSlot& slot) {
  uint32_t state = slot.state.load(std::memory_order_seq_cst);
  if (state == FastSlot::kSubmitted || state == FastSlot::kClaimed) {
    slot.orphaned.store(true, std::memory_order_seq_cst);
    state = slot.state.load(std::memory_order_seq_cst);  // it may have finished before it saw the mark
  }
  // Each finished state is tried once: it changes only to idle (here, or by complete() for an orphaned one).
  if (state == FastSlot::kDone || state == FastSlot::kFailed) to_idle(slot, state);
}

void FastSlots::retire(HandleTable& table) {
  const size_t end = chunk_end_.load(std::memory_order_acquire);
  for (size_t c = 0; c < end; ++c) {
    Chunk* chunk = chunks_[c].load(std::memory_order_acquire);
    if (!chunk) continue;
    for (FastSlot& slot : chunk->slots) {
      const uint32_t state = slot.state.load(std::memory_order_seq_cst);
      if (state >= FastSlot::kSubmitted && !slot.orphaned.load(std::memory_order_seq_cst)) {
        if (state == FastSlot::kSubmitted || state == FastSlot::kClaimed)  // not expected: the runtime failed them
          complete(slot, Status(StatusCode::kAborted, "hvdlite was shut down before this operation completed"));
        // A copy: the slot's own outcome is the next runtime's.
        auto moved = std::make_shared<HandleState>();
        moved->status = slot.outcome.status;
        moved->done.store(1, std::memory_order_release);
        table.adopt(handle_of(slot.index, slot.sequence.load(std::memory_order_relaxed)), std::move(moved));
      }
      slot.outcome.status = Status();
      slot.state.store(FastSlot::kIdle, std::memory_order_relaxed);
      slot.ordinary.store(0, std::memory_order_relaxed);
      slot.token.store(0, std::memory_order_relaxed);
      slot.entry.name_record = nullptr;
    }
    for (auto& word : chunk->submitted) word.store(0, std::memory_order_relaxed);
  }
  pending_.store(false, std::memory_order_seq_cst);
  closed_.store(false, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
}

}  // namespace hvdlite
