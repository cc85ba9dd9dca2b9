// Channel between two ranks on one host through shared-memory rings (see shm_segment.h). Liveness: a dead
// process cannot signal through memory, so the pair's TCP control socket (kept open, otherwise idle) is polled
// while waiting; the kernel closes it when the peer exits.
#pragma once
#include "transport/channel.h"
#include "transport/shm_segment.h"

namespace hvdlite {

class ShmChannel : public Channel {
 public:
  ShmChannel(int peer, std::string peer_host, const ShmInbox* mine, int peer_slot_in_mine, const ShmInbox* theirs,
             int my_slot_in_theirs, int control_fd);
  size_t try_send(const void* data, size_t length) override;
  size_t try_recv(void* data, size_t length) override;
  size_t try_recv_cold(void* data, size_t length) override;
  // Hands the ring's bytes over in place, at most kMaxHandOver per call so the sender gets room back as the
  // consumer goes (a reduction from the ring then overlaps with the peer's next copy in).
  size_t try_recv_with(size_t length, size_t granule, const RecvConsumer& consume) override;
  bool align_stream(bool sending) override;
  size_t message_capacity() const override { return sizeof(MailSlot::payload); }
  bool try_send_message(const void* data, size_t bytes) override;
  bool try_recv_message(void* data, size_t bytes) override;
  bool try_recv_message_up_to(void* data, size_t capacity, size_t* bytes) override;
  int poll_fd() const override { return -1; }
  void check_alive() override;
  PeerState peer_state() const override;
  const char* kind() const override { return "shm"; }

 private:
  void ring_peer_doorbell();
  // Copies n bytes that start at stream position `from` out of the receive ring (handling its wrap).
  void copy_out(char* data, uint64_t from, size_t n, bool streaming = false) const;
  size_t recv(void* data, size_t length, bool streaming);
  // The next message into data when it has arrived: of exactly `bytes`, or (exact false) of at most that many.
  bool take_message(void* data, size_t bytes, bool exact, size_t* taken);
  RingHeader* send_ring_;
  char* send_data_;
  RingHeader* recv_ring_;
  char* recv_data_;
  size_t send_capacity_;  // rings differ in size where /dev/shm had no room for the configured one
  size_t recv_capacity_;
  InboxHeader* peer_header_;
  int control_fd_;
  uint64_t mail_sent_ = 0;        // messages this end has sent
  uint64_t mail_taken_seen_ = 0;  // the peer's mail_taken when last read
  uint64_t mail_received_ = 0;    // messages this end has received
};

}  // namespace hvdlite
