#include "runtime/message.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <string_view>

namespace hvdlite {

const char* op_name(OpType op) {
  static const char* const names[kNumOpTypes] = {"allreduce", "allgather",       "broadcast",
                                                 "alltoall",  "reducescatter",   "barrier",
                                                 "join",      "add_process_set", "remove_process_set"};
  int i = static_cast<int>(op);
  if (op == OpType::kAbort) return "abort";
  return (i >= 0 && i < kNumOpTypes) ? names[i] : "unknown";
}

namespace {
constexpr std::string_view kAutoNameInfix = ".noname.";
}  // namespace

void auto_name_into(std::string& out, OpType op, int64_t n) {
  char number[24];
  out.assign(op_name(op)).append(kAutoNameInfix).append(number, std::to_chars(number, number + sizeof number, n).ptr);
}

bool has_auto_name_form(OpType op, const std::string& name) {
  const std::string_view op_text = op_name(op);
  const std::string_view text = name;
  return text.size() > op_text.size() + kAutoNameInfix.size() && text.substr(0, op_text.size()) == op_text &&
         text.substr(op_text.size(), kAutoNameInfix.size()) == kAutoNameInfix;
}

const char* reduce_op_name(ReduceOp op) {
  static const char* const names[] = {"Sum", "Average", "Min", "Max", "Product", "Adasum"};
  int i = static_cast<int>(op);
  return (i >= 0 && i < 6) ? names[i] : "unknown";
}

void Request::write(WireWriter& w) const {
  w.put<int32_t>(rank);
  w.put<int32_t>(static_cast<int32_t>(op));
  w.put<int32_t>(static_cast<int32_t>(dtype));
  w.put<int32_t>(static_cast<int32_t>(reduce_op));
  w.put<int32_t>(root_rank);
  w.put<int32_t>(process_set);
  w.put<double>(prescale);
  w.put<double>(postscale);
  w.put_vector(shape);
  w.put_vector(ranks);
  w.put_string(name);
  w.put<uint8_t>(cacheable ? 1 : 0);
  w.put<uint8_t>(unnamed ? 1 : 0);
  w.put<uint8_t>(on_device ? 1 : 0);
  w.put<double>(waited_seconds);
  w.put<uint64_t>(layout);
}

namespace {

// Enum fields are checked as they are read: everything downstream (names, sizes, kernels) indexes by them.
OpType read_op(WireReader& r) {
  int32_t v = r.get<int32_t>();
  if ((v < 0 || v >= kNumOpTypes) && v != static_cast<int32_t>(OpType::kAbort)) {
    throw Error(StatusCode::kInternal, "malformed negotiation message: operation " + std::to_string(v));
  }
  return static_cast<OpType>(v);
}

DType read_dtype(WireReader& r) {
  int32_t v = r.get<int32_t>();
  if (v < 0 || v >= kNumDTypes) {
    throw Error(StatusCode::kInternal, "malformed negotiation message: dtype " + std::to_string(v));
  }
  return static_cast<DType>(v);
}

ReduceOp read_reduce_op(WireReader& r) {
  int32_t v = r.get<int32_t>();
  if (v < 0 || v > static_cast<int32_t>(ReduceOp::kAdasum)) {
    throw Error(StatusCode::kInternal, "malformed negotiation message: reduce op " + std::to_string(v));
  }
  return static_cast<ReduceOp>(v);
}

}  // namespace

Request Request::Read(WireReader& r) {
  Request q;
  q.rank = r.get<int32_t>();
  q.op = read_op(r);
  q.dtype = read_dtype(r);
  q.reduce_op = read_reduce_op(r);
  q.root_rank = r.get<int32_t>();
  q.process_set = r.get<int32_t>();
  q.prescale = r.get<double>();
  q.postscale = r.get<double>();
  q.shape = r.get_vector<int64_t>();
  q.shape_key = key_of_shape(q.shape);
  q.ranks = r.get_vector<int32_t>();
  q.name = r.get_string();
  q.cacheable = r.get<uint8_t>() != 0;
  q.unnamed = r.get<uint8_t>() != 0;
  q.on_device = r.get<uint8_t>() != 0;
  q.waited_seconds = r.get<double>();
  q.layout = r.get<uint64_t>();
  return q;
}

void Response::write(WireWriter& w) const {
  w.put<uint8_t>(is_error ? 1 : 0);
  w.put<int32_t>(error_code);
  w.put_string(error);
  w.put<int32_t>(static_cast<int32_t>(op));
  w.put<int32_t>(static_cast<int32_t>(dtype));
  w.put<int32_t>(static_cast<int32_t>(reduce_op));
  w.put<int32_t>(root_rank);
  w.put<int32_t>(process_set);
  w.put<double>(prescale);
  w.put<double>(postscale);
  w.put_vector(shape);
  w.put_vector(first_dims);
  w.put_vector(joined);
  w.put_vector(ranks);
  w.put_string(name);
  w.put<uint8_t>(cacheable ? 1 : 0);
  w.put<uint8_t>(unnamed ? 1 : 0);
  w.put<uint8_t>(on_device ? 1 : 0);
  w.put<uint64_t>(layout);
}

Response Response::Read(WireReader& r) {
  Response s;
  s.is_error = r.get<uint8_t>() != 0;
  s.error_code = r.get<int32_t>();
  s.error = r.get_string();
  s.op = read_op(r);
  s.dtype = read_dtype(r);
  s.reduce_op = read_reduce_op(r);
  s.root_rank = r.get<int32_t>();
  s.process_set = r.get<int32_t>();
  s.prescale = r.get<double>();
  s.postscale = r.get<double>();
  s.shape = r.get_vector<int64_t>();
  s.elements = element_count_or_unknown(s.shape);
  s.shape_key = key_of_shape(s.shape);
  s.first_dims = r.get_vector<int64_t>();
  s.joined = r.get_vector<int32_t>();
  s.ranks = r.get_vector<int32_t>();
  s.name = r.get_string();
  s.cacheable = r.get<uint8_t>() != 0;
  s.unnamed = r.get<uint8_t>() != 0;
  s.on_device = r.get<uint8_t>() != 0;
  s.layout = r.get<uint64_t>();
  return s;
}

Response Response::Failure(const Request& about, int32_t code, std::string message) {
  Response r;
  r.is_error = true;
  r.error_code = code;
  r.error = std::move(message);
  r.op = about.op;
  r.name = about.name;
  r.process_set = about.process_set;
  r.cacheable = false;
  return r;
}

bool Response::matches(const Request& q, int member_index, bool same_name) const {
  // An unnamed request's name is its own; what it carries is compared below.
  if (is_error || q.op != op || q.dtype != dtype || q.process_set != process_set || q.unnamed != unnamed ||
      (!unnamed && !same_name && q.name != name) || q.on_device != on_device) {
    return false;
  }
  switch (op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      return same_shape(q) && q.reduce_op == reduce_op && q.prescale == prescale && q.postscale == postscale &&
             q.layout == layout;
    case OpType::kBroadcast:
      return same_shape(q) && q.root_rank == root_rank;
    case OpType::kAllgather:
      return member_index >= 0 && member_index < static_cast<int>(first_dims.size()) && !q.shape.empty() &&
             q.shape.size() == shape.size() && q.shape[0] == first_dims[member_index] &&
             std::equal(q.shape.begin() + 1, q.shape.end(), shape.begin() + 1);
    case OpType::kAlltoall:
      return q.shape.size() == shape.size() && !q.shape.empty() &&
             std::equal(q.shape.begin() + 1, q.shape.end(), shape.begin() + 1);
    default:
      return false;
  }
}

namespace {

void append_unnamed_cache_name(std::string& name, OpType op, DType dtype, ReduceOp reduce_op, int32_t root_rank,
                               double prescale, double postscale, const std::vector<int64_t>& shape, bool on_device,
                               uint64_t layout) {
  // Rows of an allgather or alltoall may differ by member: only the other dimensions are the same everywhere.
  const bool by_rows = op == OpType::kAllgather || op == OpType::kAlltoall;
  name += op_name(op);
  name += ".noname(";
  name += dtype_name(dtype);
  name += " [";
  char number[32];
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) name += ", ";
    if (i == 0 && by_rows) {
      name += '*';
      continue;
    }
    name.append(number, std::to_chars(number, number + sizeof number, shape[i]).ptr);
  }
  name += ']';
  if (op == OpType::kAllreduce || op == OpType::kReducescatter) {
    name += ' ';
    name += reduce_op_name(reduce_op);
    if (prescale != 1.0 || postscale != 1.0) {
      name += " scaled ";
      name.append(number, std::to_chars(number, number + sizeof number, prescale).ptr);
      name += ' ';
      name.append(number, std::to_chars(number, number + sizeof number, postscale).ptr);
    }
    if (layout != 0) {
      name += " packed ";
      name.append(number, std::to_chars(number, number + sizeof number, layout, 16).ptr);
    }
  } else if (op == OpType::kBroadcast) {
    name += " from ";
    name.append(number, std::to_chars(number, number + sizeof number, root_rank).ptr);
  }
  if (on_device) name += " on device";
  name += ')';
}

}  // namespace

