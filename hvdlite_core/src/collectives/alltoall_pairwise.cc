// Pairwise-exchange alltoall: in step k (1 <= k < n) member i sends its block for i+k and receives the block
// from i-k, so every member talks to one peer at a time and no link is oversubscribed. n-1 latencies.
#include <cstring>

#include "collectives/algorithms.h"
#include "common/copy_bytes.h"

namespace hvdlite {

void alltoall_pairwise(Communicator& comm, const void* input, const std::vector<size_t>& send_bytes, void* output,
                       const std::vector<size_t>& recv_bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  std::vector<size_t> send_offsets(n, 0), recv_offsets(n, 0);
  for (int i = 1; i < n; ++i) {
    send_offsets[i] = send_offsets[i - 1] + send_bytes[i - 1];
    recv_offsets[i] = recv_offsets[i - 1] + recv_bytes[i - 1];
  }
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (send_bytes[r] > 0) copy_bytes(out + recv_offsets[r], in + send_offsets[r], send_bytes[r]);
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n;
    int from = (r - k + n) % n;
    comm.progress().sendrecv(comm.channel(to), in + send_offsets[to], send_bytes[to], comm.channel(from),
                             out + recv_offsets[from], recv_bytes[from]);
  }
}

}  // namespace hvdlite
