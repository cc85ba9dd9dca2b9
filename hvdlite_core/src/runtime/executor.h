// Runs the negotiated responses on this rank, in order: fused allreduces through the fusion buffer, every other
// collective on its own, errors delivered to their handles. Transport failures propagate (they are fatal for
// the runtime); everything else completes the affected handle and execution goes on.
#pragma once
#include <atomic>
#include <vector>

#include "backends/backend.h"
#include "common/huge_page_buffer.h"
#include "common/timeline.h"
#include "gpu/gpu_context.h"
#include "runtime/autotuner.h"
#include "runtime/controller.h"
#include "runtime/fusion.h"
#include "runtime/process_sets.h"
#include "runtime/tensor_queue.h"

namespace hvdlite {

class GpuExecutor;

class Executor {
 public:
  Executor(const Config& config, int rank, ProcessSetRegistry& sets, Controller& controller, TensorQueue& queue,
           Timeline& timeline, Backend& backend, GpuContext& gpu_context);
  ~Executor();
  // eager: allreduces already reduced during negotiation (runtime/eager.h), finished first.
  void execute(const std::vector<const Response*>& responses, const std::vector<EagerResult>& eager);
  // A fatal error: CUDA collectives in flight are aborted and their handles fail with why.
  void abort_device_work(const Status& why);
  const Autotuner& tuner() const { return tuner_; }
  // An allreduce finished outside execute() (the steady lane), counted where execute() would have counted it.
  void count_allreduced(int64_t bytes);
  // The pieces fused groups ran in so far (a group run whole is one), for build_info.
  uint64_t fused_pieces() const { return fused_pieces_.load(std::memory_order_relaxed); }

 private:
  // Copies each eager result out (with the postscale) and finishes its entry.
  void finish_eager(const std::vector<EagerResult>& results);
  void run_single(const Response& response);
  void run_fused(const std::vector<const Response*>& group);
  // Both return what ran, for the timeline ("" where the backend does not say).
  const char* run_allreduce(Communicator& comm, const Response& r, TensorEntry* entry);
  const char* run_allgather(Communicator& comm, const Response& r, TensorEntry* entry);
  void run_broadcast(Communicator& comm, const Response& r, TensorEntry* entry);
  void run_alltoall(Communicator& comm, const Response& r, TensorEntry* entry);
  void run_reducescatter(Communicator& comm, const Response& r, TensorEntry* entry);
  void run_process_set_change(const Response& r, TensorEntry* entry);
  void run_on_device(const std::vector<const Response*>& group);
  char* fusion_buffer(size_t bytes);

  const Config& config_;
  int rank_;
  ProcessSetRegistry& sets_;
  Controller& controller_;
  TensorQueue& queue_;
  Timeline& timeline_;
  Backend& backend_;
  GpuContext& gpu_context_;
  std::unique_ptr<GpuExecutor> gpu_;  // made by the first CUDA collective
  Autotuner tuner_;                   // HVDLITE_AUTOTUNE: the fusion threshold in use
  HugePageBuffer fusion_;             // on huge pages: a peer's single copy reads it (common/huge_page_buffer.h)
  std::vector<char> zeros_;           // stand-in input of a joined rank
  // Reused from cycle to cycle, so that running cached tensors allocates nothing: the fusion plan, a group's
  // responses, and a fused group's entries, which ones this rank has, and their layout.
  FusionPlan plan_;
  std::vector<const Response*> group_;
  std::vector<TensorEntry*> fused_entries_;
  FusedLayout fused_layout_;
  std::atomic<uint64_t> fused_pieces_{0};
};

}  // namespace hvdlite
