// Ring reduce-scatter (bandwidth-optimal).
//
// Members form a ring (i sends to i+1, receives from i-1). The buffer is cut into n segments. In step s
// (0 <= s < n-1) member i sends segment (i - s - 1) mod n and receives segment (i - s - 2) mod n, reducing it
// into its own copy; after n-1 steps member i holds the full reduction of segment i. Cost: n-1 latencies,
// (n-1)/n of the data sent per member.
//
// The incoming bytes are reduced where the channel holds them (for shared memory, straight out of the ring:
// no copy into scratch first), and the send and the reduction alternate in pieces of kPieceBytes, so the
// peer's copy into my ring overlaps with my reduction of what it sent before.
#include "collectives/algorithms.h"

namespace hvdlite {
namespace {
constexpr size_t kPieceBytes = 256 << 10;  // a multiple of every element size
}

void reduce_scatter_ring(Communicator& comm, void* buffer, const std::vector<size_t>& segment_counts, DType dtype,
                         ReduceKind kind, double postscale) {
  const int n = comm.size();
  if (n == 1) return;
  const int r = comm.rank();
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> offsets(n, 0);
  for (int i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + segment_counts[i - 1] * esize;
  char* base = static_cast<char*>(buffer);
  Channel* next = comm.channel((r + 1) % n);
  Channel* prev = comm.channel((r - 1 + n) % n);
  for (int s = 0; s < n - 1; ++s) {
    const int send_segment = ((r - s - 1) % n + n) % n;
    const int recv_segment = ((r - s - 2) % n + n) % n;
    const bool scale = s == n - 2 && postscale != 1.0;  // the last step completes my segment: scale it in cache
    char* destination = base + offsets[recv_segment];
    size_t landed = 0;
    const RecvConsumer reduce = [&](const char* data, size_t bytes) {
      const size_t count = bytes / esize;
      reduce_into_scaled(dtype, kind, destination + landed, data, count, scale ? postscale : 1.0);
      landed += bytes;
    };
    // Both ends start the segment at an aligned stream offset, so the reduction reads the shm ring in place
    // rather than through an aligned bounce buffer (streams carry odd-length control messages too).
    Transfer step[2] = {Transfer::Send(next, base + offsets[send_segment], segment_counts[send_segment] * esize)
                            .per_pass(kPieceBytes)
                            .aligned_start(),
                        Transfer::RecvInto(prev, segment_counts[recv_segment] * esize, esize, &reduce)
                            .per_pass(kPieceBytes)
                            .aligned_start()};
    comm.progress().run(step, 2);
  }
}

}  // namespace hvdlite
