// Measuring the flat allreduce algorithms on this machine at init (allreduce_table.h). Every member runs every
// candidate at each probe size, interleaved (so a noisy period slows all candidates of a size alike), a warm-up
// and then timed repeats; each member keeps its median, and the slowest member's median is what counts (an
// allreduce ends when its last member does). The figures are combined with a max-allreduce by recursive
// doubling, which every member computes identically, so every member derives the same table.
#include "choice/measure_allreduce.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <vector>

#include "choice/allreduce_table.h"
#include "collectives/algorithms.h"
#include "common/log.h"
#include "common/wait.h"

namespace hvdlite {
namespace {

// 4 KiB to 16 MiB: a factor of 8 apart where messages are latency-bound, a factor of 2 from 1 MiB, where a buffer
// outgrows a core's cache and the ring (two copies through a staging ring) falls behind single copy. A coarser grid
// can miss that step, since a band boundary sits halfway between two probes.
constexpr size_t kProbeBytes[] = {4 << 10, 32 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20};
constexpr size_t kRecursiveDoublingMaxBytes = 256 << 10;  // it sends the whole buffer log2(n) times: not above
constexpr size_t kSingleCopyMinBytes = 32 << 10;          // below this, publishing the addresses costs more

// A probe from this size starts each run with its buffer just written, as a fusion buffer or a fresh gradient is:
// otherwise a run after a ring with streaming stores would find it evicted and look slower than it runs in a job.
constexpr size_t kRewriteFromBytes = 2 << 20;

// Below that size a timed sample is kBatch runs in a row, as a job runs one algorithm many times over: a single run
// right after another candidate pays for the other's cache state, which can reverse the ranking a job would see.
constexpr int kBatch = 8;

void rewrite(float* data, size_t count) {
  if (count * sizeof(float) >= kRewriteFromBytes) std::fill(data, data + count, 1.0f);
}

// streaming: the ring's store mode (the other candidates do not receive through a ring).
void run_candidate(Communicator& comm, AllreduceAlgorithm algorithm, float* data, size_t count, bool streaming) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling:
      allreduce_recursive_doubling(comm, data, count, DType::kFloat32, ReduceKind::kMax);
      break;
    case AllreduceAlgorithm::kRing:
      allreduce_ring(comm, data, count, DType::kFloat32, ReduceKind::kMax, 1.0, streaming);
      break;
    case AllreduceAlgorithm::kSingleCopy:
      allreduce_single_copy(comm, data, data, count, DType::kFloat32, ReduceKind::kMax, 1.0);
      break;
    case AllreduceAlgorithm::kRecursiveHalving:
      allreduce_recursive_halving(comm, data, count, DType::kFloat32, ReduceKind::kMax, 1.0);
      break;
  }
}

// The median of each column; every member then holds the slowest member's (a max-allreduce).
std::vector<double> slowest_medians(Communicator& comm, std::vector<std::vector<double>> seconds) {
  std::vector<double> medians;
  for (std::vector<double>& s : seconds) {
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    medians.push_back(s[s.size() / 2]);
  }
  allreduce_recursive_doubling(comm, medians.data(), medians.size(), DType::kFloat64, ReduceKind::kMax);
  return medians;
}

