// HVDLITE_AUTOTUNE=1 (Horovod's HOROVOD_AUTOTUNE): searches the fusion threshold and cycle time while the job runs,
// by successive halving over a small grid that includes the hand-set values. A window is a fixed number of
// allreduced bytes, so windows end at the same response on every rank, and there all take rank 0's choice for the
// next one through one 4-byte broadcast. Rank 0 scores a window by bytes allreduced per second of wall time; the
// first AUTOTUNE_WARMUP_WINDOWS are not scored, and each round re-measures the better half of the previous one.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"

namespace hvdlite {

struct TunedParameters {
  int64_t fusion_threshold_bytes;
  double cycle_time_ms;
};

class Autotuner {
 public:
  Autotuner(const Config& config, int rank);
  ~Autotuner();
  int64_t fusion_threshold_bytes() const { return fusion_threshold_.load(std::memory_order_relaxed); }
  // Read by the background loop on its own thread.
  double cycle_time_ms() const { return cycle_time_ms_.load(std::memory_order_relaxed); }
  // After each executed batch, with the bytes of its allreduces (every rank alike). At a window's end it calls
  // broadcast_from_rank0 (collective over every rank) with the 4-byte choice, then applies it.
  void record(int64_t allreduce_bytes, const std::function<void(int32_t*)>& broadcast_from_rank0);
  // "autotune=off|searching|done;fusion_threshold=...;cycle_time_ms=..." for build_info.
  std::string describe() const;

 private:
  int32_t decide();  // rank 0: scores the window that ended and picks the next candidate (+kDone when final)
  void apply(int32_t choice);
  double mean_score(int candidate) const;

  static constexpr int32_t kDone = 1 << 20;
  std::atomic<bool> searching_;  // atomics: describe() reads them from other threads
  std::atomic<int64_t> fusion_threshold_;
  int rank_;
  int64_t window_bytes_;
  int64_t warmup_left_;
  std::vector<TunedParameters> candidates_;
  int hand_set_ = 0;  // the candidate with the configured values
  TunedParameters current_;
  int current_index_ = 0;
  std::atomic<double> cycle_time_ms_;
  int64_t bytes_in_window_ = 0;
  int windows_ = 0;
  std::chrono::steady_clock::time_point window_start_;
  // Rank 0's search state.
  std::vector<int> round_queue_;  // still to measure in this round
  std::vector<int> survivors_;    // measured in this round
  std::map<int, std::vector<double>> scores_;
  FILE* log_ = nullptr;
};

}  // namespace hvdlite
