#include "runtime/config_agreement.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "common/config.h"
#include "common/status.h"

namespace hvdlite {
namespace {

struct SharedKnob {
  const char* name;
  double (*read)(const Config&);
};

const std::vector<SharedKnob>& shared_knobs() {
  static const std::vector<SharedKnob> knobs = {
      {"FUSION_THRESHOLD", [](const Config& c) { return static_cast<double>(c.fusion_threshold_bytes); }},
      {"FUSION_TENSOR_LIMIT", [](const Config& c) { return static_cast<double>(c.fusion_tensor_limit_bytes); }},
      {"CACHE_CAPACITY", [](const Config& c) { return static_cast<double>(c.cache_capacity); }},
      {"EAGER_ALLREDUCE_BYTES", [](const Config& c) { return static_cast<double>(c.eager_allreduce_bytes); }},
      {"SMALL_MESSAGE_BYTES", [](const Config& c) { return static_cast<double>(c.small_message_bytes); }},
      {"SINGLE_COPY_ALLREDUCE", [](const Config& c) { return c.single_copy_allreduce ? 1.0 : 0.0; }},
      {"SINGLE_COPY_ALLREDUCE_BYTES",
       [](const Config& c) { return static_cast<double>(c.single_copy_allreduce_bytes); }},
      {"ALLREDUCE_ALGORITHMS", [](const Config& c) { return static_cast<double>(c.allreduce_algorithms); }},
      {"HIERARCHICAL_ALLREDUCE", [](const Config& c) { return static_cast<double>(c.hierarchical_allreduce); }},
      {"HIERARCHICAL_ALLGATHER", [](const Config& c) { return static_cast<double>(c.hierarchical_allgather); }},
      {"HIERARCHICAL_PIPELINE_BYTES",
       [](const Config& c) { return static_cast<double>(c.hierarchical_pipeline_bytes); }},
      {"CPU_OPERATIONS", [](const Config& c) { return static_cast<double>(c.cpu_operations); }},
      // Every member of a set must take the same data plane for its CUDA collectives.
      {"GPU_OPERATIONS", [](const Config& c) { return static_cast<double>(c.gpu_operations); }},
      // The autotuner's windows end at the same response on every rank, where they broadcast rank 0's choice.
      {"AUTOTUNE", [](const Config& c) { return c.autotune ? 1.0 : 0.0; }},
      {"AUTOTUNE_WINDOW_BYTES", [](const Config& c) { return static_cast<double>(c.autotune_window_bytes); }},
      {"AUTOTUNE_WARMUP_WINDOWS", [](const Config& c) { return static_cast<double>(c.autotune_warmup_windows); }},
  };
  return knobs;
}

std::string show(const char* name, double value) {
  if (std::string(name).rfind("HIERARCHICAL_", 0) == 0 && value < 0) return "auto";
  if (std::string(name) == "CPU_OPERATIONS") return value == 1 ? "mpi" : "builtin";
  if (std::string(name) == "GPU_OPERATIONS")
    return value == Config::kGpuNccl ? "nccl" : value == Config::kGpuHost ? "host" : "auto";
  if (std::string(name) == "ALLREDUCE_ALGORITHMS") {
    static const char* const names[] = {"tuned", "fixed", "rd", "rhd", "ring", "single_copy"};
    if (value >= 0 && value < 6) return names[static_cast<int>(value)];
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.15g", value);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

void check_config_agreement(Communicator& world, const Config& config) {
  const auto& knobs = shared_knobs();
  const size_t n = knobs.size();
  std::vector<double> mine(n), everyone(n * world.size());
  for (size_t k = 0; k < n; ++k) mine[k] = knobs[k].read(config);
  // The ring itself, not the dispatcher: which algorithm the dispatcher takes depends on the knobs being checked.
  std::copy(mine.begin(), mine.end(), everyone.begin() + world.rank() * n);
  allgather_ring(world, everyone.data(), std::vector<size_t>(world.size(), n * sizeof(double)));
  std::string problems;
  for (size_t k = 0; k < n; ++k) {
    std::map<double, std::vector<int>> holders;  // value -> the ranks that have it
    for (int r = 0; r < world.size(); ++r) holders[everyone[r * n + k]].push_back(world.global_rank(r));
    if (holders.size() < 2) continue;
    problems += (problems.empty() ? "" : "; ") + std::string("HVDLITE_") + knobs[k].name + " differs between ranks:";
    bool first = true;
    for (const auto& kv : holders) {
      problems += (first ? " " : ", ") + show(knobs[k].name, kv.first) + " on " + rank_list(kv.second);
      first = false;
    }
  }
  if (!problems.empty()) {
    throw Error(StatusCode::kInvalidArgument,
                problems +
                    ". Every rank must use the same value (each rank plans fusion, indexes the response "
                    "cache and chooses algorithms on its own); set it in the launcher's environment, not "
                    "per rank");
  }
}

}  // namespace hvdlite
