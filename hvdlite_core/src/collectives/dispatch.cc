// Algorithm choice. Small messages are latency-bound (recursive doubling: log2(n) exchanges), large ones
// bandwidth-bound (the ring: 2(n-1)/n of the data per rank); on one host, single-copy reads move fewer bytes but
// pin every page on every call. The crossovers differ by processor, so a job on one host uses a table measured on
// this machine (allreduce_table.h) and, from ADAPTIVE_ALLREDUCE_BYTES up, its own runs (allreduce_adaptive.h);
// other communicators, and jobs that set SMALL_MESSAGE_BYTES or SINGLE_COPY_ALLREDUCE, use the fixed rules.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/cost_model.h"
#include "common/copy_bytes.h"
#include "common/huge_page_promotion.h"
#include "common/wait.h"

namespace hvdlite {

std::vector<size_t> even_split(size_t count, int n) {
  std::vector<size_t> parts(n, count / n);
  for (size_t i = 0; i < count % n; ++i) parts[i] += 1;
  return parts;
}

AllreduceAlgorithm flat_allreduce_choice(const Communicator& comm, size_t bytes, size_t count) {
  const size_t small = static_cast<size_t>(comm.config().small_message_bytes);
  AllreduceAlgorithm algorithm;
  const int band = comm.adaptive() ? comm.adaptive()->band(bytes) : -1;
  if (band >= 0) {
    algorithm = comm.adaptive()->peek(band);
  } else if (!comm.allreduce_table().empty()) {
    algorithm = comm.allreduce_table().choose(bytes);
  } else if (comm.config().single_copy_allreduce && bytes >= small) {
    algorithm = AllreduceAlgorithm::kSingleCopy;
  } else {
    algorithm = bytes < small ? AllreduceAlgorithm::kRecursiveDoubling : AllreduceAlgorithm::kRing;
  }
  if (algorithm == AllreduceAlgorithm::kSingleCopy && !comm.single_copy_local()) algorithm = AllreduceAlgorithm::kRing;
  // The ring needs a segment per member; single copy and recursive doubling take any count (even 1 element).
  if (algorithm == AllreduceAlgorithm::kRing && count < static_cast<size_t>(comm.size())) {
    algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  }
  return algorithm;
}

namespace {

// In place, including the postscale: the ring and single copy scale each piece while it is in cache.
void run_flat(Communicator& comm, AllreduceAlgorithm algorithm, void* buffer, size_t count, DType dtype,
              ReduceKind kind, double postscale) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling:
      allreduce_recursive_doubling(comm, buffer, count, dtype, kind);
      if (postscale != 1.0) scale_in_place(dtype, buffer, count, postscale);
      break;
    case AllreduceAlgorithm::kRing:
      allreduce_ring(comm, buffer, count, dtype, kind, postscale);
      break;
    case AllreduceAlgorithm::kSingleCopy:
      allreduce_single_copy(comm, buffer, buffer, count, dtype, kind, postscale);
      break;
  }
}

}  // namespace

void allreduce(Communicator& comm, const void* input, void* output, size_t count, DType dtype, ReduceKind kind,
               double postscale) {
  const size_t bytes = count * dtype_size(dtype);
  if (comm.size() > 1 && count > 0) {
    if (use_hierarchical_allreduce(comm, bytes)) {
      if (input != output) copy_bytes(output, input, bytes);
      allreduce_hierarchical(comm, output, count, dtype, kind);
    } else {
      // Large allreduces on one host: the adaptive choice for this cycle, timed for rank 0's next choices.
      AdaptiveAllreduce* adaptive = comm.adaptive();
      const int band = adaptive ? adaptive->band(bytes) : -1;
      const AllreduceAlgorithm algorithm = band >= 0 ? adaptive->take(band) : flat_allreduce_choice(comm, bytes, count);
      const Clock::time_point start = band >= 0 ? Clock::now() : Clock::time_point();
      HugePagePromoter* promoter = band >= 0 ? huge_page_promoter() : nullptr;
      const int64_t collapses_before = promoter ? promoter->attempts() : 0;
      if (algorithm == AllreduceAlgorithm::kSingleCopy) {
        allreduce_single_copy(comm, input, output, count, dtype, kind, postscale);  // reads input, scales as it goes
      } else {
        if (input != output) copy_bytes(output, input, bytes);
        run_flat(comm, algorithm, output, count, dtype, kind, postscale);
      }
      // A run that also moved its buffers onto huge pages (common/huge_page_promotion.h) is not a figure of the
      // algorithm, or single copy would look several times slower than it runs.
      if (band >= 0) {
        const bool figure = !promoter || promoter->attempts() == collapses_before;
        adaptive->observe(band, bytes, algorithm,
                          figure ? std::chrono::duration<double>(Clock::now() - start).count() : -1.0);
      }
      return;
    }
  } else if (input != output && bytes > 0) {
    copy_bytes(output, input, bytes);
  }
  if (postscale != 1.0) scale_in_place(dtype, output, count, postscale);
}

