#include "transport/progress.h"

#include <poll.h>
#include <time.h>

#include <algorithm>
#include <sstream>

#include "common/status.h"
#include "common/wait.h"

namespace hvdlite {
namespace {
thread_local int64_t t_spin_override = -1;
}

void Progress::set_thread_spin(int64_t spin_us) { t_spin_override = spin_us; }
int64_t Progress::thread_spin() { return t_spin_override; }

bool Progress::advance(Transfer* transfers, size_t count, bool* all_done) {
  bool moved = false;
  bool done = true;
  for (size_t i = 0; i < count; ++i) {
    Transfer& t = transfers[i];
    if (t.message) {
      if (t.done < t.length) {
        size_t bytes = t.length;
        if (t.is_send ? t.channel->try_send_message(t.data, t.length)
            : t.up_to ? t.channel->try_recv_message_up_to(t.data, t.length, &bytes)
                      : t.channel->try_recv_message(t.data, t.length)) {
          t.done = t.length = bytes;
          moved = true;
        } else {
          done = false;
        }
      }
      continue;
    }
    // A transfer marked for an aligned start first moves its end of the stream to an 8-byte boundary.
    if (t.align && !t.aligned && t.done < t.length) {
      if (!t.channel->align_stream(t.is_send)) {
        done = false;
        continue;
      }
      t.aligned = moved = true;
    }
    // Keep pushing on one transfer while it moves (fewer passes, bigger copies), up to its per-pass budget.
    size_t budget = t.max_per_pass;
    while (t.done < t.length && budget > 0) {
      size_t want = std::min(t.length - t.done, budget);
      size_t n;
      if (t.is_send) {
        n = t.channel->try_send(t.data + t.done, want);
      } else if (t.consumer) {
        want -= want % t.granule;  // the length is whole granules; a budget need not be
        n = want > 0 ? t.channel->try_recv_with(want, t.granule, *t.consumer) : 0;
      } else {
        n = t.cold ? t.channel->try_recv_cold(t.data + t.done, want) : t.channel->try_recv(t.data + t.done, want);
      }
      if (n == 0) break;
      t.done += n;
      budget -= std::min(budget, n);
      moved = true;
    }
    if (t.done < t.length) done = false;
  }
  *all_done = done;
  return moved;
}

void Progress::block(Transfer* transfers, size_t count) {
  release_held_lock();
  std::vector<struct pollfd> fds;
  bool shm_pending = false;
  for (size_t i = 0; i < count; ++i) {
    const Transfer& t = transfers[i];
    if (t.done == t.length) continue;
    int fd = t.channel->poll_fd();
    if (fd >= 0) {
      fds.push_back({fd, static_cast<short>(t.is_send ? POLLOUT : POLLIN), 0});
    } else {
      shm_pending = true;
    }
  }
  if (shm_pending && doorbell_) {
    // Register as a sleeper, then re-check: a peer that wrote before seeing us registered also bumped the
    // doorbell, so futex_wait returns at once instead of missing the wake-up.
    uint32_t seen = doorbell_->load(std::memory_order_seq_cst);
    sleepers_->fetch_add(1, std::memory_order_seq_cst);
    bool done = false;
    if (!advance(transfers, count, &done) && !done) {
      futex_wait(doorbell_, seen, fds.empty() ? 20000 : 200);
    }
    sleepers_->fetch_sub(1, std::memory_order_seq_cst);
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 0);
  } else if (!fds.empty()) {
    ::poll(fds.data(), fds.size(), 20);
  }
}

void Progress::stamp_alive() {
  if (!alive_ns_) return;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  alive_ns_->store(static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec, std::memory_order_relaxed);
}

void Progress::run(Transfer* transfers, size_t count) {
  bool done = false;
  advance(transfers, count, &done);
  if (done) return;
  auto start = Clock::now();
  auto last_move = start;
  auto last_alive_check = start;
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  const int64_t spin_us = t_spin_override >= 0 ? t_spin_override : spin_us_;
  bool held_checked = false;
  while (true) {
    const bool moved = advance(transfers, count, &done);
    if (done) return;
    // One reading per spin, though it is most of a spin's cost in a VM: it also spaces the pauses, and a tighter
    // loop of pauses saw the peer's data later there.
    const auto now = Clock::now();
    if (moved) last_move = now;
    if (!held_checked && now - start > std::chrono::microseconds(kHeldLockSpinMicroseconds)) {
      held_checked = true;  // a late peer: the caller's lock goes to its other threads (common/wait.h)
      release_held_lock();
    }
    if (now - last_move < std::chrono::microseconds(spin_us)) {
      cpu_relax();
      continue;
    }
    if (now - last_alive_check > std::chrono::milliseconds(50)) {
      last_alive_check = now;
      stamp_alive();
      for (size_t i = 0; i < count; ++i) {
        if (transfers[i].done < transfers[i].length) transfers[i].channel->check_alive();
      }
    }
    if (now - last_move > timeout) {
      std::ostringstream message;
      message << "no progress for " << timeout_s_ << " s (HVDLITE_PEER_TIMEOUT_SECONDS) waiting on";
      for (size_t i = 0; i < count; ++i) {
        const Transfer& t = transfers[i];
        if (t.done == t.length) continue;
        message << " rank " << t.channel->peer() << " (" << t.channel->peer_host() << ", "
                << (t.is_send ? "send " : "receive ") << t.done << "/" << t.length << " bytes)";
      }
      throw Error(StatusCode::kTimeout, message.str());
    }
    block(transfers, count);
  }
}

void Progress::sendrecv(Channel* to, const void* send, size_t send_bytes, Channel* from, void* recv,
                        size_t recv_bytes, bool cold_recv) {
  Transfer t[2] = {Transfer::Send(to, send, send_bytes), Transfer::Recv(from, recv, recv_bytes)};
  t[1].cold = cold_recv;
  run(t, 2);
}

void Progress::exchange(Channel* peer, const void* send, void* recv, size_t bytes) {
  if (bytes == 0 || bytes > peer->message_capacity()) {
    sendrecv(peer, send, bytes, peer, recv, bytes);
    return;
  }
  Transfer t[2] = {Transfer::Send(peer, send, bytes), Transfer::Recv(peer, recv, bytes)};
  t[0].message = t[1].message = true;
  run(t, 2);
}

}  // namespace hvdlite
