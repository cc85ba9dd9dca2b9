#include "transport/tcp_channel.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common/status.h"
#include "transport/socket_util.h"

namespace hvdlite {

TcpChannel::TcpChannel(int fd, int peer, std::string peer_host) : Channel(peer, std::move(peer_host)), fd_(fd) {
  socket_set_nonblocking(fd_, true);
  socket_set_nodelay(fd_);
  int buffer = 4 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
}

TcpChannel::~TcpChannel() { ::close(fd_); }

bool TcpChannel::peer_gone() const {
  struct pollfd p = {fd_, static_cast<short>(POLLRDHUP), 0};  // not POLLIN: unread data is no sign of death
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

std::string TcpChannel::describe() const { return "rank " + std::to_string(peer_) + " (" + peer_host_ + ")"; }

size_t TcpChannel::try_send(const void* data, size_t length) {
  if (length == 0) return 0;
  ssize_t n = ::send(fd_, data, length, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  throw Error(StatusCode::kRemoteError, "lost connection to " + describe() + ": " + strerror(errno));
}

size_t TcpChannel::try_recv(void* data, size_t length) {
  if (length == 0) return 0;
  ssize_t n = ::recv(fd_, data, length, MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) throw Error(StatusCode::kRemoteError, describe() + " closed its connection (did the process exit?)");
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  throw Error(StatusCode::kRemoteError, "lost connection to " + describe() + ": " + strerror(errno));
}

}  // namespace hvdlite
