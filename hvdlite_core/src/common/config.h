// Every tunable of the core, declared once in config.cc's table and read once at init. Each knob is read from
// HVDLITE_<NAME>, falling back to HOROVOD_<NAME> so existing Horovod job scripts keep their tuning.
#pragma once
#include <cstdint>
#include <string>

namespace hvdlite {

// The response cache's largest capacity: the negotiation announces windows of its vote blocks in 16 bits of
// 64-position words (runtime/vote_exchange.h).
constexpr int64_t kMaxCachePositions = 0xffff * 64;

struct Config {
  int64_t fusion_threshold_bytes = 64 << 20;      // FUSION_THRESHOLD: fuse small allreduces up to this size
  int64_t fusion_tensor_limit_bytes = 256 << 10;  // FUSION_TENSOR_LIMIT: larger tensors are reduced unfused
  double cycle_time_ms = 1.0;                     // CYCLE_TIME: longest sleep of the background loop between cycles
  double idle_cycle_time_ms = 10.0;               // IDLE_CYCLE_TIME: the same once its cycles find nothing to do
                                                  // for a while (0: never lengthen; runtime/background_loop.cc)
  int64_t cache_capacity = 65536;                 // CACHE_CAPACITY: response cache entries; 0 disables the cache
  int64_t eager_allreduce_bytes = 4096;           // EAGER_ALLREDUCE_BYTES: cached allreduces that fit ride on the
                                                  // negotiation exchange (runtime/eager.h); 0: off; 16 KB at most
  double stall_warning_seconds = 60.0;            // STALL_CHECK_TIME_SECONDS: report tensors some ranks lack
  double stall_shutdown_seconds = 0.0;            // STALL_SHUTDOWN_TIME_SECONDS: fail them after this (0: never)
  double desync_timeout_seconds = 30.0;           // DESYNC_TIMEOUT_SECONDS: fail collectives ranks wait on crosswise
                                                  // after this (runtime/desync.h; 0: never)
  double peer_timeout_seconds = 5.0;         // PEER_TIMEOUT_SECONDS: a peer silent this long mid-operation is lost
  double peer_unreachable_seconds = 3.0;     // PEER_UNREACHABLE_SECONDS: a remote host that answers no TCP
                                             // heartbeat this long is lost, busy or not (0: kernel defaults)
  double start_timeout_seconds = 60.0;       // START_TIMEOUT: connecting the mesh at init
  int64_t small_message_bytes = 64 << 10;    // SMALL_MESSAGE_BYTES: latency-optimal algorithms below this
  int64_t shm_ring_bytes = 1 << 20;          // SHM_RING_BYTES: per-peer shared-memory ring size (1 MiB: the
                                             // data cycles through less cache than with a larger ring)
  int64_t streaming_store_bytes = 64 << 20;  // STREAMING_STORE_BYTES: a ring allreduce or allgather of at least
                                             // this many bytes receives into its result with streaming stores
                                             // (0: never). Unset, a job on one host takes a tuned table's
                                             // figure (tuning/table_file.h)
  bool streaming_store_bytes_set = false;    // whether the knob was given (then no tuned table overrides it)
  int64_t huge_page_bytes = 4 << 20;         // HUGE_PAGE_BYTES: a reused buffer of at least this many bytes that
                                      // peers read or write by single copy is moved onto transparent huge pages
                                      // (common/huge_page_promotion.h); the fusion buffer asks for them
                                      // from this size; 0: neither
  bool shm_disable = false;                       // SHM_DISABLE: use TCP even between ranks on one host
  bool cma_disable = false;                       // CMA_DISABLE: no single-copy cross-memory attach on one host
  int hierarchical_allreduce = -1;                // HIERARCHICAL_ALLREDUCE: two-tier allreduce where ranks span
                                                  // hosts with several on each: 1 or auto (unset), 0 never
  int hierarchical_allgather = -1;                // HIERARCHICAL_ALLGATHER: the same for allgather
  int64_t hierarchical_pipeline_bytes = 4 << 20;  // HIERARCHICAL_PIPELINE_BYTES: two-tier allreduce overlaps its
                                                  // host and network tiers over chunks of this size (0: no overlap)
  bool single_copy_allreduce = false;  // SINGLE_COPY_ALLREDUCE: one-host allreduces by cross-memory attach from
                                       // SMALL_MESSAGE_BYTES on
  int64_t single_copy_allreduce_bytes = 16 << 20;  // SINGLE_COPY_ALLREDUCE_BYTES: one-host allreduces of at
                                                   // least this many bytes by single copy (0: never)
  int allreduce_algorithms = 0;  // ALLREDUCE_ALGORITHMS: on one host, "tuned" kTuned: a tuned table where one was
                                 // written for this machine (tuning/table_file.h), else the fixed rules; "fixed":
                                 // the fixed rules (setting SMALL_MESSAGE_BYTES or SINGLE_COPY_ALLREDUCE[_BYTES]
                                 // implies it); one algorithm for every flat allreduce: kForcedRd and on
                                 // (choice/select.h); "measure": measure at init and write the tuned table
                                 // (python -m hvdlite.tune)
  static constexpr int kTuned = 0, kFixed = 1, kForcedRd = 2, kForcedRhd = 3, kForcedRing = 4, kForcedSingleCopy = 5,
                       kMeasure = 6;
  std::string algorithm_cache_dir;    // ALGORITHM_CACHE_DIR: where tuned tables are kept ("": $XDG_CACHE_HOME/hvdlite
                                      // or ~/.cache/hvdlite)
  int cpu_operations = 0;             // CPU_OPERATIONS: data plane for host tensors: builtin (Horovod's
                                      // "gloo" names it too) 0, mpi 1 (backends/backend.h)
  int gpu_operations = 0;             // GPU_OPERATIONS: data plane for CUDA tensors, one of:
  static constexpr int kGpuAuto = 0;  // NCCL, staged through host memory where ranks share a device
  static constexpr int kGpuNccl = 1;  // NCCL only: ranks sharing a device is an error
  static constexpr int kGpuHost = 2;  // always staged (runtime/staged_collectives.h)
  std::string mpi_plugin;             // MPI_PLUGIN: path of the MPI plugin ("": beside the core library)
  std::string cudart_library;         // CUDART_LIBRARY: CUDA runtime for CUDA tensors ("": search)
  std::string nccl_library;           // NCCL_LIBRARY: NCCL for CUDA tensors ("": search; gpu/cuda_api.h)
  int64_t spin_microseconds = 50;     // SPIN_MICROSECONDS: a caller waiting on its operation busy-waits
                                      // this long before sleeping. Unset, longer where the
                                      // machine's ranks have a CPU each (transport/caller_spin.h)
  bool spin_microseconds_set = false;         // whether the knob was given
  int64_t background_spin_microseconds = 5;   // BACKGROUND_SPIN_MICROSECONDS: the same, background thread
  bool autotune = false;                      // AUTOTUNE: search FUSION_THRESHOLD and CYCLE_TIME while the job
                                              // runs (runtime/autotuner.h)
  int64_t autotune_window_bytes = 128 << 20;  // AUTOTUNE_WINDOW_BYTES: allreduced bytes per measured window
  int64_t autotune_warmup_windows = 2;        // AUTOTUNE_WARMUP_WINDOWS: windows measured before the search
  std::string autotune_log;                   // AUTOTUNE_LOG: CSV of every window's score, written by rank 0
  std::string log_level = "warning";          // LOG_LEVEL: TRACE, DEBUG, INFO, WARNING, ERROR, FATAL (any case)
  bool log_hide_time = false;                 // LOG_HIDE_TIME: log lines without their time
  std::string timeline;                       // TIMELINE: Chrome-trace file written by rank 0 ("": off)
  bool timeline_mark_cycles = false;          // TIMELINE_MARK_CYCLES: mark each cycle that ran collectives

  static Config FromEnvironment();
  std::string Describe() const;    // "key=value;..." for --check-build style reports and debug logs
  static std::string KnobTable();  // "NAME\tdefault\tmeaning\n" per knob, for the generated docs/knobs.md
};

}  // namespace hvdlite
