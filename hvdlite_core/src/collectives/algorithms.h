// The collective algorithms, each taking a Communicator and raw buffers; each file opens with its protocol and
// cost. Which one runs is decided in choice/ (chooser.h); every setting an algorithm needs comes as an argument.
// Conventions: counts are elements, offsets bytes; every member calls with matching arguments (negotiation guarantees
// it); buffers may be empty (count 0), in which case no bytes move but the call stays collective where ordering
// requires it.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/reduce_kernels.h"

namespace hvdlite {

enum class AllreduceAlgorithm { kRecursiveDoubling, kRing, kSingleCopy, kRecursiveHalving };
const char* algorithm_name(AllreduceAlgorithm algorithm);  // "rd", "ring", "single_copy", "rhd"

// --- algorithms ---
void allreduce_recursive_doubling(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind);
// dst (op)= src over a whole buffer of bytes; op must be commutative, so that every member ends bit-identical.
using BufferReducer = std::function<void(void* dst, const void* src)>;
// The same over a buffer of mixed contents (the negotiation's bits and eager allreduces, runtime/eager.h).
void allreduce_recursive_doubling(Communicator& comm, void* buffer, size_t bytes, const BufferReducer& reduce);
// postscale multiplies each member's segment as its last reduction lands, so the result needs no extra pass.
// cold_output: the allgather half receives into the result with streaming stores (it will not stay in cache).
void allreduce_ring(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind, double postscale,
                    bool cold_output);
// Needs count >= the largest power of two <= comm.size(); postscale multiplies each member's reduced range.
void allreduce_recursive_halving(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind,
                                 double postscale);
// Reduce-scatter in each host, allreduce across hosts, allgather in each host; needs comm.local()/cross().
// Pipelined over `chunks` pieces (the cross tier of one while the host tier of the next); across(cross, data,
// count) allreduces one piece's segment over the cross tier in place.
using AllreduceAcross = std::function<void(Communicator& cross, void* buffer, size_t count)>;
void allreduce_hierarchical(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind,
                            size_t chunks, const AllreduceAcross& across);
// Scales each reduced segment while it is still in cache (saves a pass over the result).
void allreduce_single_copy(Communicator& comm, const void* input, void* output, size_t count, DType dtype,
                           ReduceKind kind, double postscale);
// In place on a full-size buffer: afterwards member i's segment (segment_counts[i] elements, in order) holds the
// reduction of that segment over all members, multiplied by postscale. Other segments hold partial sums.
void reduce_scatter_ring(Communicator& comm, void* buffer, const std::vector<size_t>& segment_counts, DType dtype,
                         ReduceKind kind, double postscale = 1.0);
// cold_output: output is too large to stay in cache; blocks are received into it with streaming stores.
void allgather_ring(Communicator& comm, void* output, const std::vector<size_t>& block_bytes,
                    bool cold_output = false);
// Allgather in each host, across hosts by the members of equal local index (a slice each), in each host again;
// needs comm.local()/cross().
void allgather_hierarchical(Communicator& comm, const void* input, void* output,
                            const std::vector<size_t>& block_bytes);
void allgather_single_copy(Communicator& comm, const void* input, void* output,
                           const std::vector<size_t>& block_bytes);
void broadcast_tree(Communicator& comm, void* buffer, size_t bytes, int root_index);
void broadcast_chain(Communicator& comm, void* buffer, size_t bytes, int root_index);
void broadcast_single_copy(Communicator& comm, void* buffer, size_t bytes, int root_index);
// send_bytes[i]: bytes of input for member i (blocks in member order); recv_bytes[i]: bytes from member i.
void alltoall_pairwise(Communicator& comm, const void* input, const std::vector<size_t>& send_bytes, void* output,
                       const std::vector<size_t>& recv_bytes);
void barrier_dissemination(Communicator& comm);

// Exchanges between two members by index: what an algorithm needs that any backend can carry (Adasum runs on
// the mesh's channels and on MPI alike).
class PointToPoint {
 public:
  virtual ~PointToPoint() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends to and receives from the same peer at once (both sides call it with mirrored sizes).
  virtual void sendrecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_bytes) = 0;
};

// Adasum (adasum.cc): in place over a fused buffer of tensors (tensor_counts elements each, in order); needs a
// power-of-two number of members and a floating-point dtype (adasum_supports). scratch: adasum_scratch_bytes.
bool adasum_supports(DType dtype);
size_t adasum_scratch_bytes(const std::vector<size_t>& tensor_counts, DType dtype);
void allreduce_adasum(PointToPoint& pairs, void* buffer, const std::vector<size_t>& tensor_counts, DType dtype,
                      char* scratch);

// Even split of count elements over n members, the first (count % n) getting one more (Horovod's rule).
std::vector<size_t> even_split(size_t count, int n);

}  // namespace hvdlite
