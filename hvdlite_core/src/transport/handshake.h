// Mutual authentication of a new TCP connection with the per-job secret (challenge-response, HMAC-SHA256):
//
//   listener -> connector : "HVDLITE1" | server_nonce[16]
//   connector -> listener : "HVDLITE1" | rank (i32 LE) | client_nonce[16] |
//                           HMAC(secret, "client" | job_id | server_nonce | client_nonce | rank)
//   listener -> connector : rank (i32 LE) | HMAC(secret, "server" | job_id | client_nonce | server_nonce | rank)
//
// Fresh nonces on both sides stop replays; the secret never crosses the wire. A failed handshake throws and
// the listener drops that connection and keeps accepting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/wait.h"

namespace hvdlite {

struct HandshakeKeys {
  std::vector<uint8_t> secret;
  std::string job_id;
};

// Connector side: proves our rank, checks the listener is expected_peer. Throws on failure.
void handshake_connect(int fd, int my_rank, int expected_peer, const HandshakeKeys& keys, Clock::time_point deadline);
// Listener side: returns the authenticated peer rank. Throws on failure.
int handshake_accept(int fd, int my_rank, const HandshakeKeys& keys, Clock::time_point deadline);

}  // namespace hvdlite
