// The mesh: one authenticated channel to every other rank, established at init. Pairs on one host talk
// through shared memory (unless disabled); others through TCP. Every pair also keeps its TCP socket, which
// on one host only serves to notice the peer's death.
//
// Setup order (no deadlock, no race on segments): create my shm inbox, its memory reserved (shm_room.h);
// connect to every lower rank (their listeners are open before addresses are published, so connects queue in
// the backlog); accept every higher rank, dropping connections that fail the handshake; swap inbox sizes with
// co-located peers (if one has none, the host uses TCP); map co-located peers' inboxes (they exist: each rank
// created its inbox before its first handshake); exchange one status byte with everyone (all mapped, and
// whether cross-memory attach works), after which every rank unlinks its own segment name.
#pragma once
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/channel.h"
#include "transport/handshake.h"
#include "transport/progress.h"
#include "transport/shm_segment.h"

namespace hvdlite {

struct PeerInfo {
  std::string address;  // "host:port" of the listener
  int host_id;
  pid_t pid;
};

class Mesh {
 public:
  Mesh(const Config& config, int rank, std::vector<PeerInfo> peers, HandshakeKeys keys, int listen_fd);
  ~Mesh();
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  Channel* channel(int peer) const { return channels_[peer].get(); }
  bool same_host(int peer) const { return peers_[peer].host_id == peers_[rank_].host_id; }
  int host_id(int peer) const { return peers_[peer].host_id; }
  pid_t pid(int peer) const { return peers_[peer].pid; }
  // Single-copy reads of a co-located peer's memory (process_vm_readv) work in both directions.
  bool cma_usable(int peer) const { return same_host(peer) && cma_ok_[peer]; }
  Progress& progress() { return *progress_; }
  // Whether this machine's CPUs outnumber the job's ranks on it: a background thread's cycle then need not take a
  // CPU from a rank's own thread.
  bool cpus_to_spare() const { return cpus_to_spare_; }
  // Whether each of the job's ranks on this machine has a CPU of its own: a meeting of them then costs no switch.
  bool cpu_per_rank() const { return cpu_per_rank_; }
  std::string describe() const;  // "shm:N tcp:M cma:yes" for build/debug info
  // After a transport failure: the peers that are gone, so an error names every loss and not only the peer an
  // operation happened to wait on: "; connections closed by now: rank 0 (host); not responding for over 1 s:
  // rank 2 (host)" (co-located peers only for the second part: it reads their inbox stamps). "" when none.
  std::string lost_peers_report() const;

 private:
  void connect_all(Clock::time_point deadline);
  void accept_all(Clock::time_point deadline);
  bool agree_on_shm(size_t my_ring_bytes, const std::string& my_failure, Clock::time_point deadline);
  void build_channels();
  void exchange_status_bytes(Clock::time_point deadline);
  int local_index(int rank) const;

  const Config& config_;
  int rank_;
  std::vector<PeerInfo> peers_;
  HandshakeKeys keys_;
  int listen_fd_;
  std::vector<int> control_fds_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<int> local_ranks_;  // ranks on my host, ascending (includes me)
  ShmInbox my_inbox_;
  std::vector<ShmInbox> peer_inboxes_;  // indexed by global rank; empty for remote peers
  std::vector<bool> cma_ok_;
  std::unique_ptr<Progress> progress_;
  bool cpus_to_spare_ = false;
  bool cpu_per_rank_ = false;
};

}  // namespace hvdlite
