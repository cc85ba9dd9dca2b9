#include "transport/shm_channel.h"

#include <poll.h>

#include <algorithm>
#include <cstring>

#include "common/copy_bytes.h"
#include "common/status.h"
#include "common/wait.h"

namespace hvdlite {

ShmChannel::ShmChannel(int peer, std::string peer_host, const ShmInbox* mine, int peer_slot_in_mine,
                       const ShmInbox* theirs, int my_slot_in_theirs, int control_fd)
    : Channel(peer, std::move(peer_host)),
      send_ring_(theirs->ring(my_slot_in_theirs)),
      send_data_(theirs->ring_data(my_slot_in_theirs)),
      recv_ring_(mine->ring(peer_slot_in_mine)),
      recv_data_(mine->ring_data(peer_slot_in_mine)),
      send_capacity_(theirs->ring_bytes()),
      recv_capacity_(mine->ring_bytes()),
      peer_header_(theirs->header()),
      control_fd_(control_fd) {}

void ShmChannel::ring_peer_doorbell() {
  peer_header_->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (peer_header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&peer_header_->doorbell);
}

size_t ShmChannel::try_send(const void* data, size_t length) {
  uint64_t head = send_ring_->head.load(std::memory_order_relaxed);
  uint64_t tail = send_ring_->tail.load(std::memory_order_acquire);
  size_t room = send_capacity_ - static_cast<size_t>(head - tail);
  size_t n = std::min(length, room);
  if (n == 0) return 0;
  size_t offset = static_cast<size_t>(head % send_capacity_);
  size_t first = std::min(n, send_capacity_ - offset);
  copy_bytes(send_data_ + offset, data, first);
  if (n > first) copy_bytes(send_data_, static_cast<const char*>(data) + first, n - first);
  send_ring_->head.store(head + n, std::memory_order_release);
  ring_peer_doorbell();
  return n;
}

void ShmChannel::copy_out(char* data, uint64_t from, size_t n, bool streaming) const {
  size_t offset = static_cast<size_t>(from % recv_capacity_);
  size_t first = std::min(n, recv_capacity_ - offset);
  auto copy = streaming ? copy_bytes_streaming : copy_bytes;
  copy(data, recv_data_ + offset, first);
  if (n > first) copy(data + first, recv_data_, n - first);
}

size_t ShmChannel::try_recv(void* data, size_t length) { return recv(data, length, false); }
size_t ShmChannel::try_recv_cold(void* data, size_t length) { return recv(data, length, true); }

size_t ShmChannel::recv(void* data, size_t length, bool streaming) {
  uint64_t tail = recv_ring_->tail.load(std::memory_order_relaxed);
  uint64_t head = recv_ring_->head.load(std::memory_order_acquire);
  size_t n = std::min(length, static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  copy_out(static_cast<char*>(data), tail, n, streaming);
  recv_ring_->tail.store(tail + n, std::memory_order_release);
  ring_peer_doorbell();  // the peer may be waiting for room
  return n;
}

size_t ShmChannel::try_recv_with(size_t length, size_t granule, const RecvConsumer& consume) {
  constexpr size_t kMaxHandOver = 256 << 10;
  uint64_t tail = recv_ring_->tail.load(std::memory_order_relaxed);
  uint64_t head = recv_ring_->head.load(std::memory_order_acquire);
  size_t n = std::min({length, static_cast<size_t>(head - tail), kMaxHandOver});
  n -= n % granule;  // a partial element stays in the ring until the rest of it arrives
  if (n == 0) return 0;
  const size_t offset = static_cast<size_t>(tail % recv_capacity_);
  if (offset % granule == 0 && recv_capacity_ % granule == 0) {
    // In place: the ring data is cache-line aligned, so the offset decides the alignment, and an aligned
    // stream never splits an element at the wrap.
    const size_t first = std::min(n, recv_capacity_ - offset);
    consume(recv_data_ + offset, first);
    if (n > first) consume(recv_data_, n - first);
  } else {
    // The stream is misaligned for this element size (an odd-length message went before): go through a small
    // aligned buffer, which stays in L1.
    alignas(64) char bounce[16 << 10];
    for (size_t done = 0; done < n;) {
      const size_t m = std::min(sizeof(bounce) - sizeof(bounce) % granule, n - done);
      copy_out(bounce, tail + done, m);
      consume(bounce, m);
      done += m;
    }
  }
  recv_ring_->tail.store(tail + n, std::memory_order_release);
  ring_peer_doorbell();  // the peer may be waiting for room
  return n;
}

bool ShmChannel::align_stream(bool sending) {
  if (sending) {
    const uint64_t head = send_ring_->head.load(std::memory_order_relaxed);
    const uint64_t skip = (8 - head % 8) % 8;
    if (skip == 0) return true;
    const uint64_t tail = send_ring_->tail.load(std::memory_order_acquire);
    if (send_capacity_ - static_cast<size_t>(head - tail) < skip) return false;
    send_ring_->head.store(head + skip, std::memory_order_release);  // the skipped bytes are never read
    ring_peer_doorbell();
    return true;
  }
  const uint64_t tail = recv_ring_->tail.load(std::memory_order_relaxed);
  const uint64_t skip = (8 - tail % 8) % 8;
  if (skip == 0) return true;
  const uint64_t head = recv_ring_->head.load(std::memory_order_acquire);
  if (head - tail < skip) return false;
  recv_ring_->tail.store(tail + skip, std::memory_order_release);
  ring_peer_doorbell();
  return true;
}

bool ShmChannel::try_send_message(const void* data, size_t bytes) {
  if (mail_sent_ - mail_taken_seen_ >= kMailSlots) {
    mail_taken_seen_ = send_ring_->mail_taken.load(std::memory_order_acquire);
    if (mail_sent_ - mail_taken_seen_ >= kMailSlots) return false;  // the peer has not read message n - slots yet
  }
  MailSlot& slot = send_ring_->mail[mail_sent_ % kMailSlots];
  slot.bytes = static_cast<uint32_t>(bytes);
  std::memcpy(slot.payload, data, bytes);
  slot.seq.store(++mail_sent_, std::memory_order_release);
  ring_peer_doorbell();
  return true;
}

bool ShmChannel::try_recv_message(void* data, size_t bytes) {
  size_t taken;
  return take_message(data, bytes, true, &taken);
}

bool ShmChannel::try_recv_message_up_to(void* data, size_t capacity, size_t* bytes) {
  return take_message(data, capacity, false, bytes);
}

bool ShmChannel::take_message(void* data, size_t bytes, bool exact, size_t* taken) {
  MailSlot& slot = recv_ring_->mail[mail_received_ % kMailSlots];
  if (slot.seq.load(std::memory_order_acquire) != mail_received_ + 1) return false;
  if (exact ? slot.bytes != bytes : slot.bytes > bytes) {
    throw Error(StatusCode::kInternal, "rank " + std::to_string(peer_) + " sent a message of " +
                                           std::to_string(slot.bytes) + " bytes where this rank expected " +
                                           (exact ? "" : "at most ") + std::to_string(bytes) +
                                           " (the ranks run different collectives)");
  }
  *taken = slot.bytes;
  std::memcpy(data, slot.payload, *taken);
  recv_ring_->mail_taken.store(++mail_received_, std::memory_order_release);
  ring_peer_doorbell();  // the peer may be waiting for a free slot
  return true;
}

Channel::PeerState ShmChannel::peer_state() const {
  // Nothing is ever sent on the control socket: readable means closed (a loopback connection never times out).
  struct pollfd p = {control_fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  bool closed = ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR));
  return closed ? PeerState::kClosed : PeerState::kAlive;
}

void ShmChannel::check_alive() {
  if (peer_gone()) {
    throw Error(StatusCode::kRemoteError,
                "rank " + std::to_string(peer_) + " (" + peer_host_ + ") exited or closed its connection");
  }
}

}  // namespace hvdlite
