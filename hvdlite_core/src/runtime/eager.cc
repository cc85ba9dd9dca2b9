#include "runtime/eager.h"

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
  return !r.is_error && r.op == OpType::kAllreduce && r.process_set == 0 && !r.on_device && r.joined.empty() &&
         r.reduce_op != ReduceOp::kAdasum && element_count(r.shape) > 0;
}

void EagerLayout::update(const ResponseCache& cache, int64_t budget_bytes) {
  if (cache.generation() == generation_ && budget_bytes == budget_) return;
  generation_ = cache.generation();
  budget_ = budget_bytes;
  segments_.clear();
  index_of_.assign(cache.occupied_end(), -1);
  bytes_ = 0;
  for (size_t p = 0; p < cache.occupied_end(); ++p) {
    if (!cache.occupied(static_cast<int>(p))) continue;
    const Response& r = cache.at(static_cast<int>(p));
    if (!eligible(r)) continue;
    const size_t count = static_cast<size_t>(element_count(r.shape));
    const size_t padded = (count * dtype_size(r.dtype) + 7) / 8 * 8;
    if (static_cast<int64_t>(bytes_ + padded) > budget_bytes) continue;  // a smaller one further on may still fit
    index_of_[p] = static_cast<int>(segments_.size());
    segments_.push_back({static_cast<int>(p), bytes_, count, r.dtype, reduce_kind(r.reduce_op)});
    bytes_ += padded;
  }
}

const EagerSegment* EagerLayout::find(int position) const {
  if (position < 0 || static_cast<size_t>(position) >= index_of_.size() || index_of_[position] < 0) return nullptr;
  return &segments_[index_of_[position]];
}

void reduce_eager(const std::vector<EagerSegment>& segments, char* dst, const char* src) {
  for (const EagerSegment& s : segments) reduce_into(s.dtype, s.kind, dst + s.offset, src + s.offset, s.count);
}

}  // namespace hvdlite
