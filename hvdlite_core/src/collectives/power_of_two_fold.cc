#include "collectives/power_of_two_fold.h"

namespace hvdlite {

FoldShape::FoldShape(int n, int rank) {
  while (p * 2 <= n) p *= 2;
  rem = n - p;
  if (rank >= 2 * rem) {
    virtual_rank = rank - rem;
    return;
  }
  neighbour = rank % 2 == 0 ? rank + 1 : rank - 1;
  if (rank % 2 == 1) virtual_rank = rank / 2;
}

PowerOfTwoFold::PowerOfTwoFold(Communicator& comm, void* buffer, size_t bytes, char* incoming,
                               const BufferReducer& reduce)
    : comm_(comm), bytes_(bytes), shape_(comm.size(), comm.rank()) {
  if (shape_.neighbour < 0) return;
  Progress& progress = comm.progress();
  Channel* neighbour = comm.channel(shape_.neighbour);
  if (!active()) {
    Transfer send = Transfer::Send(neighbour, buffer, bytes);
    progress.run(&send, 1);
    Transfer result = Transfer::Recv(neighbour, buffer, bytes);
    progress.run(&result, 1);
    return;
  }
  Transfer recv = Transfer::Recv(neighbour, incoming, bytes);
  progress.run(&recv, 1);
  reduce(buffer, incoming);
}

void PowerOfTwoFold::finish(void* buffer) {
  if (shape_.neighbour >= 0) {  // odd member: return the result to the even neighbour that sat out
    Transfer send = Transfer::Send(comm_.channel(shape_.neighbour), buffer, bytes_);
    comm_.progress().run(&send, 1);
  }
}

}  // namespace hvdlite
