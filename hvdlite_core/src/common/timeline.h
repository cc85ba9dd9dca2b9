// Timeline: a Chrome-trace (chrome://tracing, Perfetto) record of what happened to each tensor: when it was
// enqueued and negotiated, and when its collective ran (fused or not). Enabled with HVDLITE_TIMELINE=<file>
// (or HOROVOD_TIMELINE); written by rank 0, like Horovod's. Only the thread running a cycle writes events, and
// cycles never overlap, so the writer needs no lock.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>
#include <unordered_map>

namespace hvdlite {

class Timeline {
 public:
  ~Timeline();
  void open(const std::string& path);
  bool enabled() const { return file_ != nullptr; }
  // Phase "B" at `start` (when the tensor was enqueued), for a tensor row named `tensor`.
  void begin(const std::string& tensor, const std::string& activity, std::chrono::steady_clock::time_point start);
  void begin(const std::string& tensor, const std::string& activity) { begin(tensor, activity, std::chrono::steady_clock::now()); }
  void end(const std::string& tensor);
  void close();

 private:
  int row(const std::string& tensor);
  void write(const std::string& event);
  std::FILE* file_ = nullptr;
  std::chrono::steady_clock::time_point origin_;
  std::unordered_map<std::string, int> rows_;
  bool first_ = true;
};

}  // namespace hvdlite
