// The one place that decides how a collective of the built-in backend runs: which algorithm, with which
// settings, for a collective of this size on this communicator. Everything else in this folder feeds it: the
// per-machine table of one-host allreduce algorithms (measured at init or read from the cache), the job's own runs
// of large allreduces (adaptive), the alpha-beta cost model with the link costs measured at init, and the
// streaming-store vote. Dispatch (dispatch.cc) asks and runs what it is told.
//
// Config stays as it was read from the environment; what init derives from measurements lives in Derived.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "choice/allreduce_adaptive.h"
#include "choice/allreduce_table.h"
#include "choice/cost_model.h"
#include "collectives/algorithms.h"
#include "common/config.h"

namespace hvdlite {

// What init derived from this machine and this job, on every rank alike (rank 0's figures, broadcast).
struct Derived {
  AllreduceTable table;              // one host only; empty: the fixed rules decide
  std::string table_origin;          // "cached" or "measured" ("" without a table)
  std::string table_path;            // rank 0's cache file
  int table_measurements = 0;        // how many measurements voted for the table (0: written by hand)
  int64_t streaming_store_bytes;     // STREAMING_STORE_BYTES, or what the measurements voted for
  std::string streaming_origin;      // "knob", "default", "cached" or "measured"
  int64_t adaptive_allreduce_bytes;  // where the online choice starts (0: off)
};

struct AllreducePlan {
  bool two_tier = false;  // reduce-scatter in each host, allreduce across, allgather in each host
  size_t chunks = 1;      // two-tier: the pipeline's chunks
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;  // flat
  bool cold_output = false;  // the ring receives into its result with streaming stores
  int adaptive_band = -1;    // >= 0: chosen online; the run is timed and reported back (observe)
};

enum class AllgatherAlgorithm { kRing, kTwoTier, kSingleCopy };
enum class BroadcastAlgorithm { kTree, kChain, kSingleCopy };

class Chooser {
 public:
  explicit Chooser(const Config& config);

  // At init, collective over the world on the init thread before any other traffic: measures or reads what the
  // choice needs (link costs between hosts, the one-host table, where streaming stores pay).
  void establish(Communicator& world, Mesh& mesh);

  // The plan for an allreduce of `count` elements (`bytes` in all) on comm. The rules, in the order they apply:
  //   1. Two tiers, where the communicator spans hosts with several members on each, and HIERARCHICAL_ALLREDUCE
  //      says so or (unset) the cost model predicts them faster.
  //   2. The job's own runs, for large allreduces of the world on one host (ADAPTIVE_ALLREDUCE_BYTES).
  //   3. The measured table, for the world on one host (ALLREDUCE_ALGORITHMS=measured).
  //   4. An algorithm named by ALLREDUCE_ALGORITHMS (rd, rhd, ring, single_copy).
  //   5. The fixed rules: SINGLE_COPY_ALLREDUCE, then recursive doubling below SMALL_MESSAGE_BYTES, else the ring;
  //      unless the knobs fixed them (ALLREDUCE_ALGORITHMS=fixed, or SMALL_MESSAGE_BYTES given), the size from
  //      which the ring runs grows with the communicator as the cost model prices it (ring_from_bytes), and
  //      recursive halving and doubling runs where the model prices it clearly below both (halving_band).
  //   6. What the communicator can run: single copy needs cross-memory attach to every member, the ring a
  //      segment per member, recursive halving one per member of the largest power of two among them.
  // take = true consumes the online choice's trial run for this cycle (dispatch); false only looks (labels).
  AllreducePlan allreduce(const Communicator& comm, size_t bytes, size_t count, bool take = false);
  // The one-tier algorithm for a buffer of count elements (rules 2-6): what a tier of a two-tier run uses too.
  AllreduceAlgorithm flat_allreduce(const Communicator& comm, size_t bytes, size_t count, bool take = false);
  // After a run of a plan with adaptive_band >= 0: this rank's seconds (< 0: not a figure of the algorithm).
  void observe(const AllreducePlan& plan, size_t bytes, double seconds);

  AllgatherAlgorithm allgather(const Communicator& comm, size_t total_bytes) const;
  BroadcastAlgorithm broadcast(const Communicator& comm, size_t bytes) const;
  // Whether a result of this many bytes is written with streaming stores (it will not stay in cache).
  bool cold(size_t bytes) const;

  // The online choice's decision word travels in the negotiation (controller.cc); null when off.
  AdaptiveAllreduce* adaptive() { return adaptive_.get(); }
  const Derived& derived() const { return derived_; }
  const Config& config() const { return config_; }
  // "allreduce_table=...;streaming_store_bytes=...;streaming_store_bytes_from=...;allreduce_halving_bytes=...;adaptive_..."
  // for build_info.
  std::string describe() const;

 private:
  bool measured_for(const Communicator& comm) const { return &comm == world_ && !derived_.table.empty(); }
  bool two_tier_allreduce(const Communicator& comm, size_t bytes) const;
  bool two_tier_allgather(const Communicator& comm, size_t total_bytes) const;
  // What the model says for a communicator of this layout (cached per layout): from which size the ring replaces
  // recursive doubling, and where recursive halving beats both.
  const FlatRule& layout(const Communicator& comm) const;
  const FlatRule& layout(int hosts, int per_host, const LinkCosts& costs) const;

  const Config& config_;
  Derived derived_;
  const Communicator* world_ = nullptr;  // the communicator the table and the online choice are for
  std::unique_ptr<AdaptiveAllreduce> adaptive_;
  // (hosts, members per host) -> its choice; entries never move. A two-tier allreduce's cross tier asks from a
  // helper thread.
  mutable std::mutex layouts_mutex_;
  mutable std::map<std::pair<int, int>, FlatRule> layouts_;
};

}  // namespace hvdlite
