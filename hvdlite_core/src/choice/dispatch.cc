// Runs what the chooser (chooser.h) names for each collective of the built-in backend.
#include "choice/dispatch.h"

#include "common/copy_bytes.h"
#include "common/huge_page_promotion.h"

namespace hvdlite {
namespace {

// Single copy's peers read the input and write the output: where those are reused, they go onto huge pages first.
void promote_for_peers(const Communicator& comm, const void* input, void* output, size_t bytes) {
  const int64_t min_bytes = comm.config().huge_page_bytes;
  HugePagePromoter* promoter = min_bytes > 0 ? huge_page_promoter() : nullptr;
  if (!promoter) return;
  promoter->note_use(input, bytes, static_cast<size_t>(min_bytes));
  if (output != input) promoter->note_use(output, bytes, static_cast<size_t>(min_bytes));
}

// In place, including the postscale: all but recursive doubling scale each piece while it is in cache.
void run_flat(Communicator& comm, AllreduceAlgorithm algorithm, bool cold_output, void* buffer, size_t count,
              DType dtype, ReduceKind kind, double postscale) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling:
      allreduce_recursive_doubling(comm, buffer, count, dtype, kind);
      if (postscale != 1.0) scale_in_place(dtype, buffer, count, postscale);
      break;
    case AllreduceAlgorithm::kRing:
      allreduce_ring(comm, buffer, count, dtype, kind, postscale, cold_output);
      break;
    case AllreduceAlgorithm::kSingleCopy:
      promote_for_peers(comm, buffer, buffer, count * dtype_size(dtype));
      allreduce_single_copy(comm, buffer, buffer, count, dtype, kind, postscale);
      break;
    case AllreduceAlgorithm::kRecursiveHalving:
      allreduce_recursive_halving(comm, buffer, count, dtype, kind, postscale);
      break;
  }
}

// The cross-host tier of a two-tier allreduce: each chunk's segment gets its own flat choice on the cross tier.
void allreduce_across(const Chooser& chooser, Communicator& cross, void* buffer, size_t count, DType dtype,
                      ReduceKind kind) {
  if (cross.size() == 1 || count == 0) return;
  const size_t bytes = count * dtype_size(dtype);
  run_flat(cross, chooser.flat_allreduce(cross, bytes, count), chooser.cold(bytes), buffer, count, dtype, kind, 1.0);
}

}  // namespace

const char* allreduce(const Chooser& chooser, Communicator& comm, const void* input, void* output, size_t count,
                      DType dtype, ReduceKind kind, double postscale) {
  const size_t bytes = count * dtype_size(dtype);
  if (comm.size() == 1 || count == 0) {
    if (input != output && bytes > 0) copy_bytes(output, input, bytes);
    if (postscale != 1.0) scale_in_place(dtype, output, count, postscale);
    return "";
  }
  const AllreducePlan plan = chooser.allreduce(comm, bytes, count);
  if (plan.two_tier) {
    if (input != output) copy_bytes(output, input, bytes);
    allreduce_hierarchical(comm, output, count, dtype, kind, plan.chunks,
                           [&](Communicator& cross, void* buffer, size_t elements) {
                             allreduce_across(chooser, cross, buffer, elements, dtype, kind);
                           });
    if (postscale != 1.0) scale_in_place(dtype, output, count, postscale);
  } else if (plan.algorithm == AllreduceAlgorithm::kSingleCopy) {
    promote_for_peers(comm, input, output, bytes);
    allreduce_single_copy(comm, input, output, count, dtype, kind, postscale);  // reads input, scales as it goes
  } else {
    if (input != output) copy_bytes(output, input, bytes);
    run_flat(comm, plan.algorithm, plan.cold_output, output, count, dtype, kind, postscale);
  }
  return plan.label();
}

const char* allgather(const Chooser& chooser, Communicator& comm, const void* input, void* output,
                      const std::vector<size_t>& block_bytes) {
  size_t total = 0;
  for (size_t b : block_bytes) total += b;
  switch (chooser.allgather(comm, total)) {
    case AllgatherAlgorithm::kTwoTier:
      allgather_hierarchical(comm, input, output, block_bytes);
      return "hierarchical";
    case AllgatherAlgorithm::kSingleCopy:
      allgather_single_copy(comm, input, output, block_bytes);
      return "single_copy";
    case AllgatherAlgorithm::kRing:
      break;
  }
  size_t offset = 0;
  for (int i = 0; i < comm.rank(); ++i) offset += block_bytes[i];
  if (block_bytes[comm.rank()] > 0) copy_bytes(static_cast<char*>(output) + offset, input, block_bytes[comm.rank()]);
  if (comm.size() > 1) allgather_ring(comm, output, block_bytes, chooser.cold(total));
  return "ring";
}

void broadcast(const Chooser& chooser, Communicator& comm, void* buffer, size_t bytes, int root_index) {
  if (comm.size() == 1 || bytes == 0) return;
  switch (chooser.broadcast(comm, bytes)) {
    case BroadcastAlgorithm::kSingleCopy:
      broadcast_single_copy(comm, buffer, bytes, root_index);
      break;
    case BroadcastAlgorithm::kTree:
      broadcast_tree(comm, buffer, bytes, root_index);
      break;
    case BroadcastAlgorithm::kChain:
      broadcast_chain(comm, buffer, bytes, root_index);
      break;
  }
}

}  // namespace hvdlite
