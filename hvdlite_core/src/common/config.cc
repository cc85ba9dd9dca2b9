#include "common/config.h"

#include <algorithm>
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
    throw Error(StatusCode::kInvalidArgument, "environment variable HVDLITE_" + name + " (or HOROVOD_" + name +
                                                  ") is not a number: '" + text + "'");
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
  const char* meaning;  // one line for users (docs/knobs.md is generated from this table)
};

template <typename T>
Knob number_knob(const char* name, T Config::* field, const char* meaning) {
  return {name, [=](Config& c, const char* text) { c.*field = static_cast<T>(parse_number(name, text)); },
          [=](const Config& c) {
            std::ostringstream s;
            s << c.*field;
            return s.str();
          },
          meaning};
}

// A word from a fixed list (case-insensitive), stored as its number; shown as the first word with that number.
Knob choice_knob(const char* name, int Config::* field, std::vector<std::pair<std::string, int>> choices,
                 const char* explain, const char* meaning) {
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
            throw Error(StatusCode::kInvalidArgument,
                        std::string("HVDLITE_") + name + " (or HOROVOD_" + name + ") is '" + text + "'; " + explain);
          },
          [=](const Config& c) {
            for (const auto& choice : choices) {
              if (choice.second == c.*field) return choice.first;
            }
            return std::to_string(c.*field);
          },
          meaning};
}

Knob bool_knob(const char* name, bool Config::* field, const char* meaning) {
  return {name, [=](Config& c, const char* text) { c.*field = parse_bool(text); },
          [=](const Config& c) { return std::string(c.*field ? "1" : "0"); }, meaning};
}

Knob text_knob(const char* name, std::string Config::* field, const char* meaning) {
  return {name, [=](Config& c, const char* text) { c.*field = text; }, [=](const Config& c) { return c.*field; },
          meaning};
}

