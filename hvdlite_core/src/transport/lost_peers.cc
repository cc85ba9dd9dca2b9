#include "transport/lost_peers.h"

#include <set>
#include <sstream>

namespace hvdlite {
namespace {

// "host:port" -> "host" (each rank listens on its own port; "[::1]:5" -> "[::1]").
std::string host_of(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

void append(std::string* list, const PeerCondition& peer) {
  *list += (list->empty() ? "" : ", ") + ("rank " + std::to_string(peer.rank) + " (" + peer.address + ")");
}

}  // namespace

std::string describe_lost_peers(const std::vector<PeerCondition>& peers, double unreachable_seconds) {
  std::set<std::string> unreachable_hosts;
  for (const PeerCondition& p : peers) {
    if (p.state == PeerCondition::kUnreachable) unreachable_hosts.insert(host_of(p.address));
  }
  std::string closed, unreachable, silent;
  for (const PeerCondition& p : peers) {
    if (p.state == PeerCondition::kClosed)
      append(&closed, p);
    else if (p.state == PeerCondition::kUnreachable || unreachable_hosts.count(host_of(p.address)))
      append(&unreachable, p);
    else if (p.state == PeerCondition::kSilent)
      append(&silent, p);
  }
  std::string report;
  if (!closed.empty()) report += "; connections closed by now: " + closed;
  if (!unreachable.empty()) {
    std::ostringstream limit;
    limit << unreachable_seconds;
    report +=
        "; unreachable (no heartbeat answer for " + limit.str() + " s: host down or network cut): " + unreachable;
  }
  if (!silent.empty()) report += "; not responding for over 1 s (stopped or hung): " + silent;
  return report;
}

}  // namespace hvdlite
