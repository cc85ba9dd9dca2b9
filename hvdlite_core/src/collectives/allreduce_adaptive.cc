#include "collectives/allreduce_adaptive.h"

#include <algorithm>

namespace hvdlite {

AdaptiveAllreduce::AdaptiveAllreduce(size_t min_bytes, const AllreduceTable& initial) : min_bytes_(min_bytes) {
  for (int b = 0; b < kBands; ++b) {
    // Start from what the init-time table (or the fixed rules) runs at the band's lower end.
    const size_t bytes = min_bytes_ << std::min(2 * b, 40);
    const bool single_copy = !initial.empty() && initial.choose(bytes) == AllreduceAlgorithm::kSingleCopy;
    bands_[b].chosen = single_copy ? 1 : 0;
    if (single_copy) applied_ |= 1u << b;
  }
  last_choices_ = applied_;
}

int AdaptiveAllreduce::band(size_t bytes) const {
  if (min_bytes_ == 0 || bytes < min_bytes_) return -1;
  int b = 0;
  for (size_t limit = min_bytes_ * 4; bytes >= limit && b < kBands - 1; limit *= 4) ++b;
  return b;
}

uint32_t AdaptiveAllreduce::propose() {
  uint32_t word = 0;
  for (int b = 0; b < kBands; ++b) {
    Band& band = bands_[b];
    if (band.chosen) word |= 1u << b;
    if (band.runs_since_trial >= band.trial_interval) word |= 1u << (16 + b);
  }
  return word;
}

void AdaptiveAllreduce::apply(uint32_t word) {
  if ((word ^ last_choices_) & 0xffffu) switches_.fetch_add(1, std::memory_order_relaxed);
  last_choices_ = word & 0xffffu;
  applied_ = word;
}

AllreduceAlgorithm AdaptiveAllreduce::peek(int b) const {
  int s = (applied_ >> b) & 1;
  if (applied_ & (1u << (16 + b))) s ^= 1;
  return algorithm(s);
}

AllreduceAlgorithm AdaptiveAllreduce::take(int b) {
  const AllreduceAlgorithm chosen = peek(b);
  bands_[b].trial_running = (applied_ & (1u << (16 + b))) != 0;
  applied_ &= ~(1u << (16 + b));  // one trial run per cycle; the band's other runs take the choice
  return chosen;
}

void AdaptiveAllreduce::observe(int b, size_t bytes, AllreduceAlgorithm a, double seconds) {
  runs_[slot(a)].fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) return;
  Band& band = bands_[b];
  const int s = slot(a);
  const double per_byte = seconds / static_cast<double>(bytes);
  if (!band.trial_running) {
    // A run of the chosen algorithm (on rank 0, always the band's choice: only rank 0's view decides).
    double& estimate = band.estimate[s];
    if (estimate > 0 && per_byte > kSurprise * estimate) {
      band.trial_interval = kMinTrialInterval;  // the machine changed under us: look at the other one soon
      band.runs_since_trial = std::max(band.runs_since_trial, band.trial_interval);
    } else {
      ++band.runs_since_trial;
    }
    estimate = estimate < 0 ? per_byte : kWeight * per_byte + (1 - kWeight) * estimate;
    return;
  }
  // A trial: its figure replaces the algorithm's estimate (which is old by now), then the two are compared.
  band.trial_running = false;
  band.runs_since_trial = 0;
  band.estimate[s] = per_byte;
  const int other = 1 - s;
  if (band.chosen != s && (band.estimate[other] < 0 || per_byte < kSwitchMargin * band.estimate[other])) {
    band.chosen = s;
    band.trial_interval = kMinTrialInterval;
  } else {
    band.trial_interval = std::min(2 * band.trial_interval, kMaxTrialInterval);
  }
}

std::string AdaptiveAllreduce::describe() const {
  return "adaptive_allreduce=" + std::to_string(min_bytes_) +
         ";adaptive_runs=ring:" + std::to_string(runs_[0].load(std::memory_order_relaxed)) +
         ",single_copy:" + std::to_string(runs_[1].load(std::memory_order_relaxed)) +
         ";adaptive_switches=" + std::to_string(switches_.load(std::memory_order_relaxed));
}

}  // namespace hvdlite
