// Single-copy allreduce for members on one host (Linux cross-memory attach).
//
//   1. Members exchange the addresses of their input and output buffers (also an arrival barrier).
//   2. Member i owns segment i: in cache-sized chunks it copies its own input into its output, reduces into it
//      every peer's input, read straight from the peer's memory, and writes the finished chunk straight into
//      every peer's output while the chunk is still in its cache.
//   3. Barrier: every peer has read my input and written my output, so the buffers go back to the caller.
// This moves about half the memory traffic of a ring through shared-memory staging buffers. Each segment is
// reduced by exactly one member, so all members get bit-identical results. Pushing the result, rather than
// pulling it after a second barrier, saves a rendezvous and sends the chunk from cache.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/single_copy.h"
#include "common/copy_bytes.h"

namespace hvdlite {
namespace {
constexpr size_t kChunkBytes = 256 << 10;  // a chunk and its incoming copy stay in L2
}

void allreduce_single_copy(Communicator& comm, const void* input, void* output, size_t count, DType dtype,
                           ReduceKind kind, double postscale) {
  const int n = comm.size();
  const int r = comm.rank();
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> segments = even_split(count, n);
  std::vector<size_t> offsets(n, 0);
  for (int i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + segments[i - 1] * esize;
  std::vector<PublishedBuffers> peers = exchange_addresses(comm, input, output);

  const size_t chunk_elements = std::max<size_t>(1, kChunkBytes / esize);
  char* incoming = comm.scratch(chunk_elements * esize);
  char* out = static_cast<char*>(output);
  const char* in = static_cast<const char*>(input);
  for (size_t done = 0; done < segments[r]; done += chunk_elements) {
    const size_t elements = std::min(chunk_elements, segments[r] - done);
    const size_t offset = offsets[r] + done * esize;
    if (out != in) copy_bytes(out + offset, in + offset, elements * esize);
    for (int step = 1; step < n; ++step) {
      int peer = (r + step) % n;
      read_peer(comm, peer, peers[peer].input + offset, incoming, elements * esize);
      // The last peer's contribution completes the chunk: scale it in the same pass.
      reduce_into_scaled(dtype, kind, out + offset, incoming, elements, step == n - 1 ? postscale : 1.0);
    }
    if (n == 1 && postscale != 1.0) scale_in_place(dtype, out + offset, elements, postscale);
    // Only I touch segment r of any member's buffers, so the peers' copies of this chunk are mine to write.
    for (int step = 1; step < n; ++step) {
      int peer = (r + step) % n;
      write_peer(comm, peer, out + offset, peers[peer].output + offset, elements * esize);
    }
  }
  barrier_dissemination(comm);
}

void allgather_single_copy(Communicator& comm, const void* input, void* output,
                           const std::vector<size_t>& block_bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  std::vector<size_t> offsets(n, 0);
  for (int i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + block_bytes[i - 1];
  std::vector<PublishedBuffers> peers = exchange_addresses(comm, input, output);
  char* out = static_cast<char*>(output);
  if (block_bytes[r] > 0) copy_bytes(out + offsets[r], input, block_bytes[r]);
  for (int step = 1; step < n; ++step) {
    int peer = (r + step) % n;
    if (block_bytes[peer] > 0) read_peer(comm, peer, peers[peer].input, out + offsets[peer], block_bytes[peer]);
  }
  barrier_dissemination(comm);
}

void broadcast_single_copy(Communicator& comm, void* buffer, size_t bytes, int root_index) {
  std::vector<PublishedBuffers> peers = exchange_addresses(comm, buffer, buffer);
  if (comm.rank() != root_index) read_peer(comm, root_index, peers[root_index].input, buffer, bytes);
  barrier_dissemination(comm);
}

}  // namespace hvdlite
