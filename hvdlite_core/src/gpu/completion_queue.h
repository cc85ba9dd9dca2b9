// Finishes the handles of CUDA collectives once the device has done their work, on a thread of its own, so that
// neither the background thread nor the framework's stream ever blocks on the data plane's stream: the
// executor launches a collective, records an event behind it and moves on; this thread polls the events in
// launch order (one stream: they complete in that order) and runs each batch's finish callback.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "gpu/gpu_context.h"

namespace hvdlite {

class CompletionQueue {
 public:
  using Finish = std::function<void(const Status&)>;
  // async_error: "" or what NCCL reports as failed (a communicator's asynchronous error), polled while waiting.
  CompletionQueue(GpuContext& context, int device, std::function<std::string()> async_error);
  ~CompletionQueue();  // finishes every batch (waiting for the device, or failing them after abort)
  // done: an event recorded behind the batch's work; returned to the context's pool once it completes.
  void push(cuda::Event done, Finish finish);
  // Everything pending and pushed later finishes with why: at once when its event completes, or at the latest
  // after abort_grace (an aborted NCCL communicator ends its kernels; a wedged device must not hang the job).
  void abort(const Status& why);
  // Blocks until every batch pushed so far has finished.
  void drain();

 private:
  struct Batch {
    cuda::Event done;
    Finish finish;
  };
  void loop();
  Status wait_for(cuda::Event done);

  GpuContext& context_;
  const cuda::Runtime& cuda_;
  int device_;
  std::function<std::string()> async_error_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> batches_;
  bool busy_ = false;  // a batch is out of batches_ and not finished yet
  bool stopping_ = false;
  bool aborted_ = false;
  Status abort_status_;
  std::chrono::steady_clock::time_point aborted_at_;
  std::thread thread_;
  static constexpr std::chrono::seconds kAbortGrace{5};
};

}  // namespace hvdlite
