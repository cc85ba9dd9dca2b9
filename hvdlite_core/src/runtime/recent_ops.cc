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
  Op op;
  op.key = entry_key(q.process_set, q.name);
  op.what = std::string(op_name(q.op)) + " '" + q.name + "' (";
  if (q.op != OpType::kBarrier && q.op != OpType::kJoin) {
    op.what += human_bytes(element_count(q.shape) * static_cast<int64_t>(dtype_size(q.dtype))) + ", ";
  }
  if (q.process_set != 0) op.what += "process set " + std::to_string(q.process_set) + ", ";
  ops_.push_back(std::move(op));
  if (ops_.size() > kKept) ops_.pop_front();
}

void RecentOps::finished(const TensorEntry& entry, bool ok) {
  std::string key = entry_key(entry.request.process_set, entry.request.name);
  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    if (it->key == key) {
      it->state = ok ? "done" : "failed";
      return;
    }
  }
}

std::string RecentOps::report(int rank) const {
  if (ops_.empty()) return "";
  std::string text = "last " + std::to_string(ops_.size()) + " collectives on rank " + std::to_string(rank) +
                     ", oldest first: ";
  for (size_t i = 0; i < ops_.size(); ++i) text += (i ? ", " : "") + ops_[i].what + ops_[i].state + ")";
  return text;
}

}  // namespace hvdlite
