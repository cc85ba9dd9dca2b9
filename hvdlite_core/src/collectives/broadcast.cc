// Broadcast over channels. Tree (small messages): binomial tree rooted at the root; in round k members with
// virtual rank < 2^k send to virtual rank + 2^k: log2(n) latencies. Chain (large messages): members in ring order
// from the root pass the buffer on in chunks, each forwarded as soon as it arrives, so once the pipeline fills every
// link is busy: about one buffer time plus (n-1) chunk times.
#include <algorithm>

#include "collectives/algorithms.h"

namespace hvdlite {
namespace {
constexpr size_t kChunkBytes = 512 << 10;
}

void broadcast_tree(Communicator& comm, void* buffer, size_t bytes, int root_index) {
  const int n = comm.size();
  const int virtual_rank = (comm.rank() - root_index + n) % n;
  int mask = 1;
  while (mask < n) {  // receive from the parent: the member that differs in our lowest set bit
    if (virtual_rank & mask) {
      int parent = ((virtual_rank - mask) + root_index) % n;
      Transfer recv = Transfer::Recv(comm.channel(parent), buffer, bytes);
      comm.progress().run(&recv, 1);
      break;
    }
    mask <<= 1;
  }
  std::vector<Transfer> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (virtual_rank + mask < n) {
      int child = (virtual_rank + mask + root_index) % n;
      sends.push_back(Transfer::Send(comm.channel(child), buffer, bytes));
    }
  }
  comm.progress().run(sends);
}

void broadcast_chain(Communicator& comm, void* buffer, size_t bytes, int root_index) {
  const int n = comm.size();
  const int virtual_rank = (comm.rank() - root_index + n) % n;
  Channel* prev = virtual_rank > 0 ? comm.channel((comm.rank() - 1 + n) % n) : nullptr;
  Channel* next = virtual_rank < n - 1 ? comm.channel((comm.rank() + 1) % n) : nullptr;
  char* data = static_cast<char*>(buffer);
  for (size_t done = 0; done < bytes; done += kChunkBytes) {
    size_t now = std::min(kChunkBytes, bytes - done);
    if (prev) {
      Transfer recv = Transfer::Recv(prev, data + done, now);
      comm.progress().run(&recv, 1);
    }
    if (next) {
      Transfer send = Transfer::Send(next, data + done, now);
      comm.progress().run(&send, 1);
    }
  }
}

}  // namespace hvdlite
