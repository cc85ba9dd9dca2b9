// A Channel is a reliable, ordered byte stream to one peer rank. Collectives run in the same order on every
// rank, so streams need no tags: each algorithm consumes exactly what its peer sends, in order.
// Channels never block: try_send/try_recv move what they can and return the byte count (0 = would block).
// Waiting is done by the progress engine (progress.h), which knows how to sleep on every kind of channel at
// once. I/O failure throws hvdlite::Error(kRemoteError) naming the peer.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace hvdlite {

// Takes received bytes where they lie (a reduction reads them straight into its destination).
using RecvConsumer = std::function<void(const char* data, size_t bytes)>;

class Channel {
 public:
  virtual ~Channel() = default;
  virtual size_t try_send(const void* data, size_t length) = 0;
  virtual size_t try_recv(void* data, size_t length) = 0;
  // The same into a destination that is large and cold (streaming stores where the channel copies itself).
  virtual size_t try_recv_cold(void* data, size_t length) { return try_recv(data, length); }
  // Receives without a destination buffer: hands what has arrived to consume, in whole granules (an element
  // size; length is a multiple of it) and returns the bytes handed over. The data passed is aligned to granule.
  // The default receives into a bounce buffer (holding a partial granule until the rest arrives); shared
  // memory hands over its ring in place, saving a copy per byte.
  virtual size_t try_recv_with(size_t length, size_t granule, const RecvConsumer& consume);
  // Moves this end of the stream to the next multiple of 8 bytes (the sender skips ahead, the receiver skips the
  // same bytes), so that a message both ends mark alike starts aligned whatever odd-length messages went before.
  // False while that cannot happen yet (no room to skip, or the skipped bytes not yet written); call again.
  // Only shared memory needs it (its ring is handed over in place); elsewhere a no-op.
  virtual bool align_stream(bool sending) { return true; }
  // Small messages on a path of their own beside the stream, all or nothing: try_send_message and
  // try_recv_message return false while that cannot happen yet. Both ends must send and receive the same messages
  // this way, each the same size (at most message_capacity() bytes; 0: the channel has no such path), or with
  // try_recv_message_up_to, which takes a message of any size up to capacity and says its size in *bytes.
  virtual size_t message_capacity() const { return 0; }
  virtual bool try_send_message(const void* data, size_t bytes) { return false; }
  virtual bool try_recv_message(void* data, size_t bytes) { return false; }
  virtual bool try_recv_message_up_to(void* data, size_t capacity, size_t* bytes) { return false; }
  // Socket to poll for readiness; -1 when the channel is not socket-based.
  virtual int poll_fd() const = 0;
  // Throws if the peer is known to be gone (used while sleeping on channels that cannot signal a death).
  virtual void check_alive() = 0;
  // A non-blocking probe, used to name every lost peer in an error, not only the one an operation happened to
  // wait on: kClosed when the peer closed its end (exited, crashed, was killed), kUnreachable when its host
  // stopped answering the kernel heartbeat (socket_set_heartbeat: host down, network cut).
  enum class PeerState { kAlive, kClosed, kUnreachable };
  virtual PeerState peer_state() const = 0;
  bool peer_gone() const { return peer_state() != PeerState::kAlive; }
  virtual const char* kind() const = 0;
  int peer() const { return peer_; }
  const std::string& peer_host() const { return peer_host_; }

 protected:
  Channel(int peer, std::string peer_host) : peer_(peer), peer_host_(std::move(peer_host)) {}
  int peer_;
  std::string peer_host_;

 private:
  std::vector<char> bounce_;  // try_recv_with's default: bytes received, not yet handed over
  size_t bounce_fill_ = 0;    // fewer than one granule between calls
};

}  // namespace hvdlite
