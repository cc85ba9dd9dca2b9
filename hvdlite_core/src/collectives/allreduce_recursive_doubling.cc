// Recursive doubling allreduce (latency-optimal, for small messages).
//
// With p the largest power of two <= n and rem = n - p: among the first 2*rem members, each even one hands its
// data to its odd neighbour and sits out; the remaining p members then exchange whole buffers with partners
// at distance 1, 2, 4, ... (log2 p rounds), each reducing what it receives; finally the odd neighbours return
// the result to the members that sat out. Cost: log2(p) (+2 if n is not a power of two) message latencies,
// n*log2(p) bytes per member. Both partners compute a (op) b with a commutative op, so every member ends with
// bit-identical results.
#include "collectives/algorithms.h"

namespace hvdlite {

void allreduce_recursive_doubling(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind) {
  allreduce_recursive_doubling(comm, buffer, count * dtype_size(dtype),
                               [=](void* dst, const void* src) { reduce_into(dtype, kind, dst, src, count); });
}

void allreduce_recursive_doubling(Communicator& comm, void* buffer, size_t bytes, const BufferReducer& reduce) {
  const int n = comm.size();
  const int r = comm.rank();
  char* incoming = comm.scratch(bytes);
  Progress& progress = comm.progress();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;

  int virtual_rank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      Transfer send = Transfer::Send(comm.channel(r + 1), buffer, bytes);
      progress.run(&send, 1);
      Transfer result = Transfer::Recv(comm.channel(r + 1), buffer, bytes);
      progress.run(&result, 1);
      return;
    }
    Transfer recv = Transfer::Recv(comm.channel(r - 1), incoming, bytes);
    progress.run(&recv, 1);
    reduce(buffer, incoming);
    virtual_rank = r / 2;
  } else {
    virtual_rank = r - rem;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    int partner_virtual = virtual_rank ^ mask;
    int partner = partner_virtual < rem ? partner_virtual * 2 + 1 : partner_virtual + rem;
    Channel* channel = comm.channel(partner);
    progress.sendrecv(channel, buffer, bytes, channel, incoming, bytes);
    reduce(buffer, incoming);
  }
  if (r < 2 * rem) {  // odd member: return the result to the even neighbour that sat out
    Transfer send = Transfer::Send(comm.channel(r - 1), buffer, bytes);
    progress.run(&send, 1);
  }
}

}  // namespace hvdlite
