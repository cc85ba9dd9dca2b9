#include "transport/handshake.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "common/hmac_sha256.h"
#include "common/status.h"
#include "transport/socket_util.h"

namespace hvdlite {
namespace {

constexpr char kMagic[8] = {'H', 'V', 'D', 'L', 'I', 'T', 'E', '1'};
using Nonce = std::array<uint8_t, 16>;

Nonce random_nonce() {
  Nonce nonce;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::read(fd, nonce.data(), nonce.size()) != static_cast<ssize_t>(nonce.size())) {
    if (fd >= 0) ::close(fd);
    throw Error(StatusCode::kInternal, "cannot read /dev/urandom for a handshake nonce");
  }
  ::close(fd);
  return nonce;
}

Digest proof(const HandshakeKeys& keys, const char* role, const Nonce& first, const Nonce& second, int32_t rank) {
  std::vector<uint8_t> message(role, role + std::strlen(role));
  message.insert(message.end(), keys.job_id.begin(), keys.job_id.end());
  message.insert(message.end(), first.begin(), first.end());
  message.insert(message.end(), second.begin(), second.end());
  for (int i = 0; i < 4; ++i) message.push_back(static_cast<uint8_t>(static_cast<uint32_t>(rank) >> (8 * i)));
  return hmac_sha256(keys.secret.data(), keys.secret.size(), message.data(), message.size());
}

int32_t decode_rank(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return static_cast<int32_t>(v);
}

void encode_rank(int32_t rank, uint8_t* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(static_cast<uint32_t>(rank) >> (8 * i));
}

}  // namespace

void handshake_connect(int fd, int my_rank, int expected_peer, const HandshakeKeys& keys,
                       Clock::time_point deadline) {
  std::string who = "rank " + std::to_string(expected_peer) + " at " + socket_peer_name(fd);
  uint8_t hello[8 + 16];
  socket_read_all(fd, hello, sizeof(hello), deadline, who);
  if (std::memcmp(hello, kMagic, 8) != 0) throw Error(StatusCode::kRemoteError, who + " is not an hvdlite listener");
  Nonce server_nonce;
  std::memcpy(server_nonce.data(), hello + 8, 16);
  Nonce client_nonce = random_nonce();
  uint8_t reply[8 + 4 + 16 + 32];
  std::memcpy(reply, kMagic, 8);
  encode_rank(my_rank, reply + 8);
  std::memcpy(reply + 12, client_nonce.data(), 16);
  Digest mine = proof(keys, "client", server_nonce, client_nonce, my_rank);
  std::memcpy(reply + 28, mine.data(), 32);
  socket_write_all(fd, reply, sizeof(reply), deadline, who);
  uint8_t answer[4 + 32];
  socket_read_all(fd, answer, sizeof(answer), deadline, who + " (it may have rejected our credentials)");
  int32_t peer = decode_rank(answer);
  Digest theirs;
  std::memcpy(theirs.data(), answer + 4, 32);
  if (peer != expected_peer || !digest_equal(theirs, proof(keys, "server", client_nonce, server_nonce, peer))) {
    throw Error(StatusCode::kRemoteError, who + " failed authentication (wrong job secret?)");
  }
}

int handshake_accept(int fd, int my_rank, const HandshakeKeys& keys, Clock::time_point deadline) {
  std::string who = "connection from " + socket_peer_name(fd);
  Nonce server_nonce = random_nonce();
  uint8_t hello[8 + 16];
  std::memcpy(hello, kMagic, 8);
  std::memcpy(hello + 8, server_nonce.data(), 16);
  socket_write_all(fd, hello, sizeof(hello), deadline, who);
  uint8_t reply[8 + 4 + 16 + 32];
  socket_read_all(fd, reply, sizeof(reply), deadline, who);
  if (std::memcmp(reply, kMagic, 8) != 0) throw Error(StatusCode::kRemoteError, who + " did not speak hvdlite");
  int32_t peer = decode_rank(reply + 8);
  Nonce client_nonce;
  std::memcpy(client_nonce.data(), reply + 12, 16);
  Digest theirs;
  std::memcpy(theirs.data(), reply + 28, 32);
  if (!digest_equal(theirs, proof(keys, "client", server_nonce, client_nonce, peer))) {
    throw Error(StatusCode::kRemoteError, who + " failed authentication (wrong job secret)");
  }
  uint8_t answer[4 + 32];
  encode_rank(my_rank, answer);
  Digest mine = proof(keys, "server", client_nonce, server_nonce, my_rank);
  std::memcpy(answer + 4, mine.data(), 32);
  socket_write_all(fd, answer, sizeof(answer), deadline, who);
  return peer;
}

}  // namespace hvdlite
