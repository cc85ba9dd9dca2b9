// Online choice between the ring and single copy for large allreduces on one host (issue 11).
//
// Why: on a virtual machine the host moves the vCPUs about every few seconds, and which of the two algorithms is
// faster moves with it (docs/benchmarks.md, "the far placement": with the two vCPUs far apart, 16 MB took 7.7 ms by
// the ring and 3.2 ms in Open MPI's single-copy path; with them close, the ring wins). A table measured at init
// (allreduce_table.h) fixes one answer for the job, so large messages are instead chosen from the job's own runs.
//
// How the ranks agree: rank 0 decides and every rank applies its decision, which travels in the negotiation's bit
// exchange (runtime/controller.cc puts it in the flag word; the other ranks contribute ones to the AND). The
// decision holds for the allreduces executed in that cycle, so every rank runs the same algorithm for the same
// response. Rank 0 decides from its own timings: an allreduce ends on every rank at about the same time.
//
// The policy, per size band (a factor of 4 from ADAPTIVE_ALLREDUCE_BYTES up): run the algorithm with the lower
// recent seconds per byte; now and then run one allreduce of the band with the other one, to see whether it has
// become the faster. The pause between such trials doubles each time a trial confirms the choice (up to
// kMaxTrialInterval runs of the band) and starts short again when the choice flips or when the chosen algorithm
// suddenly runs much slower than its estimate (the machine changed). A losing trial costs one allreduce: with the
// ring 2.4x slower than single copy, that is under 3% of the band's time at the longest interval.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "collectives/allreduce_table.h"

namespace hvdlite {

class AdaptiveAllreduce {
 public:
  static constexpr int kBands = 16;
  static constexpr int kMinTrialInterval = 4;   // runs of a band between trials of the other algorithm, at first
  static constexpr int kMaxTrialInterval = 64;  // and at most
  static constexpr double kSwitchMargin = 0.95;  // the other algorithm takes over below this share of the time
  static constexpr double kSurprise = 1.5;        // a run this much slower than its estimate calls a trial soon
  static constexpr double kWeight = 0.5;          // of the newest run in a band's running estimate

  // min_bytes: the smallest allreduce chosen online (0: none). initial(bytes): the algorithm to start from.
  AdaptiveAllreduce(size_t min_bytes, const AllreduceTable& initial);

  // The band of an allreduce of this many bytes, or -1 when it is not chosen online.
  int band(size_t bytes) const;

  // Rank 0, before each negotiation: the decision word for this cycle.
  uint32_t propose();
  // Every rank, after the exchange: the agreed word (rank 0's proposal).
  void apply(uint32_t word);
  // The algorithm for the next allreduce of this band in this cycle; take() also uses up the cycle's trial.
  AllreduceAlgorithm peek(int band) const;
  AllreduceAlgorithm take(int band);
  // After each allreduce of a band: this rank's seconds (rank 0's feed its proposals).
  void observe(int band, size_t bytes, AllreduceAlgorithm algorithm, double seconds);

  // "adaptive_allreduce=<min bytes>;adaptive_runs=ring:N,single_copy:M;adaptive_switches=K" for build_info
  // (switches: changes of some band's choice in the applied words, the same count on every rank).
  std::string describe() const;

 private:
  static int slot(AllreduceAlgorithm a) { return a == AllreduceAlgorithm::kSingleCopy ? 1 : 0; }
  static AllreduceAlgorithm algorithm(int slot) {
    return slot == 1 ? AllreduceAlgorithm::kSingleCopy : AllreduceAlgorithm::kRing;
  }

  struct Band {
    int chosen = 0;                     // slot of the algorithm in use (rank 0's view)
    double estimate[2] = {-1, -1};      // running seconds per byte of each algorithm; -1: not run yet
    int runs_since_trial = 0;
    int trial_interval = kMinTrialInterval;
    bool trial_running = false;         // the run between take() and observe() is a trial
  };

  size_t min_bytes_;
  Band bands_[kBands];
  // The applied word: bit b = band b's algorithm slot; bit 16 + b = the first allreduce of band b this cycle
  // runs the other one.
  uint32_t applied_ = 0;
  uint32_t last_choices_ = 0;  // the low half of the last applied word
  std::atomic<uint64_t> runs_[2] = {{0}, {0}};
  std::atomic<uint64_t> switches_{0};
};

}  // namespace hvdlite
