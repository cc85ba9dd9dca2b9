#include "runtime/fusion.h"

#include <unistd.h>

#include <algorithm>

namespace hvdlite {
namespace {

bool fusable(const Response& r) { return !r.is_error && r.op == OpType::kAllreduce && r.none_joined(); }

bool compatible(const Response& a, const Response& b) {
  return a.process_set == b.process_set && a.on_device == b.on_device && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale;
}

int64_t bytes_of(const Response& r) { return element_count(r) * static_cast<int64_t>(dtype_size(r.dtype)); }

}  // namespace

void plan_fusion(const std::vector<const Response*>& responses, int64_t threshold_bytes, int64_t tensor_limit_bytes,
                 FusionPlan* plan) {
  const int64_t limit = std::min(threshold_bytes, tensor_limit_bytes);
  plan->group_of.resize(responses.size());
  plan->heads.clear();
  plan->group_bytes.clear();
  plan->open.clear();
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = *responses[i];
    const int64_t bytes = bytes_of(r);
    const bool joins_others = fusable(r) && bytes < limit;
    bool placed = false;
    if (joins_others) {
      for (size_t g : plan->open) {
        if (compatible(*responses[plan->heads[g]], r) && plan->group_bytes[g] + bytes <= threshold_bytes) {
          plan->group_of[i] = g;
          plan->group_bytes[g] += bytes;
          placed = true;
          break;
        }
      }
    }
    if (placed) continue;
    plan->group_of[i] = plan->heads.size();
    plan->heads.push_back(i);
    plan->group_bytes.push_back(bytes);
    if (joins_others) plan->open.push_back(plan->heads.size() - 1);
  }
  // Laid out group after group, each in response order (a counting sort): group_ends holds each group's start
  // first, and its end once the group's members are placed.
  plan->group_ends.assign(plan->heads.size(), 0);
  for (size_t i = 0; i < responses.size(); ++i) ++plan->group_ends[plan->group_of[i]];
  size_t start = 0;
  for (size_t& place : plan->group_ends) {
    const size_t count = place;
    place = start;
    start += count;
  }
  plan->members.resize(responses.size());
  for (size_t i = 0; i < responses.size(); ++i) plan->members[plan->group_ends[plan->group_of[i]]++] = i;
}

FusedLayout fused_layout(const std::vector<const Response*>& group) {
  FusedLayout layout;
  fused_layout(group, &layout);
  return layout;
}

void fused_layout(const std::vector<const Response*>& group, FusedLayout* layout) {
  layout->counts.resize(group.size());
  layout->offsets.resize(group.size());
  layout->total = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    layout->counts[i] = static_cast<size_t>(element_count(*group[i]));
    layout->offsets[i] = layout->total;
    layout->total += layout->counts[i];
  }
}

size_t fusion_piece_bytes(bool cheap_meetings) {
  if (!cheap_meetings) return 0;
  static const size_t piece = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) / 4 : size_t{256} << 10;  // unknown: a common L2 of 1 MB
  }();
  return piece;
}

size_t piece_end(const FusedLayout& layout, size_t first, size_t piece_elements) {
  size_t end = first + 1;
  while (end < layout.counts.size() &&
         layout.offsets[end] + layout.counts[end] - layout.offsets[first] <= piece_elements)
    ++end;
  return end;
}

}  // namespace hvdlite
