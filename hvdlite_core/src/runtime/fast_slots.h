// Slots: the per-tensor path of a named host allreduce submitted again and again (a gradient's, every step). A name
// queued the ordinary way with a kept request (one that carries its name's token back) gets a slot at its record's
// place (NameRecord::slot): an entry that stays filled with the name's request, and the state of its one operation.
// A later submission whose kept request still describes that entry writes the buffers, changes the slot's state
// and sets a bit; the next cycle's drain claims it, and from there the slot's entry is negotiated and executed like
// any other. No spare entry, request check, key, name lookup, lock or handle-table row per operation: the caller's
// thread touches the slot and a bit. Anything else (a first call, a change of shape or type, an operation of the
// name still in flight, the timeline on, shutdown) goes the ordinary way, which refuses or queues it as before.
//
// A slot's states:  idle -> busy -> submitted -> claimed -> done | failed -> (released) idle.
// busy belongs to one writer: a submission filling the slot in, or the queue arming or disarming it under its lock.
// A handle names the slot and the operation's sequence number there; releasing it (synchronize) makes the slot idle
// again. While an ordinary operation of the name is in flight the slot takes no submission (`ordinary`), and while
// the slot's operation is in flight the ordinary way refuses the name, as it refuses any name in flight.
//
// The slots outlive each runtime (the C ABI owns them, as it owns the handle table): when a runtime goes, the
// handles of operations not yet released move to the handle table (retire), and the next runtime's handles carry
// a new epoch.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "hvdlite.h"
#include "runtime/entry.h"
#include "runtime/handle_table.h"

namespace hvdlite {

// An operation's every step touches three lines of its slot: the first (its state and what the armed request must
// match), the entry's first (its buffers, and what a cycle reads; TensorEntry) and the outcome's first. With
// thousands of names submitted each step, every other line a step touched would be a cache miss of its own.
struct alignas(64) FastSlot {
  enum State : uint32_t { kIdle, kBusy, kSubmitted, kClaimed, kDone, kFailed };
  std::atomic<uint32_t> state{kIdle};
  std::atomic<uint32_t> sequence{0};  // the slot's operations so far: a handle names one
  std::atomic<uint8_t> ordinary{0};   // 1 while an ordinary operation of the name is in flight
  std::atomic<bool> orphaned{false};  // its handle was released before it finished: idle once it does
  // The armed request as a submission compares it (the rest is the entry's); written under busy, by arm().
  int8_t dtype = 0;
  int8_t reduce_op = 0;
  uint8_t ndim = 0;
  int16_t process_set = 0;         // sets beyond its range are not armed (arm)
  std::atomic<uint64_t> token{0};  // the kept request's token (name_slot) it is armed for; 0: not armed
  // The kept request's name, once compared: by the C ABI's contract a request with a token is never renamed, so the
  // same pointer is the same name.
  const char* known_name = nullptr;
  uint64_t shape_key = kUnknownShapeKey;  // key_of_shape; unknown: the entry's shape is compared instead
  double prescale = 1.0;
  double postscale = 1.0;
  uint64_t layout = 0;
  TensorEntry entry;    // the name's request, negotiated and executed as any entry; its hot fields on line 1
  HandleState outcome;  // what its handle reports
  uint32_t index = 0;   // the name record's place
};

static_assert(offsetof(FastSlot, entry) == 64, "a submission's fields outgrow the slot's first line");

class FastSlots {
 public:
  static constexpr size_t kMostSlots = size_t{1} << 20;  // names at record places beyond take the ordinary way
  FastSlots();
  ~FastSlots();
  FastSlots(const FastSlots&) = delete;
  FastSlots& operator=(const FastSlots&) = delete;

  // Handle ids: bit 62, then the runtime's epoch, the operation's sequence and the slot's place. The handle
  // table's ids count up from 1 and never reach bit 62.
  static bool names_slot(int64_t id) { return id > 0 && (static_cast<uint64_t>(id) >> 62) == 1; }

