// Hierarchical (two-tier) allreduce for members spread over H hosts with L members on each.
//
//   1. reduce-scatter inside each host (ring over shared memory): local member i ends with segment i of the
//      buffer (an even split in L) reduced over its host;
//   2. allreduce of segment i across hosts, among the H members with local index i (the cross communicator):
//      L independent allreduces of 1/L of the data, in parallel over the network;
//   3. allgather of the L reduced segments inside each host.
// Each host sends 2(H-1)/H of the buffer over the network in total, where each host-crossing edge of the flat ring
// carries 2(N-1)/N.
//
// Pipeline: the buffer is cut into chunks (how many: choice/chooser.h), and chunk k's cross-host allreduce runs
// on a helper thread while the caller reduce-scatters chunk k+1 and allgathers chunk k-1, so neither tier idles.
// The threads use disjoint channels (local peers versus peers on other hosts) and disjoint scratch (each
// communicator owns its own); each tier runs its chunks in the same order on every member, so the tagless channels
// stay in step. Each segment is reduced once, then copied: results are bit-identical on every member, though
// summed in another order than the flat ring's.
#include <algorithm>

#include "collectives/algorithms.h"
#include "common/ordered_worker.h"
#include "transport/progress.h"

namespace hvdlite {
namespace {

// One chunk's layout: where it starts and its split into the L local segments.
struct Chunk {
  char* data;
  std::vector<size_t> segments;  // elements per local member
  std::vector<size_t> segment_bytes;
  size_t my_offset = 0;  // bytes from data to my segment
  size_t my_count = 0;   // elements in my segment
};

Chunk make_chunk(char* data, size_t count, int local_size, int local_rank, size_t esize) {
  Chunk chunk{data, even_split(count, local_size), {}, 0, 0};
  chunk.segment_bytes.resize(chunk.segments.size());
  for (size_t i = 0; i < chunk.segments.size(); ++i) {
    chunk.segment_bytes[i] = chunk.segments[i] * esize;
    if (static_cast<int>(i) < local_rank) chunk.my_offset += chunk.segment_bytes[i];
  }
  chunk.my_count = chunk.segments[local_rank];
  return chunk;
}

}  // namespace

void allreduce_hierarchical(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind,
                            size_t chunk_count, const AllreduceAcross& across) {
  Communicator& local = *comm.local();
  Communicator& cross = *comm.cross();
  const size_t esize = dtype_size(dtype);
  chunk_count = std::max<size_t>(1, chunk_count);
  std::vector<Chunk> chunks;
  char* next = static_cast<char*>(buffer);
  for (size_t elements : even_split(count, static_cast<int>(chunk_count))) {
    chunks.push_back(make_chunk(next, elements, local.size(), local.rank(), esize));
    next += elements * esize;
  }
  auto reduce_scatter = [&](const Chunk& c) { reduce_scatter_ring(local, c.data, c.segments, dtype, kind); };
  auto across_hosts = [&](const Chunk& c) { across(cross, c.data + c.my_offset, c.my_count); };
  auto allgather = [&](const Chunk& c) { allgather_ring(local, c.data, c.segment_bytes); };
  if (chunks.size() == 1) {
    reduce_scatter(chunks[0]);
    across_hosts(chunks[0]);
    allgather(chunks[0]);
    return;
  }
  // The helper waits the way the caller does (the background thread spins less than a user thread).
  const int64_t spin_us = Progress::thread_spin();
  OrderedWorker cross_stage([spin_us] { Progress::set_thread_spin(spin_us); });
  reduce_scatter(chunks[0]);
  cross_stage.submit([&, k = size_t{0}] { across_hosts(chunks[k]); });
  for (size_t k = 1; k <= chunks.size(); ++k) {
    if (k < chunks.size()) {
      reduce_scatter(chunks[k]);
      cross_stage.submit([&, k] { across_hosts(chunks[k]); });
    }
    cross_stage.wait(k - 1);
    allgather(chunks[k - 1]);
  }
}

}  // namespace hvdlite
