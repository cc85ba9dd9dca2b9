#include "runtime/fusion.h"

#include <algorithm>

namespace hvdlite {
namespace {

bool fusable(const Response& r) { return !r.is_error && r.op == OpType::kAllreduce && r.joined.empty(); }

bool compatible(const Response& a, const Response& b) {
  return a.process_set == b.process_set && a.on_device == b.on_device && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale;
}

int64_t bytes_of(const Response& r) { return element_count(r.shape) * static_cast<int64_t>(dtype_size(r.dtype)); }

}  // namespace

std::vector<std::vector<size_t>> plan_fusion(const std::vector<Response>& responses, int64_t threshold_bytes,
                                             int64_t tensor_limit_bytes) {
  const int64_t limit = std::min(threshold_bytes, tensor_limit_bytes);
  std::vector<std::vector<size_t>> groups;
  std::vector<int64_t> group_bytes;
  std::vector<size_t> open;  // indices into groups that still accept members
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = responses[i];
    int64_t bytes = bytes_of(r);
    bool placed = false;
    if (fusable(r) && bytes < limit) {
      for (size_t g : open) {
        const Response& head = responses[groups[g].front()];
        if (compatible(head, r) && group_bytes[g] + bytes <= threshold_bytes) {
          groups[g].push_back(i);
          group_bytes[g] += bytes;
          placed = true;
          break;
        }
      }
    }
    if (placed) continue;
    groups.push_back({i});
    group_bytes.push_back(bytes);
    if (fusable(r) && bytes < limit) open.push_back(groups.size() - 1);
  }
  return groups;
}

FusedLayout fused_layout(const std::vector<const Response*>& group) {
  FusedLayout layout;
  layout.counts.resize(group.size());
  layout.offsets.resize(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    layout.counts[i] = static_cast<size_t>(element_count(group[i]->shape));
    layout.offsets[i] = layout.total;
    layout.total += layout.counts[i];
  }
  return layout;
}

}  // namespace hvdlite
