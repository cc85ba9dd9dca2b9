#include "runtime/process_sets.h"

namespace hvdlite {

ProcessSetRegistry::ProcessSetRegistry(Mesh* mesh, const Config* config) : mesh_(mesh), config_(config) {
  std::vector<int> everyone(mesh->size());
  for (int i = 0; i < mesh->size(); ++i) everyone[i] = i;
  sets_[0].reset(new Communicator(mesh_, config_, everyone));
  world_ = sets_[0].get();
}

Communicator* ProcessSetRegistry::get_added(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second.get();
}

bool ProcessSetRegistry::members(int id, std::vector<int>* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  *out = it->second->members();
  return true;
}

int ProcessSetRegistry::find(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kv : sets_) {
    if (kv.second->members() == ranks) return kv.first;
  }
  return -1;
}

int ProcessSetRegistry::add(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  int id = next_id_++;
  sets_[id].reset(new Communicator(mesh_, config_, ranks));
  version_.fetch_add(1, std::memory_order_release);
  return id;
}

bool ProcessSetRegistry::remove(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool removed = id != 0 && sets_.erase(id) > 0;
  if (removed) version_.fetch_add(1, std::memory_order_release);
  return removed;
}

std::vector<int> ProcessSetRegistry::ids() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> out;
  for (const auto& kv : sets_) out.push_back(kv.first);
  return out;
}

}  // namespace hvdlite
