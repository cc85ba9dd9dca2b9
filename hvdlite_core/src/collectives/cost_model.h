// The alpha-beta cost model behind the automatic choice between the flat and the hierarchical allreduce.
//
// A message of b bytes over a link costs alpha + b / beta. There are two kinds of link: between ranks on one host
// (shared memory) and between hosts (the network, where the L ranks of a host share one link). The model counts
// the steps each algorithm takes and the bytes its slowest link carries per step (derivations in
// docs/hierarchical.md); reduction arithmetic is not counted (it is the same work either way).
//
// The constants are measured once at init when the ranks span hosts (ping-pong of 8 B for alpha, a one-way 4 MiB
// transfer for beta, first between two ranks on each host, then between two hosts), unless given by the
// LOCAL_/CROSS_ knobs; rank 0's figures are broadcast, so every rank predicts, and chooses, alike.
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/link_costs.h"

namespace hvdlite {

class Communicator;
struct Config;

// Collective over `world`, which must have tiers (Communicator::local()/cross()).
LinkCosts measure_link_costs(Communicator& world, const Config& config);

// How many chunks of about pipeline_bytes (HIERARCHICAL_PIPELINE_BYTES) the two-tier allreduce may pipeline a
// buffer of `bytes` over (1: not pipelined)...
size_t hierarchical_pipeline_chunks(size_t bytes, int64_t pipeline_bytes);
// ...and how many it does: that many, or 1 where the model predicts the tiers one after the other to be faster
// (each chunk pays every step's latency again). Without measured link costs, the knob's count.
size_t choose_hierarchical_chunks(int hosts, int per_host, size_t bytes, size_t small_message_bytes,
                                  const LinkCosts& c, int64_t pipeline_bytes);

// Predicted seconds for an allreduce of `bytes` over hosts x per_host ranks numbered host by host, with the
// algorithms dispatch.cc would run (recursive doubling below small_message_bytes, else the ring); the two-tier
// one pipelined over chunks of pipeline_bytes (HIERARCHICAL_PIPELINE_BYTES; 0: its tiers one after the other).
double predict_allreduce_flat(int hosts, int per_host, size_t bytes, size_t small_message_bytes, const LinkCosts& c);
double predict_allreduce_hierarchical(int hosts, int per_host, size_t bytes, size_t small_message_bytes,
                                      const LinkCosts& c, int64_t pipeline_bytes = 0);
// The same for an allgather whose output is `bytes` (every member's block together): the ring, and
// allgather_hierarchical.cc's three phases.
double predict_allgather_flat(int hosts, int per_host, size_t bytes, const LinkCosts& c);
double predict_allgather_hierarchical(int hosts, int per_host, size_t bytes, const LinkCosts& c);

}  // namespace hvdlite
