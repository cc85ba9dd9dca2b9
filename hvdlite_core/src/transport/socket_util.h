// Thin helpers over POSIX sockets: listen, connect, blocking I/O with a deadline, and peer descriptions.
#pragma once
#include <cstddef>
#include <string>

#include "common/wait.h"

namespace hvdlite {

int socket_listen(const std::string& bind_host, int* port_out);
// Connects to "host:port", retrying refused connections until the deadline.
int socket_connect(const std::string& address, Clock::time_point deadline);
void socket_set_nonblocking(int fd, bool on);
void socket_set_nodelay(int fd);
// Kernel heartbeat: TCP keepalive probes every second once the connection is idle for a second, and the
// connection fails with ETIMEDOUT when the peer's kernel has answered neither probes nor data for
// unreachable_seconds (TCP_USER_TIMEOUT). Catches hosts that vanish without a FIN (power loss, link down,
// packets dropped); the peer's kernel answers probes for it, so a slow or stopped process never trips it.
// unreachable_seconds <= 0 leaves the system defaults (hours).
void socket_set_heartbeat(int fd, double unreachable_seconds);
// Reads/writes exactly length bytes or throws Error (kTimeout at the deadline, kRemoteError on EOF/failure).
void socket_write_all(int fd, const void* data, size_t length, Clock::time_point deadline, const std::string& who);
void socket_read_all(int fd, void* data, size_t length, Clock::time_point deadline, const std::string& who);
std::string socket_peer_name(int fd);

}  // namespace hvdlite
