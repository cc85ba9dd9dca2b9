// Tensor fusion: allreduces that agree on process set, dtype, reduce op and scale factors are packed into one
// buffer (up to the fusion threshold) and reduced by one collective: one latency instead of many, and the
// bandwidth-optimal algorithms get large messages. Grouping depends only on the response list, so it is
// identical on every rank.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/message.h"

namespace hvdlite {

// Groups of response indices, in execution order (a group runs when its first member comes up). Tensors of
// tensor_limit_bytes or more stay alone: they are bandwidth-bound already, and fusing them would only copy
// them into and out of the fusion buffer (two extra passes over memory).
std::vector<std::vector<size_t>> plan_fusion(const std::vector<Response>& responses, int64_t threshold_bytes,
                                             int64_t tensor_limit_bytes);

// Where each member of a fused group lies in the fusion buffer, in elements of the group's dtype.
struct FusedLayout {
  std::vector<size_t> counts;
  std::vector<size_t> offsets;
  size_t total = 0;
};
FusedLayout fused_layout(const std::vector<const Response*>& group);

}  // namespace hvdlite
