// What the links between ranks cost, for the alpha-beta model in choice/cost_model.h: a message of b bytes
// takes latency + b / bandwidth. Measured at init (cost_model.cc) and kept by the Mesh, whose links they describe.
#pragma once
#include <string>

namespace hvdlite {

struct LinkCosts {
  double local_latency_s = 0, local_bytes_per_s = 0;  // between two ranks on one host
  double cross_latency_s = 0, cross_bytes_per_s = 0;  // between hosts: one stream alone on a host's link
  bool known() const { return local_bytes_per_s > 0 && cross_bytes_per_s > 0; }
  // "local_latency_us=..;local_gbytes_per_s=..;cross_latency_us=..;cross_gbytes_per_s=.." ("" when unknown)
  std::string describe() const;
};

}  // namespace hvdlite
