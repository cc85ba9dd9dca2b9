#include "transport/mesh.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/status.h"
#include "transport/caller_spin.h"
#include "transport/lost_peers.h"
#include "transport/shm_channel.h"
#include "transport/shm_room.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"

namespace hvdlite {
namespace {

// A word whose address peers read with process_vm_readv, and write back unchanged with process_vm_writev, to prove
// cross-memory attach works both ways (single-copy allreduce writes its result into the peers; a seccomp profile
// may allow one call and not the other).
volatile uint64_t g_cma_probe = 0x636d612d70726f62ull;

bool cma_works(pid_t pid, uint64_t address) {
  uint64_t value = 0;
  struct iovec local = {&value, sizeof(value)};
  struct iovec remote = {reinterpret_cast<void*>(address), sizeof(value)};
  // Refused (ptrace policy, containers) or a wrong value both mean "not usable": we keep to the rings.
  ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n != static_cast<ssize_t>(sizeof(value)) || value != g_cma_probe) return false;
  return process_vm_writev(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof(value));
}

}  // namespace

Mesh::Mesh(const Config& config, int rank, std::vector<PeerInfo> peers, HandshakeKeys keys, int listen_fd)
    : config_(config), rank_(rank), peers_(std::move(peers)), keys_(std::move(keys)), listen_fd_(listen_fd) {
  int n = size();
  control_fds_.assign(n, -1);
  channels_.resize(n);
  peer_inboxes_.resize(n);
  cma_ok_.assign(n, false);
  for (int r = 0; r < n; ++r) {
    if (same_host(r)) local_ranks_.push_back(r);
  }
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(config_.start_timeout_seconds));
  bool use_shm = !config_.shm_disable && local_ranks_.size() > 1;
  InboxAttempt attempt;
  if (use_shm) {
    attempt =
        create_inbox_within_room(ShmInbox::Name(keys_.job_id, rank_), rank_, static_cast<int>(local_ranks_.size()),
                                 static_cast<size_t>(config_.shm_ring_bytes));
    my_inbox_ = std::move(attempt.inbox);
    if (my_inbox_.header()) my_inbox_.header()->cma_probe_address = reinterpret_cast<uint64_t>(&g_cma_probe);
  }
  try {
    connect_all(deadline);
    if (use_shm) use_shm = agree_on_shm(attempt.ring_bytes, attempt.failure, deadline);
    if (use_shm) {
      for (int r : local_ranks_) {
        if (r != rank_) peer_inboxes_[r] = ShmInbox::Open(ShmInbox::Name(keys_.job_id, r), r);
      }
    }
    build_channels();
    exchange_status_bytes(deadline);
  } catch (...) {
    for (int fd : control_fds_)
      if (fd >= 0) ::close(fd);  // fds moved into channels are already -1
    ::close(listen_fd_);
    throw;
  }
  my_inbox_.unlink();  // everyone has mapped it; the name is no longer needed (and cannot leak)
  ::close(listen_fd_);
  listen_fd_ = -1;
  std::vector<pid_t> other_hosts_pids;
  for (const PeerInfo& peer : peers_) {
    if (peer.host_id != peers_[rank_].host_id) other_hosts_pids.push_back(peer.pid);
  }
  const int machine_ranks = ranks_on_this_machine(static_cast<int>(local_ranks_.size()), other_hosts_pids);
  const int cpus = usable_cpus();
  cpus_to_spare_ = machine_ranks < cpus;
  cpu_per_rank_ = machine_ranks <= cpus;
  const int64_t spin_us = caller_spin_microseconds(config_, machine_ranks, cpus);
  if (use_shm) {
    progress_.reset(new Progress(&my_inbox_.header()->doorbell, &my_inbox_.header()->sleepers,
                                 &my_inbox_.header()->alive_ns, spin_us, config_.peer_timeout_seconds));
  } else {
    progress_.reset(new Progress(nullptr, nullptr, nullptr, spin_us, config_.peer_timeout_seconds));
  }
}