// The ring at the largest probe with ordinary and with streaming stores, interleaved (streaming_choice.h).
StreamingProbe measure_streaming(Communicator& comm, float* data, size_t count) {
  constexpr int kRepeats = 5;
  std::vector<std::vector<double>> seconds(2);
  for (int repeat = -1; repeat < kRepeats; ++repeat) {
    for (int streaming = 0; streaming < 2; ++streaming) {
      rewrite(data, count);
      auto start = Clock::now();
      run_candidate(comm, AllreduceAlgorithm::kRing, data, count, streaming == 1);
      if (repeat >= 0) seconds[streaming].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  const std::vector<double> medians = slowest_medians(comm, seconds);
  return StreamingProbe{count * sizeof(float), medians[0], medians[1]};
}

}  // namespace

std::vector<size_t> allreduce_probe_bytes() {
  return std::vector<size_t>(std::begin(kProbeBytes), std::end(kProbeBytes));
}

AllreduceMeasurement measure_allreduce_probes(Communicator& comm) {
  AllreduceMeasurement measurement;
  std::vector<AllreduceProbe>& probes = measurement.probes;
  std::vector<double> figures;  // every candidate's median, probe by probe, for the max-allreduce
  std::vector<float> data(kProbeBytes[std::size(kProbeBytes) - 1] / sizeof(float), 1.0f);
  // First touch: the shared-memory rings are mapped but not yet faulted in, and page faults would make the ring and
  // recursive doubling look far slower than they run once warm. So every algorithm first moves the largest probe
  // once, more than a ring's worth through every channel it uses (recursive doubling's partners included).
  run_candidate(comm, AllreduceAlgorithm::kRecursiveDoubling, data.data(), data.size(), false);
  run_candidate(comm, AllreduceAlgorithm::kRing, data.data(), data.size(), false);
  if (comm.single_copy_local()) run_candidate(comm, AllreduceAlgorithm::kSingleCopy, data.data(), data.size(), false);
  // Then the store mode, so that the ring competes below in the mode this measurement found faster.
  measurement.streaming = measure_streaming(comm, data.data(), data.size());
  const bool streaming_pays = !streaming_loses(measurement.streaming);
  for (size_t bytes : kProbeBytes) {
    AllreduceProbe probe{bytes, {-1, -1, -1}};
    const size_t count = bytes / sizeof(float);
    const int repeats = bytes >= (16 << 20) ? 3 : bytes >= (2 << 20) ? 5 : 9;
    std::vector<AllreduceAlgorithm> candidates;
    if (bytes <= kRecursiveDoublingMaxBytes) candidates.push_back(AllreduceAlgorithm::kRecursiveDoubling);
    if (count >= static_cast<size_t>(comm.size())) candidates.push_back(AllreduceAlgorithm::kRing);
    if (comm.single_copy_local() && bytes >= kSingleCopyMinBytes)
      candidates.push_back(AllreduceAlgorithm::kSingleCopy);
    std::vector<std::vector<double>> seconds(candidates.size());
    for (int repeat = -1; repeat < repeats; ++repeat) {  // -1: the warm-up (first touch, ring set-up)
      for (size_t c = 0; c < candidates.size(); ++c) {
        rewrite(data.data(), count);
        const int batch = bytes < kRewriteFromBytes ? kBatch : 1;
        auto start = Clock::now();
        for (int b = 0; b < batch; ++b) {
          run_candidate(comm, candidates[c], data.data(), count,
                        streaming_pays && bytes >= measurement.streaming.bytes);
        }
        if (repeat >= 0) seconds[c].push_back(std::chrono::duration<double>(Clock::now() - start).count() / batch);
      }
    }
    for (size_t c = 0; c < candidates.size(); ++c) {
      std::nth_element(seconds[c].begin(), seconds[c].begin() + seconds[c].size() / 2, seconds[c].end());
      probe.seconds[static_cast<int>(candidates[c])] = seconds[c][seconds[c].size() / 2];
    }
    for (double s : probe.seconds) figures.push_back(s);
    probes.push_back(probe);
  }
  // Not a candidate anywhere stays negative: -1 on every member.
  allreduce_recursive_doubling(comm, figures.data(), figures.size(), DType::kFloat64, ReduceKind::kMax);
  for (size_t i = 0; i < probes.size(); ++i) {
    for (int a = 0; a < 3; ++a) probes[i].seconds[a] = figures[i * 3 + a];
  }
  if (log_enabled(LogLevel::kInfo)) {
    std::ostringstream figures_text;
    for (const AllreduceProbe& p : probes) {
      figures_text << " " << p.bytes << "B:";
      for (int a = 0; a < 3; ++a) {
        if (p.seconds[a] >= 0)
          figures_text << " " << algorithm_name(static_cast<AllreduceAlgorithm>(a)) << "=" << p.seconds[a] * 1e6
                       << "us";
      }
    }
    HVD_LOG(kInfo, "allreduce algorithms measured (slowest rank's median):" << figures_text.str());
    HVD_LOG(kInfo, "ring of " << measurement.streaming.bytes
                              << " B with ordinary stores: " << measurement.streaming.plain * 1e6
                              << "us, with streaming stores: " << measurement.streaming.streamed * 1e6
                              << "us (slowest rank's median)");
  }
  return measurement;
}

}  // namespace hvdlite
