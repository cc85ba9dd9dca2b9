// Online choice between the ring and single copy for allreduces on one host, from the size where the ring starts.
// On a virtual machine the host moves the vCPUs about, and which of the two is faster moves with them, so a table
// fixed at init (allreduce_table.h) is not enough: these sizes are chosen from the job's own runs.
//
// Agreement: rank 0 decides from its own timings (an allreduce ends on every rank at about the same time), and the
// decision travels in the negotiation's bit exchange (runtime/controller.cc puts it in the flag word; the other
// ranks contribute ones to the AND). It holds for the allreduces executed in that cycle, so every rank runs the
// same algorithm for the same response.
//
// Policy, per size band (a factor of 4 from ADAPTIVE_ALLREDUCE_BYTES up): run the algorithm with the lower recent
// median seconds per byte; at intervals try the other for kTrialRuns runs (one per cycle; single runs are too noisy)
// and switch when the trial's median is clearly lower. The pause between trials doubles while trials confirm the
// choice (up to kMaxTrialInterval runs) and resets on a switch or when the chosen algorithm slows down. No trial
// before the job has allreduced warm_bytes: the ring's first runs fault its pages in and would lose.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "choice/allreduce_table.h"

namespace hvdlite {

// Where the online choice starts when ADAPTIVE_ALLREDUCE_BYTES is not given: where the measured table (or, without
// one, SMALL_MESSAGE_BYTES) first runs the ring or single copy, and not below `floor`. Which of the two is faster
// moves with where the host runs the vCPUs: when it puts them far apart, the ring slows several times from a few
// hundred KB up while single copy hardly changes, and a table measured at init cannot know which placement comes.
size_t default_adaptive_bytes(const AllreduceTable& table, size_t ring_from, size_t floor);

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
