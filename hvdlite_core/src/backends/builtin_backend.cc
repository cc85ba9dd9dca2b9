// The built-in data plane: hvdlite's own algorithms (collectives/) over the TCP/shared-memory mesh, each
// collective run as the chooser says (choice/chooser.h, choice/dispatch.h).
#include <cstring>

#include "backends/backend.h"
#include "choice/dispatch.h"
#include "collectives/algorithms.h"
#include "common/copy_bytes.h"

namespace hvdlite {
namespace {

class BuiltinBackend : public Backend {
 public:
  explicit BuiltinBackend(const Chooser& chooser) : chooser_(chooser) {}
  const char* name() const override { return "builtin"; }

  const char* allreduce(int, Communicator& comm, const void* input, void* output, size_t count, DType dtype,
                        ReduceKind kind, double postscale) override {
    return hvdlite::allreduce(chooser_, comm, input, output, count, dtype, kind, postscale);
  }

  void adasum(int, Communicator& comm, void* buffer, const std::vector<size_t>& tensor_counts, DType dtype) override {
    MeshPairs pairs(comm);
    allreduce_adasum(pairs, buffer, tensor_counts, dtype, comm.scratch(adasum_scratch_bytes(tensor_counts, dtype)));
  }

  const char* allgather(int, Communicator& comm, const void* input, void* output,
                        const std::vector<size_t>& block_bytes) override {
    return hvdlite::allgather(chooser_, comm, input, output, block_bytes);
  }

  void broadcast(int, Communicator& comm, void* buffer, size_t bytes, int root_index) override {
    hvdlite::broadcast(chooser_, comm, buffer, bytes, root_index);
  }

  void alltoall(int, Communicator& comm, const void* input, const std::vector<size_t>& send_bytes, void* output,
                const std::vector<size_t>& recv_bytes) override {
    alltoall_pairwise(comm, input, send_bytes, output, recv_bytes);
  }

  void reduce_scatter(int, Communicator& comm, void* work, void* mine, const std::vector<size_t>& counts, DType dtype,
                      ReduceKind kind) override {
    reduce_scatter_ring(comm, work, counts, dtype, kind);
    size_t offset = 0;
    for (int i = 0; i < comm.rank(); ++i) offset += counts[i];
    const size_t esize = dtype_size(dtype);
    if (counts[comm.rank()] > 0) {
      copy_bytes(mine, static_cast<char*>(work) + offset * esize, counts[comm.rank()] * esize);
    }
  }

  std::string describe() const override { return "cpu_operations=builtin"; }

 private:
  const Chooser& chooser_;
  // Adasum's exchanges over the mesh's channels.
  class MeshPairs : public PointToPoint {
   public:
    explicit MeshPairs(Communicator& comm) : comm_(comm) {}
    int rank() const override { return comm_.rank(); }
    int size() const override { return comm_.size(); }
    void sendrecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override {
      Channel* channel = comm_.channel(peer);
      comm_.progress().sendrecv(channel, send, send_bytes, channel, recv, recv_bytes);
    }

   private:
    Communicator& comm_;
  };
};

}  // namespace

std::unique_ptr<Backend> make_builtin_backend(const Chooser& chooser) {
  return std::unique_ptr<Backend>(new BuiltinBackend(chooser));
}

}  // namespace hvdlite