void allreduce_flat(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind) {
  if (comm.size() == 1 || count == 0) return;
  run_flat(comm, flat_allreduce_choice(comm, count * dtype_size(dtype), count), buffer, count, dtype, kind, 1.0);
}

namespace {

// Every member takes the same decision: it depends on the set's layout, the job-wide setting (1/0 force it, -1
// lets the model choose) and the link costs rank 0 measured and broadcast at init (cost_model.h).
// predict(two_tier, hosts, per_host, costs) gives the model's seconds for one algorithm.
template <typename Predict>
bool two_tier_chosen(const Communicator& comm, int setting, Predict predict) {
  if (!comm.local() || comm.local()->size() < 2) return false;
  if (setting >= 0) return setting == 1;
  const LinkCosts& costs = comm.link_costs();
  if (!costs.known()) return false;
  const int hosts = comm.host_count(), per_host = comm.local()->size();
  return predict(true, hosts, per_host, costs) < predict(false, hosts, per_host, costs);
}

}  // namespace

bool use_hierarchical_allreduce(const Communicator& comm, size_t bytes) {
  const size_t small = static_cast<size_t>(comm.config().small_message_bytes);
  return two_tier_chosen(comm, comm.config().hierarchical_allreduce,
                         [&](bool two_tier, int hosts, int per_host, const LinkCosts& c) {
                           return two_tier ? predict_allreduce_hierarchical(
                                                 hosts, per_host, bytes, small, c,
                                                 comm.config().hierarchical_pipeline_bytes)
                                           : predict_allreduce_flat(hosts, per_host, bytes, small, c);
                         });
}

bool use_hierarchical_allgather(const Communicator& comm, size_t total_bytes) {
  return two_tier_chosen(comm, comm.config().hierarchical_allgather,
                         [&](bool two_tier, int hosts, int per_host, const LinkCosts& c) {
                           return two_tier ? predict_allgather_hierarchical(hosts, per_host, total_bytes, c)
                                           : predict_allgather_flat(hosts, per_host, total_bytes, c);
                         });
}

void allgather(Communicator& comm, const void* input, void* output, const std::vector<size_t>& block_bytes) {
  size_t total = 0;
  for (size_t b : block_bytes) total += b;
  if (comm.size() > 1 && use_hierarchical_allgather(comm, total)) {
    allgather_hierarchical(comm, input, output, block_bytes);
    return;
  }
  if (comm.size() > 1 && comm.single_copy_local() && total >= static_cast<size_t>(comm.config().small_message_bytes)) {
    allgather_single_copy(comm, input, output, block_bytes);
    return;
  }
  size_t offset = 0;
  for (int i = 0; i < comm.rank(); ++i) offset += block_bytes[i];
  if (block_bytes[comm.rank()] > 0) copy_bytes(static_cast<char*>(output) + offset, input, block_bytes[comm.rank()]);
  if (comm.size() > 1) allgather_ring(comm, output, block_bytes, result_is_cold(comm, total));
}

void broadcast(Communicator& comm, void* buffer, size_t bytes, int root_index) {
  if (comm.size() == 1 || bytes == 0) return;
  if (comm.single_copy_local() && bytes >= static_cast<size_t>(comm.config().small_message_bytes)) {
    broadcast_single_copy(comm, buffer, bytes, root_index);
  } else if (bytes < static_cast<size_t>(comm.config().small_message_bytes)) {
    broadcast_tree(comm, buffer, bytes, root_index);
  } else {
    broadcast_chain(comm, buffer, bytes, root_index);
  }
}

}  // namespace hvdlite
