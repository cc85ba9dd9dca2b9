// Hierarchical (two-tier) allreduce for members spread over H hosts with L members on each.
//
//   1. reduce-scatter inside each host (ring over shared memory): local member i ends with segment i of the
//      buffer (an even split in L) reduced over its host;
//   2. allreduce of segment i across hosts, among the H members with local index i (the cross communicator):
//      L independent allreduces of 1/L of the data, one per local member, in parallel over the network;
//   3. allgather of the L reduced segments inside each host.
//
// Bytes each host sends over the network: 2(H-1)/H of the buffer in total (its L members share it), against
// 2(N-1)/N per rank for the flat ring over N = H*L ranks, whose host-crossing edges carry that much each. The
// local tiers add 2(L-1)/L of the buffer through shared memory, which is several times faster than the network.
// Results are bit-identical on every member (each segment is reduced once, then copied), though summed in
// another order than the flat ring's.
#include "collectives/algorithms.h"

namespace hvdlite {

void allreduce_hierarchical(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind) {
  Communicator& local = *comm.local();
  Communicator& cross = *comm.cross();
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> segments = even_split(count, local.size());
  std::vector<size_t> segment_bytes(segments.size());
  size_t my_offset = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    segment_bytes[i] = segments[i] * esize;
    if (static_cast<int>(i) < local.rank()) my_offset += segment_bytes[i];
  }
  reduce_scatter_ring(local, buffer, segments, dtype, kind);
  allreduce_flat(cross, static_cast<char*>(buffer) + my_offset, segments[local.rank()], dtype, kind);
  allgather_ring(local, buffer, segment_bytes);
}

}  // namespace hvdlite
