// Ring reduce-scatter (bandwidth-optimal).
//
// Members form a ring (i sends to i+1, receives from i-1). The buffer is cut into n segments. In step s
// (0 <= s < n-1) member i sends segment (i - s - 1) mod n and receives segment (i - s - 2) mod n, reducing it
// into its own copy; after n-1 steps member i holds the full reduction of segment i. Each step is streamed in
// chunks so the receive buffer stays cache-sized. Cost: n-1 latencies, (n-1)/n of the data sent per member.
#include <algorithm>

#include "collectives/algorithms.h"

namespace hvdlite {
namespace {
constexpr size_t kChunkBytes = 256 << 10;
}

void reduce_scatter_ring(Communicator& comm, void* buffer, const std::vector<size_t>& segment_counts, DType dtype,
                         ReduceKind kind) {
  const int n = comm.size();
  if (n == 1) return;
  const int r = comm.rank();
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> offsets(n, 0);
  for (int i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + segment_counts[i - 1] * esize;
  char* base = static_cast<char*>(buffer);
  Channel* next = comm.channel((r + 1) % n);
  Channel* prev = comm.channel((r - 1 + n) % n);
  const size_t chunk_elements = std::max<size_t>(1, kChunkBytes / esize);
  char* incoming = comm.scratch(chunk_elements * esize);
  for (int s = 0; s < n - 1; ++s) {
    int send_segment = ((r - s - 1) % n + n) % n;
    int recv_segment = ((r - s - 2) % n + n) % n;
    size_t send_count = segment_counts[send_segment];
    size_t recv_count = segment_counts[recv_segment];
    for (size_t done = 0; done < std::max(send_count, recv_count); done += chunk_elements) {
      size_t send_now = done < send_count ? std::min(chunk_elements, send_count - done) : 0;
      size_t recv_now = done < recv_count ? std::min(chunk_elements, recv_count - done) : 0;
      comm.progress().sendrecv(next, base + offsets[send_segment] + done * esize, send_now * esize, prev, incoming,
                               recv_now * esize);
      reduce_into(dtype, kind, base + offsets[recv_segment] + done * esize, incoming, recv_now);
    }
  }
}

}  // namespace hvdlite
