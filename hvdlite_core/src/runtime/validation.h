// Cross-rank validation: the coordinator's pure function from "what each member submitted for one tensor" to
// the Response every member will act on. A mismatch becomes an error Response naming the tensor, the ranks and
// the differing values; it is delivered to every member, and nothing else is affected.
#pragma once
#include <vector>

#include "runtime/message.h"

namespace hvdlite {

// requests: the submissions of the members that did submit (any order). joined: members (global ranks) that
// have called join() and take part without submitting. members: the process set's global ranks, ascending.
Response build_response(const std::vector<Request>& requests, const std::vector<int>& joined,
                        const std::vector<int>& members);

}  // namespace hvdlite
