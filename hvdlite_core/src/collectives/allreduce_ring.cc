// Ring allreduce = ring reduce-scatter (reduce_scatter_ring.cc) + ring allgather of the reduced segments.
// Each member sends and receives 2(n-1)/n of the buffer: the bandwidth optimum, independent of n. A result larger
// than the cache is best received with streaming stores (cold_output), which skip reading each destination line
// only to overwrite it (from STREAMING_STORE_BYTES, or where a tuned table says: choice/select.h).
#include "collectives/algorithms.h"

namespace hvdlite {

void allreduce_ring(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind, double postscale,
                    bool cold_output) {
  std::vector<size_t> segments = even_split(count, comm.size());
  reduce_scatter_ring(comm, buffer, segments, dtype, kind, postscale);
  std::vector<size_t> segment_bytes(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) segment_bytes[i] = segments[i] * dtype_size(dtype);
  allgather_ring(comm, buffer, segment_bytes, cold_output);
}

}  // namespace hvdlite
