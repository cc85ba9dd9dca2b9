// The coordinator's side of negotiation, run by global rank 0 (controller.h, step 3): it matches the requests of
// uncached tensors by (process set, name), and answers which collectives every member has submitted, in the order
// their first request arrived, and which fail: stalled (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS), out of step
// (desync.h), or aborted by a rank's error.
#pragma once
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "runtime/entry.h"
#include "runtime/message.h"
#include "runtime/process_sets.h"

namespace hvdlite {

class Coordinator {
 public:
  Coordinator(const Config& config, int size, ProcessSetRegistry& sets);
  // One rank's request of this round (joins and aborts included).
  void ingest(const Request& request);
  // This round's responses: complete collectives in arrival order, a join once every rank joined, the failures
  // of collectives out of step or stalled, and one abort that carries every aborting rank's reason.
  std::vector<Response> decide();
  // Every cycle: logs stall warnings; true when some waiting tensor is due to fail: stalled, out of step, or on a
  // process set removed since the last round.
  bool round_due(Clock::time_point now);
  // Whether some collective waits here for the other members' requests.
  bool waiting() const { return !arrival_order_.empty(); }

 private:
  struct Submissions {
    std::vector<Request> requests;
    std::chrono::steady_clock::time_point first_seen;
    bool warned = false;
  };
  void report_stalls(std::vector<Response>& out);
  // Fails the collectives that ranks wait on crosswise (desync.h), with one message for all.
  void report_out_of_step(std::vector<Response>& out);
  // Keys of those collectives (and, when message is given, their description); empty when none.
  std::vector<std::string> out_of_step(std::string* message);
  std::vector<int> missing_ranks(const Submissions& s);
  std::string missing_ranks_text(const Submissions& s);

  const Config& config_;
  int size_;
  ProcessSetRegistry& sets_;
  std::map<std::string, Submissions> table_;
  std::vector<std::string> arrival_order_;
  std::set<int> joined_ranks_;
  std::vector<Request> aborts_;  // kAbort requests of this round, in rank order
  int last_joined_ = -1;
  std::chrono::steady_clock::time_point last_stall_check_;
  uint64_t decided_sets_version_ = 0;  // the process sets' version when decide() last ran
};

}  // namespace hvdlite
