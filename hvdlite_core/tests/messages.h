// Requests and responses as the unit tests build them: the fields a test varies, the rest at their defaults.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/message.h"

namespace hvdlite {

inline Request req(int rank, OpType op, DType dtype, std::vector<int64_t> shape, std::string name = "grad") {
  Request q;
  q.rank = rank;
  q.op = op;
  q.dtype = dtype;
  q.shape = std::move(shape);
  q.name = std::move(name);
  return q;
}

inline Response resp(const std::string& name, int64_t elements, DType dtype = DType::kFloat32, int ps = 0) {
  Response r;
  r.name = name;
  r.shape = {elements};
  r.dtype = dtype;
  r.process_set = ps;
  return r;
}

}  // namespace hvdlite