void append_unnamed_cache_name(std::string& out, const Request& q) {
  append_unnamed_cache_name(out, q.op, q.dtype, q.reduce_op, q.root_rank, q.prescale, q.postscale, q.shape,
                            q.on_device, q.layout);
}

std::string unnamed_cache_name(const Request& q) {
  std::string name;
  append_unnamed_cache_name(name, q);
  return name;
}

std::string unnamed_cache_name(const Response& r) {
  std::string name;
  append_unnamed_cache_name(name, r.op, r.dtype, r.reduce_op, r.root_rank, r.prescale, r.postscale, r.shape,
                            r.on_device, r.layout);
  return name;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t element_count_or_unknown(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

namespace {

bool fits(int64_t dim, int bits) { return dim >= 0 && dim < (int64_t{1} << bits); }

}  // namespace

uint64_t key_of_shape(const int64_t* d, size_t ndim) {
  // None is kUnknownShapeKey: a packed key has a zero among its top two bits or, with three dimensions, in bits 60
  // and 61.
  switch (ndim) {
    case 0:
      return 0;
    case 1:
      if (fits(d[0], 62)) return (uint64_t{1} << 62) | static_cast<uint64_t>(d[0]);
      break;
    case 2:
      if (fits(d[0], 31) && fits(d[1], 31))
        return (uint64_t{2} << 62) | (static_cast<uint64_t>(d[0]) << 31) | static_cast<uint64_t>(d[1]);
      break;
    case 3:
      if (fits(d[0], 20) && fits(d[1], 20) && fits(d[2], 20))
        return (uint64_t{3} << 62) | (static_cast<uint64_t>(d[0]) << 40) | (static_cast<uint64_t>(d[1]) << 20) |
               static_cast<uint64_t>(d[2]);
      break;
    default:
      break;
  }
  return kUnknownShapeKey;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

}  // namespace hvdlite
