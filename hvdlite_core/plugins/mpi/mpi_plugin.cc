// The MPI data plane: hvdlite's collectives as MPI calls on one communicator per process set.
//
// Compiled against the MPI that setup.py found (mpicxx/mpicc) and loaded by the core with dlopen, only when a
// job asks for it (mpi_plugin_abi.h says why). Communicators: a duplicate of the job's communicator for set 0,
// MPI_Comm_split of it for every other set (collective over the job, which is why process sets are added by
// every rank); their error handler returns codes, which become messages naming the MPI call.
//
// Types: MPI's built-in types and operators where MPI has them (Open MPI's reductions are its own vectorised
// loops); float16, bfloat16 and bool travel as opaque contiguous types with user-defined operators that call
// the core's reduction, so they reduce exactly as on the built-in backend.
//
// MPI counts are int: allreduce and bcast go in chunks of at most 2^30 elements/bytes; the variable-size
// collectives fail with a clear message past 2 GiB per block.
// MPI's C API only: its deprecated C++ bindings would add a library to link and warnings to read.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "mpi_plugin_abi.h"

namespace {

thread_local std::string g_error;
hvdlite_reduce_fn g_reduce = nullptr;
std::map<int, MPI_Comm> g_comms;  // set id -> communicator (MPI_COMM_NULL: this rank is not a member)
MPI_Datatype g_half = MPI_DATATYPE_NULL, g_bfloat = MPI_DATATYPE_NULL, g_bool = MPI_DATATYPE_NULL;
MPI_Op g_custom_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
bool g_started = false;

constexpr size_t kChunk = size_t(1) << 30;  // elements or bytes per MPI call (MPI counts are int)

// hvdlite_dtype values (hvdlite.h)
enum {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,
  kUInt16 = 9,
  kInt16 = 10
};

int fail(const std::string& message) {
  g_error = message;
  return 1;
}

// Refused before anything was sent: every member refuses alike (the arguments are negotiated), so the job goes on.
int refuse(const std::string& message) {
  g_error = message;
  return 2;
}

int check(int code, const char* call) {
  if (code == MPI_SUCCESS) return 0;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return fail(std::string("MPI backend: ") + call + " failed: " + std::string(text, length));
}

#define MPI_CHECK(call)             \
  do {                              \
    int rc_ = check((call), #call); \
    if (rc_) return rc_;            \
  } while (0)

int element_size(int dtype) {
  switch (dtype) {
    case kUInt8:
    case kInt8:
    case kBool:
      return 1;
    case kFloat16:
    case kBFloat16:
    case kUInt16:
    case kInt16:
      return 2;
    case kInt32:
    case kFloat32:
      return 4;
    default:
      return 8;
  }
}

// Our user-defined operators: which dtype is told by the datatype MPI hands back.
template <int kKind>
void custom_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  int dtype = *type == g_half ? kFloat16 : *type == g_bfloat ? kBFloat16 : kBool;
  g_reduce(dtype, kKind, inout, in, static_cast<size_t>(*len));
}

MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case kUInt8:
      return MPI_UINT8_T;
    case kInt8:
      return MPI_INT8_T;
    case kUInt16:
      return MPI_UINT16_T;
    case kInt16:
      return MPI_INT16_T;
    case kInt32:
      return MPI_INT32_T;
    case kInt64:
      return MPI_INT64_T;
    case kFloat32:
      return MPI_FLOAT;
    case kFloat64:
      return MPI_DOUBLE;
    case kFloat16:
      return g_half;
    case kBFloat16:
      return g_bfloat;
    default:
      return g_bool;
  }
}

MPI_Op mpi_op(int dtype, int kind) {
  if (dtype == kFloat16 || dtype == kBFloat16 || dtype == kBool) return g_custom_ops[kind];
  static const MPI_Op builtin[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  return builtin[kind];
}

int comm_of(int id, MPI_Comm* out) {
  auto it = g_comms.find(id);
  if (it == g_comms.end() || it->second == MPI_COMM_NULL) {
    return fail("MPI backend: no communicator for process set " + std::to_string(id) + " on this rank");
  }
  *out = it->second;
  return 0;
}

int to_int(size_t value, const char* what, int* out) {
  if (value > static_cast<size_t>(INT32_MAX)) {
    return refuse(std::string("MPI backend: ") + what + " of " + std::to_string(value) +
                  " bytes exceeds MPI's int count limit (2 GiB); use the built-in backend for it");
  }
  *out = static_cast<int>(value);
  return 0;
}

// Variable-size blocks as int counts and displacements.
int layout(const size_t* bytes, int n, const char* what, std::vector<int>* counts, std::vector<int>* displs) {
  counts->resize(n);
  displs->resize(n);
  size_t offset = 0;
  for (int i = 0; i < n; ++i) {
    if (to_int(bytes[i], what, &(*counts)[i]) || to_int(offset, what, &(*displs)[i])) return 2;
    offset += bytes[i];
  }
  return 0;
}

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "PMI_RANK"}) {
    if (std::getenv(name)) return true;
  }
  return false;
}

