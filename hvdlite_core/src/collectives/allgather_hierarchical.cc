// Hierarchical (two-tier) allgather for members spread over H hosts with L members on each.
//
//   1. allgather inside each host (ring over shared memory): every member of the host holds the host's data,
//      its members' blocks in local order;
//   2. across hosts, among the H members with local index i (the cross communicator): member i contributes
//      slice i of its host's data (an even byte split in L) and receives slice i of every other host's: L rings
//      in parallel, each moving 1/L of the data, so each host's link carries every other host's data once;
//   3. allgather inside each host of what step 2 brought: member i's block is slice i of every other host.
// Finally every block is copied to its place in the output, unless ranks are numbered host by host (then the
// phases work in the output itself).
//
// Each host's link carries (H-1)/H of the output in H-1 steps, where the flat ring sends (N-1)/N of it through each
// host-crossing edge in N-1 steps. The price, local traffic and three copies of the output through memory, is cheap
// next to a network link.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "common/copy_bytes.h"

namespace hvdlite {
namespace {

// Byte range [begin, end) of slice i when `bytes` is split evenly in `parts`.
size_t slice_begin(size_t bytes, int parts, int i) {
  size_t base = bytes / parts, extra = bytes % parts;
  return i * base + std::min<size_t>(i, extra);
}

size_t slice_size(size_t bytes, int parts, int i) {
  return slice_begin(bytes, parts, i + 1) - slice_begin(bytes, parts, i);
}

}  // namespace

void allgather_hierarchical(Communicator& comm, const void* input, void* output,
                            const std::vector<size_t>& block_bytes) {
  Communicator& local = *comm.local();
  Communicator& cross = *comm.cross();
  const std::vector<std::vector<int>>& hosts = comm.host_members();
  const int H = static_cast<int>(hosts.size()), L = local.size();
  const int my_host = cross.rank(), my_local = local.rank();

  // Staging holds the output host by host: host h's data (its members' blocks in local order) at host_base[h].
  std::vector<size_t> host_bytes(H, 0), host_base(H + 1, 0);
  for (int h = 0; h < H; ++h) {
    for (int m : hosts[h]) host_bytes[h] += block_bytes[m];
    host_base[h + 1] = host_base[h] + host_bytes[h];
  }
  const size_t total = host_base[H];
  // Ranks numbered host by host (the usual layout) make the staging order the output order: stage in place.
  bool host_by_host = true;
  for (int h = 0, next = 0; h < H; ++h) {
    for (int m : hosts[h]) host_by_host = host_by_host && m == next++;
  }
  // scratch: [cross blocks: <= total][local blocks: <= total][staging: total, unless in place]
  char* cross_buffer = comm.scratch(2 * total + (host_by_host ? 0 : total) + 1);
  char* local_buffer = cross_buffer + total;
  char* staging = host_by_host ? static_cast<char*>(output) : local_buffer + total;

  // 1. In the host.
  std::vector<size_t> local_blocks(L);
  size_t my_offset = 0;
  for (int i = 0; i < L; ++i) {
    local_blocks[i] = block_bytes[hosts[my_host][i]];
    if (i < my_local) my_offset += local_blocks[i];
  }
  char* my_host_data = staging + host_base[my_host];
  if (local_blocks[my_local] > 0) copy_bytes(my_host_data + my_offset, input, local_blocks[my_local]);
  allgather_ring(local, my_host_data, local_blocks);

  // 2. Across hosts: slice my_local of every host's data.
  std::vector<size_t> cross_blocks(H), cross_offsets(H, 0);
  for (int h = 0; h < H; ++h) {
    cross_blocks[h] = slice_size(host_bytes[h], L, my_local);
    if (h > 0) cross_offsets[h] = cross_offsets[h - 1] + cross_blocks[h - 1];
  }
  copy_bytes(cross_buffer + cross_offsets[my_host], my_host_data + slice_begin(host_bytes[my_host], L, my_local),
             cross_blocks[my_host]);
  allgather_ring(cross, cross_buffer, cross_blocks);

  // 3. In the host again: member i's block is slice i of every other host, hosts in order.
  std::vector<size_t> from_others(L, 0);
  for (int i = 0; i < L; ++i) {
    for (int h = 0; h < H; ++h)
      if (h != my_host) from_others[i] += slice_size(host_bytes[h], L, i);
  }
  size_t mine_at = 0;
  for (int i = 0; i < my_local; ++i) mine_at += from_others[i];
  size_t at = mine_at;
  for (int h = 0; h < H; ++h) {
    if (h == my_host) continue;
    copy_bytes(local_buffer + at, cross_buffer + cross_offsets[h], cross_blocks[h]);
    at += cross_blocks[h];
  }
  allgather_ring(local, local_buffer, from_others);
  at = 0;
  for (int i = 0; i < L; ++i) {  // unpack every slice to its host's place in staging
    for (int h = 0; h < H; ++h) {
      if (h == my_host) continue;
      const size_t size = slice_size(host_bytes[h], L, i);
      copy_bytes(staging + host_base[h] + slice_begin(host_bytes[h], L, i), local_buffer + at, size);
      at += size;
    }
  }

  if (host_by_host) return;
  // Blocks to their places in member order.
  std::vector<size_t> member_offset(comm.size() + 1, 0);
  for (int m = 0; m < comm.size(); ++m) member_offset[m + 1] = member_offset[m] + block_bytes[m];
  char* out = static_cast<char*>(output);
  for (int h = 0; h < H; ++h) {
    at = host_base[h];
    for (int m : hosts[h]) {
      if (block_bytes[m] > 0) copy_bytes(out + member_offset[m], staging + at, block_bytes[m]);
      at += block_bytes[m];
    }
  }
}

}  // namespace hvdlite
