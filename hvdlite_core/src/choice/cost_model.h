// The alpha-beta cost model behind the automatic choice between the flat and the hierarchical allreduce: b bytes
// over a link cost alpha + b / beta, with constants for links within a host and between hosts (where a host's L
// ranks share one link). It counts each algorithm's steps and the bytes its slowest link carries per step
// (docs/hierarchical.md), not the reduction arithmetic, the same either way. The constants are measured at init
// unless given by the LOCAL_/CROSS_ knobs; rank 0's are broadcast, so every rank predicts, and chooses, alike.
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/link_costs.h"

namespace hvdlite {

class Communicator;
struct Config;

// Sizes [from, to) of a flat allreduce that run recursive halving and doubling.
struct HalvingBand {
  size_t from = 0, to = 0;
  bool contains(size_t bytes) const { return bytes >= from && bytes < to; }
};

// What the flat rules run on one layout, by size: recursive doubling below ring_from, recursive halving inside the
// band, else the ring. Built from a size alone, it is the two-algorithm rule without a band.
struct FlatRule {
  FlatRule(size_t ring_from = 0, HalvingBand halving = HalvingBand()) : ring_from(ring_from), halving(halving) {}
  size_t ring_from;
  HalvingBand halving;
};

// Collective over `world`, which must have tiers (Communicator::local()/cross()).
LinkCosts measure_link_costs(Communicator& world, const Config& config);

// How many chunks of about pipeline_bytes (HIERARCHICAL_PIPELINE_BYTES) the two-tier allreduce may pipeline a
// buffer of `bytes` over (1: not pipelined)...
size_t hierarchical_pipeline_chunks(size_t bytes, int64_t pipeline_bytes);
// ...and how many it does: that many, or 1 where the model predicts the tiers one after the other to be faster
// (each chunk pays every step's latency again). Without measured link costs, the knob's count.
size_t choose_hierarchical_chunks(int hosts, int per_host, size_t bytes, const FlatRule& cross, const LinkCosts& c,
                                  int64_t pipeline_bytes);

// Predicted seconds for an allreduce of `bytes` over hosts x per_host ranks numbered host by host, with the
// algorithms dispatch runs: the flat one by `rule`; the two-tier one pipelined over chunks of pipeline_bytes
// (HIERARCHICAL_PIPELINE_BYTES; 0: its tiers one after the other), its cross tier run by `cross` (the rule for
// hosts x 1). They count steps and bytes, and the reductions only where they wait for a whole receive (recursive
// doubling and halving): the ring reduces each piece as the next streams in.
double predict_allreduce_flat(int hosts, int per_host, size_t bytes, const FlatRule& rule, const LinkCosts& c);
// Recursive halving and doubling (allreduce_recursive_halving.cc): log2 latencies like recursive doubling, the
// ring's bytes, and a reduction after each receive (counted here, since the ring hides its own in the stream).
double predict_allreduce_halving(int hosts, int per_host, size_t bytes, const LinkCosts& c);
// The sizes at which the model prices recursive halving clearly below (by the measured table's margin) what the
// size rule would run: recursive doubling below ring_from, else the ring. Empty below 4 members, where it cannot
// win. Without measured link costs, assumed_link_costs() price it.
HalvingBand halving_band(int hosts, int per_host, size_t ring_from, const LinkCosts& c);
double predict_allreduce_hierarchical(int hosts, int per_host, size_t bytes, const FlatRule& cross,
                                      const LinkCosts& c, int64_t pipeline_bytes = 0);
// From which size the ring replaces recursive doubling for hosts x per_host members: small_message_bytes for a
// pair, and as many times more as the model's crossover for this layout is above a pair's (never less). Recursive
// doubling takes log2(n) exchanges of the whole buffer and reduces all of it at each; the ring takes 2(n-1)
// steps of 1/n of it and reduces as it streams. With many members the ring's latencies dominate up to large sizes.
// Without measured link costs, assumed_link_costs() price it (the ratio depends on them only weakly).
size_t ring_from_bytes(int hosts, int per_host, size_t small_message_bytes, const LinkCosts& c);
// Typical figures for when nothing was measured: a host's shared memory, and a 10 Gbit/s network.
LinkCosts assumed_link_costs();
// The same for an allgather whose output is `bytes` (every member's block together): the ring, and
// allgather_hierarchical.cc's three phases.
double predict_allgather_flat(int hosts, int per_host, size_t bytes, const LinkCosts& c);
double predict_allgather_hierarchical(int hosts, int per_host, size_t bytes, const LinkCosts& c);

}  // namespace hvdlite
