#include "runtime/handle_table.h"

namespace hvdlite {

void HandleTable::insert(int64_t id, std::shared_ptr<HandleState> state) {
  if (spare_.empty()) {
    states_.emplace(id, std::move(state));
    return;
  }
  States::node_type node = std::move(spare_.back());
  spare_.pop_back();
  node.key() = id;
  node.mapped() = std::move(state);
  states_.insert(std::move(node));  // ids are never reused: always placed
}

void HandleTable::erase(int64_t id) {
  States::node_type node = states_.extract(id);
  if (node.empty()) return;
  node.mapped().reset();
  spare_.push_back(std::move(node));
}

int64_t HandleTable::add(std::shared_ptr<HandleState> state) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t id = next_id_++;
  insert(id, std::move(state));
  return id;
}

void HandleTable::add_many(const std::vector<std::shared_ptr<HandleState>>& states, int64_t* ids_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < states.size(); ++i) {
    ids_out[i] = next_id_++;
    insert(ids_out[i], states[i]);
  }
}

std::shared_ptr<HandleState> HandleTable::get(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(id);
  return it == states_.end() ? nullptr : it->second;
}

void HandleTable::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  erase(id);
}

void HandleTable::release_many(const int64_t* ids, int32_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int32_t i = 0; i < count; ++i) erase(ids[i]);
}

}  // namespace hvdlite
