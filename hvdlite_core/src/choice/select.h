// The one function that decides how a collective of the built-in backend runs: which algorithm, with which
// settings, for a collective of this size on a communicator of this layout. Pure: the same arguments give the same
// plan on every member and at every call, so a label taken for the timeline is what runs, and a test can check a
// decision without running it. Each rule stands on an interleaved A/B (docs/decisions/018-choosing-an-algorithm.md).
#pragma once
#include <cstddef>
#include <cstdint>

#include "choice/allreduce_table.h"
#include "collectives/algorithms.h"

namespace hvdlite {

class Communicator;
struct Config;

// What the choice needs to know of a communicator.
struct Layout {
  int size = 1;
  int hosts = 1;
  int per_host = 1;          // members on each host, where the communicator has tiers
  bool tiers = false;        // several hosts with several members on each: local() and cross() exist
  bool single_copy = false;  // every member reaches every other's memory (one host, cross-memory attach)
  bool world = false;        // the job's world, which a tuned table was measured for
};
Layout layout_of(const Communicator& comm, const Communicator* world);

// The settings the rules read, taken once from the knobs (settings_from) and a tuned table.
struct ChoiceSettings {
  size_t small_message_bytes = 64 << 10;    // latency-optimal algorithms below this
  size_t single_copy_bytes = 16 << 20;      // one host: single copy from this size (0: never)
  int forced = -1;                          // an AllreduceAlgorithm for every flat allreduce it can run; -1: none
  size_t streaming_store_bytes = 64 << 20;  // the ring writes results from this size with streaming stores (0: never)
  bool two_tier_allreduce = true;           // across hosts with several members on each
  bool two_tier_allgather = true;
  size_t pipeline_bytes = 4 << 20;  // a two-tier allreduce pipelines its tiers over chunks of this size (0: no)
  AllreduceTable table;             // tuned for the world on one host (python -m hvdlite.tune); empty: none
};
ChoiceSettings settings_from(const Config& config);

struct AllreducePlan {
  bool two_tier = false;  // reduce-scatter in each host, allreduce across, allgather in each host
  size_t chunks = 1;      // two-tier: the pipeline's chunks
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;  // flat
  bool cold_output = false;  // the ring receives into its result with streaming stores
  const char* label() const { return two_tier ? "hierarchical" : algorithm_name(algorithm); }
};

enum class AllgatherAlgorithm { kRing, kTwoTier, kSingleCopy };
enum class BroadcastAlgorithm { kTree, kChain, kSingleCopy };

// An allreduce of count elements, bytes in all. The rules, in the order they apply:
//   1. Two tiers where the layout has them, unless HIERARCHICAL_ALLREDUCE=0.
//   2. An algorithm named by ALLREDUCE_ALGORITHMS (rd, rhd, ring, single_copy).
//   3. The tuned table, for the world on one host.
//   4. Single copy from SINGLE_COPY_ALLREDUCE_BYTES on one host, recursive doubling below SMALL_MESSAGE_BYTES,
//      else the ring.
//   5. What the layout can run: single copy needs every member's memory, the ring one element per member,
//      recursive halving one per member of the largest power of two; recursive doubling runs anything.
AllreducePlan select_allreduce(const Layout& layout, size_t bytes, size_t count, const ChoiceSettings& settings);
// Rules 2-5: what a flat allreduce runs, and a tier of a two-tier one.
AllreduceAlgorithm select_flat_allreduce(const Layout& layout, size_t bytes, size_t count,
                                         const ChoiceSettings& settings);
AllgatherAlgorithm select_allgather(const Layout& layout, size_t total_bytes, const ChoiceSettings& settings);
BroadcastAlgorithm select_broadcast(const Layout& layout, size_t bytes, const ChoiceSettings& settings);
// How many chunks of about pipeline_bytes a two-tier allreduce of `bytes` pipelines over (1: its tiers in turn).
size_t pipeline_chunks(size_t bytes, size_t pipeline_bytes);

}  // namespace hvdlite
