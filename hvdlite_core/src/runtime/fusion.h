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
// them into and out of the fusion buffer (two extra passes over memory). Kept flat and reused from cycle to cycle:
// planning allocates nothing once the plan has seen as many responses.
struct FusionPlan {
  std::vector<size_t> members;     // response indices, group after group, each group in response order
  std::vector<size_t> group_ends;  // one past each group's last place in members
  size_t groups() const { return group_ends.size(); }
  size_t begin(size_t group) const { return group ? group_ends[group - 1] : 0; }
  size_t end(size_t group) const { return group_ends[group]; }

  // Working space of plan_fusion.
  std::vector<size_t> group_of;  // by response
  std::vector<size_t> heads;     // by group: its first response
  std::vector<int64_t> group_bytes;
  std::vector<size_t> open;  // groups that still accept members
};
void plan_fusion(const std::vector<const Response*>& responses, int64_t threshold_bytes, int64_t tensor_limit_bytes,
                 FusionPlan* plan);

// Where each member of a fused group lies in the fusion buffer, in elements of the group's dtype.
struct FusedLayout {
  std::vector<size_t> counts;
  std::vector<size_t> offsets;
  size_t total = 0;
};
FusedLayout fused_layout(const std::vector<const Response*>& group);
void fused_layout(const std::vector<const Response*>& group, FusedLayout* layout);  // into a reused one

// A fused group runs in pieces of whole members, each copied in, reduced and copied out before the next one, so
// that a piece's tensors, its part of the fusion buffer and the transport's copies stay in the core's L2 cache
// instead of streaming the group through memory three times. Each piece is a meeting of the members more, cheap
// only where they share the machine and each has a CPU; elsewhere the group runs whole (0). A quarter of the L2.
size_t fusion_piece_bytes(bool cheap_meetings);
// One past the last member of the piece that starts at member `first`: whole members up to piece_elements
// elements from the first one's offset, and at least that one.
size_t piece_end(const FusedLayout& layout, size_t first, size_t piece_elements);

}  // namespace hvdlite
