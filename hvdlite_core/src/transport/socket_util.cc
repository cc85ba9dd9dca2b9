#include "transport/socket_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/status.h"

namespace hvdlite {
namespace {

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

void wait_ready(int fd, short events, Clock::time_point deadline, const std::string& who, const char* what) {
  while (true) {
    int left = remaining_ms(deadline);
    struct pollfd p = {fd, events, 0};
    int r = ::poll(&p, 1, left);
    if (r > 0) return;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw Error(StatusCode::kTimeout, std::string("timed out ") + what + " " + who);
    throw Error(StatusCode::kRemoteError, std::string("poll failed ") + what + " " + who + ": " + strerror(errno));
  }
}

void split_address(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) throw Error(StatusCode::kInvalidArgument, "address without port: " + address);
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
}

}  // namespace

int socket_listen(const std::string& bind_host, int* port_out) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* result = nullptr;
  const char* host = bind_host.empty() ? nullptr : bind_host.c_str();
  int rc = getaddrinfo(host, "0", &hints, &result);
  if (rc != 0)
    throw Error(StatusCode::kInvalidArgument, "cannot resolve bind address '" + bind_host + "': " + gai_strerror(rc));
  int fd = -1;
  std::string last_error = "no address";
  for (struct addrinfo* ai = result; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    last_error = strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(result);
  if (fd < 0) throw Error(StatusCode::kInternal, "cannot listen on '" + bind_host + "': " + last_error);
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len);
  *port_out = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

int socket_connect(const std::string& address, Clock::time_point deadline) {
  std::string host, port;
  split_address(address, &host, &port);
  std::string last_error;
  while (true) {
    struct addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* result = nullptr;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
    if (rc == 0) {
      for (struct addrinfo* ai = result; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          freeaddrinfo(result);
          socket_set_nodelay(fd);
          return fd;
        }
        last_error = strerror(errno);
        ::close(fd);
      }
      freeaddrinfo(result);
    } else {
      last_error = gai_strerror(rc);
    }
    if (Clock::now() >= deadline) {
      throw Error(StatusCode::kTimeout,
                  "could not connect to " + address + " before the start timeout: " + last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void socket_set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void socket_set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void socket_set_heartbeat(int fd, double unreachable_seconds) {
  if (unreachable_seconds <= 0) return;
  int one = 1;
  int probe_count = std::max(1, static_cast<int>(std::ceil(unreachable_seconds)));
  unsigned int user_timeout_ms = static_cast<unsigned int>(unreachable_seconds * 1000);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probe_count, sizeof(probe_count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

void socket_write_all(int fd, const void* data, size_t length, Clock::time_point deadline, const std::string& who) {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    ssize_t n = ::send(fd, p, length, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      length -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      wait_ready(fd, POLLOUT, deadline, who, "writing to");
    } else {
      throw Error(StatusCode::kRemoteError, "writing to " + who + " failed: " + strerror(errno));
    }
  }
}

void socket_read_all(int fd, void* data, size_t length, Clock::time_point deadline, const std::string& who) {
  char* p = static_cast<char*>(data);
  while (length > 0) {
    ssize_t n = ::recv(fd, p, length, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      length -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw Error(StatusCode::kRemoteError, who + " closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLIN, deadline, who, "reading from");
    } else {
      throw Error(StatusCode::kRemoteError, "reading from " + who + " failed: " + strerror(errno));
    }
  }
}

std::string socket_peer_name(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) return "unknown peer";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<struct sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown peer";
  }
  return std::string(host) + ":" + port;
}

}  // namespace hvdlite
