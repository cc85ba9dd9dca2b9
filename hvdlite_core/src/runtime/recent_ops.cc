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

RecentOps::Op& RecentOps::place(OpType kind, int32_t process_set, int64_t bytes, const NameRecord* record) {
  Op& op = ring_[submitted_ % kKept];
  op.op = kind;
  op.process_set = process_set;
  op.record = record;
  op.bytes = bytes;
  op.state = "pending";
  ++submitted_;
  if (count_ < kKept) ++count_;
  return op;
}

void RecentOps::submitted(TensorEntry& entry) {
  const Request& q = entry.request;
  Op& op = place(q.op, q.process_set, element_count(q.shape) * static_cast<int64_t>(dtype_size(q.dtype)),
                 entry.name_record);
  op.name = q.name;
  if (entry.name_record) entry.recent_seq = static_cast<uint32_t>(submitted_);  // 0 once in 2^32: left pending
}

void RecentOps::submitted(OpType kind, int32_t process_set, const char* name, int64_t bytes) {
  place(kind, process_set, bytes, nullptr).name.assign(name);
}

void RecentOps::finished(TensorEntry& entry, bool ok) {
  const char* state = ok ? "done" : "failed";
  if (const NameRecord* record = entry.name_record) {
    // Its record, while still kept, found through the entry: a name is in flight once at a time, so that record is
    // its name's newest, and the name's own record is not read (with thousands in flight, a cache miss each). The
    // entry keeps the place's low 32 bits, which give the same ring place and count since: kKept divides 2^32.
    const uint32_t seq = entry.recent_seq;
    entry.recent_seq = 0;
    if (seq != 0 && static_cast<uint32_t>(static_cast<uint32_t>(submitted_) - seq) < count_ &&
        ring_[(seq - 1) % kKept].record == record)
      ring_[(seq - 1) % kKept].state = state;
    return;
  }
  const Request& q = entry.request;
  for (size_t age = 0; age < count_; ++age) {
    Op& op = newest(age);
    if (op.record == nullptr && op.process_set == q.process_set && op.name == q.name) {
      op.state = state;
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
