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

class HandleTable {
 public:
  int64_t add(std::shared_ptr<HandleState> state);
  void add_many(const std::vector<std::shared_ptr<HandleState>>& states, int64_t* ids_out);  // under one lock
  std::shared_ptr<HandleState> get(int64_t id);
  void release(int64_t id);
  void release_many(const int64_t* ids, int32_t count);  // under one lock

 private:
  using States = std::unordered_map<int64_t, std::shared_ptr<HandleState>>;
  void insert(int64_t id, std::shared_ptr<HandleState> state);  // under mutex_
  void erase(int64_t id);                                       // under mutex_
  std::mutex mutex_;
  States states_;
  std::vector<States::node_type> spare_;  // released handles' nodes, reused: a steady state allocates none
  int64_t next_id_ = 1;
};

}  // namespace hvdlite