const char* last_error() { return g_error.c_str(); }

const char* library_version() {
  static char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  char* newline = std::strchr(text, '\n');
  if (newline) *newline = '\0';
  return text;
}

int stop() {
  int finalized = 0;
  MPI_Finalized(&finalized);  // at exit, whoever owns MPI may have finalised it before hvdlite shut down
  for (auto& kv : g_comms) {
    if (kv.second != MPI_COMM_NULL && !finalized) MPI_Comm_free(&kv.second);
  }
  g_comms.clear();
  g_started = false;
  return 0;
}

int start(const void* comm_address, int rank, int size, hvdlite_reduce_fn reduce, int* thread_multiple) {
  if (g_started) stop();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return fail("MPI backend: MPI has already been finalised in this process");
  if (!initialized) {
    if (!launched_by_mpi()) {
      return fail(
          "MPI backend: this process was not started by an MPI launcher (no OMPI_/PMI_ variables), so "
          "MPI cannot connect the ranks; start the job with hvdlite-run --mpi (or mpirun), or use the "
          "built-in backend (unset HVDLITE_CPU_OPERATIONS)");
    }
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    // Finalised at exit, after the Python interpreter's own exit handlers have shut hvdlite down.
    std::atexit([] {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    });
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  // Collectives run on whichever thread drives progress, one at a time: SERIALIZED is the least we can use.
  if (provided < MPI_THREAD_SERIALIZED) {
    return fail("MPI backend: MPI was initialised with thread level " + std::to_string(provided) +
                ", below MPI_THREAD_SERIALIZED; hvdlite calls MPI from its background thread (initialise MPI "
                "with MPI_Init_thread and MPI_THREAD_MULTIPLE, as mpi4py does by default)");
  }
  *thread_multiple = provided == MPI_THREAD_MULTIPLE ? 1 : 0;
  MPI_Comm base = comm_address ? *static_cast<const MPI_Comm*>(comm_address) : MPI_COMM_WORLD;
  int mpi_rank = -1, mpi_size = -1;
  MPI_CHECK(MPI_Comm_rank(base, &mpi_rank));
  MPI_CHECK(MPI_Comm_size(base, &mpi_size));
  if (mpi_rank != rank || mpi_size != size) {
    return fail("MPI backend: the MPI communicator has rank " + std::to_string(mpi_rank) + " of " +
                std::to_string(mpi_size) + " but hvdlite placed this process as rank " + std::to_string(rank) +
                " of " + std::to_string(size) +
                "; start the job with hvdlite-run --mpi or mpirun, or pass the "
                "communicator hvdlite should use: hvd.init(comm=...)");
  }
  MPI_Comm world;
  MPI_CHECK(MPI_Comm_dup(base, &world));  // our own: our messages never match the application's
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  g_comms[0] = world;
  g_reduce = reduce;
  if (g_half == MPI_DATATYPE_NULL) {
    MPI_Type_contiguous(2, MPI_BYTE, &g_half);
    MPI_Type_commit(&g_half);
    MPI_Type_contiguous(2, MPI_BYTE, &g_bfloat);
    MPI_Type_commit(&g_bfloat);
    MPI_Type_contiguous(1, MPI_BYTE, &g_bool);
    MPI_Type_commit(&g_bool);
    MPI_Op_create(&custom_op<0>, 1, &g_custom_ops[0]);
    MPI_Op_create(&custom_op<1>, 1, &g_custom_ops[1]);
    MPI_Op_create(&custom_op<2>, 1, &g_custom_ops[2]);
    MPI_Op_create(&custom_op<3>, 1, &g_custom_ops[3]);
  }
  g_started = true;
  return 0;
}

int add_set(int id, const int32_t* ranks, int count) {
  MPI_Comm world;
  if (comm_of(0, &world)) return 1;
  int me = 0;
  MPI_Comm_rank(world, &me);
  bool member = false;
  for (int i = 0; i < count; ++i) member = member || ranks[i] == me;
  MPI_Comm comm = MPI_COMM_NULL;
  // Members keep their order (key = rank); non-members get MPI_COMM_NULL.
  MPI_CHECK(MPI_Comm_split(world, member ? 0 : MPI_UNDEFINED, me, &comm));
  if (comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  g_comms[id] = comm;
  return 0;
}

int remove_set(int id) {
  auto it = g_comms.find(id);
  if (it == g_comms.end()) return 0;
  if (it->second != MPI_COMM_NULL) MPI_Comm_free(&it->second);
  g_comms.erase(it);
  return 0;
}

int allreduce(int id, const void* input, void* output, size_t count, int dtype, int kind) {
  MPI_Comm comm;
  if (comm_of(id, &comm)) return 1;
  const size_t esize = static_cast<size_t>(element_size(dtype));
  for (size_t done = 0; done < count; done += kChunk) {
    const int n = static_cast<int>(count - done < kChunk ? count - done : kChunk);
    char* out = static_cast<char*>(output) + done * esize;
    const void* in = input == output ? MPI_IN_PLACE : static_cast<const char*>(input) + done * esize;
    MPI_CHECK(MPI_Allreduce(in, out, n, mpi_type(dtype), mpi_op(dtype, kind), comm));
  }
  return 0;
}

int allgatherv(int id, const void* input, void* output, const size_t* block_bytes) {
  MPI_Comm comm;
  if (comm_of(id, &comm)) return 1;
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  std::vector<int> counts, displs;
  if (layout(block_bytes, n, "allgather", &counts, &displs)) return 2;
  MPI_CHECK(MPI_Allgatherv(input, counts[me], MPI_BYTE, output, counts.data(), displs.data(), MPI_BYTE, comm));
  return 0;
}

int bcast(int id, void* buffer, size_t bytes, int root) {
  MPI_Comm comm;
  if (comm_of(id, &comm)) return 1;
  for (size_t done = 0; done < bytes; done += kChunk) {
    const int n = static_cast<int>(bytes - done < kChunk ? bytes - done : kChunk);
    MPI_CHECK(MPI_Bcast(static_cast<char*>(buffer) + done, n, MPI_BYTE, root, comm));
  }
  return 0;
}

int alltoallv(int id, const void* input, const size_t* send_bytes, void* output, const size_t* recv_bytes) {
  MPI_Comm comm;
  if (comm_of(id, &comm)) return 1;
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  if (layout(send_bytes, n, "alltoall", &scounts, &sdispls) ||
      layout(recv_bytes, n, "alltoall", &rcounts, &rdispls)) {
    return 2;
  }
  MPI_CHECK(MPI_Alltoallv(input, scounts.data(), sdispls.data(), MPI_BYTE, output, rcounts.data(), rdispls.data(),
                          MPI_BYTE, comm));
  return 0;
}

int reduce_scatter(int id, const void* input, void* output, const size_t* counts, int dtype, int kind) {
  MPI_Comm comm;
  if (comm_of(id, &comm)) return 1;
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> recv(n);
  for (int i = 0; i < n; ++i) {
    if (to_int(counts[i] * static_cast<size_t>(element_size(dtype)), "reducescatter block", &recv[i])) return 2;
    recv[i] = static_cast<int>(counts[i]);
  }
  MPI_CHECK(MPI_Reduce_scatter(input, output, recv.data(), mpi_type(dtype), mpi_op(dtype, kind), comm));
  return 0;
}

int sendrecv(int id, int peer, const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  MPI_Comm comm;
  if (comm_of(id, &comm)) return 1;
  int s = 0, r = 0;
  if (to_int(send_bytes, "message", &s) || to_int(recv_bytes, "message", &r)) return 2;
  MPI_CHECK(MPI_Sendrecv(send, s, MPI_BYTE, peer, 0, recv, r, MPI_BYTE, peer, 0, comm, MPI_STATUS_IGNORE));
  return 0;
}

const hvdlite_mpi_plugin kTable = {
    HVDLITE_MPI_PLUGIN_ABI_VERSION,
    last_error,
    library_version,
    start,
    stop,
    add_set,
    remove_set,
    allreduce,
    allgatherv,
    bcast,
    alltoallv,
    reduce_scatter,
    sendrecv,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const hvdlite_mpi_plugin* hvdlite_mpi_plugin_v1(void) {
  return &kTable;
}
