// Ranks out of step: collectives that ranks wait on crosswise, so that none of them can ever complete.
//
// Typical cause: one rank raised in user code, caught it and went on to a barrier while another waits in an
// allgather; or two ranks submit differently named tensors. Negotiation alone never fails these (each tensor
// just lacks some ranks), and the stall warning only says that something is missing.
//
// The rule: rank r waits on rank m when r has submitted an incomplete collective that m has not, older than the
// timeout. Ranks on a cycle of that relation are out of step: each waits on a rank that waits, directly or
// through others, on it. A rank that is merely slow (evaluating for minutes, say) has submitted nothing the
// others lack, so it is on no cycle and never trips this; one that submits asynchronously and then computes for
// longer than the timeout can, which is why the timeout is a knob (HVDLITE_DESYNC_TIMEOUT_SECONDS; 0 disables).
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
