#include "runtime/fast_slots.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace hvdlite {

namespace {
constexpr int kSequenceShift = 20, kEpochShift = 52;
constexpr uint64_t kSlotMark = uint64_t{1} << 62, kEpochMask = (uint64_t{1} << 10) - 1;
static_assert(FastSlots::kMostSlots <= (size_t{1} << kSequenceShift), "slot places outgrow their bits");
}  // namespace

bool describes(const Request& armed, const hvdlite_request& q) {
  if (armed.dtype != static_cast<DType>(q.dtype) || armed.reduce_op != static_cast<ReduceOp>(q.reduce_op) ||
      armed.prescale != q.prescale_factor || armed.postscale != q.postscale_factor || armed.layout != q.layout ||
      armed.shape.size() != static_cast<size_t>(q.ndim) || std::strcmp(armed.name.c_str(), q.name) != 0)
    return false;
  int64_t elements = 1;
  for (int32_t d = 0; d < q.ndim; ++d) {
    if (armed.shape[d] != q.shape[d]) return false;
    elements *= q.shape[d];
  }
  // check_request refuses null buffers of a tensor with elements.
  return elements == 0 || (q.input && q.output);
}

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
  uint32_t idle = FastSlot::kIdle;
  if (!slot.state.compare_exchange_strong(idle, FastSlot::kBusy, std::memory_order_seq_cst)) return false;
  TensorEntry& armed = slot.entry;
  armed.request = entry.request;
  armed.key = entry.key;
  armed.name_record = entry.name_record;
  armed.name_slot = token;
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

bool FastSlots::submit(const hvdlite_request& q, int64_t* handle) {
  const uint64_t token = q.name_slot;
  if (token == 0 || q.op != HVDLITE_OP_ALLREDUCE || q.process_set_id != 0 || q.memory != HVDLITE_HOST_MEMORY ||
      !q.name || q.ndim < 0 || (q.ndim > 0 && !q.shape))
    return false;
  const uint32_t index = static_cast<uint32_t>((token & 0xffffffffu) - 1);
  FastSlot* slot = find(index);
  if (!slot || slot->token.load(std::memory_order_relaxed) != token) return false;
  uint32_t idle = FastSlot::kIdle;
  if (!slot->state.compare_exchange_strong(idle, FastSlot::kBusy, std::memory_order_seq_cst)) return false;
  // The slot is this thread's now. An ordinary operation of the name that went in flight meanwhile, or a close,
  // is seen here: each side writes its mark before it reads the other's.
  if (closed_.load(std::memory_order_seq_cst) || slot->ordinary.load(std::memory_order_seq_cst) != 0 ||
      slot->token.load(std::memory_order_relaxed) != token || !describes(slot->entry.request, q)) {
    slot->state.store(FastSlot::kIdle, std::memory_order_release);
    return false;
  }
  TensorEntry& entry = slot->entry;
  entry.input = q.input;
  entry.output = q.output;
  HandleState& outcome = *slot->handle;
  outcome.done.store(0, std::memory_order_relaxed);
  if (!outcome.status.ok()) outcome.status = Status();
  slot->orphaned.store(false, std::memory_order_relaxed);
  const uint32_t sequence = slot->sequence.load(std::memory_order_relaxed) + 1;
  slot->sequence.store(sequence, std::memory_order_relaxed);
  slot->state.store(FastSlot::kSubmitted, std::memory_order_release);
  // The bit, then the flag: a drain clears the flag before it reads the bits, so it either sees this bit or the
  // flag is set again for the next cycle.
  chunks_[index / kChunkSlots]
      .load(std::memory_order_relaxed)
      ->submitted[index % kChunkSlots / 64]
      .fetch_or(uint64_t{1} << (index % 64), std::memory_order_seq_cst);
  if (!pending_.load(std::memory_order_seq_cst)) pending_.store(true, std::memory_order_seq_cst);
  *handle = handle_of(index, sequence);
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
      for (uint64_t bits = chunk->submitted[w].exchange(0, std::memory_order_seq_cst); bits; bits &= bits - 1) {
        FastSlot& slot = chunk->slots[w * 64 + static_cast<size_t>(__builtin_ctzll(bits))];
        slot.state.store(FastSlot::kClaimed, std::memory_order_relaxed);
        slot.entry.enqueued = now;
        out.push_back(&slot.entry);
        ++taken;
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
  slot.state.store(status.ok() ? FastSlot::kDone : FastSlot::kFailed, std::memory_order_seq_cst);
  slot.handle->finish(status);
  if (slot.orphaned.load(std::memory_order_seq_cst)) {
    uint32_t finished = status.ok() ? FastSlot::kDone : FastSlot::kFailed;
    slot.state.compare_exchange_strong(finished, FastSlot::kIdle, std::memory_order_seq_cst);
  }
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
  uint32_t state = slot->state.load(std::memory_order_seq_cst);
  if (state == FastSlot::kSubmitted || state == FastSlot::kClaimed) {
    slot->orphaned.store(true, std::memory_order_seq_cst);
    state = slot->state.load(std::memory_order_seq_cst);  // it may have finished before it saw the mark
  }
  while (state == FastSlot::kDone || state == FastSlot::kFailed) {
    if (slot->state.compare_exchange_weak(state, FastSlot::kIdle, std::memory_order_seq_cst)) break;
  }
  return true;
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
        table.adopt(handle_of(slot.index, slot.sequence.load(std::memory_order_relaxed)), slot.handle);
        slot.handle = std::make_shared<HandleState>();
      }
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
