// Ring allgather with per-member block sizes. The caller has placed its own block in output. In step s
// (0 <= s < n-1) member i forwards block (i - s) mod n to i+1 and receives block (i - s - 1) mod n from i-1.
// Cost: n-1 latencies; each member sends everything except one block once.
#include "collectives/algorithms.h"

namespace hvdlite {

void allgather_ring(Communicator& comm, void* output, const std::vector<size_t>& block_bytes, bool cold_output) {
  const int n = comm.size();
  const int r = comm.rank();
  std::vector<size_t> offsets(n, 0);
  for (int i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + block_bytes[i - 1];
  char* base = static_cast<char*>(output);
  Channel* next = comm.channel((r + 1) % n);
  Channel* prev = comm.channel((r - 1 + n) % n);
  for (int s = 0; s < n - 1; ++s) {
    int send_block = ((r - s) % n + n) % n;
    int recv_block = ((r - s - 1) % n + n) % n;
    comm.progress().sendrecv(next, base + offsets[send_block], block_bytes[send_block], prev,
                             base + offsets[recv_block], block_bytes[recv_block], cold_output);
  }
}

}  // namespace hvdlite
