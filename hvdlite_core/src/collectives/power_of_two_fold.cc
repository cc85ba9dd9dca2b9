#include "collectives/power_of_two_fold.h"

namespace hvdlite {

PowerOfTwoFold::PowerOfTwoFold(Communicator& comm, void* buffer, size_t bytes, char* incoming,
                               const BufferReducer& reduce)
    : comm_(comm), bytes_(bytes) {
  const int n = comm.size(), r = comm.rank();
  while (p_ * 2 <= n) p_ *= 2;
  rem_ = n - p_;
  Progress& progress = comm.progress();
  if (r >= 2 * rem_) {
    virtual_rank_ = r - rem_;
    return;
  }
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
  virtual_rank_ = r / 2;
}

void PowerOfTwoFold::finish(void* buffer) {
  const int r = comm_.rank();
  if (r < 2 * rem_) {  // odd member: return the result to the even neighbour that sat out
    Transfer send = Transfer::Send(comm_.channel(r - 1), buffer, bytes_);
    comm_.progress().run(&send, 1);
  }
}

}  // namespace hvdlite
