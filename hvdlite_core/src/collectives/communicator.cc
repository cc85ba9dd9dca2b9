#include "collectives/communicator.h"

#include <algorithm>

namespace hvdlite {

Communicator::Communicator(Mesh* mesh, const Config* config, std::vector<int> members)
    : mesh_(mesh), config_(config), members_(std::move(members)) {
  auto it = std::find(members_.begin(), members_.end(), mesh_->rank());
  if (it != members_.end()) my_index_ = static_cast<int>(it - members_.begin());
  single_copy_local_ = members_.size() > 1;
  for (int r : members_) {
    if (r != mesh_->rank() && !mesh_->cma_usable(r)) single_copy_local_ = false;
  }
}

char* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

}  // namespace hvdlite
