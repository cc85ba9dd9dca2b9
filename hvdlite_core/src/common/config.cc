#include "common/config.h"

#include <cctype>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "common/status.h"

namespace hvdlite {
namespace {

const char* lookup(const std::string& name) {
  for (const char* prefix : {"HVDLITE_", "HOROVOD_"}) {
    if (const char* value = std::getenv((prefix + name).c_str())) {
      if (*value) return value;
    }
  }
  return nullptr;
}

double parse_number(const std::string& name, const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || *end != '\0') {
    throw Error(StatusCode::kInvalidArgument,
                "environment variable HVDLITE_" + name + " (or HOROVOD_" + name + ") is not a number: '" + text + "'");
  }
  return value;
}

bool parse_bool(const char* text) {
  std::string v(text);
  return !(v == "0" || v == "false" || v == "False" || v == "no" || v == "off");
}

struct Knob {
  const char* name;
  std::function<void(Config&, const char*)> apply;
  std::function<std::string(const Config&)> show;
};

template <typename T>
Knob number_knob(const char* name, T Config::*field, double scale = 1.0) {
  return {name,
          [=](Config& c, const char* text) { c.*field = static_cast<T>(parse_number(name, text) * scale); },
          [=](const Config& c) { std::ostringstream s; s << c.*field; return s.str(); }};
}

// A word from a fixed list (case-insensitive), stored as its number; shown as the first word with that number.
Knob choice_knob(const char* name, int Config::*field, std::vector<std::pair<std::string, int>> choices,
                 const char* explain) {
  return {name,
          [=](Config& c, const char* text) {
            std::string v(text);
            for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
            for (const auto& choice : choices) {
              if (choice.first == v) {
                c.*field = choice.second;
                return;
              }
            }
            throw Error(StatusCode::kInvalidArgument, std::string("HVDLITE_") + name + " (or HOROVOD_" + name +
                                                          ") is '" + text + "'; " + explain);
          },
          [=](const Config& c) {
            for (const auto& choice : choices) {
              if (choice.second == c.*field) return choice.first;
            }
            return std::to_string(c.*field);
          }};
}

Knob bool_knob(const char* name, bool Config::*field) {
  return {name, [=](Config& c, const char* text) { c.*field = parse_bool(text); },
          [=](const Config& c) { return std::string(c.*field ? "1" : "0"); }};
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      number_knob("FUSION_THRESHOLD", &Config::fusion_threshold_bytes),
      number_knob("FUSION_TENSOR_LIMIT", &Config::fusion_tensor_limit_bytes),
      number_knob("CYCLE_TIME", &Config::cycle_time_ms),
      number_knob("IDLE_CYCLE_TIME", &Config::idle_cycle_time_ms),
      number_knob("CACHE_CAPACITY", &Config::cache_capacity),
      number_knob("EAGER_ALLREDUCE_BYTES", &Config::eager_allreduce_bytes),
      number_knob("STALL_CHECK_TIME_SECONDS", &Config::stall_warning_seconds),
      number_knob("STALL_SHUTDOWN_TIME_SECONDS", &Config::stall_shutdown_seconds),
      number_knob("DESYNC_TIMEOUT_SECONDS", &Config::desync_timeout_seconds),
      number_knob("PEER_TIMEOUT_SECONDS", &Config::peer_timeout_seconds),
      number_knob("PEER_UNREACHABLE_SECONDS", &Config::peer_unreachable_seconds),
      number_knob("START_TIMEOUT", &Config::start_timeout_seconds),
      number_knob("SMALL_MESSAGE_BYTES", &Config::small_message_bytes),
      number_knob("SHM_RING_BYTES", &Config::shm_ring_bytes),
      number_knob("STREAMING_STORE_BYTES", &Config::streaming_store_bytes),
      number_knob("HUGE_PAGE_BYTES", &Config::huge_page_bytes),
      bool_knob("SHM_DISABLE", &Config::shm_disable),
      bool_knob("CMA_DISABLE", &Config::cma_disable),
      bool_knob("SINGLE_COPY_ALLREDUCE", &Config::single_copy_allreduce),
      choice_knob("ALLREDUCE_ALGORITHMS", &Config::allreduce_algorithms, {{"measured", 0}, {"auto", 0}, {"fixed", 1}},
                  "it takes measured (choose per size from this machine's figures) or fixed"),
      number_knob("ADAPTIVE_ALLREDUCE_BYTES", &Config::adaptive_allreduce_bytes),
      {"ALGORITHM_CACHE_DIR", [](Config& c, const char* text) { c.algorithm_cache_dir = text; },
       [](const Config& c) { return c.algorithm_cache_dir; }},
      {"HIERARCHICAL_ALLREDUCE",
       [](Config& c, const char* text) {
         c.hierarchical_allreduce = std::string(text) == "auto" ? -1 : (parse_bool(text) ? 1 : 0);
       },
       [](const Config& c) {
         return std::string(c.hierarchical_allreduce < 0 ? "auto" : c.hierarchical_allreduce ? "1" : "0");
       }},
      {"HIERARCHICAL_ALLGATHER",
       [](Config& c, const char* text) {
         c.hierarchical_allgather = std::string(text) == "auto" ? -1 : (parse_bool(text) ? 1 : 0);
       },
       [](const Config& c) {
         return std::string(c.hierarchical_allgather < 0 ? "auto" : c.hierarchical_allgather ? "1" : "0");
       }},
      number_knob("HIERARCHICAL_PIPELINE_BYTES", &Config::hierarchical_pipeline_bytes),
      number_knob("LOCAL_LATENCY_US", &Config::local_latency_us),
      number_knob("LOCAL_GBYTES_PER_S", &Config::local_gbytes_per_s),
      number_knob("CROSS_LATENCY_US", &Config::cross_latency_us),
      number_knob("CROSS_GBYTES_PER_S", &Config::cross_gbytes_per_s),
      choice_knob("CPU_OPERATIONS", &Config::cpu_operations, {{"builtin", 0}, {"gloo", 0}, {"tcp", 0}, {"mpi", 1}},
                  "hvdlite offers builtin (alias gloo) and mpi for host tensors"),
      {"MPI_PLUGIN", [](Config& c, const char* text) { c.mpi_plugin = text; },
       [](const Config& c) { return c.mpi_plugin; }},
      {"CUDART_LIBRARY", [](Config& c, const char* text) { c.cudart_library = text; },
       [](const Config& c) { return c.cudart_library; }},
      {"NCCL_LIBRARY", [](Config& c, const char* text) { c.nccl_library = text; },
       [](const Config& c) { return c.nccl_library; }},
      number_knob("SPIN_MICROSECONDS", &Config::spin_microseconds),
      number_knob("BACKGROUND_SPIN_MICROSECONDS", &Config::background_spin_microseconds),
      {"LOG_LEVEL", [](Config& c, const char* text) { c.log_level = text; },
       [](const Config& c) { return c.log_level; }},
      bool_knob("LOG_HIDE_TIME", &Config::log_hide_time),
      {"TIMELINE", [](Config& c, const char* text) { c.timeline = text; },
       [](const Config& c) { return c.timeline; }},
      bool_knob("TIMELINE_MARK_CYCLES", &Config::timeline_mark_cycles),
      bool_knob("AUTOTUNE", &Config::autotune),
      number_knob("AUTOTUNE_WINDOW_BYTES", &Config::autotune_window_bytes),
      number_knob("AUTOTUNE_WARMUP_WINDOWS", &Config::autotune_warmup_windows),
      {"AUTOTUNE_LOG", [](Config& c, const char* text) { c.autotune_log = text; },
       [](const Config& c) { return c.autotune_log; }},
  };
  return table;
}

}  // namespace