Knob auto_switch_knob(const char* name, int Config::* field, const char* meaning) {
  return {
      name,
      [=](Config& c, const char* text) { c.*field = std::string(text) == "auto" ? -1 : (parse_bool(text) ? 1 : 0); },
      [=](const Config& c) { return std::string(c.*field < 0 ? "auto"
                                                : c.*field   ? "1"
                                                             : "0"); }, meaning};
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      number_knob("FUSION_THRESHOLD", &Config::fusion_threshold_bytes,
                  "allreduces are fused into one buffer up to this many bytes"),
      number_knob("FUSION_TENSOR_LIMIT", &Config::fusion_tensor_limit_bytes,
                  "a tensor larger than this many bytes is reduced on its own, unfused"),
      number_knob("CYCLE_TIME", &Config::cycle_time_ms,
                  "longest sleep of the background loop between cycles, in milliseconds"),
      number_knob("IDLE_CYCLE_TIME", &Config::idle_cycle_time_ms,
                  "the same, once its own cycles have found nothing to do for a while (0: never lengthen)"),
      number_knob("CACHE_CAPACITY", &Config::cache_capacity,
                  "response cache entries (at most 4194240); 0 turns the cache off"),
      number_knob("EAGER_ALLREDUCE_BYTES", &Config::eager_allreduce_bytes,
                  "cached allreduces up to this many bytes in all travel inside the negotiation exchange (0: off; at "
                  "most 16384)"),
      number_knob("STALL_CHECK_TIME_SECONDS", &Config::stall_warning_seconds,
                  "warn about a tensor some ranks have not submitted after this long (0: never)"),
      number_knob("STALL_SHUTDOWN_TIME_SECONDS", &Config::stall_shutdown_seconds,
                  "fail a tensor stalled this long (0: never)"),
      // Horovod's switch for both stall checks (hvdlite-run --no-stall-check); after them, so that it wins.
      {"STALL_CHECK_DISABLE",
       [](Config& c, const char* text) {
         if (parse_bool(text)) c.stall_warning_seconds = c.stall_shutdown_seconds = 0;
       },
       [](const Config& c) {
         return std::string(c.stall_warning_seconds <= 0 && c.stall_shutdown_seconds <= 0 ? "1" : "0");
       },
       "1: neither warn about nor fail stalled tensors (both stall times 0)"},
      number_knob("DESYNC_TIMEOUT_SECONDS", &Config::desync_timeout_seconds,
                  "fail collectives that ranks wait on in crossed orders after this long (0: never)"),
      number_knob("PEER_TIMEOUT_SECONDS", &Config::peer_timeout_seconds,
                  "a peer silent this long in the middle of an operation is declared lost"),
      number_knob(
          "PEER_UNREACHABLE_SECONDS", &Config::peer_unreachable_seconds,
          "a remote host that answers no TCP heartbeat this long is declared lost (0: the kernel's defaults)"),
      number_knob("START_TIMEOUT", &Config::start_timeout_seconds, "seconds init waits for every rank to connect"),
      number_knob("SMALL_MESSAGE_BYTES", &Config::small_message_bytes,
                  "below this size the latency-optimal algorithms run (with ALLREDUCE_ALGORITHMS=fixed)"),
      number_knob("SHM_RING_BYTES", &Config::shm_ring_bytes,
                  "size of each shared-memory ring between two ranks of one host (at least 64 KiB; halved at init "
                  "where /dev/shm has no room)"),
      number_knob("STREAMING_STORE_BYTES", &Config::streaming_store_bytes,
                  "ring allreduces and allgathers of at least this many bytes write their result with streaming "
                  "stores (0: never; unset on one host: a tuned table's figure, else the default)"),
      number_knob("HUGE_PAGE_BYTES", &Config::huge_page_bytes,
                  "reused buffers of at least this many bytes that peers read by single copy move onto transparent "
                  "huge pages (0: never)"),
      bool_knob("SHM_DISABLE", &Config::shm_disable, "1: TCP even between ranks of one host"),
      bool_knob("CMA_DISABLE", &Config::cma_disable, "1: no single-copy (cross-memory attach) transfers on one host"),
      bool_knob("SINGLE_COPY_ALLREDUCE", &Config::single_copy_allreduce,
                "1: allreduces on one host by single copy from SMALL_MESSAGE_BYTES (implies "
                "ALLREDUCE_ALGORITHMS=fixed)"),
      number_knob("SINGLE_COPY_ALLREDUCE_BYTES", &Config::single_copy_allreduce_bytes,
                  "allreduces on one host of at least this many bytes run by single copy (0: never; implies "
                  "ALLREDUCE_ALGORITHMS=fixed)"),
      choice_knob("ALLREDUCE_ALGORITHMS", &Config::allreduce_algorithms,
                  {{"tuned", Config::kTuned},
                   {"fixed", Config::kFixed},
                   {"rd", Config::kForcedRd},
                   {"rhd", Config::kForcedRhd},
                   {"ring", Config::kForcedRing},
                   {"single_copy", Config::kForcedSingleCopy}},
                  "it takes tuned (this machine's tuned table where python -m hvdlite.tune wrote one, else the fixed "
                  "rules), fixed, or one algorithm: rd, rhd, ring or single_copy",
                  "tuned: the algorithm per size from this machine's tuned table (python -m hvdlite.tune), else the "
                  "fixed rules; fixed: SMALL_MESSAGE_BYTES and SINGLE_COPY_ALLREDUCE[_BYTES] decide; rd, rhd, ring "
                  "or single_copy: that algorithm for every flat allreduce it can run"),
      text_knob("ALGORITHM_CACHE_DIR", &Config::algorithm_cache_dir,
                "where tuned algorithm tables are kept (empty: $XDG_CACHE_HOME/hvdlite or ~/.cache/hvdlite)"),
      auto_switch_knob("HIERARCHICAL_ALLREDUCE", &Config::hierarchical_allreduce,
                       "two-tier allreduce where ranks span hosts with several on each: 1 or auto; 0: never"),
      auto_switch_knob("HIERARCHICAL_ALLGATHER", &Config::hierarchical_allgather, "the same for allgather"),
      number_knob("HIERARCHICAL_PIPELINE_BYTES", &Config::hierarchical_pipeline_bytes,
                  "two-tier allreduce overlaps its host and network tiers over chunks of this size (0: no overlap)"),
      choice_knob("CPU_OPERATIONS", &Config::cpu_operations, {{"builtin", 0}, {"gloo", 0}, {"tcp", 0}, {"mpi", 1}},
                  "hvdlite offers builtin (alias gloo) and mpi for host tensors",
                  "data plane for host tensors: builtin (also gloo, tcp) or mpi"),
      choice_knob("GPU_OPERATIONS", &Config::gpu_operations,
                  {{"auto", Config::kGpuAuto},
                   {"nccl", Config::kGpuNccl},
                   {"host", Config::kGpuHost},
                   {"mpi", Config::kGpuHost},
                   {"gloo", Config::kGpuHost}},
                  "hvdlite offers auto, nccl and host (alias mpi, gloo) for CUDA tensors",
                  "data plane for CUDA tensors: auto (NCCL, or staged through host memory where ranks share a "
                  "GPU), nccl (refuse to stage) or host (always staged; also mpi, gloo)"),
      text_knob("MPI_PLUGIN", &Config::mpi_plugin, "path of the MPI plugin (empty: found or compiled on first use)"),
      text_knob("CUDART_LIBRARY", &Config::cudart_library, "CUDA runtime library for CUDA tensors (empty: searched)"),
      text_knob("NCCL_LIBRARY", &Config::nccl_library, "NCCL library for CUDA tensors (empty: searched)"),
      number_knob("SPIN_MICROSECONDS", &Config::spin_microseconds,
                  "a framework thread waiting on its operation busy-waits this long before it sleeps (unset: "
                  "5000 where the job's ranks on this machine do not outnumber the CPUs each may run on, else 50)"),
      number_knob("BACKGROUND_SPIN_MICROSECONDS", &Config::background_spin_microseconds,
                  "the same for the background thread"),
      text_knob("LOG_LEVEL", &Config::log_level, "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL, either case"),
      bool_knob("LOG_HIDE_TIME", &Config::log_hide_time, "1: log lines without their time"),
      text_knob("TIMELINE", &Config::timeline, "rank 0 writes a Chrome-trace timeline to this file (empty: off)"),
      bool_knob("TIMELINE_MARK_CYCLES", &Config::timeline_mark_cycles,
                "1: mark each background cycle that ran collectives in the timeline"),
      bool_knob("AUTOTUNE", &Config::autotune, "1: search FUSION_THRESHOLD and CYCLE_TIME while the job runs"),
      number_knob("AUTOTUNE_WINDOW_BYTES", &Config::autotune_window_bytes,
                  "allreduced bytes per scored autotuning window"),
      number_knob("AUTOTUNE_WARMUP_WINDOWS", &Config::autotune_warmup_windows,
                  "windows left out before the autotuner's search starts"),
      text_knob("AUTOTUNE_LOG", &Config::autotune_log,
                "rank 0 writes every scored autotuning window to this CSV file"),
  };
  return table;
}

}  // namespace

