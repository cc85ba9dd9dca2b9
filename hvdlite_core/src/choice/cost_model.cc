// The alpha-beta predictions (formulas derived in docs/hierarchical.md) and the link figures' description.
#include "choice/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hvdlite {
namespace {

double message(double latency_s, double bytes_per_s, double bytes) { return latency_s + bytes / bytes_per_s; }

int power_of_two_below(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

std::string LinkCosts::describe() const {
  if (!known()) return "";
  char text[200];
  std::snprintf(text, sizeof(text),
                "local_latency_us=%.2f;local_gbytes_per_s=%.3f;cross_latency_us=%.2f;cross_gbytes_per_s=%.3f",
                local_latency_s * 1e6, local_bytes_per_s / 1e9, cross_latency_s * 1e6, cross_bytes_per_s / 1e9);
  return text;
}

size_t hierarchical_pipeline_chunks(size_t bytes, int64_t pipeline_bytes) {
  if (pipeline_bytes <= 0 || bytes <= static_cast<size_t>(pipeline_bytes)) return 1;
  const size_t chunks = (bytes + pipeline_bytes - 1) / static_cast<size_t>(pipeline_bytes);
  // Beyond 64 chunks the per-chunk latencies outweigh what more overlap could gain.
  return std::min<size_t>(chunks, 64);
}

namespace {

// Summing float32 on one core: what recursive doubling pays once per step over the whole buffer after receiving it,
// while the ring reduces each piece as the next streams in. Assumed, not measured: only its ratio to the links'
// costs moves the crossover, and weakly.
constexpr double kReduceBytesPerSecond = 4e9;

// Recursive doubling: whole-buffer exchanges with partners at distance 1, 2, 4, ...; from distance per_host on the
// partner is on another host, and every rank of a host sends across at once. A count that is not a power of two
// folds the extra ranks in first and hands them the result last. Each step reduces the whole buffer after it
// arrives.
double recursive_doubling_seconds(int hosts, int per_host, double size, const LinkCosts& c) {
  const int n = hosts * per_host, p = power_of_two_below(n);
  auto local = [&](double b) { return message(c.local_latency_s, c.local_bytes_per_s, b); };
  auto cross = [&](double b) { return message(c.cross_latency_s, c.cross_bytes_per_s, b); };
  double t = 0;
  for (int distance = 1; distance < p; distance *= 2) {
    t += (distance < per_host ? local(size) : cross(size * per_host)) + size / kReduceBytesPerSecond;
  }
  if (p != n) t += 2 * (per_host > 1 ? local(size) : cross(size)) + size / kReduceBytesPerSecond;
  return t;
}

// The ring: 2(n-1) steps of size/n per link; one link per host crosses to the next host and sets the pace.
double ring_seconds(int hosts, int per_host, double size, const LinkCosts& c) {
  const int n = hosts * per_host;
  double step = hosts > 1 ? message(c.cross_latency_s, c.cross_bytes_per_s, size / n)
                          : message(c.local_latency_s, c.local_bytes_per_s, size / n);
  if (hosts > 1 && per_host > 1) step = std::max(step, message(c.local_latency_s, c.local_bytes_per_s, size / n));
  return 2.0 * (n - 1) * step;
}

// The size from which the ring is cheaper than recursive doubling for this layout (bisection over sizes: the
// difference of two piecewise-linear costs changes sign once).
double crossover_bytes(int hosts, int per_host, const LinkCosts& c) {
  auto ring_cheaper = [&](double b) {
    return ring_seconds(hosts, per_host, b, c) <= recursive_doubling_seconds(hosts, per_host, b, c);
  };
  double low = 1, high = 1ull << 40;
  if (!ring_cheaper(high)) return high;
  if (ring_cheaper(low)) return low;
  for (int i = 0; i < 64; ++i) {
    const double middle = std::sqrt(low * high);
    (ring_cheaper(middle) ? high : low) = middle;
  }
  return high;
}

}  // namespace

LinkCosts assumed_link_costs() {
  LinkCosts c;
  c.local_latency_s = 2e-6;
  c.local_bytes_per_s = 8e9;
  c.cross_latency_s = 25e-6;
  c.cross_bytes_per_s = 1.25e9;
  return c;
}

size_t ring_from_bytes(int hosts, int per_host, size_t small_message_bytes, const LinkCosts& measured) {
  if (hosts * per_host <= 2) return small_message_bytes;
  const LinkCosts c = measured.known() ? measured : assumed_link_costs();
  // The knob is the crossover of a pair (on two hosts, or one host, as this layout's links are); the model says how
  // it moves with more members.
  const double pair = hosts > 1 ? crossover_bytes(2, 1, c) : crossover_bytes(1, 2, c);
  const double scale = crossover_bytes(hosts, per_host, c) / pair;
  if (!(scale > 1)) return small_message_bytes;
  return static_cast<size_t>(std::min(static_cast<double>(small_message_bytes) * scale, 1099511627776.0));
}

double predict_allreduce_flat(int hosts, int per_host, size_t bytes, const FlatRule& rule, const LinkCosts& c) {
  const int n = hosts * per_host;
  if (n < 2 || bytes == 0) return 0;
  if (rule.halving.contains(bytes)) return predict_allreduce_halving(hosts, per_host, bytes, c);
  const double size = static_cast<double>(bytes);
  return bytes < rule.ring_from ? recursive_doubling_seconds(hosts, per_host, size, c)
                                : ring_seconds(hosts, per_host, size, c);
}

double predict_allreduce_halving(int hosts, int per_host, size_t bytes, const LinkCosts& c) {
  const int n = hosts * per_host, p = power_of_two_below(n);
  if (n < 2 || bytes == 0) return 0;
  const double size = static_cast<double>(bytes);
  auto local = [&](double b) { return message(c.local_latency_s, c.local_bytes_per_s, b); };
  auto cross = [&](double b) { return message(c.cross_latency_s, c.cross_bytes_per_s, b); };
  // Each halving step and its mirror in the allgather move the same piece; from distance per_host on, every
  // member of a host sends across at once.
  double t = 0, piece = size;
  for (int distance = 1; distance < p; distance *= 2) {
    piece /= 2;
    t += 2 * (distance < per_host ? local(piece) : cross(piece * per_host));
  }
  double reduced = size * (1 - 1.0 / p);
  if (p != n) {
    t += 2 * (per_host > 1 ? local(size) : cross(size));
    reduced += size;
  }
  return t + reduced / kReduceBytesPerSecond;
}

HalvingBand halving_band(int hosts, int per_host, size_t ring_from, const LinkCosts& measured) {
  HalvingBand band;
  if (hosts * per_host < 4) return band;
  const LinkCosts c = measured.known() ? measured : assumed_link_costs();
  // Margin as the measured table's: a model's small lead is not worth a third algorithm in the mix.
  constexpr double kClearMargin = 0.9;
  // Sizes from 1 KiB to 1 TiB, four to an octave; the costs are piecewise linear, so the winning sizes are one run.
  bool inside = false;
  for (int quarter = 40; quarter <= 160; ++quarter) {
    const double size = std::exp2(quarter / 4.0);
    const double rule = size < static_cast<double>(ring_from) ? recursive_doubling_seconds(hosts, per_host, size, c)
                                                              : ring_seconds(hosts, per_host, size, c);
    const bool wins = predict_allreduce_halving(hosts, per_host, static_cast<size_t>(size), c) < kClearMargin * rule;
    if (wins && !inside) band.from = static_cast<size_t>(size);
    if (!wins && inside) {
      band.to = static_cast<size_t>(size);
      return band;
    }
    inside = wins;
  }
  if (inside) band.to = ~size_t{0};
  return band;
}

namespace {

double predict_two_tier(int hosts, int per_host, size_t bytes, const FlatRule& cross_rule, const LinkCosts& c,
                        size_t chunk_count) {
  // Each chunk runs both tiers on its share of the buffer (allreduce_hierarchical.cc).
  const double chunks = static_cast<double>(chunk_count);
  const double size = static_cast<double>(bytes) / chunks;
  const double segment = size / per_host;
  auto local = [&](double b) { return message(c.local_latency_s, c.local_bytes_per_s, b); };
  auto cross = [&](double b) { return message(c.cross_latency_s, c.cross_bytes_per_s, b); };
  // Reduce-scatter and allgather inside the host: per_host - 1 steps each of one segment per link.
  const double host_tier = 2.0 * (per_host - 1) * local(segment);
  // Across hosts: per_host allreduces of one segment at once, sharing each host's link.
  double network_tier = 0;
  if (cross_rule.halving.contains(static_cast<size_t>(segment))) {
    LinkCosts shared = c;
    shared.cross_bytes_per_s /= per_host;
    network_tier = predict_allreduce_halving(hosts, 1, static_cast<size_t>(segment), shared);
  } else if (segment < cross_rule.ring_from) {
    const int p = power_of_two_below(hosts);
    for (int distance = 1; distance < p; distance *= 2) {
      network_tier += cross(segment * per_host) + segment / kReduceBytesPerSecond;
    }
    if (p != hosts) network_tier += 2 * cross(segment * per_host) + segment / kReduceBytesPerSecond;
  } else {
    network_tier = 2.0 * (hosts - 1) * cross(segment / hosts * per_host);
  }
  if (chunk_count == 1) return host_tier + network_tier;
  // Overlapped: the slower tier runs back to back, the faster one adds its first (or last) chunk.
  return chunks * std::max(host_tier, network_tier) + std::min(host_tier, network_tier);
}

}  // namespace

size_t choose_hierarchical_chunks(int hosts, int per_host, size_t bytes, const FlatRule& cross, const LinkCosts& c,
                                  int64_t pipeline_bytes) {
  const size_t most = hierarchical_pipeline_chunks(bytes, pipeline_bytes);
  if (most == 1 || !c.known() || hosts < 2 || per_host < 2) return most;
  // Every chunk pays each tier's latencies again: with many hosts the cross ring's 2(H-1) steps per chunk can
  // cost more than the overlap saves.
  return predict_two_tier(hosts, per_host, bytes, cross, c, most) <
                 predict_two_tier(hosts, per_host, bytes, cross, c, 1)
             ? most
             : 1;
}

double predict_allreduce_hierarchical(int hosts, int per_host, size_t bytes, const FlatRule& cross,
                                      const LinkCosts& c, int64_t pipeline_bytes) {
  if (hosts < 2 || per_host < 2 || bytes == 0) return predict_allreduce_flat(hosts, per_host, bytes, cross, c);
  return predict_two_tier(hosts, per_host, bytes, cross, c,
                          choose_hierarchical_chunks(hosts, per_host, bytes, cross, c, pipeline_bytes));
}

double predict_allgather_flat(int hosts, int per_host, size_t bytes, const LinkCosts& c) {
  const int n = hosts * per_host;
  if (n < 2 || bytes == 0) return 0;
  const double block = static_cast<double>(bytes) / n;
  // n-1 steps of one block per link; one link per host crosses to the next host and sets the pace.
  double step = hosts > 1 ? message(c.cross_latency_s, c.cross_bytes_per_s, block)
                          : message(c.local_latency_s, c.local_bytes_per_s, block);
  if (hosts > 1 && per_host > 1) step = std::max(step, message(c.local_latency_s, c.local_bytes_per_s, block));
  return (n - 1) * step;
}

double predict_allgather_hierarchical(int hosts, int per_host, size_t bytes, const LinkCosts& c) {
  if (hosts < 2 || per_host < 2 || bytes == 0) return predict_allgather_flat(hosts, per_host, bytes, c);
  const double size = static_cast<double>(bytes), n = hosts * per_host;
  auto local = [&](double b) { return message(c.local_latency_s, c.local_bytes_per_s, b); };
  // 1. the host's blocks in the host; 2. hosts-1 steps in which the host's per_host cross rings each move a
  // 1/per_host slice of one host's data over the shared link; 3. the slices from other hosts in the host.
  return (per_host - 1) * local(size / n) +
         (hosts - 1) * message(c.cross_latency_s, c.cross_bytes_per_s, size / hosts) +
         (per_host - 1) * local(size * (hosts - 1) / (hosts * static_cast<double>(per_host)));
}

}  // namespace hvdlite
