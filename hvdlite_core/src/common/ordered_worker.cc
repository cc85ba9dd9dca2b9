#include "common/ordered_worker.h"

namespace hvdlite {

OrderedWorker::OrderedWorker(std::function<void()> setup)
    : thread_([this, setup = std::move(setup)]() mutable { loop(std::move(setup)); }) {}

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    queue_.clear();
  }
  changed_.notify_all();
  thread_.join();
}

void OrderedWorker::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(job));
  }
  changed_.notify_all();
}

void OrderedWorker::wait(size_t index) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return finished_ > index || error_; });
  if (error_) std::rethrow_exception(error_);
}

void OrderedWorker::loop(std::function<void()> setup) {
  if (setup) setup();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closing, nothing left
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    if (!error_) {
      lock.unlock();
      try {
        job();
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
    }
    ++finished_;
    changed_.notify_all();
  }
}

}  // namespace hvdlite