  // The submission (any thread): true, with *handle, when the slot of the request's token took it; false when it
  // must go the ordinary way.
  bool submit(const hvdlite_request& q, int64_t* handle);
  // The same for a batch, all or none: true with handles[i] for requests[i] when every one's slot took it (a name
  // twice in the batch never is). reserved: the caller's scratch, reused.
  bool submit_many(const hvdlite_request* requests, int count, int64_t* handles, std::vector<FastSlot*>& reserved);
  // Whether submissions wait for a drain (a cheap check for the queue's empty()).
  bool any_submitted() const { return pending_.load(std::memory_order_seq_cst); }

  // The queue's side, under its lock.
  // The slot at a record's place, made if new (null beyond kMostSlots).
  FastSlot* make(uint32_t index);
  FastSlot* find(uint32_t index) const;  // without the lock too; null when none was made
  // Arms the slot for an ordinary entry of a name with a kept request: its entry becomes a copy of this one's
  // request, for the token. False when the slot is not idle (it keeps what it had), or when the request's process
  // set is beyond the slot's field.
  bool arm(FastSlot& slot, const TensorEntry& entry, uint64_t token);
  // Disarms an idle slot (its record is swept); false when the slot is not idle.
  bool disarm(FastSlot& slot);
  // Moves the submitted slots' entries to out, claimed (the drain), stamped as queued now: the stall checks count
  // seconds from it, and a stamp a cycle late never reports a stall early. Returns how many.
  size_t claim(std::vector<TensorEntry*>& out);
  // After close(): no submission is taken any more; the submitted ones are claimed into out to be failed.
  void close(std::vector<TensorEntry*>& out);

  // The end of a claimed entry's operation (any thread that finishes entries): done or failed, waiters woken.
  static void complete(FastSlot& slot, const Status& status);

  // Handle lookups (any thread). The slot whose operation the id names, while it is not released; else null.
  FastSlot* owner(int64_t id) const;
  // Releases a finished operation's handle (the slot goes idle); an unfinished one is released when it finishes.
  // False when the id names no slot's operation.
  bool release(int64_t id);
  // The same for the slot owner() found for the handle.
  static void release(FastSlot& slot);

  // The runtime is gone: every unreleased handle moves to the table, slots are disarmed, and the next runtime's
  // handles carry a new epoch. Only with no runtime using the slots.
  void retire(HandleTable& table);

 private:
  static constexpr size_t kChunkSlots = 256, kChunks = kMostSlots / kChunkSlots;
  struct Chunk {
    std::array<FastSlot, kChunkSlots> slots;
    std::array<std::atomic<uint64_t>, kChunkSlots / 64> submitted{};  // bit: that slot waits for a drain
  };
  int64_t handle_of(uint32_t index, uint32_t sequence) const;
  // The slot of a request's token, made busy by this thread, when it may take the request; else null.
  FastSlot* reserve(const hvdlite_request& q);
  // Fills a reserved slot in with the request's buffers and hands it to the next drain; returns its handle.
  int64_t publish(FastSlot& slot, const hvdlite_request& q);
  // A finished slot (state `finished`) made idle; false if its state was another.
  static bool to_idle(FastSlot& slot, uint32_t finished);
  // Claims the slots whose bits are set; closing: also waits out submissions still filling a slot in.
  size_t take(std::vector<TensorEntry*>& out, bool closing, Clock::time_point now);
  std::array<std::atomic<Chunk*>, kChunks> chunks_{};
  std::atomic<size_t> chunk_end_{0};  // one past the highest chunk made
  // Set by a submission that finds it clear, cleared by the drain: submissions that find it set, most of them,
  // only read its line, which the draining thread then does not take from them.
  alignas(64) std::atomic<bool> pending_{false};
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> epoch_{1};
};

}  // namespace hvdlite
