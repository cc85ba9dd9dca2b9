// Recursive doubling allreduce (latency-optimal, for small messages).
//
// With p the largest power of two <= n, the extra members fold in first and get the result last
// (power_of_two_fold.h); the p others exchange whole buffers with partners at distance 1, 2, 4, ... (log2 p
// rounds), each reducing what it receives. Cost: log2(p) (+2 if n is not a power of two) message latencies,
// n*log2(p) bytes per member. Both partners compute a (op) b with a commutative op, so every member ends with
// bit-identical results.
#include "collectives/algorithms.h"
#include "collectives/power_of_two_fold.h"

namespace hvdlite {

void allreduce_recursive_doubling(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind) {
  allreduce_recursive_doubling(comm, buffer, count * dtype_size(dtype),
                               [=](void* dst, const void* src) { reduce_into(dtype, kind, dst, src, count); });
}

void allreduce_recursive_doubling(Communicator& comm, void* buffer, size_t bytes, const BufferReducer& reduce) {
  char* incoming = comm.scratch(bytes);
  PowerOfTwoFold fold(comm, buffer, bytes, incoming, reduce);
  if (!fold.active()) return;
  Progress& progress = comm.progress();
  for (int mask = 1; mask < fold.size(); mask <<= 1) {
    Channel* channel = comm.channel(fold.member(fold.virtual_rank() ^ mask));
    progress.exchange(channel, buffer, incoming, bytes);  // a small one as one message each way
    reduce(buffer, incoming);
  }
  fold.finish(buffer);
}

}  // namespace hvdlite
