#include "transport/shm_room.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>

namespace hvdlite {
namespace {

std::string mebibytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1 << 20));
  return text;
}

std::string dev_shm_room() {
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) != 0) return "/dev/shm (not found)";
  return "/dev/shm (" + mebibytes(static_cast<double>(fs.f_blocks) * fs.f_frsize) + ", " +
         mebibytes(static_cast<double>(fs.f_bavail) * fs.f_frsize) + " free)";
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

const char kFix[] =
    "Fix: give /dev/shm more room (docker run --shm-size=1g; in Kubernetes a memory-backed emptyDir mounted at "
    "/dev/shm), lower HVDLITE_SHM_RING_BYTES, or set HVDLITE_SHM_DISABLE=1 to use TCP without this warning";

}  // namespace

InboxAttempt create_inbox_within_room(const std::string& name, int owner_rank, int slots, size_t ring_bytes) {
  InboxAttempt attempt;
  for (size_t ring = ring_bytes;; ring /= 2) {
    try {
      attempt.inbox = ShmInbox::Create(name, owner_rank, slots, ring);
      attempt.ring_bytes = ring;
      attempt.failure.clear();
      return attempt;
    } catch (const ShmSpaceError& e) {
      attempt.failure = e.what();
    }
    if (ring / 2 < kMinShmRingBytes) return attempt;
  }
}

std::string describe_shm_shortage(const std::vector<int>& ranks, const std::vector<uint64_t>& rings,
                                  size_t configured_ring_bytes, const std::string& failure) {
  std::vector<int> without, smaller;
  uint64_t smallest = configured_ring_bytes;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (rings[i] == 0)
      without.push_back(ranks[i]);
    else if (rings[i] < configured_ring_bytes)
      smaller.push_back(ranks[i]);
    if (rings[i] > 0) smallest = std::min(smallest, rings[i]);
  }
  const size_t n = ranks.size();
  const std::string need = mebibytes(static_cast<double>(configured_ring_bytes) * n) + " per rank (" +
                           std::to_string(n) +
                           " rings of HVDLITE_SHM_RING_BYTES=" + std::to_string(configured_ring_bytes) + "), " +
                           mebibytes(static_cast<double>(configured_ring_bytes) * n * n) + " for the host's " +
                           std::to_string(n) + " ranks";
  if (!without.empty()) {
    return "shared memory is off between the " + std::to_string(n) +
           " ranks on this host, which talk over TCP "
           "instead (slower): " +
           dev_shm_room() + " has no room for rank(s) " + join_ranks(without) + "'s inbox even with " +
           std::to_string(kMinShmRingBytes >> 10) +
           " KiB rings; the configured rings "
           "need " +
           need + " [" + failure + "]. " + kFix;
  }
  if (!smaller.empty()) {
    return "rank(s) " + join_ranks(smaller) + " use smaller shared-memory rings (down to " +
           std::to_string(smallest >> 10) + " KiB), which is slower for large messages: " + dev_shm_room() +
           " has no room for the configured rings, " + need + ". " + kFix;
  }
  return "";
}

}  // namespace hvdlite
