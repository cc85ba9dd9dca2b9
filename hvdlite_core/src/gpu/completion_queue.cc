#include "gpu/completion_queue.h"

#include <sched.h>
#include <time.h>

namespace hvdlite {

CompletionQueue::CompletionQueue(GpuContext& context, int device, std::function<std::string()> async_error)
    : context_(context), cuda_(*context.gpu().cuda), device_(device), async_error_(std::move(async_error)) {
  thread_ = std::thread([this] { loop(); });
}

CompletionQueue::~CompletionQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CompletionQueue::push(cuda::Event done, Finish finish) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batches_.push_back(Batch{done, std::move(finish)});
  }
  changed_.notify_all();
}

void CompletionQueue::abort(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    abort_status_ = why;
    aborted_at_ = std::chrono::steady_clock::now();
  }
  changed_.notify_all();
}

void CompletionQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return batches_.empty() && !busy_; });
}

Status CompletionQueue::wait_for(cuda::Event done) {
  // Spin briefly (a small collective completes in microseconds), then sleep in short slices; NCCL's
  // asynchronous errors are polled once a millisecond or so.
  auto start = std::chrono::steady_clock::now();
  int polls = 0;
  while (true) {
    cuda::Error status = cuda_.EventQuery(done);
    if (status == cuda::kSuccess) return Status::Ok();
    if (status != cuda::kNotReady) {
      return Status(StatusCode::kInternal,
                    std::string("the CUDA work of this collective failed: ") + cuda_.GetErrorString(status));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_ && std::chrono::steady_clock::now() - aborted_at_ > kAbortGrace) return abort_status_;
    }
    if (++polls % 16 == 0) {
      std::string error = async_error_();
      if (!error.empty()) return Status(StatusCode::kRemoteError, error);
    }
    if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(50)) {
      sched_yield();
    } else {
      struct timespec slice = {0, 50000};
      nanosleep(&slice, nullptr);
    }
  }
}

void CompletionQueue::loop() {
  cuda_.SetDevice(device_);
  while (true) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !batches_.empty(); });
      if (batches_.empty()) return;  // stopping, nothing left
      batch = std::move(batches_.front());
      batches_.pop_front();
      busy_ = true;
    }
    Status status = wait_for(batch.done);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (status.ok() && aborted_) status = abort_status_;  // the work may have been cut short by the abort
    }
    if (status.ok()) context_.release_event(batch.done);  // a failed event is left alone, never reused
    batch.finish(status);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    changed_.notify_all();
  }
}

}  // namespace hvdlite
