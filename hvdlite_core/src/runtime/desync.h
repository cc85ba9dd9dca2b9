// Ranks out of step: collectives that ranks wait on crosswise, so that none of them can ever complete (say one rank
// caught an exception and went on to a barrier while another waits in an allgather). Negotiation alone never fails
// these, since each tensor just lacks some ranks.
//
// The rule: rank r waits on rank m when r has submitted an incomplete collective that m has not, older than the
// timeout; ranks on a cycle of that relation are out of step. A merely slow rank has submitted nothing the others
// lack, so it is on no cycle; one that submits asynchronously and then computes past the timeout can trip it, which
// is why the timeout is a knob (HVDLITE_DESYNC_TIMEOUT_SECONDS; 0 disables).
#pragma once
#include <string>
#include <vector>

namespace hvdlite {

struct IncompleteCollective {
  std::string description;  // e.g. "allgather of tensor 'x'"
  std::vector<int> submitters;
  std::vector<int> missing;  // members that have neither submitted it nor joined
  double age_seconds = 0;
};

// Indices (ascending) of the collectives that out-of-step ranks wait on: submitted by a rank on a wait cycle and
// missing a rank on the same cycle. Empty when nothing is out of step.
std::vector<size_t> find_out_of_step(const std::vector<IncompleteCollective>& incomplete, double timeout_seconds);

// One message naming every collective found and who submitted / lacks it, the same text on every rank.
std::string describe_out_of_step(const std::vector<IncompleteCollective>& incomplete,
                                 const std::vector<size_t>& found, double timeout_seconds);

}  // namespace hvdlite
