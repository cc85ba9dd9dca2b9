// Process sets: id -> members and their Communicator. Set 0 is every rank. Additions and removals happen
// only on the background thread, in negotiated order, so ids agree on every rank; readers on other threads
// (rank lists for the Python side) take the lock.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/communicator.h"

namespace hvdlite {

class ProcessSetRegistry {
 public:
  ProcessSetRegistry(Mesh* mesh, const Config* config);
  // nullptr when the id is unknown. The pointer stays valid while the set exists (background thread only). Set 0,
  // every rank, exists as long as the registry: asked for on every cycle and for most tensors, it takes no lock.
  Communicator* get(int id) { return id == 0 ? world_ : get_added(id); }
  bool members(int id, std::vector<int>* out);
  int find(const std::vector<int>& ranks);  // id of an existing set with exactly these members, or -1
  int add(const std::vector<int>& ranks);
  bool remove(int id);
  std::vector<int> ids();
  // Changes whenever a set is added or removed: what is derived from membership is recomputed only then.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  Mesh* mesh_;
  const Config* config_;
  std::mutex mutex_;
  Communicator* get_added(int id);
  std::map<int, std::unique_ptr<Communicator>> sets_;
  Communicator* world_;  // sets_[0], never removed
  int next_id_ = 1;
  std::atomic<uint64_t> version_{0};
};

}  // namespace hvdlite
