// Online choice between the ring and single copy for large allreduces on one host (issue 11).
//
// Why: on a virtual machine the host moves the vCPUs about every few seconds, and which of the two algorithms is
// faster moves with it (docs/benchmarks.md, "the ring and single copy by placement": with the two vCPUs far apart,
// single copy took 64 MB in 16-17 ms and the ring in 30-31; up to 1 MB the ring won in every placement). A table
// measured at init (allreduce_table.h) fixes one answer for the whole job, so large messages are instead chosen
// from the job's own runs.
//
// How the ranks agree: rank 0 decides and every rank applies its decision, which travels in the negotiation's bit
// exchange (runtime/controller.cc puts it in the flag word; the other ranks contribute ones to the AND). The
// decision holds for the allreduces executed in that cycle, so every rank runs the same algorithm for the same
// response. Rank 0 decides from its own timings: an allreduce ends on every rank at about the same time.
//
// The policy, per size band (a factor of 4 from ADAPTIVE_ALLREDUCE_BYTES up): run the algorithm whose recent runs
// have the lower median seconds per byte; now and then run a trial of kTrialRuns allreduces of the band with the
// other one (one per negotiation cycle), and move to it when the trial's median is clearly lower. Single runs
// are too noisy to decide on: the first version compared one trial run against a running mean and flipped 11-29
// times in a 768-allreduce benchmark, losing 35% at 256 KB. The pause between trials doubles each time a trial
// confirms the choice (up to kMaxTrialInterval runs of the band) and starts short again when the choice flips or
// when the chosen algorithm's last runs are much slower than before (the machine changed). No trial starts before
// the job has allreduced warm_bytes (twice the shared-memory ring): the ring's first runs fault the rings' pages
// in and take about 3x their steady time at 256 KB, so single copy won every early trial.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/allreduce_table.h"

namespace hvdlite {

// Where the online choice starts when ADAPTIVE_ALLREDUCE_BYTES is not given: at `fallback` (16 MiB), or lower, from
// the first size the measured table runs single copy at (but not below 1 MiB). The table is measured on an idle
// machine, one algorithm at a time; inside training on 2 cores, where each rank's background thread shares its core
// with the compute thread, the ring ran ResNet-50's 3-9 MB gradients faster than the first single copy, whose three
// rendezvous per allreduce waited for the peer's thread to be scheduled (docs/benchmarks.md). Single copy now has
// two and won in training too (2026-11-26), but the idle table still cannot see that contention: where it chose
// single copy, the job's own runs decide.
size_t default_adaptive_bytes(const AllreduceTable& table, size_t fallback);

class AdaptiveAllreduce {
 public:
  static constexpr int kBands = 16;
  static constexpr int kWindow = 8;              // recent runs kept per algorithm and band
  static constexpr int kTrialRuns = 3;           // runs of the other algorithm in one trial
  static constexpr int kMinTrialInterval = 8;    // runs of a band between trials, at first
  static constexpr int kMaxTrialInterval = 128;  // and at most: a losing trial then costs 3 runs in 131
  static constexpr double kSwitchMargin = 0.9;   // the other algorithm takes over below this share of the time
  static constexpr double kSurprise = 1.5;       // each of the last 3 runs this much slower than before: a trial

  // min_bytes: the smallest allreduce chosen online (0: none). initial: where each band starts. warm_bytes: the
  // bytes the chosen algorithms move before the first trial.
  AdaptiveAllreduce(size_t min_bytes, const AllreduceTable& initial, size_t warm_bytes);

  // The band of an allreduce of this many bytes, or -1 when it is not chosen online.
  int band(size_t bytes) const;

  // Rank 0, before each negotiation: the decision word for this cycle.
  uint32_t propose() const;
  // Every rank, after the exchange: the agreed word (rank 0's proposal).
  void apply(uint32_t word);
  // The algorithm for the next allreduce of this band in this cycle; take() also uses up the cycle's trial run.
  AllreduceAlgorithm peek(int band) const;
  AllreduceAlgorithm take(int band);
  // After each allreduce of a band (taken with take()): this rank's seconds. Rank 0's feed its proposals.
  // seconds < 0: the run took place but its time is not the algorithm's (it also moved its buffers onto huge
  // pages); it counts as a run and teaches nothing, and an unfinished trial still owes that run.
  void observe(int band, size_t bytes, AllreduceAlgorithm algorithm, double seconds);

  // "adaptive_allreduce=<min bytes>;adaptive_runs=ring:N,single_copy:M;adaptive_switches=K" for build_info
  // (switches: changes of some band's choice in the applied words, the same count on every rank).
  std::string describe() const;

 private:
  static AllreduceAlgorithm algorithm(int slot) {
    return slot == 1 ? AllreduceAlgorithm::kSingleCopy : AllreduceAlgorithm::kRing;
  }
  static int slot(AllreduceAlgorithm a) { return a == AllreduceAlgorithm::kSingleCopy ? 1 : 0; }

  // The last kWindow figures (seconds per byte) of one algorithm in one band.
  struct Recent {
    double figures[kWindow];
    int count = 0;  // valid figures, up to kWindow
    int next = 0;   // where the next one goes
    void add(double figure);
    void clear() { count = next = 0; }
    // The median of `last` figures after skipping the `skip` newest (all the rest when last is larger); -1 when
    // there are none.
    double median(int skip = 0, int last = kWindow) const;
    double lowest(int last) const;  // of the newest `last` figures; -1 when there are none
  };

  struct Band {
    int chosen = 0;  // slot of the algorithm in use (what rank 0 proposes)
    Recent recent[2];
    int runs_since_trial = 0;
    int trial_interval = kMinTrialInterval;
    int trial_left = 0;          // runs of the current trial still to come (rank 0 proposes a trial while > 0)
    bool trial_running = false;  // the run between take() and observe() is a trial run
  };

  void after_chosen_run(Band& band, int s, double per_byte);
  void after_trial_run(Band& band, int s, double per_byte);

  size_t min_bytes_;
  size_t warm_bytes_left_;
  Band bands_[kBands];
  // The applied word: bit b = band b's algorithm slot; bit 16 + b = the first allreduce of band b this cycle
  // runs the other one.
  uint32_t applied_ = 0;
  uint32_t last_choices_ = 0;  // the low half of the last applied word
  std::atomic<uint64_t> runs_[2] = {{0}, {0}};
  std::atomic<uint64_t> switches_{0};
};

}  // namespace hvdlite
