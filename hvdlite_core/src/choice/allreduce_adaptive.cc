#include "choice/allreduce_adaptive.h"

#include <algorithm>

namespace hvdlite {

void AdaptiveAllreduce::Recent::add(double figure) {
  figures[next] = figure;
  next = (next + 1) % kWindow;
  if (count < kWindow) ++count;
}

double AdaptiveAllreduce::Recent::median(int skip, int last) const {
  const int n = std::min(last, count - skip);
  if (n <= 0) return -1;
  double values[kWindow];
  for (int i = 0; i < n; ++i) values[i] = figures[(next - 1 - skip - i + 2 * kWindow) % kWindow];
  std::sort(values, values + n);
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double AdaptiveAllreduce::Recent::lowest(int last) const {
  double low = -1;
  for (int i = 0; i < std::min(last, count); ++i) {
    const double figure = figures[(next - 1 - i + kWindow) % kWindow];
    if (low < 0 || figure < low) low = figure;
  }
  return low;
}

size_t default_adaptive_bytes(const AllreduceTable& table, size_t ring_from, size_t floor) {
  if (table.empty()) return std::max(floor, ring_from);
  for (const AllreduceTable::Band& band : table.bands()) {
    if (band.algorithm != AllreduceAlgorithm::kRecursiveDoubling) return std::max(floor, band.min_bytes);
  }
  return 0;  // recursive doubling at every size: nothing to choose online
}

AdaptiveAllreduce::AdaptiveAllreduce(size_t min_bytes, const AllreduceTable& initial, size_t warm_bytes)
    : min_bytes_(min_bytes), warm_bytes_left_(warm_bytes) {
  for (int b = 0; b < kBands; ++b) {
    // Start from what the init-time table (or the fixed rules: the ring) runs at the band's lower end.
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

uint32_t AdaptiveAllreduce::propose() const {
  uint32_t word = 0;
  for (int b = 0; b < kBands; ++b) {
    if (bands_[b].chosen) word |= 1u << b;
    if (bands_[b].trial_left > 0) word |= 1u << (16 + b);
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
  warm_bytes_left_ -= std::min(warm_bytes_left_, bytes);
  const bool trial = band.trial_running;
  band.trial_running = false;
  if (seconds < 0) return;  // not a figure of the algorithm; a trial run is proposed again next cycle
  const double per_byte = seconds / static_cast<double>(bytes);
  if (trial)
    after_trial_run(band, slot(a), per_byte);
  else
    after_chosen_run(band, slot(a), per_byte);
}

void AdaptiveAllreduce::after_chosen_run(Band& band, int s, double per_byte) {
  Recent& recent = band.recent[s];
  recent.add(per_byte);
  ++band.runs_since_trial;
  if (band.trial_left > 0 || s != band.chosen) return;
  // The machine changed under us when the last 3 runs are much slower than the ones before them: look at the
  // other algorithm soon, and keep looking often.
  const bool surprised = recent.count == kWindow && recent.lowest(3) > kSurprise * recent.median(3, kWindow - 3);
  if (surprised) band.trial_interval = kMinTrialInterval;
  if (warm_bytes_left_ > 0) return;
  if (surprised || band.runs_since_trial >= band.trial_interval) {
    band.trial_left = kTrialRuns;
    band.recent[1 - s].clear();  // its old figures are from another time
    band.runs_since_trial = 0;
  }
}

void AdaptiveAllreduce::after_trial_run(Band& band, int s, double per_byte) {
  band.recent[s].add(per_byte);
  if (band.trial_left == 0 || --band.trial_left > 0 || s == band.chosen) return;
  // The trial is complete: its median against the chosen algorithm's recent median.
  const double trial = band.recent[s].median(0, kTrialRuns);
  const double incumbent = band.recent[band.chosen].median();
  if (incumbent < 0 || trial < kSwitchMargin * incumbent) {
    band.chosen = s;
    band.trial_interval = kMinTrialInterval;
  } else {
    band.trial_interval = std::min(2 * band.trial_interval, kMaxTrialInterval);
  }
  band.runs_since_trial = 0;
}

std::string AdaptiveAllreduce::describe() const {
  return "adaptive_allreduce=" + std::to_string(min_bytes_) +
         ";adaptive_runs=ring:" + std::to_string(runs_[0].load(std::memory_order_relaxed)) +
         ",single_copy:" + std::to_string(runs_[1].load(std::memory_order_relaxed)) +
         ";adaptive_switches=" + std::to_string(switches_.load(std::memory_order_relaxed));
}

}  // namespace hvdlite
