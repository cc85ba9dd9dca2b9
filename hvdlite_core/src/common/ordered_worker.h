// One helper thread that runs submitted jobs strictly in submission order, so a pipelined algorithm can overlap
// one stage (e.g. the cross-host tier) with the caller's next stage. Jobs are numbered from 0 as submitted;
// wait(i) returns when job i has run, rethrowing its exception (and the first exception stops later jobs:
// each of them then rethrows it too). The destructor stops taking jobs, lets the running one finish and joins;
// it never throws, so an algorithm that fails in the caller's stage can unwind through it.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace hvdlite {

class OrderedWorker {
 public:
  // setup runs first on the new thread (e.g. to copy the caller's thread-local settings).
  explicit OrderedWorker(std::function<void()> setup = nullptr);
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  void submit(std::function<void()> job);
  void wait(size_t index);

 private:
  void loop(std::function<void()> setup);
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  size_t finished_ = 0;
  bool closing_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace hvdlite