Mesh::~Mesh() {
  channels_.clear();  // TCP channels close their sockets
  for (int fd : control_fds_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

int Mesh::local_index(int rank) const {
  return static_cast<int>(std::lower_bound(local_ranks_.begin(), local_ranks_.end(), rank) - local_ranks_.begin());
}

void Mesh::connect_all(Clock::time_point deadline) {
  for (int peer = 0; peer < rank_; ++peer) {
    int fd = socket_connect(peers_[peer].address, deadline);
    try {
      handshake_connect(fd, rank_, peer, keys_, deadline);
    } catch (...) {
      ::close(fd);
      throw;
    }
    control_fds_[peer] = fd;
  }
  accept_all(deadline);
}

void Mesh::accept_all(Clock::time_point deadline) {
  // Each accepted connection is authenticated on its own thread, so a stranger that connects and stays
  // silent (or a slow one) cannot hold up the peers queued behind it.
  struct Outcome {
    int fd;
    int peer;  // -1: failed
    std::string error;
    bool cut_short;  // still in its handshake when the listener stopped
  };
  std::mutex mutex;
  std::vector<Outcome> outcomes;
  std::set<int> in_progress;
  bool stopping = false;  // under mutex: set with the shutdown of every handshake still in progress
  std::vector<std::thread> workers;
  int expected = size() - 1 - rank_;
  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      for (int fd : in_progress) ::shutdown(fd, SHUT_RDWR);  // unblocks their handshakes at once
    }
    for (std::thread& t : workers) t.join();
    // Strangers still in their handshake, or rejected since the last look, are said too: none is dropped silently.
    for (const Outcome& o : outcomes) {
      if (o.peer >= 0) {
        ::close(o.fd);  // authenticated but not taken
      } else {
        HVD_LOG(kWarning, "rejected a connection to the data-plane listener: "
                              << o.error << (o.cut_short ? " (cut short: every rank had connected)" : ""));
      }
    }
  };
  while (expected > 0) {
    std::vector<Outcome> ready;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ready.swap(outcomes);
    }
    for (const Outcome& o : ready) {
      if (o.peer < 0) {
        HVD_LOG(kWarning, "rejected a connection to the data-plane listener: " << o.error);
      } else if (o.peer <= rank_ || o.peer >= size() || control_fds_[o.peer] >= 0) {
        HVD_LOG(kWarning, "rejected a connection to the data-plane listener: unexpected rank " << o.peer);
        ::close(o.fd);
      } else {
        control_fds_[o.peer] = o.fd;
        --expected;
      }
    }
    if (expected == 0) break;
    if (Clock::now() >= deadline) {
      finish();
      std::string missing;
      for (int r = rank_ + 1; r < size(); ++r)
        if (control_fds_[r] < 0) missing += " " + std::to_string(r);
      throw Error(StatusCode::kTimeout, "timed out at start waiting for ranks" + missing + " to connect");
    }
    struct pollfd p = {listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      std::lock_guard<std::mutex> lock(mutex);
      in_progress.insert(fd);
    }
    auto handshake_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    workers.emplace_back([&, fd, handshake_deadline] {
      Outcome outcome{fd, -1, "", false};
      try {
        outcome.peer = handshake_accept(fd, rank_, keys_, handshake_deadline);
      } catch (const Error& e) {
        outcome.error = e.what();
      }
      std::lock_guard<std::mutex> lock(mutex);
      // Decided here, by the outcome itself: the kernel may already have given this fd's number to a later stranger.
      outcome.cut_short = stopping && outcome.peer < 0;
      in_progress.erase(fd);
      if (outcome.peer < 0) ::close(fd);
      outcomes.push_back(outcome);
    });
  }
  finish();
}

bool Mesh::agree_on_shm(size_t my_ring_bytes, const std::string& my_failure, Clock::time_point deadline) {
  // Each co-located pair swaps what its inbox got over the control socket: shared memory is used between the
  // host's ranks only if every one of them has an inbox, and the lowest of them explains any shortage.
  std::vector<uint64_t> rings(local_ranks_.size(), 0);
  const uint64_t mine = my_ring_bytes;
  for (int r : local_ranks_) {
    if (r != rank_) socket_write_all(control_fds_[r], &mine, sizeof(mine), deadline, "rank " + std::to_string(r));
  }
  for (size_t i = 0; i < local_ranks_.size(); ++i) {
    int r = local_ranks_[i];
    if (r == rank_) {
      rings[i] = mine;
    } else {
      socket_read_all(control_fds_[r], &rings[i], sizeof(rings[i]), deadline, "rank " + std::to_string(r));
    }
  }
  bool everyone = std::none_of(rings.begin(), rings.end(), [](uint64_t bytes) { return bytes == 0; });
  if (rank_ == local_ranks_.front()) {
    // The lowest rank may not know the failure text of another; the sizes say enough, the text is a bonus.
    std::string warning = describe_shm_shortage(local_ranks_, rings, static_cast<size_t>(config_.shm_ring_bytes),
                                                my_failure.empty() ? "see that rank's /dev/shm" : my_failure);
    if (!warning.empty()) HVD_LOG(kWarning, warning);
  }
  if (!everyone) my_inbox_ = ShmInbox();  // unlinks and unmaps it: the host talks over TCP
  return everyone;
}

