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

#include "transport/link_costs.h"

namespace hvdlite {

class Communicator;
struct Config;

// Collective over `world`, which must have tiers (Communicator::local()/cross()).
LinkCosts measure_link_costs(Communicator& world, const Config& config);

// Predicted seconds for an allreduce of `bytes` over hosts x per_host ranks numbered host by host, with the
// algorithms dispatch.cc would run (recursive doubling below small_message_bytes, else the ring).
double predict_allreduce_flat(int hosts, int per_host, size_t bytes, size_t small_message_bytes, const LinkCosts& c);
double predict_allreduce_hierarchical(int hosts, int per_host, size_t bytes, size_t small_message_bytes,
                                      const LinkCosts& c);
// The same for an allgather whose output is `bytes` (every member's block together): the ring, and
// allgather_hierarchical.cc's three phases.
double predict_allgather_flat(int hosts, int per_host, size_t bytes, const LinkCosts& c);
double predict_allgather_hierarchical(int hosts, int per_host, size_t bytes, const LinkCosts& c);

}  // namespace hvdlite
