#include "backends/mpi_backend.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "../../plugins/mpi/mpi_plugin_abi.h"
#include "collectives/algorithms.h"
#include "common/status.h"

namespace hvdlite {
namespace {

std::atomic<bool> g_thread_multiple{false};

const hvdlite_mpi_plugin* g_plugin = nullptr;

MpiAvailability probe(const Config& config) {
  MpiAvailability a;
  a.path = config.mpi_plugin;
  if (a.path.empty()) {
    // The Python package compiles the plugin for this machine's MPI and names it here (hvdlite/common/mpi_plugin.py).
    a.why_not =
        "no MPI plugin was given (HVDLITE_MPI_PLUGIN); hvdlite compiles one on first use where an MPI's "
        "compiler wrapper mpicc is on PATH: apt-get install -y openmpi-bin libopenmpi-dev";
    return a;
  }
  a.built = true;
  // RTLD_GLOBAL: Open MPI's own components, loaded later by libmpi, resolve their symbols in the global scope.
  void* library = dlopen(a.path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!library) {
    const char* why = dlerror();
    a.why_not = "the MPI plugin " + a.path + " does not load: " + (why ? why : "unknown dlopen error") +
                " (is the MPI library it was built with installed and on the library path?)";
    return a;
  }
  auto entry = reinterpret_cast<const hvdlite_mpi_plugin* (*)()>(dlsym(library, "hvdlite_mpi_plugin_v1"));
  const hvdlite_mpi_plugin* plugin = entry ? entry() : nullptr;
  if (!plugin || plugin->abi_version != HVDLITE_MPI_PLUGIN_ABI_VERSION) {
    a.why_not = a.path + " is not an hvdlite MPI plugin of this version (ABI " +
                std::to_string(HVDLITE_MPI_PLUGIN_ABI_VERSION) + "); reinstall hvdlite";
    return a;
  }
  g_plugin = plugin;
  a.usable = true;
  a.library_version = plugin->library_version();
  return a;
}

void reduce_callback(int dtype, int kind, void* inout, const void* in, size_t count) {
  reduce_into(static_cast<DType>(dtype), static_cast<ReduceKind>(kind), inout, in, count);
}

int kind_code(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kMin:
      return 1;
    case ReduceKind::kMax:
      return 2;
    case ReduceKind::kProduct:
      return 3;
    default:
      return 0;
  }
}

class MpiBackend : public Backend {
 public:
  explicit MpiBackend(const hvdlite_mpi_plugin* plugin) : plugin_(plugin) {}
  ~MpiBackend() override {
    plugin_->stop();
    g_thread_multiple = false;
  }

  const char* name() const override { return "mpi"; }

  void set_added(int set, Communicator& comm) override {
    std::vector<int32_t> ranks(comm.members().begin(), comm.members().end());
    check(plugin_->add_set(set, ranks.data(), static_cast<int>(ranks.size())));
  }
  void set_removed(int set) override { check(plugin_->remove_set(set)); }

  const char* allreduce(int set, Communicator& comm, const void* input, void* output, size_t count, DType dtype,
                        ReduceKind kind, double postscale) override {
    if (count > 0 && comm.size() > 1) {
      check(plugin_->allreduce(set, input, output, count, static_cast<int>(dtype), kind_code(kind)));
    } else if (input != output && count > 0) {
      std::memcpy(output, input, count * dtype_size(dtype));
    }
    if (postscale != 1.0) scale_in_place(dtype, output, count, postscale);
    return "";  // MPI chooses its own algorithms
  }

  void adasum(int set, Communicator& comm, void* buffer, const std::vector<size_t>& tensor_counts,
              DType dtype) override {
    PluginPairs pairs(plugin_, set, comm);
    const size_t bytes = adasum_scratch_bytes(tensor_counts, dtype);
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    allreduce_adasum(pairs, buffer, tensor_counts, dtype, scratch_.data());
  }

  const char* allgather(int set, Communicator& comm, const void* input, void* output,
                        const std::vector<size_t>& block_bytes) override {
    check(plugin_->allgatherv(set, input, output, block_bytes.data()));
    return "";
  }

