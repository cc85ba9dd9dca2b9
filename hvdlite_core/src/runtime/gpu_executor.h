// Runs negotiated collectives on CUDA tensors through NCCL: the GPU counterpart of executor.h's host path. All
// launches go on the data plane's own stream after it waits for the event each caller recorded at enqueue; an event
// recorded behind the launch tells the completion queue when handles finish, so neither this thread nor the
// caller's stream waits for the device. Fused allreduces use a device fusion buffer; scaling rides on NCCL's
// PreMulSum; ragged allgather, reducescatter and alltoall are grouped NCCL broadcasts, reduces, sends/receives.
// A process set whose members share a GPU (or every set, under HVDLITE_GPU_OPERATIONS=host) takes the host-staged
// path instead (runtime/staged_collectives.h), with the same stream ordering and completion.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/nccl_communicators.h"
#include "common/timeline.h"
#include "gpu/completion_queue.h"
#include "gpu/gpu_context.h"
#include "runtime/entry.h"
#include "runtime/staged_collectives.h"
#include "runtime/tensor_queue.h"

namespace hvdlite {

class GpuExecutor {
 public:
  // host: the host data plane, for the NCCL unique id and alltoall's row counts.
  GpuExecutor(GpuContext& context, Backend& host, TensorQueue& queue, Timeline& timeline);
  ~GpuExecutor();  // waits until launched work has finished and its handles are finished
  // One fused allreduce (group of several) or one collective. Launches and returns: the entries move to the
  // completion queue. On a throw nothing was moved out of entries.
  void run(Communicator& comm, const std::vector<const Response*>& group, std::vector<TensorEntry>& entries);
  // Whether the CUDA collectives of head's process set are staged through host memory. Decided at the set's first
  // CUDA collective (collective over its members: they compare their devices); throws Error(kInvalidArgument),
  // naming head's tensor, on every member where the user asked for NCCL and members share a device.
  bool staged(const Response& head, Communicator& comm);
  void set_removed(int set) {
    comms_.remove(set);
    planes_.erase(set);
  }
  // A fatal error elsewhere (a lost peer): NCCL communicators are aborted and pending handles fail with why.
  void abort(const Status& why);

 private:
  struct Reduction;
  Reduction plan_reduction(const Response& r, int members, nccl::Comm comm);
  void run_on_nccl(Communicator& comm, nccl::Comm nc, const std::vector<const Response*>& group,
                   std::vector<TensorEntry>& entries);
  void reduce(const Response& r, Communicator& comm, nccl::Comm nc, const void* in, void* out, size_t count);
  void scale(void* data, size_t count, DType dtype, double factor);
  void allreduce(Communicator& comm, nccl::Comm nc, const std::vector<const Response*>& group,
                 std::vector<TensorEntry>& entries);
  void allgather(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e);
  void broadcast(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e);
  void alltoall(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e);
  void reducescatter(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e);
  char* fusion_buffer(size_t bytes);
  std::shared_ptr<void> device_alloc(size_t bytes);

  GpuContext& context_;
  const cuda::Runtime& cuda_;
  const nccl::Library& nccl_;
  int device_;
  Backend& host_;
  TensorQueue& queue_;
  Timeline& timeline_;  // execution spans end when the device is done
  cuda::Stream stream_ = nullptr;
  char* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;
  NcclCommunicators comms_;
  struct Plane {
    bool staged = false;
    std::string refusal;  // why NCCL was forced and cannot run (the set's collectives fail with it)
  };
  std::map<int, Plane> planes_;  // by process set
  std::unique_ptr<StagedCollectives> staged_;
  std::unique_ptr<CompletionQueue> completions_;  // declared last: drained first on destruction
};

}  // namespace hvdlite
