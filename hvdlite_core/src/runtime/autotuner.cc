#include "runtime/autotuner.h"

#include <algorithm>
#include <sstream>

namespace hvdlite {

Autotuner::Autotuner(const Config& config, int rank)
    : searching_(config.autotune),
      fusion_threshold_(config.fusion_threshold_bytes),
      rank_(rank),
      window_bytes_(std::max<int64_t>(config.autotune_window_bytes, 1)),
      warmup_left_(std::max<int64_t>(config.autotune_warmup_windows, 0)),
      current_{config.fusion_threshold_bytes, config.cycle_time_ms},
      cycle_time_ms_(config.cycle_time_ms) {
  if (!searching_) return;
  // The grid: fusion thresholds from one ResNet layer's gradients to several models' worth, and a shorter cycle
  // next to the configured one; the configured values are always in it.
  std::vector<int64_t> thresholds = {4 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20, config.fusion_threshold_bytes};
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  std::vector<double> cycles = {config.cycle_time_ms};
  if (config.cycle_time_ms != 0.5) cycles.push_back(0.5);
  for (double c : cycles) {
    for (int64_t t : thresholds) {
      if (t == config.fusion_threshold_bytes && c == config.cycle_time_ms)
        hand_set_ = static_cast<int>(candidates_.size());
      candidates_.push_back({t, c});
    }
  }
  // Warm-up windows run the configured values; without warm-up the first window already measures candidate 0.
  current_index_ = warmup_left_ > 0 ? hand_set_ : 0;
  current_ = candidates_[current_index_];
  fusion_threshold_ = current_.fusion_threshold_bytes;
  cycle_time_ms_ = current_.cycle_time_ms;
  if (rank_ == 0) {
    for (int i = warmup_left_ > 0 ? 0 : 1; i < static_cast<int>(candidates_.size()); ++i) round_queue_.push_back(i);
    if (!config.autotune_log.empty()) {
      log_ = std::fopen(config.autotune_log.c_str(), "w");
      if (log_)
        std::fprintf(log_, "window,fusion_threshold_bytes,cycle_time_ms,bytes,seconds,bytes_per_second,phase\n");
    }
  }
  window_start_ = std::chrono::steady_clock::now();
}

Autotuner::~Autotuner() {
  if (log_) std::fclose(log_);
}

double Autotuner::mean_score(int candidate) const {
  auto found = scores_.find(candidate);
  if (found == scores_.end() || found->second.empty()) return 0;
  double sum = 0;
  for (double s : found->second) sum += s;
  return sum / found->second.size();
}

int32_t Autotuner::decide() {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - window_start_).count();
  const double score = seconds > 0 ? bytes_in_window_ / seconds : 0;
  const bool warmup = warmup_left_ > 0;
  if (log_) {
    std::fprintf(log_, "%d,%lld,%g,%lld,%.6f,%.1f,%s\n", windows_,
                 static_cast<long long>(current_.fusion_threshold_bytes), current_.cycle_time_ms,
                 static_cast<long long>(bytes_in_window_), seconds, score, warmup ? "warmup" : "search");
    std::fflush(log_);
  }
  if (warmup) {
    --warmup_left_;
  } else {
    scores_[current_index_].push_back(score);
    survivors_.push_back(current_index_);
  }
  if (warmup_left_ > 0) return current_index_;
  if (round_queue_.empty()) {
    // The round is over: keep the better half (by the mean of every window each has had).
    std::sort(survivors_.begin(), survivors_.end(), [&](int a, int b) { return mean_score(a) > mean_score(b); });
    survivors_.resize((survivors_.size() + 1) / 2);
    if (survivors_.size() <= 1) {
      const int best = survivors_.empty() ? hand_set_ : survivors_.front();
      const TunedParameters& p = candidates_[best];
      std::ostringstream message;
      message << "hvdlite autotune: chose FUSION_THRESHOLD=" << p.fusion_threshold_bytes
              << " CYCLE_TIME=" << p.cycle_time_ms << " ms after " << windows_ + 1 << " windows ("
              << mean_score(best) / 1e9
              << " GB/s allreduced; the configured FUSION_THRESHOLD=" << candidates_[hand_set_].fusion_threshold_bytes
              << " CYCLE_TIME=" << candidates_[hand_set_].cycle_time_ms << " ms: " << mean_score(hand_set_) / 1e9
              << " GB/s)\n";
      std::fputs(message.str().c_str(), stderr);
      if (log_) std::fprintf(log_, "# chosen: %s", message.str().c_str() + 18);
      return best + kDone;
    }
    round_queue_ = survivors_;
    survivors_.clear();
  }
  const int next = round_queue_.front();
  round_queue_.erase(round_queue_.begin());
  return next;
}

void Autotuner::apply(int32_t choice) {
  const bool done = choice >= kDone;
  const int index = done ? choice - kDone : choice;
  if (index < 0 || index >= static_cast<int>(candidates_.size())) return;  // cannot happen: same grid everywhere
  current_index_ = index;
  current_ = candidates_[index];
  fusion_threshold_.store(current_.fusion_threshold_bytes, std::memory_order_relaxed);
  cycle_time_ms_.store(current_.cycle_time_ms, std::memory_order_relaxed);
  if (done) searching_ = false;
}

void Autotuner::record(int64_t allreduce_bytes, const std::function<void(int32_t*)>& broadcast_from_rank0) {
  if (!searching_) return;
  bytes_in_window_ += allreduce_bytes;
  if (bytes_in_window_ < window_bytes_) return;
  int32_t choice = rank_ == 0 ? decide() : 0;
  broadcast_from_rank0(&choice);
  apply(choice);
  ++windows_;
  bytes_in_window_ = 0;
  window_start_ = std::chrono::steady_clock::now();
}

std::string Autotuner::describe() const {
  std::ostringstream s;
  s << "autotune="
    << (searching_            ? "searching"
        : candidates_.empty() ? "off"
                              : "done")
    << ";tuned_fusion_threshold=" << fusion_threshold_bytes() << ";tuned_cycle_time_ms=" << cycle_time_ms();
  return s.str();
}

}  // namespace hvdlite
