#include "runtime/recent_ops.h"

#include "common/dtype.h"
#include "runtime/message.h"

namespace hvdlite {
namespace {

std::string human_bytes(int64_t n) {
  if (n >= (1 << 20)) return std::to_string(n >> 20) + " MB";
  if (n >= (1 << 10)) return std::to_string(n >> 10) + " KB";
  return std::to_string(n) + " B";
}

}  // namespace

void RecentOps::submitted(const TensorEntry& entry) {
  const Request& q = entry.request;
  submitted(q.op, q.process_set, q.name.c_str(), element_count(q.shape) * static_cast<int64_t>(dtype_size(q.dtype)),
            entry.name_record);
}

void RecentOps::submitted(OpType kind, int32_t process_set, const char* name, int64_t bytes,
                          const NameRecord* record) {
  Op& op = ring_[next_];
  op.op = kind;
  op.process_set = process_set;
  op.name.assign(name);
  op.record = record;
  op.bytes = bytes;
  op.state = "pending";
  next_ = (next_ + 1) % kKept;
  if (count_ < kKept) ++count_;
}

void RecentOps::finished(const TensorEntry& entry, bool ok) {
  const Request& q = entry.request;
  for (size_t age = 0; age < count_; ++age) {
    Op& op = newest(age);
    if (op.record == entry.name_record && op.process_set == q.process_set && op.name == q.name) {
      op.state = ok ? "done" : "failed";
      return;
    }
  }
}

std::string RecentOps::report(int rank) const {
  if (count_ == 0) return "";
  std::string text =
      "last " + std::to_string(count_) + " collectives on rank " + std::to_string(rank) + ", oldest first: ";
  for (size_t i = 0; i < count_; ++i) {
    const Op& op = newest(count_ - 1 - i);
    text += (i ? ", " : "") + std::string(op_name(op.op)) + " '" + op.name + "' (";
    if (op.op != OpType::kBarrier && op.op != OpType::kJoin) text += human_bytes(op.bytes) + ", ";
    if (op.process_set != 0) text += "process set " + std::to_string(op.process_set) + ", ";
    text += std::string(op.state) + ")";
  }
  return text;
}

}  // namespace hvdlite
