// Measuring the links at init, for the cost model (cost_model.h): 8-byte ping-pongs give the latency, a one-way
// 8 MiB transfer answered by one byte the bandwidth. Runs on the init thread over the mesh's channels, before any
// other traffic.
#include <algorithm>
#include <chrono>
#include <vector>

#include "choice/cost_model.h"
#include "collectives/algorithms.h"
#include "common/config.h"
#include "common/wait.h"

namespace hvdlite {
namespace {

constexpr size_t kProbeBytes = 8 << 20;  // long enough to see past a token bucket's burst and TCP's slow start
constexpr int kLatencyRounds = 30;
constexpr int kBandwidthRounds = 3;

// Member a sends `bytes` to member b, which answers with `reply` bytes, `rounds` times; a gets each round's
// seconds (b and the other members get nothing).
std::vector<double> exchange(Communicator& comm, int a, int b, size_t bytes, size_t reply, int rounds) {
  std::vector<double> seconds;
  if (comm.rank() != a && comm.rank() != b) return seconds;
  std::vector<char> buffer(std::max(bytes, reply));
  Progress& progress = comm.progress();
  const int peer = comm.rank() == a ? b : a;
  for (int i = 0; i < rounds; ++i) {
    auto start = Clock::now();
    Transfer first = comm.rank() == a ? Transfer::Send(comm.channel(peer), buffer.data(), bytes)
                                      : Transfer::Recv(comm.channel(peer), buffer.data(), bytes);
    progress.run(&first, 1);
    Transfer second = comm.rank() == a ? Transfer::Recv(comm.channel(peer), buffer.data(), reply)
                                       : Transfer::Send(comm.channel(peer), buffer.data(), reply);
    progress.run(&second, 1);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return seconds;
}

// Latency and bandwidth between members 0 and 1 of comm, as member 0 measures them (zeros elsewhere).
void measure_pair(Communicator& comm, double* latency_s, double* bytes_per_s) {
  std::vector<double> round_trips = exchange(comm, 0, 1, 8, 8, kLatencyRounds);
  std::vector<double> transfers = exchange(comm, 0, 1, kProbeBytes, 1, kBandwidthRounds);
  if (comm.rank() != 0) return;
  std::sort(round_trips.begin(), round_trips.end());
  *latency_s = round_trips[round_trips.size() / 2] / 2;
  double best = *std::min_element(transfers.begin(), transfers.end());
  *bytes_per_s = kProbeBytes / std::max(best - 2 * *latency_s, 1e-9);
}

}  // namespace

LinkCosts measure_link_costs(Communicator& world, const Config& config) {
  Communicator& local = *world.local();
  Communicator& cross = *world.cross();
  double figures[4] = {config.local_latency_us * 1e-6, config.local_gbytes_per_s * 1e9,
                       config.cross_latency_us * 1e-6, config.cross_gbytes_per_s * 1e9};
  double measured[4] = {0, 0, 0, 0};
  // Two ranks on every host at once (hosts do not share links), then two hosts through the ranks of local
  // index 0 alone, so that the stream has the host's link to itself.
  if (figures[0] <= 0 || figures[1] <= 0) measure_pair(local, &measured[0], &measured[1]);
  if ((figures[2] <= 0 || figures[3] <= 0) && local.rank() == 0) measure_pair(cross, &measured[2], &measured[3]);
  for (int i = 0; i < 4; ++i) {
    if (figures[i] <= 0) figures[i] = measured[i];
  }
  broadcast_tree(world, figures, sizeof(figures), 0);  // rank 0 measured both: everyone decides with its figures
  LinkCosts costs;
  costs.local_latency_s = figures[0];
  costs.local_bytes_per_s = figures[1];
  costs.cross_latency_s = figures[2];
  costs.cross_bytes_per_s = figures[3];
  return costs;
}

}  // namespace hvdlite
