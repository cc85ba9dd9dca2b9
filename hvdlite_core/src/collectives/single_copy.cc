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

namespace {

using CrossMemoryCall = ssize_t (*)(pid_t, const struct iovec*, unsigned long, const struct iovec*, unsigned long,
                                    unsigned long);

// Moves bytes between local memory and member's memory at remote_address with process_vm_readv or _writev, which
// may move fewer bytes than asked (or be interrupted): loops until all are moved. Throws, naming the rank, on
// failure.
void cross_memory(Communicator& comm, int member, CrossMemoryCall call, const char* verb, char* local,
                  uint64_t remote_address, size_t bytes) {
  while (bytes > 0) {
    struct iovec l = {local, bytes};
    struct iovec r = {reinterpret_cast<void*>(remote_address), bytes};
    ssize_t n = call(comm.pid(member), &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw Error(StatusCode::kRemoteError, std::string(verb) + " the memory of rank " +
                                                std::to_string(comm.global_rank(member)) +
                                                " failed (did it exit?): " + strerror(errno));
    }
    local += n;
    remote_address += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

void read_peer(Communicator& comm, int member, uint64_t remote_address, void* local, size_t bytes) {
  cross_memory(comm, member, process_vm_readv, "reading", static_cast<char*>(local), remote_address, bytes);
}

void write_peer(Communicator& comm, int member, const void* local, uint64_t remote_address, size_t bytes) {
  // process_vm_writev only reads the local iovec's memory; the cast is for the shared iovec type.
  cross_memory(comm, member, process_vm_writev, "writing", const_cast<char*>(static_cast<const char*>(local)),
               remote_address, bytes);
}

}  // namespace hvdlite
