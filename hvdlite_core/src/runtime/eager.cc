#include "runtime/eager.h"

#include <algorithm>

namespace hvdlite {

ReduceKind reduce_kind(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return ReduceKind::kMin;
    case ReduceOp::kMax:
      return ReduceKind::kMax;
    case ReduceOp::kProduct:
      return ReduceKind::kProduct;
    default:
      return ReduceKind::kSum;
  }
}

bool EagerLayout::eligible(const Response& r) {
  return !r.is_error && r.op == OpType::kAllreduce && r.process_set == 0 && !r.on_device && r.none_joined() &&
         r.reduce_op != ReduceOp::kAdasum && element_count(r) > 0;
}

namespace {
size_t padded_bytes(const Response& r) {
  return (static_cast<size_t>(element_count(r)) * dtype_size(r.dtype) + 7) / 8 * 8;
}
}  // namespace

bool EagerLayout::idle(const ResponseCache& cache, int position) {
  return cache.touch_count() - cache.touched_at(position) > cache.size();
}

void EagerLayout::missed(const ResponseCache& cache, int position) {
  size_t bytes;
  if (cache.generation() == generation_ && static_cast<size_t>(position) < missable_.size()) {
    bytes = missable_[position];
  } else {
    const Response& r = cache.at(position);
    bytes = eligible(r) ? padded_bytes(r) : 0;
  }
  if (bytes > 0) missed_bytes_ = std::min(missed_bytes_, bytes);
}

void EagerLayout::update(const ResponseCache& cache, int64_t budget_bytes) {
  bool rebuild = cache.generation() != generation_ || budget_bytes != budget_;
  if (!rebuild && missed_bytes_ != std::numeric_limits<size_t>::max()) {
    // Rebuilt only when a response that missed would fit once the idle ones are left out: otherwise the choice
    // would come out the same, cycle after cycle.
    int64_t reclaimable = budget_ - static_cast<int64_t>(bytes_);
    for (const EagerSegment& s : segments_) {
      if (idle(cache, s.position)) reclaimable += static_cast<int64_t>(padded_bytes(cache.at(s.position)));
    }
    rebuild = static_cast<int64_t>(missed_bytes_) <= reclaimable;
  }
  missed_bytes_ = std::numeric_limits<size_t>::max();
  if (!rebuild) return;
  generation_ = cache.generation();
  budget_ = budget_bytes;
  segments_.clear();
  index_of_.assign(cache.occupied_end(), -1);
  missable_.assign(cache.occupied_end(), 0);
  bytes_ = 0;
  // Those in use first, then the smallest, ties by position: the same choice on every rank.
  std::vector<std::tuple<bool, size_t, int>>& candidates = candidates_;
  candidates.clear();
  for (size_t p = 0; p < cache.occupied_end(); ++p) {
    const int position = static_cast<int>(p);
    if (!cache.occupied(position) || !eligible(cache.at(position))) continue;
    const size_t padded = padded_bytes(cache.at(position));
    candidates.emplace_back(idle(cache, position), padded, position);
    // Past the region's largest budget a size only needs to stay too large.
    missable_[p] = static_cast<uint32_t>(std::min<size_t>(padded, std::numeric_limits<uint32_t>::max()));
  }
  std::sort(candidates.begin(), candidates.end());
  // index_of_ marks the chosen for the head or the tail; they are laid out below.
  constexpr int kHead = -2, kTail = -3;
  const size_t head_budget = static_cast<size_t>(std::min<int64_t>(budget_bytes, kEagerHeadBytes));
  size_t chosen_bytes = 0, head_bytes = 0;
  for (const auto& [unused, padded, position] : candidates) {
    if (static_cast<int64_t>(chosen_bytes + padded) > budget_bytes) continue;  // a smaller idle one may fit
    chosen_bytes += padded;
    const bool head = head_bytes + padded <= head_budget;
    if (head) head_bytes += padded;
    index_of_[position] = head ? kHead : kTail;
  }
  auto place = [&](int position) {
    const Response& r = cache.at(position);
    index_of_[position] = static_cast<int>(segments_.size());
    segments_.push_back({position, bytes_, padded_bytes(r), static_cast<size_t>(element_count(r)), r.dtype,
                         reduce_kind(r.reduce_op)});
    bytes_ += padded_bytes(r);
  };
  for (size_t p = 0; p < index_of_.size(); ++p) {
    if (index_of_[p] == kHead) place(static_cast<int>(p));
  }
  head_bytes_ = bytes_;
  for (const auto& [unused, padded, position] : candidates) {  // the tail smallest first
    if (index_of_[position] == kTail) place(position);
  }
}

const EagerSegment* EagerLayout::find(int position) const {
  if (position < 0 || static_cast<size_t>(position) >= index_of_.size() || index_of_[position] < 0) return nullptr;
  return &segments_[index_of_[position]];
}

void reduce_eager(const std::vector<EagerSegment>& segments, char* dst, const char* src, size_t from, size_t to) {
  for (const EagerSegment& s : segments) {
    if (s.offset >= from && s.offset + s.bytes <= to)
      reduce_into(s.dtype, s.kind, dst + s.offset, src + s.offset, s.count);
  }
}

}  // namespace hvdlite
