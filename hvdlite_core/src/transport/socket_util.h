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
// Reads/writes exactly length bytes or throws Error (kTimeout at the deadline, kRemoteError on EOF/failure).
void socket_write_all(int fd, const void* data, size_t length, Clock::time_point deadline, const std::string& who);
void socket_read_all(int fd, void* data, size_t length, Clock::time_point deadline, const std::string& who);
std::string socket_peer_name(int fd);

}  // namespace hvdlite
