// A rank's shared-memory "inbox": one single-producer/single-consumer byte ring per co-located peer (with a few
// one-line mail slots for small messages beside it), plus a doorbell word. Every change a peer makes that this rank
// may be waiting for (bytes written into one of my rings, or space freed in a ring I write into) increments my
// doorbell, so one futex covers all my channels. Layout: [InboxHeader][RingHeader slot 0][data 0][RingHeader slot
// 1][data 1]... where slot i carries bytes from the host's i-th rank (ranks of a host in ascending order) to the
// owner.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace hvdlite {

// The inbox could not be given its memory (a full or small /dev/shm); needed_bytes is what one inbox takes.
class ShmSpaceError : public Error {
 public:
  ShmSpaceError(size_t needed_bytes, const std::string& message)
      : Error(StatusCode::kInternal, message), needed_bytes_(needed_bytes) {}
  size_t needed_bytes() const { return needed_bytes_; }

 private:
  size_t needed_bytes_;
};

// A small message from the slot's sender to the owner: the sender fills the payload, then publishes seq, so the
// owner polling seq finds a short message in the line it has just fetched, and a longer one in the lines right
// after it. The ring costs more on the critical path of a latency-bound exchange: besides the data, a head line
// crossing between the cores one way and a tail line back. Room for a kilobyte collective and the negotiation words
// around it.
struct alignas(64) MailSlot {
  std::atomic<uint64_t> seq;  // 1 + the message's number among the pair's messages, once it is in place
  uint32_t bytes;
  char payload[2048 - 12];
};
constexpr size_t kMailSlots = 4;

struct alignas(64) RingHeader {
  std::atomic<uint64_t> head;  // bytes ever written (producer)
  char pad_head[56];
  std::atomic<uint64_t> tail;  // bytes ever consumed (consumer)
  char pad_tail[56];
  MailSlot mail[kMailSlots];         // message n goes into mail[n % kMailSlots]
  std::atomic<uint64_t> mail_taken;  // messages the owner has consumed; read by the sender when slots run out
  char pad_mail[56];
};

struct alignas(64) InboxHeader {
  uint64_t magic;
  int32_t owner_rank;
  int32_t slots;
  uint64_t ring_bytes;
  uint64_t cma_probe_address;  // where the owner keeps a known word, for testing process_vm_readv
  // The creating process and its pid namespace (the inode of /proc/self/ns/pid): a segment whose creator has
  // died before unlinking it (killed during init) is recognised, and removed, by a later inbox's creation.
  int32_t creator_pid;
  int32_t pad_pid;
  uint64_t creator_pid_namespace;
  char pad[16];
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> sleepers;
  char pad2[56];
  // CLOCK_MONOTONIC (host-wide) nanoseconds of the owner's last sign of life: its threads stamp it while they
  // run cycles or wait on peers. A stopped or hung process stops stamping; its peers name it when they time out.
  std::atomic<int64_t> alive_ns;
  char pad3[56];
};

class ShmInbox {
 public:
  // Creates (and owns until unlink) this rank's inbox, its memory reserved; ShmSpaceError when there is no room.
  static ShmInbox Create(const std::string& name, int owner_rank, int slots, size_t ring_bytes);
  // Maps a peer's inbox created by Create.
  static ShmInbox Open(const std::string& name, int expected_owner);
  ShmInbox() = default;
  ShmInbox(ShmInbox&& other) noexcept;
  ShmInbox& operator=(ShmInbox&& other) noexcept;
  ~ShmInbox();

  InboxHeader* header() const { return static_cast<InboxHeader*>(base_); }
  RingHeader* ring(int slot) const;
  char* ring_data(int slot) const { return reinterpret_cast<char*>(ring(slot) + 1); }
  size_t ring_bytes() const { return header()->ring_bytes; }
  void unlink();
  static std::string Name(const std::string& job_id, int rank);
  // Unlinks the inboxes in /dev/shm whose creator, of this pid namespace, is no longer running: a process killed
  // between creating its inbox and the end of init (when every peer has mapped it and it is unlinked) leaves it
  // behind. Returns how many it removed. Create calls it.
  static int RemoveOrphans();

 private:
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace hvdlite
