// A submitted operation as the core sees it: the request that is negotiated, the caller's buffers, and the
// handle through which the caller learns the outcome.
#pragma once
#include <atomic>
#include <charconv>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "common/wait.h"
#include "runtime/message.h"

namespace hvdlite {

struct FastSlot;  // runtime/fast_slots.h

struct HandleState {
  std::atomic<uint32_t> done{0};        // futex word: 0 pending, 1 finished
  std::atomic<uint32_t> waiters{0};     // threads asleep on done: finish() skips the wake syscall when none
  Status status;                        // written before done is set
  std::unique_ptr<char[]> output;       // results the core owns (allgather, alltoall, reducescatter); not zeroed
  std::shared_ptr<void> device_output;  // the same in CUDA memory (freed with cudaFree), instead of output
  size_t output_bytes = 0;
  std::vector<int64_t> output_shape;
  std::vector<int32_t> int_results;  // alltoall received splits, join's last rank, a new process set id

  void finish(Status s) {
    status = std::move(s);
    done.store(1, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst) > 0) futex_wake_all(&done);
  }
  bool finished() const { return done.load(std::memory_order_acquire) != 0; }
  // Back to a new operation's state, for reuse; only its one owner may hold it.
  void reset() {
    done.store(0, std::memory_order_relaxed);
    waiters.store(0, std::memory_order_relaxed);
    status = Status();
    output.reset();
    device_output.reset();
    output_bytes = 0;
    output_shape.clear();
    int_results.clear();
  }
  char* allocate_output(size_t bytes) {
    output.reset(new char[bytes > 0 ? bytes : 1]);
    output_bytes = bytes;
    return output.get();
  }
};

// What the core keeps about one name (process set and name) across its operations, so that a name submitted every
// step is hashed once per operation (when queued) and found from its entry after that. Owned by the tensor queue;
// an entry points at its name's record while it is in flight, and the record outlives it.
struct NameRecord {
  // The record's place in the queue's table and the count of names that held it: together the token a caller's
  // kept request carries (hvdlite_request.name_slot), refused once the record is swept and reused.
  uint32_t slot = 0;
  uint32_t generation = 1;
  size_t key_hash = 0;     // of its key: a token handed back with another name finds no record
  bool in_flight = false;  // under the queue's lock
  uint64_t batch = 0;      // the last grouped submission that named it (TensorQueue::push), under the queue's lock
  // Where the response cache held this name when last looked up, and that slot's stamp then: still valid while
  // the stamps agree (ResponseCache::stamp_at). Read and written only by the negotiating thread.
  int cache_position = -1;
  uint64_t cache_stamp = 0;
};

struct TensorEntry {
  // What every step of a cached operation reads or writes comes first, in one line with the start of its request
  // (the kind and flags a cycle reads): with thousands of operations in flight, each other line a step touched
  // would be a cache miss of its own. (A slot places its entry on a line of its own: runtime/fast_slots.h.)
  const void* input = nullptr;
  void* output = nullptr;
  Clock::time_point enqueued;         // set by Runtime::enqueue, for the timeline and the stall checks
  NameRecord* name_record = nullptr;  // set with key
  // The slot this entry belongs to, for good (runtime/fast_slots.h): it is never reused for another operation's
  // request, and its outcome goes to the slot instead of a handle. Null for the queue's own entries.
  FastSlot* fast_slot = nullptr;
  // Where the response cache held a response that this request matched, and that position's stamp then: it still
  // matches while the stamps agree (the request is unchanged: an entry is reset before another operation, a slot's
  // entry armed again). The negotiating thread's; a slot's entry keeps it from one operation to the next, so that
  // its steady state reads neither its name's record nor the response to find its hit.
  uint64_t matched_stamp = 0;
  int32_t matched_position = -1;
  // Its place among the recent operations (RecentOps, which keeps its low 32 bits) while it is the newest record of
  // its name; 0 when not recorded. Under the queue's lock.
  uint32_t recent_seq = 0;
  Request request;
  std::vector<int32_t> splits;  // alltoall rows per member
  void* stream = nullptr;       // CUDA memory: the caller's stream (cudaStream_t) that produces the input
  void* ready = nullptr;        // CUDA memory: an event recorded on stream at enqueue; the data plane's stream waits
                                // on it, then returns it to the pool (gpu/event_pool.h)
  std::shared_ptr<HandleState> handle;
  std::string key;                     // entry_key(process set, name), set once when queued (TensorQueue::push)
  uint64_t name_slot = 0;              // the caller's token for its name's record (hvdlite_request.name_slot)
  uint64_t* name_slot_home = nullptr;  // where the caller keeps it, written when the name gets a new record

  // Back to a new entry's state, but keeping what its strings and vectors have allocated: the queue reuses the
  // entries of finished operations, so that a steady state of named tensors allocates no name, shape or key.
  void reset_keeping_capacity() {
    // Field by field: building a fresh entry and moving the buffers back cost a tenth of an enqueue. A field
    // added to either struct changes its size and stops the build here (the suite's build: libstdc++ on x86-64)
    // until it is reset below too.
#if defined(__GLIBCXX__) && defined(__x86_64__)
    static_assert(sizeof(Request) == 152 && sizeof(TensorEntry) == 312, "reset the new field below");
#endif
    const Request defaults;
    request.rank = defaults.rank;
    request.op = defaults.op;
    request.dtype = defaults.dtype;
    request.reduce_op = defaults.reduce_op;
    request.root_rank = defaults.root_rank;
    request.process_set = defaults.process_set;
    request.prescale = defaults.prescale;
    request.postscale = defaults.postscale;
    request.shape.clear();
    request.shape_key = defaults.shape_key;
    request.ranks.clear();
    request.name.clear();
    request.cacheable = defaults.cacheable;
    request.unnamed = defaults.unnamed;
    request.on_device = defaults.on_device;
    request.device = defaults.device;
    request.waited_seconds = defaults.waited_seconds;
    request.layout = defaults.layout;
    input = nullptr;
    output = nullptr;
    splits.clear();
    stream = nullptr;
    ready = nullptr;
    handle.reset();
    enqueued = Clock::time_point();
    key.clear();
    name_record = nullptr;
    name_slot = 0;
    name_slot_home = nullptr;
    fast_slot = nullptr;
    recent_seq = 0;
    matched_position = -1;
    matched_stamp = 0;
  }
};

// The key of an in-flight tensor: "<process set>/<name>". Built once when the tensor is queued and carried with
// it (TensorEntry::key); lookups from a response write it into a reused buffer, so that a cached tensor's steady
// state allocates no string. No formatting machinery (snprintf cost more than the rest of the bookkeeping).
inline void entry_key_into(std::string& key, int32_t process_set, const std::string& name) {
  char prefix[16];
  char* end = std::to_chars(prefix, prefix + sizeof prefix - 1, process_set).ptr;
  *end++ = '/';
  key.assign(prefix, end).append(name);
}

inline std::string entry_key(int32_t process_set, const std::string& name) {
  std::string key;
  key.reserve(name.size() + 4);
  entry_key_into(key, process_set, name);
  return key;
}

}  // namespace hvdlite
