// The progress engine: drives a set of sends and receives on channels until all complete, waiting in the way
// each channel allows (poll for sockets, the shared-memory doorbell futex for shm rings), with a deadline.
// Algorithms describe a step as a list of transfers and call run(); they never block on a channel themselves.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/channel.h"

namespace hvdlite {

struct Transfer {
  Channel* channel;
  char* data;
  size_t length;
  bool is_send;
  size_t done = 0;
  // A receive with no destination buffer: the bytes go to *consumer in whole granules (Channel::try_recv_with).
  const RecvConsumer* consumer = nullptr;
  size_t granule = 1;
  // Bytes moved per pass over the transfers before the engine turns to the next one (default: as many as the
  // channel takes). A send capped like this alternates with a consuming receive, so both sides pipeline.
  size_t max_per_pass = SIZE_MAX;
  // Start at an 8-byte boundary of the channel's stream (Channel::align_stream). Both ends must mark the matching
  // send and receive alike; the ring reduce-scatter does, so its reductions read the shm ring in place.
  bool align = false;
  bool aligned = false;  // align_stream has succeeded for this transfer
  // A receive into a destination too large to stay in cache: the channel may write it with streaming stores
  // (Channel::try_recv_cold), which skip reading each destination line before overwriting it.
  bool cold = false;
  // A whole small message on the channel's message path (Channel::try_send_message), not the stream.
  bool message = false;
  // A message receive that takes any size up to length (Channel::try_recv_message_up_to): length becomes its size.
  bool up_to = false;

  static Transfer Send(Channel* c, const void* data, size_t length) {
    return Transfer{c, static_cast<char*>(const_cast<void*>(data)), length, true};
  }
  static Transfer Recv(Channel* c, void* data, size_t length) {
    return Transfer{c, static_cast<char*>(data), length, false};
  }
  static Transfer RecvInto(Channel* c, size_t length, size_t granule, const RecvConsumer* consumer) {
    Transfer t{c, nullptr, length, false};
    t.consumer = consumer;
    t.granule = granule;
    return t;
  }
  Transfer& per_pass(size_t bytes) {
    max_per_pass = bytes;
    return *this;
  }
  Transfer& aligned_start() {
    align = true;
    return *this;
  }
};

class Progress {
 public:
  // Spin budget for the calling thread, overriding the configured one (the background thread spins less:
  // its waits overlap with the training step's computation, which needs the core more).
  static void set_thread_spin(int64_t spin_us);
  // The calling thread's override (-1: none), for helpers that should wait the way their caller does.
  static int64_t thread_spin();
  // doorbell/sleepers/alive_ns: this rank's shm inbox words (nullptr when it has no shm channels).
  Progress(std::atomic<uint32_t>* doorbell, std::atomic<uint32_t>* sleepers, std::atomic<int64_t>* alive_ns,
           int64_t spin_us, double timeout_s)
      : doorbell_(doorbell), sleepers_(sleepers), alive_ns_(alive_ns), spin_us_(spin_us), timeout_s_(timeout_s) {}
  int64_t spin_microseconds() const { return spin_us_; }  // a framework thread's spin budget (no override)
  // Records a sign of life for co-located peers (InboxHeader::alive_ns); called by every waiting thread.
  void stamp_alive();
  void run(Transfer* transfers, size_t count);
  // Moves what the channels take at once, without waiting; run() later goes on from there.
  void start(Transfer* transfers, size_t count) {
    bool done;
    advance(transfers, count, &done);
  }
  void run(std::vector<Transfer>& transfers) { run(transfers.data(), transfers.size()); }
  // cold_recv: the receive buffer is too large to stay in cache (Transfer::cold).
  void sendrecv(Channel* to, const void* send, size_t send_bytes, Channel* from, void* recv, size_t recv_bytes,
                bool cold_recv = false);
  // Sends bytes to peer and receives as many from it, as one message each way where the channel has a message
  // path that fits them, else on the stream. The peer must make the matching exchange call.
  void exchange(Channel* peer, const void* send, void* recv, size_t bytes);

 private:
  bool advance(Transfer* transfers, size_t count, bool* all_done);
  void block(Transfer* transfers, size_t count);
  std::atomic<uint32_t>* doorbell_;
  std::atomic<uint32_t>* sleepers_;
  std::atomic<int64_t>* alive_ns_;
  int64_t spin_us_;
  double timeout_s_;
};

}  // namespace hvdlite