Config Config::FromEnvironment() {
  Config config;
  for (const Knob& knob : knobs()) {
    if (const char* text = lookup(knob.name)) knob.apply(config, text);
  }
  // A user who set the fixed rules keeps them: the knobs override a tuned table.
  if (!lookup("ALLREDUCE_ALGORITHMS") &&
      (lookup("SMALL_MESSAGE_BYTES") || lookup("SINGLE_COPY_ALLREDUCE") || lookup("SINGLE_COPY_ALLREDUCE_BYTES"))) {
    config.allreduce_algorithms = Config::kFixed;
  }
  config.streaming_store_bytes_set = lookup("STREAMING_STORE_BYTES") != nullptr;
  config.spin_microseconds_set = lookup("SPIN_MICROSECONDS") != nullptr;
  if (config.shm_ring_bytes < 64 << 10) config.shm_ring_bytes = 64 << 10;
  // Past a few kilobytes an exchange is no longer pure latency, and every cycle that carries the region pays for it.
  config.eager_allreduce_bytes = std::min<int64_t>(config.eager_allreduce_bytes, 16 << 10);
  // The negotiation announces windows of the cache's vote blocks in 16 bits of 64-position words.
  config.cache_capacity = std::min<int64_t>(config.cache_capacity, kMaxCachePositions);
  if (config.cycle_time_ms <= 0) config.cycle_time_ms = 0.1;
  return config;
}

std::string Config::KnobTable() {
  const Config defaults;
  std::ostringstream out;
  for (const Knob& knob : knobs()) out << knob.name << '\t' << knob.show(defaults) << '\t' << knob.meaning << '\n';
  return out.str();
}

std::string Config::Describe() const {
  std::ostringstream out;
  for (const Knob& knob : knobs()) out << knob.name << "=" << knob.show(*this) << ";";
  return out.str();
}

}  // namespace hvdlite