void Mesh::build_channels() {
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    std::string host = peers_[peer].address;
    if (same_host(peer) && my_inbox_.header() != nullptr) {
      channels_[peer].reset(new ShmChannel(peer, host, &my_inbox_, local_index(peer), &peer_inboxes_[peer],
                                           local_index(rank_), control_fds_[peer]));
    } else {
      channels_[peer].reset(new TcpChannel(control_fds_[peer], peer, host, config_.peer_unreachable_seconds));
      control_fds_[peer] = -1;  // owned by the channel now
    }
  }
}

void Mesh::exchange_status_bytes(Clock::time_point deadline) {
  // Byte: bit 0 = "I mapped every co-located inbox", bit 1 = "I can read and write every co-located peer's memory".
  bool cma_all = !config_.cma_disable && local_ranks_.size() > 1;
  for (int r : local_ranks_) {
    if (r != rank_ && cma_all && peer_inboxes_[r].header()) {
      cma_all = cma_works(peers_[r].pid, peer_inboxes_[r].header()->cma_probe_address);
    } else if (r != rank_) {
      cma_all = false;
    }
  }
  uint8_t mine = 1 | (cma_all ? 2 : 0);
  std::vector<uint8_t> theirs(size(), 0);
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    transfers.push_back(Transfer::Send(channels_[peer].get(), &mine, 1));
    transfers.push_back(Transfer::Recv(channels_[peer].get(), &theirs[peer], 1));
  }
  (void)deadline;
  Progress startup(my_inbox_.header() ? &my_inbox_.header()->doorbell : nullptr,
                   my_inbox_.header() ? &my_inbox_.header()->sleepers : nullptr, nullptr, 0,
                   config_.start_timeout_seconds);
  startup.run(transfers);
  for (int r : local_ranks_) cma_ok_[r] = r != rank_ && cma_all && (theirs[r] & 2);
}

std::string Mesh::describe() const {
  int shm = 0, tcp = 0;
  for (const auto& c : channels_) {
    if (!c) continue;
    if (std::strcmp(c->kind(), "shm") == 0)
      ++shm;
    else
      ++tcp;
  }
  bool cma = std::any_of(cma_ok_.begin(), cma_ok_.end(), [](bool b) { return b; });
  return "shm_peers=" + std::to_string(shm) + ";tcp_peers=" + std::to_string(tcp) + ";cma=" + (cma ? "1" : "0") +
         ";caller_spin_us=" + std::to_string(progress_->spin_microseconds()) +
         ";cpus_to_spare=" + (cpus_to_spare_ ? "1" : "0") + ";cpu_per_rank=" + (cpu_per_rank_ ? "1" : "0");
}

std::string Mesh::lost_peers_report() const {
  struct timespec now_ts;
  clock_gettime(CLOCK_MONOTONIC, &now_ts);
  const int64_t now = static_cast<int64_t>(now_ts.tv_sec) * 1000000000 + now_ts.tv_nsec;
  std::vector<PeerCondition> peers;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || !channels_[r]) continue;
    PeerCondition p{PeerCondition::kAlive, r, channels_[r]->peer_host()};
    Channel::PeerState state = channels_[r]->peer_state();
    if (state == Channel::PeerState::kClosed) {
      p.state = PeerCondition::kClosed;
    } else if (state == Channel::PeerState::kUnreachable) {
      p.state = PeerCondition::kUnreachable;
    } else if (r < static_cast<int>(peer_inboxes_.size()) && peer_inboxes_[r].header()) {
      int64_t stamp = peer_inboxes_[r].header()->alive_ns.load(std::memory_order_relaxed);
      if (stamp > 0 && now - stamp > 1000000000) p.state = PeerCondition::kSilent;
    }
    peers.push_back(p);
  }
  return describe_lost_peers(peers, config_.peer_unreachable_seconds);
}

}  // namespace hvdlite
