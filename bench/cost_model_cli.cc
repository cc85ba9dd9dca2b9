// Prints the core's cost-model predictions (hvdlite_core/src/choice/cost_model.cc) for bench/hierarchical.py:
// one JSON line per (hosts, per_host, bytes) with the flat algorithms ("flat": what the chooser runs flat;
// "ring"; "halving": recursive halving and doubling), the two-tier algorithm (allreduce, and
// allgather of that many output bytes) and, on paper only, a
// pipelined binary tree (not implemented in the core; the estimate NCCL's documentation gives for trees:
// 2 log2(N) latencies plus 2 S over the slowest link's bandwidth, the pipeline hiding the depth).
//
//   cost_model_cli LOCAL_LATENCY_S LOCAL_BYTES_PER_S CROSS_LATENCY_S CROSS_BYTES_PER_S SMALL_BYTES \
//                  HOSTSxPER_HOST[,...] BYTES[,...] [PIPELINE_BYTES]
// "hierarchical" is the two-tier algorithm with its tiers one after the other, "pipelined" with them overlapped
// over chunks of PIPELINE_BYTES (the core's default when not given).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "choice/cost_model.h"
#include "common/config.h"

using namespace hvdlite;

static std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, separator);) parts.push_back(part);
  return parts;
}

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::fprintf(stderr, "usage: %s LOCAL_LAT LOCAL_BW CROSS_LAT CROSS_BW SMALL HxL[,HxL] BYTES[,BYTES] [PIPELINE]\n",
                 argv[0]);
    return 2;
  }
  LinkCosts c;
  c.local_latency_s = std::atof(argv[1]);
  c.local_bytes_per_s = std::atof(argv[2]);
  c.cross_latency_s = std::atof(argv[3]);
  c.cross_bytes_per_s = std::atof(argv[4]);
  const size_t small = std::strtoull(argv[5], nullptr, 10);
  const int64_t pipeline = argc == 9 ? std::strtoll(argv[8], nullptr, 10) : Config().hierarchical_pipeline_bytes;
  for (const std::string& layout : split(argv[6], ',')) {
    std::vector<std::string> hl = split(layout, 'x');
    const int hosts = std::atoi(hl[0].c_str()), per_host = std::atoi(hl[1].c_str());
    for (const std::string& b : split(argv[7], ',')) {
      const size_t bytes = std::strtoull(b.c_str(), nullptr, 10);
      const int n = hosts * per_host;
      // What the chooser runs: "flat" by the layout's rule (recursive doubling, recursive halving in its band, the
      // ring), the two-tier algorithm's cross tier by the cross layout's.
      const size_t flat_ring = ring_from_bytes(hosts, per_host, small, c),
                   cross_ring = ring_from_bytes(hosts, 1, small, c);
      const FlatRule flat(flat_ring, halving_band(hosts, per_host, flat_ring, c)),
          cross(cross_ring, halving_band(hosts, 1, cross_ring, c));
      const double tree =
          2 * std::log2(static_cast<double>(n)) * c.cross_latency_s + 2.0 * bytes / c.cross_bytes_per_s;
      std::printf(
          "{\"hosts\": %d, \"per_host\": %d, \"bytes\": %zu, \"flat\": %.9g, \"ring\": %.9g, \"halving\": %.9g, "
          "\"hierarchical\": %.9g, \"pipelined\": %.9g, \"tree\": %.9g, \"allgather_flat\": %.9g, "
          "\"allgather_hierarchical\": %.9g}\n",
          hosts, per_host, bytes, predict_allreduce_flat(hosts, per_host, bytes, flat, c),
          predict_allreduce_flat(hosts, per_host, bytes, 0, c), predict_allreduce_halving(hosts, per_host, bytes, c),
          predict_allreduce_hierarchical(hosts, per_host, bytes, cross, c),
          predict_allreduce_hierarchical(hosts, per_host, bytes, cross, c, pipeline), tree,
          predict_allgather_flat(hosts, per_host, bytes, c),
          predict_allgather_hierarchical(hosts, per_host, bytes, c));
    }
  }
  return 0;
}
