// Channel over a connected, authenticated TCP socket (between hosts, or on one host with shm disabled).
#pragma once
#include "transport/channel.h"

namespace hvdlite {

class TcpChannel : public Channel {
 public:
  // Takes ownership of fd, which must already be authenticated (see handshake.h).
  TcpChannel(int fd, int peer, std::string peer_host);
  ~TcpChannel() override;
  size_t try_send(const void* data, size_t length) override;
  size_t try_recv(void* data, size_t length) override;
  int poll_fd() const override { return fd_; }
  void check_alive() override {}
  bool peer_gone() const override;
  const char* kind() const override { return "tcp"; }

 private:
  std::string describe() const;
  int fd_;
};

}  // namespace hvdlite
