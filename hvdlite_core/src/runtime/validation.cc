#include "runtime/validation.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "common/status.h"

namespace hvdlite {
namespace {

// "rank 0: float32; ranks 1, 2: int32" for a field that differs.
std::string describe_groups(const std::vector<Request>& requests,
                            const std::function<std::string(const Request&)>& show) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (const Request& q : requests) {
    std::string value = show(q);
    if (!groups.count(value)) order.push_back(value);
    groups[value].push_back(q.rank);
  }
  for (auto& group : groups) std::sort(group.second.begin(), group.second.end());
  // List the values in the order of their lowest rank, whatever order the requests arrived in.
  std::sort(order.begin(), order.end(),
            [&](const std::string& a, const std::string& b) { return groups[a].front() < groups[b].front(); });
  std::ostringstream out;
  for (size_t i = 0; i < order.size(); ++i) {
    std::vector<int>& ranks = groups[order[i]];
    out << (i ? "; " : "") << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t j = 0; j < ranks.size(); ++j) out << (j ? ", " : "") << ranks[j];
    out << ": " << order[i];
  }
  return out.str();
}

using Show = std::function<std::string(const Request&)>;
using Same = std::function<bool(const Request&, const Request&)>;

bool all_equal(const std::vector<Request>& requests, const Same& same) {
  const Request& first = requests.front();
  return std::all_of(requests.begin(), requests.end(), [&](const Request& q) { return same(first, q); });
}

Response error_response(const Request& first, StatusCode code, const std::string& message) {
  return Response::Failure(first, static_cast<int32_t>(code), message);
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool same_shape(const Request& a, const Request& b) { return a.shape == b.shape; }

// Factors agree as the error message would print them (six significant digits), as they always have.
bool same_factor(double a, double b) { return a == b || number(a) == number(b); }

bool same_trailing_shape(const Request& a, const Request& b) {
  if (a.shape.size() != b.shape.size()) return false;
  return a.shape.empty() || std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
}

std::string trailing_shape(const Request& q) {
  std::vector<int64_t> rest(q.shape.begin() + (q.shape.empty() ? 0 : 1), q.shape.end());
  return std::to_string(q.shape.size()) + "-d, rows of " + shape_string(rest);
}

}  // namespace

