// One NCCL communicator per process set, made the first time the set runs a CUDA collective: member 0 draws the
// unique id and sends it to the other members over the host data plane (the mesh, or MPI), and every member
// joins. Creation happens in negotiated order on every member, so no extra agreement is needed. A one-rank
// communicator of this process alone serves as a scaling kernel (PreMulSum over one rank multiplies).
#pragma once
#include <map>
#include <mutex>
#include <string>

#include "backends/backend.h"
#include "gpu/cuda_api.h"

namespace hvdlite {

class NcclCommunicators {
 public:
  NcclCommunicators(const nccl::Library& nccl, Backend& host);
  ~NcclCommunicators();                         // destroys (or, after abort_all, aborts) every communicator
  nccl::Comm get(int set, Communicator& comm);  // collective over the set's members
  nccl::Comm self();
  void remove(int set);
  // Aborts every communicator: kernels waiting on a lost peer end, and later calls fail.
  void abort_all();
  // "" while every communicator is healthy; otherwise the first asynchronous error (the communicators are then
  // aborted, as NCCL requires).
  std::string async_error();

 private:
  nccl::Comm create(int set, Communicator& comm);

  const nccl::Library& nccl_;
  Backend& host_;
  std::mutex mutex_;  // async_error() runs on the completion thread
  std::map<int, nccl::Comm> comms_;
  nccl::Comm self_ = nullptr;
  bool aborted_ = false;
};

}  // namespace hvdlite
