// Unit tests of the transport: receiving in place from the shared-memory ring, small messages beside it, and the
// connection handshake's verdicts on a stranger. Run
// from unit_tests.cc's main (tests/test_core_cpp.py builds the files into one binary).
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/handshake.h"
#include "transport/progress.h"
#include "transport/shm_channel.h"
#include "transport/shm_segment.h"

using namespace hvdlite;

namespace {

// A channel that delivers at most 3 bytes per receive, so elements arrive split (try_recv_with's default path).
class TrickleChannel : public Channel {
 public:
  explicit TrickleChannel(std::vector<char> stream) : Channel(1, "trickle"), stream_(std::move(stream)) {}
  size_t try_send(const void*, size_t) override { return 0; }
  size_t try_recv(void* data, size_t length) override {
    size_t n = std::min({length, size_t{3}, stream_.size() - at_});
    std::memcpy(data, stream_.data() + at_, n);
    at_ += n;
    return n;
  }
  int poll_fd() const override { return -1; }
  void check_alive() override {}
  PeerState peer_state() const override { return PeerState::kAlive; }
  const char* kind() const override { return "trickle"; }

 private:
  std::vector<char> stream_;
  size_t at_ = 0;
};

}  // namespace

void test_receive_in_place() {
  std::vector<double> values(300);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * static_cast<double>(i) - 7.0;
  const size_t bytes = values.size() * sizeof(double);
  std::vector<double> got;
  bool aligned = true, whole = true;
  const RecvConsumer collect = [&](const char* data, size_t n) {
    aligned = aligned && reinterpret_cast<uintptr_t>(data) % sizeof(double) == 0;
    whole = whole && n % sizeof(double) == 0;
    size_t k = got.size();
    got.resize(k + n / sizeof(double));
    std::memcpy(got.data() + k, data, n);
  };

  // Default path: partial elements wait in the bounce buffer until the rest arrives.
  std::vector<char> stream(bytes);
  std::memcpy(stream.data(), values.data(), bytes);
  TrickleChannel trickle(stream);
  size_t received = 0;
  for (int calls = 0; received < bytes && calls < 10000; ++calls) {
    received += trickle.try_recv_with(bytes - received, sizeof(double), collect);
  }
  CHECK(received == bytes && got == values && aligned && whole);

  // Shared memory: a loopback channel (the ring it writes is the ring it reads) of 1 KB, so 2.4 KB wrap it, sent
  // 100 bytes at a time (elements split across sends), after 0-7 stray bytes (the stream misaligned for doubles).
  ShmInbox inbox = ShmInbox::Create("/hvdlite-unit-" + std::to_string(getpid()), 0, 2, 1024);
  ShmChannel loop(0, "self", &inbox, 1, &inbox, 1, -1);
  for (size_t shift : {0, 1, 3, 4, 7, 8}) {
    char stray[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {};
    CHECK(loop.try_send(stray, shift) == shift && loop.try_recv(back, shift) == shift);
    CHECK(std::memcmp(stray, back, shift) == 0);
    got.clear();
    aligned = whole = true;
    size_t sent = 0;
    received = 0;
    for (int calls = 0; received < bytes && calls < 10000; ++calls) {
      sent += loop.try_send(reinterpret_cast<const char*>(values.data()) + sent, std::min<size_t>(100, bytes - sent));
      received += loop.try_recv_with(bytes - received, sizeof(double), collect);
    }
    CHECK(received == bytes && got == values && aligned && whole);
  }
  // align_stream: after 5 stray bytes both ends skip to the next multiple of 8, so what follows is handed over in
  // place (pointers into the ring, not a bounce buffer), and the stream stays in step.
  const char* ring_begin = inbox.ring_data(1);
  bool in_ring = true;
  const RecvConsumer in_place = [&](const char* data, size_t n) {
    in_ring = in_ring && data >= ring_begin && data + n <= ring_begin + 1024;
    collect(data, n);
  };
  char stray[5] = {9, 9, 9, 9, 9}, back[5] = {};
  CHECK(loop.try_send(stray, 5) == 5 && loop.try_recv(back, 5) == 5);
  CHECK(loop.align_stream(false) == false);  // the receiver cannot skip bytes not yet written
  CHECK(loop.align_stream(true) && loop.align_stream(false));
  got.clear();
  CHECK(loop.try_send(values.data(), 512) == 512 && loop.try_recv_with(512, sizeof(double), in_place) == 512);
  CHECK(in_ring && got.size() == 64 && std::memcmp(got.data(), values.data(), 512) == 0);
  CHECK(loop.try_send(stray, 3) == 3 && loop.try_recv(back, 3) == 3 && back[2] == 9);
  inbox.unlink();
}

// Small messages beside the stream: in order through the few mail slots, a sender held back while they are all
// unread, a size the receiver did not expect named as an error, one of any size up to a capacity taken with its
// size, and Progress::exchange sending what fits as a message and the rest on the stream.
void test_messages() {
  ShmInbox inbox = ShmInbox::Create("/hvdlite-unit-mail-" + std::to_string(getpid()), 0, 2, 1024);
  ShmChannel loop(0, "self", &inbox, 1, &inbox, 1, -1);
  CHECK(loop.message_capacity() == sizeof(MailSlot::payload));
  for (int round = 0; round < 3; ++round) {  // wraps the slots several times
    for (int i = 0; i < static_cast<int>(kMailSlots); ++i) {
      const int64_t value = 100 * round + i;
      CHECK(loop.try_send_message(&value, sizeof(value)));
    }
    const int64_t extra = -1;
    CHECK(!loop.try_send_message(&extra, sizeof(extra)));  // every slot holds an unread message
    const char stream_bytes[3] = {7, 8, 9};
    CHECK(loop.try_send(stream_bytes, 3) == 3);  // the stream goes on beside them
    for (int i = 0; i < static_cast<int>(kMailSlots); ++i) {
      int64_t got = 0;
      CHECK(loop.try_recv_message(&got, sizeof(got)) && got == 100 * round + i);
    }
    int64_t none = 0;
    CHECK(!loop.try_recv_message(&none, sizeof(none)));
    char back[3] = {};
    CHECK(loop.try_recv(back, 3) == 3 && back[2] == 9);
  }
  const int32_t small = 5;
  CHECK(loop.try_send_message(&small, sizeof(small)));
  int64_t wider = 0;
  bool named = false;
  try {
    loop.try_recv_message(&wider, sizeof(wider));
  } catch (const Error& e) {
    named = std::string(e.what()).find("4 bytes where this rank expected 8") != std::string::npos;
  }
  CHECK(named);
  // Of any size up to a capacity: taken with its size; a longer one is an error that names both sizes.
  const char note[5] = {1, 2, 3, 4, 5};
  char taken[16] = {};
  size_t taken_bytes = 0;
  // The message the exact receive refused is still the next one.
  CHECK(loop.try_recv_message_up_to(taken, sizeof(taken), &taken_bytes) && taken_bytes == sizeof(small));
  CHECK(!loop.try_recv_message_up_to(taken, sizeof(taken), &taken_bytes));  // none left
  CHECK(loop.try_send_message(note, sizeof(note)));
  CHECK(loop.try_recv_message_up_to(taken, sizeof(taken), &taken_bytes) && taken_bytes == 5 && taken[4] == 5);
  CHECK(loop.try_send_message(note, sizeof(note)));
  named = false;
  try {
    loop.try_recv_message_up_to(taken, 4, &taken_bytes);
  } catch (const Error& e) {
    named = std::string(e.what()).find("5 bytes where this rank expected at most 4") != std::string::npos;
  }
  CHECK(named);

  InboxHeader* header = inbox.header();
  ShmInbox fresh = ShmInbox::Create("/hvdlite-unit-mail2-" + std::to_string(getpid()), 0, 2, 1024);
  ShmChannel pair(0, "self", &fresh, 1, &fresh, 1, -1);
  Progress progress(&header->doorbell, &header->sleepers, &header->alive_ns, 0, 5.0);
  for (size_t bytes : {size_t{8}, sizeof(MailSlot::payload), sizeof(MailSlot::payload) + 1, size_t{200}}) {
    std::vector<char> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>(i * 7 + bytes);
    const uint64_t stream_before = fresh.ring(1)->head.load();
    progress.exchange(&pair, out.data(), in.data(), bytes);
    CHECK(in == out);
    const bool as_message = bytes <= pair.message_capacity();
    CHECK(fresh.ring(1)->head.load() - stream_before == (as_message ? 0 : bytes));
  }
  inbox.unlink();
  fresh.unlink();
}

// An inbox whose creator died before unlinking it (a process killed during init) is removed when another inbox is
// created; a live process's inbox is not.
void test_orphaned_inboxes() {
  const std::string live_name = "/hvdlite-unit-live-" + std::to_string(getpid());
  const std::string orphan_name = "/hvdlite-unit-orphan-" + std::to_string(getpid());
  ShmInbox live = ShmInbox::Create(live_name, 0, 2, 1024);
  const pid_t child = fork();
  if (child == 0) {
    ShmInbox orphan = ShmInbox::Create(orphan_name, 0, 2, 1024);
    _exit(0);  // as if killed: no destructor unlinks it
  }
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const int before = shm_open(orphan_name.c_str(), O_RDONLY, 0);
  CHECK(before >= 0);
  if (before >= 0) ::close(before);
  CHECK(ShmInbox::RemoveOrphans() >= 1);
  errno = 0;
  CHECK(shm_open(orphan_name.c_str(), O_RDONLY, 0) < 0 && errno == ENOENT);
  const int still = shm_open(live_name.c_str(), O_RDONLY, 0);
  CHECK(still >= 0);
  if (still >= 0) ::close(still);
  live.unlink();
}

void test_handshake_verdicts() {
  // The listener's verdict on a connector that holds another job's secret, and on one that sends noise: the reason
  // each stranger is dropped with (the data-plane listener logs it).
  const HandshakeKeys ours{std::vector<uint8_t>(32, 7), "job.0"};
  const HandshakeKeys theirs{std::vector<uint8_t>(32, 8), "job.0"};
  auto verdict = [&](auto stranger) {
    int fds[2];
    CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    std::thread other([&] { stranger(fds[1]); });
    std::string error;
    try {
      handshake_accept(fds[0], 0, ours, Clock::now() + std::chrono::seconds(5));
    } catch (const Error& e) {
      error = e.what();
    }
    ::shutdown(fds[0], SHUT_RDWR);
    other.join();
    ::close(fds[0]);
    ::close(fds[1]);
    return error;
  };
  const std::string wrong_secret = verdict([&](int fd) {
    try {
      handshake_connect(fd, 1, 0, theirs, Clock::now() + std::chrono::seconds(5));
    } catch (const Error&) {  // the listener hangs up without an answer
    }
  });
  CHECK(wrong_secret.find("failed authentication (wrong job secret)") != std::string::npos);
  const std::string noise = verdict([](int fd) {
    char hello[24], junk[60];
    std::memset(junk, 'x', sizeof junk);
    CHECK(::read(fd, hello, sizeof hello) == static_cast<ssize_t>(sizeof hello));
    CHECK(::write(fd, junk, sizeof junk) == static_cast<ssize_t>(sizeof junk));
  });
  CHECK(noise.find("did not speak hvdlite") != std::string::npos);
  // The same secret passes, and each side learns the other's rank.
  int fds[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  std::thread connector([&] { handshake_connect(fds[1], 1, 0, ours, Clock::now() + std::chrono::seconds(5)); });
  CHECK(handshake_accept(fds[0], 0, ours, Clock::now() + std::chrono::seconds(5)) == 1);
  connector.join();
  ::close(fds[0]);
  ::close(fds[1]);
}
