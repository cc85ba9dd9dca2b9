// Dissemination barrier: in round k member i signals i + 2^k and waits for i - 2^k. After ceil(log2 n) rounds
// every member has heard, directly or transitively, from every other. Works for any n.
#include "collectives/algorithms.h"

namespace hvdlite {

void barrier_dissemination(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  char token = 1, incoming = 0;
  for (int distance = 1; distance < n; distance <<= 1) {
    comm.progress().sendrecv(comm.channel((r + distance) % n), &token, 1, comm.channel((r - distance + n) % n),
                             &incoming, 1);
  }
}

}  // namespace hvdlite
