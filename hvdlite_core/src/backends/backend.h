// A data plane: how one negotiated collective moves bytes among the members of a process set. Negotiation,
// fusion, scaling and error delivery stay in the runtime; a backend only executes. Two exist:
//   builtin (builtin_backend.cc): hvdlite's own algorithms over the TCP/shared-memory mesh (collectives/);
//   mpi     (mpi_backend.cc):     MPI calls through the MPI plugin, loaded at run time.
// HVDLITE_CPU_OPERATIONS picks one for the job (every rank must agree: config_agreement.h).
//
// Calls arrive in negotiated order on every member, from one thread at a time (whoever drives progress).
// A failure throws hvdlite::Error; transport failures (kRemoteError, kTimeout, kInternal) are fatal for the runtime.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/reduce_kernels.h"

namespace hvdlite {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Process sets come and go on every rank, in negotiated order (members or not).
  virtual void set_added(int set, Communicator& comm) {}
  virtual void set_removed(int set) {}

  // output = reduce(input over members) * postscale; input may equal output. Returns the name of what ran, for the
  // timeline ("" where the backend does not say).
  virtual const char* allreduce(int set, Communicator& comm, const void* input, void* output, size_t count,
                                DType dtype, ReduceKind kind, double postscale) = 0;
  // Adasum (collectives/adasum.cc) in place over a fused buffer of tensors with these element counts.
  virtual void adasum(int set, Communicator& comm, void* buffer, const std::vector<size_t>& tensor_counts,
                      DType dtype) = 0;
  // output = every member's block in member order; block_bytes[i] is member i's size. Returns what ran.
  virtual const char* allgather(int set, Communicator& comm, const void* input, void* output,
                                const std::vector<size_t>& block_bytes) = 0;
  virtual void broadcast(int set, Communicator& comm, void* buffer, size_t bytes, int root_index) = 0;
  virtual void alltoall(int set, Communicator& comm, const void* input, const std::vector<size_t>& send_bytes,
                        void* output, const std::vector<size_t>& recv_bytes) = 0;
  // work: the full input (counts summed), which may be clobbered; mine: receives this member's reduced segment.
  virtual void reduce_scatter(int set, Communicator& comm, void* work, void* mine, const std::vector<size_t>& counts,
                              DType dtype, ReduceKind kind) = 0;
  // "key=value;..." for build_info: what this backend runs on.
  virtual std::string describe() const = 0;
};

// The built-in backend over the mesh, its algorithms chosen by `chooser`.
class Chooser;
std::unique_ptr<Backend> make_builtin_backend(const Chooser& chooser);

}  // namespace hvdlite
