// CUDA tensors' collectives through host memory: device -> page-locked host buffer -> the host data plane ->
// device. NCCL refuses ranks that share a GPU, so a process set whose members do (several ranks on one GPU, as
// in a test or a small model) runs here, as does every set under HVDLITE_GPU_OPERATIONS=host. The copies run on
// the GPU data plane's stream, which has waited on each caller's event: this thread waits for the copies in (the
// host collective needs the bytes), never for the caller's stream; the completion queue waits for the copies out.
// Results match the host data plane's for the same values, since that is what reduces them.
#pragma once
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "gpu/cuda_api.h"
#include "runtime/entry.h"

namespace hvdlite {

class StagedCollectives {
 public:
  StagedCollectives(const cuda::Runtime& cuda, Backend& host, cuda::Stream stream);
  ~StagedCollectives();  // the owner has let the stream finish
  // One fused allreduce (group of several) or one collective; the copies out are queued on the stream when it
  // returns. entries' inputs and outputs are in CUDA memory; results the core owns go to handle->device_output.
  void run(Communicator& comm, const std::vector<const Response*>& group, std::vector<TensorEntry>& entries);

 private:
  class PinnedBuffer {
   public:
    explicit PinnedBuffer(const cuda::Runtime& cuda) : cuda_(cuda) {}
    ~PinnedBuffer();
    char* reserve(size_t bytes);  // the caller has let the stream finish (a copy may still read the old one)
   private:
    const cuda::Runtime& cuda_;
    char* data_ = nullptr;
    size_t bytes_ = 0;
  };

  void allreduce(Communicator& comm, const std::vector<const Response*>& group, std::vector<TensorEntry>& entries);
  void broadcast(Communicator& comm, const Response& r, TensorEntry& e);
  void allgather(Communicator& comm, const Response& r, TensorEntry& e);
  void alltoall(Communicator& comm, const Response& r, TensorEntry& e);
  void reducescatter(Communicator& comm, const Response& r, TensorEntry& e);
  // Queues a copy on the stream (either direction: CUDA tells from the pointers).
  void copy(void* to, const void* from, size_t bytes, const char* what);
  void finish_copies();  // the stream's queued work, the caller's before it, is done
  // A result in CUDA memory that the handle owns, filled from host by a queued copy.
  void device_result(TensorEntry& e, const char* host, size_t bytes);

  const cuda::Runtime& cuda_;
  Backend& host_;
  cuda::Stream stream_;
  PinnedBuffer in_;   // the inputs as they came from the device; reduced in place
  PinnedBuffer out_;  // gathered and exchanged results on their way back
};

}  // namespace hvdlite