Config Config::FromEnvironment() {
  Config config;
  for (const Knob& knob : knobs()) {
    if (const char* text = lookup(knob.name)) knob.apply(config, text);
  }
  // A user who tuned the fixed rules keeps them: the knobs override the measured choice.
  if (!lookup("ALLREDUCE_ALGORITHMS") && (lookup("SMALL_MESSAGE_BYTES") || lookup("SINGLE_COPY_ALLREDUCE"))) {
    config.allreduce_algorithms = 1;
  }
  config.streaming_store_bytes_set = lookup("STREAMING_STORE_BYTES") != nullptr;
  config.adaptive_allreduce_bytes_set = lookup("ADAPTIVE_ALLREDUCE_BYTES") != nullptr;
  // Horovod's switch for both stall checks (hvdlite-run --no-stall-check); 0 seconds turns each off.
  if (const char* text = lookup("STALL_CHECK_DISABLE")) {
    if (parse_bool(text)) config.stall_warning_seconds = config.stall_shutdown_seconds = 0;
  }
  if (config.shm_ring_bytes < 64 << 10) config.shm_ring_bytes = 64 << 10;
  if (config.cycle_time_ms <= 0) config.cycle_time_ms = 0.1;
  return config;
}

std::string Config::Describe() const {
  std::ostringstream out;
  for (const Knob& knob : knobs()) out << knob.name << "=" << knob.show(*this) << ";";
  return out.str();
}

}  // namespace hvdlite
