#include "collectives/communicator.h"

#include <algorithm>

#include "collectives/algorithms.h"

namespace hvdlite {

Communicator::Communicator(Mesh* mesh, const Config* config, std::vector<int> members, bool tiers)
    : mesh_(mesh), config_(config), members_(std::move(members)) {
  auto it = std::find(members_.begin(), members_.end(), mesh_->rank());
  if (it != members_.end()) my_index_ = static_cast<int>(it - members_.begin());
  single_copy_local_ = members_.size() > 1;
  for (int r : members_) {
    if (r != mesh_->rank() && !mesh_->cma_usable(r)) single_copy_local_ = false;
  }
  std::vector<int> hosts;
  for (int r : members_) {
    if (std::find(hosts.begin(), hosts.end(), mesh_->host_id(r)) == hosts.end()) hosts.push_back(mesh_->host_id(r));
  }
  host_count_ = static_cast<int>(hosts.size());
  if (tiers) build_tiers();
}

void Communicator::build_tiers() {
  // Hosts in order of first appearance among the members, and each host's members in member order.
  std::vector<int> hosts;
  std::vector<std::vector<int>> on_host;
  for (int r : members_) {
    auto it = std::find(hosts.begin(), hosts.end(), mesh_->host_id(r));
    if (it == hosts.end()) {
      hosts.push_back(mesh_->host_id(r));
      on_host.emplace_back();
      it = hosts.end() - 1;
    }
    on_host[it - hosts.begin()].push_back(r);
  }
  if (my_index_ < 0 || hosts.size() < 2) return;
  for (const auto& members : on_host) {
    if (members.size() != on_host[0].size()) return;  // uneven hosts: no tiers (flat algorithms only)
  }
  const int my_host =
      static_cast<int>(std::find(hosts.begin(), hosts.end(), mesh_->host_id(mesh_->rank())) - hosts.begin());
  const auto& mine = on_host[my_host];
  const size_t local_index = std::find(mine.begin(), mine.end(), mesh_->rank()) - mine.begin();
  std::vector<int> cross;
  for (const auto& members : on_host) cross.push_back(members[local_index]);
  for (const auto& members : on_host) {
    host_members_.emplace_back();
    for (int r : members) {
      host_members_.back().push_back(
          static_cast<int>(std::find(members_.begin(), members_.end(), r) - members_.begin()));
    }
  }
  local_.reset(new Communicator(mesh_, config_, mine, /*tiers=*/false));
  cross_.reset(new Communicator(mesh_, config_, cross, /*tiers=*/false));
}

char* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

}  // namespace hvdlite

namespace hvdlite {

std::vector<size_t> even_split(size_t count, int n) {
  std::vector<size_t> parts(n, count / n);
  for (size_t i = 0; i < count % n; ++i) parts[i] += 1;
  return parts;
}

}  // namespace hvdlite
