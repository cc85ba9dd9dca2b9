#include "transport/tcp_channel.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "common/status.h"
#include "transport/socket_util.h"

namespace hvdlite {

TcpChannel::TcpChannel(int fd, int peer, std::string peer_host, double unreachable_seconds)
    : Channel(peer, std::move(peer_host)), fd_(fd), unreachable_seconds_(unreachable_seconds) {
  socket_set_nonblocking(fd_, true);
  socket_set_nodelay(fd_);
  socket_set_heartbeat(fd_, unreachable_seconds_);
  int buffer = 4 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
}

TcpChannel::~TcpChannel() { ::close(fd_); }

Channel::PeerState TcpChannel::peer_state() const {
  struct pollfd p = {fd_, static_cast<short>(POLLRDHUP), 0};  // not POLLIN: unread data is no sign of death
  if (!(::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))) return PeerState::kAlive;
  int error = 0;
  socklen_t length = sizeof(error);
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == ETIMEDOUT) unreachable_ = true;
  return unreachable_ ? PeerState::kUnreachable : PeerState::kClosed;
}

std::string TcpChannel::describe() const { return "rank " + std::to_string(peer_) + " (" + peer_host_ + ")"; }

void TcpChannel::fail(int error) const {
  if (error == ETIMEDOUT) {
    unreachable_ = true;
    std::ostringstream limit;
    limit << unreachable_seconds_;
    throw Error(StatusCode::kRemoteError, describe() + " is unreachable: its host answered no heartbeat for " +
                                              limit.str() + " s (host down or network cut?)");
  }
  throw Error(StatusCode::kRemoteError, "lost connection to " + describe() + ": " + strerror(error));
}

size_t TcpChannel::try_send(const void* data, size_t length) {
  if (length == 0) return 0;
  ssize_t n = ::send(fd_, data, length, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail(errno);
}

size_t TcpChannel::try_recv(void* data, size_t length) {
  if (length == 0) return 0;
  ssize_t n = ::recv(fd_, data, length, MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) throw Error(StatusCode::kRemoteError, describe() + " closed its connection (did the process exit?)");
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail(errno);
}

}  // namespace hvdlite
