// Room in /dev/shm for the co-located ranks' inboxes. Creating an inbox reserves its memory, so a small /dev/shm
// (containers, CI runners) shows at init instead of as SIGBUS on a later write. A rank without room for the
// configured rings halves them, down to kMinShmRingBytes, before giving up; the ranks of a host then compare
// what each got (Mesh) and use shared memory only if every one of them has an inbox.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/shm_segment.h"

namespace hvdlite {

constexpr size_t kMinShmRingBytes = 64 << 10;

struct InboxAttempt {
  ShmInbox inbox;         // empty when there was no room even for the smallest rings
  size_t ring_bytes = 0;  // what the inbox got; 0 without one
  std::string failure;    // why there is no inbox (the last attempt's error)
};

InboxAttempt create_inbox_within_room(const std::string& name, int owner_rank, int slots, size_t ring_bytes);

// One warning for the host, "" when every rank got the configured rings. ranks: the host's ranks, ascending;
// rings: what each got (0: no inbox); slots: rings per inbox.
std::string describe_shm_shortage(const std::vector<int>& ranks, const std::vector<uint64_t>& rings,
                                  size_t configured_ring_bytes, const std::string& failure);

}  // namespace hvdlite
