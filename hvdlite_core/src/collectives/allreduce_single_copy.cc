// Single-copy allreduce for members on one host (Linux cross-memory attach).
//
//   1. Members exchange the addresses of their input and output buffers (also an arrival barrier).
//   2. Member i owns segment i: it copies its own input segment into its output and reduces into it every
//      peer's input segment, read straight from the peer's memory in cache-sized chunks.
//   3. Barrier; then member i reads every other segment from its owner's output into its own output.
//   4. Barrier, so nobody reuses or returns a buffer a peer may still be reading.
// Bytes moved per member for S bytes: S/n·(n-1) read remotely + S/n local for the reduction, (n-1)/n·S read
// remotely for the gather: about 2S of memory traffic against 4-5S for a ring through shared-memory rings,
// which copies every byte into and out of a staging buffer. Each segment is reduced by exactly one member, so
// all members get bit-identical results. A reused buffer is moved onto huge pages first, which makes the peers'
// reads of it cheaper (common/huge_page_promotion.h).
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/single_copy.h"
#include "common/copy_bytes.h"
#include "common/huge_page_promotion.h"

namespace hvdlite {
namespace {
constexpr size_t kChunkBytes = 128 << 10;
}

void allreduce_single_copy(Communicator& comm, const void* input, void* output, size_t count, DType dtype,
                           ReduceKind kind, double postscale) {
  const int n = comm.size();
  const int r = comm.rank();
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> segments = even_split(count, n);
  std::vector<size_t> offsets(n, 0);
  for (int i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + segments[i - 1] * esize;
  // The peers read my input, then my output: where they are reused, put them on huge pages first.
  if (comm.config().huge_page_bytes > 0) {
    if (HugePagePromoter* promoter = huge_page_promoter()) {
      const size_t bytes = count * esize, min_bytes = static_cast<size_t>(comm.config().huge_page_bytes);
      promoter->note_use(input, bytes, min_bytes);
      if (output != input) promoter->note_use(output, bytes, min_bytes);
    }
  }
  std::vector<PublishedBuffers> peers = exchange_addresses(comm, input, output);

  const size_t chunk_elements = std::max<size_t>(1, kChunkBytes / esize);
  char* incoming = comm.scratch(chunk_elements * esize);
  char* out = static_cast<char*>(output);
  const char* in = static_cast<const char*>(input);
  for (size_t done = 0; done < segments[r]; done += chunk_elements) {
    size_t elements = std::min(chunk_elements, segments[r] - done);
    size_t offset = offsets[r] + done * esize;
    if (out != in) copy_bytes(out + offset, in + offset, elements * esize);
    for (int step = 1; step < n; ++step) {
      int peer = (r + step) % n;
      read_peer(comm, peer, peers[peer].input + offset, incoming, elements * esize);
      // The last peer's contribution completes the chunk: scale it in the same pass.
      reduce_into_scaled(dtype, kind, out + offset, incoming, elements, step == n - 1 ? postscale : 1.0);
    }
    if (n == 1 && postscale != 1.0) scale_in_place(dtype, out + offset, elements, postscale);
  }
  barrier_dissemination(comm);
  for (int step = 1; step < n; ++step) {
    int peer = (r + step) % n;
    if (segments[peer] > 0) {
      read_peer(comm, peer, peers[peer].output + offsets[peer], out + offsets[peer], segments[peer] * esize);
    }
  }
  barrier_dissemination(comm);
}

void allgather_single_copy(Communicator& comm, const void* input, void* output, const std::vector<size_t>& block_bytes) {
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
