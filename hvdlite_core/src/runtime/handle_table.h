// Handles of submitted operations, by id. Owned by the C ABI layer rather than the Runtime, so that a caller
// can still learn how an operation ended (AbortedError at shutdown) after the Runtime is gone.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/entry.h"

namespace hvdlite {

// A handle state for a new operation: one this thread made before and nobody holds any more, else a new one. A
// training loop's operations end before the same ones come round again, so a steady state allocates none. Only
// for operations without a core-owned output: a kept state would hold that memory until its reuse.
std::shared_ptr<HandleState> fresh_handle_state();

// Ids are handed out in order and a training step releases them in about the order it made them, so the live ids
// lie in a window [first_id_, first_id_ + count_) kept in a ring and visited in order. A hash table's scattered nodes
// cost a cache miss or three a lookup once thousands of operations are in flight. A handle still held when the
// window reaches its bound (never released, or kept across many steps) moves to a map, so a forgotten handle holds
// one entry there rather than the window's whole length behind it.
class HandleTable {
 public:
  // window_bound: the most ids the window spans (a power of two, at least 64) before its oldest live ones move to
  // the map.
  explicit HandleTable(size_t window_bound = size_t{1} << 16) : window_bound_(window_bound) {}
  int64_t add(std::shared_ptr<HandleState> state);
  void add_many(const std::vector<std::shared_ptr<HandleState>>& states, int64_t* ids_out);  // under one lock
  std::shared_ptr<HandleState> get(int64_t id);
  // A handle whose operation has finished well is released here, under the same lock (kReleased); otherwise its
  // state is handed out (kPending, or kUnknown with none). The caller of a finished gradient's synchronize then
  // takes one lock and copies no state.
  enum class Outcome { kReleased, kPending, kUnknown };
  Outcome release_if_done(int64_t id, std::shared_ptr<HandleState>* state_out);
  void release(int64_t id);
  // Takes a state under an id handed out elsewhere (a name's slot, runtime/fast_slots.h), outside the window.
  void adopt(int64_t id, std::shared_ptr<HandleState> state) {
    std::lock_guard<std::mutex> lock(mutex_);
    stragglers_[id] = std::move(state);
  }
  void release_many(const int64_t* ids, int32_t count);  // under one lock
  size_t held_apart() {                                  // handles moved out of the window, for tests
    std::lock_guard<std::mutex> lock(mutex_);
    return stragglers_.size();
  }

 private:
  void insert(std::shared_ptr<HandleState> state);  // under mutex_; its id is first_id_ + count_
  void erase(int64_t id);                           // under mutex_
  std::shared_ptr<HandleState>* find(int64_t id);   // under mutex_; null when unknown
  std::shared_ptr<HandleState>& at(int64_t id) {
    return ring_[(head_ + static_cast<size_t>(id - first_id_)) & mask_];
  }
  void pop_front();  // the window's oldest slot, to the map if still held
  std::mutex mutex_;
  const size_t window_bound_;
  std::vector<std::shared_ptr<HandleState>> ring_;  // capacity a power of two, grown up to window_bound_
  size_t head_ = 0, count_ = 0, mask_ = 0;
  int64_t first_id_ = 1;
  std::unordered_map<int64_t, std::shared_ptr<HandleState>> stragglers_;
};

}  // namespace hvdlite