  void broadcast(int set, Communicator& comm, void* buffer, size_t bytes, int root_index) override {
    if (bytes > 0 && comm.size() > 1) check(plugin_->bcast(set, buffer, bytes, root_index));
  }

  void alltoall(int set, Communicator& comm, const void* input, const std::vector<size_t>& send_bytes, void* output,
                const std::vector<size_t>& recv_bytes) override {
    check(plugin_->alltoallv(set, input, send_bytes.data(), output, recv_bytes.data()));
  }

  void reduce_scatter(int set, Communicator& comm, void* work, void* mine, const std::vector<size_t>& counts,
                      DType dtype, ReduceKind kind) override {
    check(plugin_->reduce_scatter(set, work, mine, counts.data(), static_cast<int>(dtype), kind_code(kind)));
  }

  std::string describe() const override {
    return std::string("cpu_operations=mpi;mpi_library=") + plugin_->library_version();
  }

 private:
  class PluginPairs : public PointToPoint {
   public:
    PluginPairs(const hvdlite_mpi_plugin* plugin, int set, Communicator& comm)
        : plugin_(plugin), set_(set), comm_(comm) {}
    int rank() const override { return comm_.rank(); }
    int size() const override { return comm_.size(); }
    void sendrecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override {
      check(plugin_->sendrecv(set_, peer, send, send_bytes, recv, recv_bytes));
    }

   private:
    const hvdlite_mpi_plugin* plugin_;
    int set_;
    Communicator& comm_;
  };

  // 2: refused before anything was sent (every member refuses alike); else MPI failed mid-call: fatal.
  static void check(int code) {
    if (code == 0) return;
    throw Error(code == 2 ? StatusCode::kInvalidArgument : StatusCode::kRemoteError, g_plugin->last_error());
  }

  const hvdlite_mpi_plugin* plugin_;
  std::vector<char> scratch_;
};

}  // namespace

// Probed again when asked about another plugin path, until one has loaded: the plugin may be built after a first
// question (hvd.nccl_built() before hvd.mpi_built()). A loaded plugin stays: MPI cannot be started twice.
MpiAvailability mpi_availability(const Config& config) {
  static std::mutex mutex;
  static MpiAvailability availability;
  static bool probed = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!probed || (!availability.usable && availability.path != config.mpi_plugin)) {
    availability = probe(config);
    probed = true;
  }
  return availability;
}

std::unique_ptr<Backend> make_mpi_backend(const Config& config, Communicator& world, const void* comm_address) {
  const MpiAvailability& mpi = mpi_availability(config);
  // Every rank learns who could load the plugin before anyone enters MPI.
  std::vector<int32_t> loaded(world.size(), 0);
  loaded[world.rank()] = mpi.usable ? 1 : 0;
  if (world.size() > 1) allgather_ring(world, loaded.data(), std::vector<size_t>(world.size(), sizeof(int32_t)));
  if (!mpi.usable) {
    throw Error(StatusCode::kInvalidArgument, "HVDLITE_CPU_OPERATIONS=mpi, but " + mpi.why_not);
  }
  std::string missing;
  for (int r = 0; r < world.size(); ++r) {
    if (!loaded[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(world.global_rank(r));
  }
  if (!missing.empty()) {
    throw Error(StatusCode::kInvalidArgument,
                "HVDLITE_CPU_OPERATIONS=mpi, but the MPI backend is not available on rank(s) " + missing +
                    " (their errors say why); every rank needs it");
  }
  int multiple = 0;
  if (g_plugin->start(comm_address, world.rank(), world.size(), &reduce_callback, &multiple) != 0) {
    throw Error(StatusCode::kInvalidArgument, g_plugin->last_error());
  }
  g_thread_multiple = multiple != 0;
  return std::unique_ptr<Backend>(new MpiBackend(g_plugin));
}

bool mpi_thread_multiple() { return g_thread_multiple.load(); }

}  // namespace hvdlite
