#include "runtime/handle_table.h"

namespace hvdlite {

int64_t HandleTable::add(std::shared_ptr<HandleState> state) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t id = next_id_++;
  states_[id] = std::move(state);
  return id;
}

void HandleTable::add_many(const std::vector<std::shared_ptr<HandleState>>& states, int64_t* ids_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < states.size(); ++i) {
    ids_out[i] = next_id_++;
    states_[ids_out[i]] = states[i];
  }
}

std::shared_ptr<HandleState> HandleTable::get(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(id);
  return it == states_.end() ? nullptr : it->second;
}

void HandleTable::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  states_.erase(id);
}

void HandleTable::release_many(const int64_t* ids, int32_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int32_t i = 0; i < count; ++i) states_.erase(ids[i]);
}

}  // namespace hvdlite
