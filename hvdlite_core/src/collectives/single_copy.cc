#include "collectives/single_copy.h"

#include <errno.h>
#include <sys/uio.h>

#include <cstring>
#include <string>

#include "common/status.h"

namespace hvdlite {

std::vector<PublishedBuffers> exchange_addresses(Communicator& comm, const void* input, const void* output) {
  const int n = comm.size();
  std::vector<PublishedBuffers> all(n);
  PublishedBuffers mine{reinterpret_cast<uint64_t>(input), reinterpret_cast<uint64_t>(output)};
  all[comm.rank()] = mine;
  std::vector<Transfer> transfers;
  transfers.reserve(2 * n);
  for (int i = 0; i < n; ++i) {
    if (i == comm.rank()) continue;
    transfers.push_back(Transfer::Send(comm.channel(i), &mine, sizeof(mine)));
    transfers.push_back(Transfer::Recv(comm.channel(i), &all[i], sizeof(PublishedBuffers)));
  }
  comm.progress().run(transfers);
  return all;
}

void read_peer(Communicator& comm, int member, uint64_t remote_address, void* local, size_t bytes) {
  char* dst = static_cast<char*>(local);
  while (bytes > 0) {
    struct iovec l = {dst, bytes};
    struct iovec r = {reinterpret_cast<void*>(remote_address), bytes};
    ssize_t n = process_vm_readv(comm.pid(member), &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw Error(StatusCode::kRemoteError, "reading the memory of rank " + std::to_string(comm.global_rank(member)) +
                                                " failed (did it exit?): " + strerror(errno));
    }
    dst += n;
    remote_address += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void write_peer(Communicator& comm, int member, const void* local, uint64_t remote_address, size_t bytes) {
  const char* src = static_cast<const char*>(local);
  while (bytes > 0) {
    struct iovec l = {const_cast<char*>(src), bytes};
    struct iovec r = {reinterpret_cast<void*>(remote_address), bytes};
    ssize_t n = process_vm_writev(comm.pid(member), &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw Error(StatusCode::kRemoteError, "writing the memory of rank " + std::to_string(comm.global_rank(member)) +
                                                " failed (did it exit?): " + strerror(errno));
    }
    src += n;
    remote_address += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace hvdlite
