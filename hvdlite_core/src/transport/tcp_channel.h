// Channel over a connected, authenticated TCP socket (between hosts, or on one host with shm disabled).
#pragma once
#include "transport/channel.h"

namespace hvdlite {

class TcpChannel : public Channel {
 public:
  // Takes ownership of fd, which must already be authenticated (see handshake.h). unreachable_seconds: the
  // kernel heartbeat's limit (socket_set_heartbeat; PEER_UNREACHABLE_SECONDS).
  TcpChannel(int fd, int peer, std::string peer_host, double unreachable_seconds);
  ~TcpChannel() override;
  size_t try_send(const void* data, size_t length) override;
  size_t try_recv(void* data, size_t length) override;
  int poll_fd() const override { return fd_; }
  void check_alive() override {}
  PeerState peer_state() const override;
  const char* kind() const override { return "tcp"; }

 private:
  std::string describe() const;
  [[noreturn]] void fail(int error) const;
  int fd_;
  double unreachable_seconds_;
  mutable bool unreachable_ = false;  // the socket failed with ETIMEDOUT (read once: SO_ERROR clears on read)
};

}  // namespace hvdlite