Response build_response(const std::vector<Request>& requests, const std::vector<int>& joined,
                        const std::vector<int>& members) {
  const Request& first = requests.front();
  std::string subject = "tensor '" + first.name + "'" +
                        (first.process_set != 0 ? " (process set " + std::to_string(first.process_set) + ")" : "");

  // Each field is compared as it is; it is put into words only when it differs (formatting every field of every
  // request cost more than the rest of negotiating a tensor).
  struct Check {
    const char* what;
    Same same;
    Show show;
  };
  std::vector<Check> checks = {{"collective operations",
                                [](const Request& a, const Request& b) { return a.op == b.op; },
                                [](const Request& q) { return std::string(op_name(q.op)); }}};
  bool ops_agree = all_equal(requests, checks[0].same);
  if (ops_agree) {
    checks.push_back({"data types", [](const Request& a, const Request& b) { return a.dtype == b.dtype; },
                      [](const Request& q) { return std::string(dtype_name(q.dtype)); }});
    if (first.op != OpType::kBarrier && first.op != OpType::kJoin && first.op != OpType::kAddProcessSet &&
        first.op != OpType::kRemoveProcessSet) {
      checks.push_back({"tensor locations",
                        [](const Request& a, const Request& b) { return a.on_device == b.on_device; },
                        [](const Request& q) { return std::string(q.on_device ? "CUDA memory" : "host memory"); }});
    }
    switch (first.op) {
      case OpType::kAllreduce:
      case OpType::kReducescatter:
        checks.push_back({"shapes", same_shape, [](const Request& q) { return shape_string(q.shape); }});
        checks.push_back({"reduce ops", [](const Request& a, const Request& b) { return a.reduce_op == b.reduce_op; },
                          [](const Request& q) { return std::string(reduce_op_name(q.reduce_op)); }});
        checks.push_back({"prescale factors",
                          [](const Request& a, const Request& b) { return same_factor(a.prescale, b.prescale); },
                          [](const Request& q) { return number(q.prescale); }});
        checks.push_back({"postscale factors",
                          [](const Request& a, const Request& b) { return same_factor(a.postscale, b.postscale); },
                          [](const Request& q) { return number(q.postscale); }});
        checks.push_back({"layouts of the packed tensors",
                          [](const Request& a, const Request& b) { return a.layout == b.layout; },
                          [](const Request& q) {
                            std::ostringstream s;
                            s << std::hex << q.layout;
                            return s.str();
                          }});
        break;
      case OpType::kBroadcast:
        checks.push_back({"shapes", same_shape, [](const Request& q) { return shape_string(q.shape); }});
        checks.push_back({"root ranks", [](const Request& a, const Request& b) { return a.root_rank == b.root_rank; },
                          [](const Request& q) { return std::to_string(q.root_rank); }});
        break;
      case OpType::kAllgather:
      case OpType::kAlltoall:
        checks.push_back({"shapes beyond the first dimension", same_trailing_shape, trailing_shape});
        break;
      case OpType::kAddProcessSet:
      case OpType::kRemoveProcessSet:
        checks.push_back({"process set arguments",
                          [](const Request& a, const Request& b) { return a.ranks == b.ranks; },
                          [](const Request& q) {
                            std::ostringstream s;
                            for (int32_t r : q.ranks) s << r << " ";
                            return s.str();
                          }});
        break;
      default:
        break;
    }
  }
  for (const Check& check : checks) {
    if (!all_equal(requests, check.same)) {
      return error_response(first, StatusCode::kMismatch,
                            std::string("Mismatched ") + check.what + " for " + subject + ": " +
                                describe_groups(requests, check.show) + ".");
    }
  }

  if (!joined.empty() && first.on_device) {
    return error_response(first, StatusCode::kInvalidArgument,
                          std::string(op_name(first.op)) + " of " + subject +
                              " is on CUDA devices while some ranks "
                              "have joined; join covers host tensors only (move the tensor to the CPU, or call join "
                              "after the last CUDA collective)");
  }
  if (!joined.empty()) {
    bool supported =
        first.op == OpType::kAllreduce || first.op == OpType::kAllgather ||
        (first.op == OpType::kBroadcast && std::find(joined.begin(), joined.end(), first.root_rank) == joined.end());
    if (!supported) {
      std::ostringstream ranks;
      for (size_t i = 0; i < joined.size(); ++i) ranks << (i ? ", " : "") << joined[i];
      return error_response(first, StatusCode::kInvalidArgument,
                            std::string(op_name(first.op)) + " of " + subject + " cannot run while rank(s) " +
                                ranks.str() +
                                " have joined (only allreduce, allgather and broadcast from a "
                                "non-joined root are supported)");
    }
  }

  Response r;
  r.op = first.op;
  r.dtype = first.dtype;
  r.reduce_op = first.reduce_op;
  r.root_rank = first.root_rank;
  r.process_set = first.process_set;
  r.prescale = first.prescale;
  r.postscale = first.postscale;
  r.shape = first.shape;
  r.elements = element_count_or_unknown(r.shape);
  r.shape_key = key_of_shape(r.shape);
  r.ranks = first.ranks;
  r.name = first.name;
  r.unnamed = first.unnamed;
  r.on_device = first.on_device;
  r.layout = first.layout;
  r.cacheable = first.cacheable && joined.empty() &&
                (first.op == OpType::kAllreduce || first.op == OpType::kAllgather || first.op == OpType::kBroadcast ||
                 first.op == OpType::kAlltoall || first.op == OpType::kReducescatter);
  r.joined.assign(joined.begin(), joined.end());
  std::sort(r.joined.begin(), r.joined.end());
  if (first.op == OpType::kAllgather) {
    r.first_dims.assign(members.size(), 0);
    for (const Request& q : requests) {
      size_t index = std::lower_bound(members.begin(), members.end(), q.rank) - members.begin();
      r.first_dims[index] = q.shape.empty() ? 0 : q.shape[0];
    }
  }
  return r;
}

}  // namespace hvdlite
