// A process set's view of the mesh: its members (global ranks, ascending), my index among them, channels by
// member index, and scratch memory reused across operations. Algorithms see only this.
#pragma once
#include <sys/types.h>

#include <memory>
#include <vector>

#include "common/config.h"
#include "transport/mesh.h"

namespace hvdlite {

class Communicator {
 public:
  // tiers: also build local() and cross() (false for those themselves).
  Communicator(Mesh* mesh, const Config* config, std::vector<int> members, bool tiers = true);
  int size() const { return static_cast<int>(members_.size()); }
  int rank() const { return my_index_; }
  int global_rank(int index) const { return members_[index]; }
  const std::vector<int>& members() const { return members_; }
  Channel* channel(int index) const { return mesh_->channel(members_[index]); }
  pid_t pid(int index) const { return mesh_->pid(members_[index]); }
  int host_id(int index) const { return mesh_->host_id(members_[index]); }  // equal ids: the same machine
  Progress& progress() const { return mesh_->progress(); }
  const Config& config() const { return *config_; }
  // Every member on this host and able to read the others' memory directly (process_vm_readv).
  bool single_copy_local() const { return single_copy_local_; }
  char* scratch(size_t bytes);
  // The two tiers of a set spread over hosts with the same number of members on each (else both null):
  // local = my host's members; cross = the members with my local index on every host, in host order of first
  // appearance. Hierarchical algorithms run on these; they share the mesh's channels.
  Communicator* local() const { return local_.get(); }
  Communicator* cross() const { return cross_.get(); }
  int host_count() const { return host_count_; }
  // Every member on this machine, each with a CPU of its own: a meeting of the members is a few stores and loads.
  bool cheap_meetings() const { return host_count_ == 1 && mesh_->cpu_per_rank(); }
  // With tiers: member indices on each host, hosts in cross() order, each host's members in local() order.
  const std::vector<std::vector<int>>& host_members() const { return host_members_; }

 private:
  void build_tiers();
  Mesh* mesh_;
  const Config* config_;
  std::vector<int> members_;
  int my_index_ = -1;
  bool single_copy_local_ = false;
  std::vector<char> scratch_;
  std::unique_ptr<Communicator> local_, cross_;
  int host_count_ = 1;
  std::vector<std::vector<int>> host_members_;
};

}  // namespace hvdlite
