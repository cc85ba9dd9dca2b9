#include "backends/nccl_communicators.h"

#include <cstring>

#include "common/status.h"

namespace hvdlite {

NcclCommunicators::NcclCommunicators(const nccl::Library& nccl, Backend& host) : nccl_(nccl), host_(host) {}

NcclCommunicators::~NcclCommunicators() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto end = [&](nccl::Comm c) { aborted_ ? nccl_.CommAbort(c) : nccl_.CommDestroy(c); };
  for (auto& entry : comms_) end(entry.second);
  if (self_) end(self_);
}

nccl::Comm NcclCommunicators::create(int set, Communicator& comm) {
  nccl::UniqueId id;
  std::memset(&id, 0, sizeof id);
  if (comm.rank() == 0) check_nccl(nccl_, nccl_.GetUniqueId(&id), "ncclGetUniqueId");
  host_.broadcast(set, comm, &id, sizeof id, 0);
  nccl::Comm c = nullptr;
  check_nccl(nccl_, nccl_.CommInitRank(&c, comm.size(), id, comm.rank()),
             ("ncclCommInitRank for process set " + std::to_string(set)).c_str());
  return c;
}

nccl::Comm NcclCommunicators::get(int set, Communicator& comm) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_)
      throw Error(StatusCode::kRemoteError, "the NCCL communicators were aborted after an earlier failure");
    auto found = comms_.find(set);
    if (found != comms_.end()) return found->second;
  }
  nccl::Comm c = create(set, comm);  // outside the lock: it waits for the other members
  std::lock_guard<std::mutex> lock(mutex_);
  comms_[set] = c;
  return c;
}

nccl::Comm NcclCommunicators::self() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) throw Error(StatusCode::kRemoteError, "the NCCL communicators were aborted after an earlier failure");
  if (!self_) {
    nccl::UniqueId id;
    check_nccl(nccl_, nccl_.GetUniqueId(&id), "ncclGetUniqueId");
    check_nccl(nccl_, nccl_.CommInitRank(&self_, 1, id, 0), "ncclCommInitRank of the one-rank communicator");
  }
  return self_;
}

void NcclCommunicators::remove(int set) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = comms_.find(set);
  if (found == comms_.end()) return;
  aborted_ ? nccl_.CommAbort(found->second) : nccl_.CommDestroy(found->second);
  comms_.erase(found);
}

void NcclCommunicators::abort_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) return;
  aborted_ = true;
  for (auto& entry : comms_) nccl_.CommAbort(entry.second);
  if (self_) nccl_.CommAbort(self_);
  comms_.clear();
  self_ = nullptr;
}

std::string NcclCommunicators::async_error() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return "";
    for (auto& entry : comms_) {
      nccl::Result result = nccl::kSuccess;
      nccl_.CommGetAsyncError(entry.second, &result);
      if (result != nccl::kSuccess && result != nccl::kInProgress) {
        error = "NCCL reported an asynchronous error on process set " + std::to_string(entry.first) + ": " +
                nccl_.GetErrorString(result) + " (a peer failed or its connection broke)";
        break;
      }
    }
  }
  if (!error.empty()) abort_all();
  return error;
}

}  // namespace hvdlite
