// The note a fatal transport error carries about which peers are gone and how ("; connections closed by now:
// rank 2 (host:port); unreachable (...): rank 0 (...), rank 1 (...)"), from what each connection knows.
// A heartbeat that goes unanswered condemns the host, not one connection: the other connections to that host time
// out on their own timers, up to one heartbeat period later, and a report written in between must still name
// every rank there.
#pragma once
#include <string>
#include <vector>

namespace hvdlite {

struct PeerCondition {
  enum State { kAlive, kClosed, kUnreachable, kSilent } state;  // kSilent: alive, but its stamp is over 1 s old
  int rank;
  std::string address;  // "host:port" of the peer's listener
};

std::string describe_lost_peers(const std::vector<PeerCondition>& peers, double unreachable_seconds);

}  // namespace hvdlite
