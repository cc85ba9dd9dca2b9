#include "runtime/staged_collectives.h"

#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/reduce_kernels.h"
#include "common/status.h"
#include "runtime/eager.h"
#include "runtime/fusion.h"

namespace hvdlite {
namespace {

double effective_postscale(const Response& r, int n) {
  return r.reduce_op == ReduceOp::kAverage ? r.postscale / n : r.postscale;
}

size_t row_bytes(const Response& r) {
  int64_t n = 1;
  for (size_t i = 1; i < r.shape.size(); ++i) n *= r.shape[i];
  return static_cast<size_t>(n) * dtype_size(r.dtype);
}

}  // namespace

StagedCollectives::PinnedBuffer::~PinnedBuffer() {
  if (data_) cuda_.FreeHost(data_);
}

char* StagedCollectives::PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return data_;
  if (data_) cuda_.FreeHost(data_);
  data_ = nullptr;
  bytes_ = 0;
  const size_t rounded = (std::max<size_t>(bytes, 1) + (1 << 20) - 1) & ~static_cast<size_t>((1 << 20) - 1);
  void* p = nullptr;
  check_cuda(cuda_, cuda_.MallocHost(&p, rounded), "cudaMallocHost of the staging buffer");
  data_ = static_cast<char*>(p);
  bytes_ = rounded;
  return data_;
}

StagedCollectives::StagedCollectives(const cuda::Runtime& cuda, Backend& host, cuda::Stream stream)
    : cuda_(cuda), host_(host), stream_(stream), in_(cuda), out_(cuda) {}

StagedCollectives::~StagedCollectives() = default;

void StagedCollectives::copy(void* to, const void* from, size_t bytes, const char* what) {
  if (bytes == 0) return;
  check_cuda(cuda_, cuda_.MemcpyAsync(to, from, bytes, cuda::kMemcpyDefault, stream_), what);
}

void StagedCollectives::finish_copies() {
  check_cuda(cuda_, cuda_.StreamSynchronize(stream_), "cudaStreamSynchronize (staged copies to host)");
}

void StagedCollectives::device_result(TensorEntry& e, const char* host, size_t bytes) {
  void* p = nullptr;
  check_cuda(cuda_, cuda_.Malloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc of a result");
  const cuda::Runtime* cuda = &cuda_;
  e.handle->device_output = std::shared_ptr<void>(p, [cuda](void* q) { cuda->Free(q); });
  e.handle->output_bytes = bytes;
  copy(p, host, bytes, "cudaMemcpyAsync of a staged result to the device");
}

void StagedCollectives::allreduce(Communicator& comm, const std::vector<const Response*>& group,
                                  std::vector<TensorEntry>& entries) {
  const Response& head = *group.front();
  const size_t esize = dtype_size(head.dtype);
  const FusedLayout layout = fused_layout(group);
  const std::vector<size_t>& counts = layout.counts;
  const std::vector<size_t>& offsets = layout.offsets;
  const size_t total = layout.total;
  finish_copies();  // the last collective's copies out may still read the buffer
  char* buffer = in_.reserve(total * esize);
  for (size_t i = 0; i < group.size(); ++i)
    copy(buffer + offsets[i] * esize, entries[i].input, counts[i] * esize, "cudaMemcpyAsync to the staging buffer");
  finish_copies();
  if (head.prescale != 1.0) scale_in_place(head.dtype, buffer, total, head.prescale);
  host_.allreduce(head.process_set, comm, buffer, buffer, total, head.dtype, reduce_kind(head.reduce_op),
                  effective_postscale(head, comm.size()));
  for (size_t i = 0; i < group.size(); ++i)
    copy(entries[i].output, buffer + offsets[i] * esize, counts[i] * esize, "cudaMemcpyAsync of a staged result");
}

void StagedCollectives::broadcast(Communicator& comm, const Response& r, TensorEntry& e) {
  const size_t bytes = static_cast<size_t>(element_count(r.shape)) * dtype_size(r.dtype);
  int root = -1;
  for (int i = 0; i < comm.size(); ++i)
    if (comm.global_rank(i) == r.root_rank) root = i;
  finish_copies();
  char* buffer = in_.reserve(bytes);
  if (comm.rank() == root) {
    copy(buffer, e.input, bytes, "cudaMemcpyAsync to the staging buffer");
    finish_copies();
  }
  host_.broadcast(r.process_set, comm, buffer, bytes, root);
  copy(e.output, buffer, bytes, "cudaMemcpyAsync of a staged result");
}

void StagedCollectives::allgather(Communicator& comm, const Response& r, TensorEntry& e) {
  const int n = comm.size();
  const size_t row = row_bytes(r);
  std::vector<size_t> blocks(n);
  size_t total = 0;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    blocks[i] = static_cast<size_t>(r.first_dims[i]) * row;
    total += blocks[i];
    rows += r.first_dims[i];
  }
  finish_copies();
  char* mine = in_.reserve(blocks[comm.rank()]);
  char* gathered = out_.reserve(total);
  copy(mine, e.input, blocks[comm.rank()], "cudaMemcpyAsync to the staging buffer");
  finish_copies();
  host_.allgather(r.process_set, comm, mine, gathered, blocks);
  e.handle->output_shape = r.shape;
  e.handle->output_shape[0] = rows;
  device_result(e, gathered, total);
}

void StagedCollectives::alltoall(Communicator& comm, const Response& r, TensorEntry& e) {
  const int n = comm.size();
  const size_t row = row_bytes(r);
  std::vector<int32_t> send_rows(e.splits), recv_rows(n, 0);
  std::vector<size_t> four(n, sizeof(int32_t));
  host_.alltoall(r.process_set, comm, send_rows.data(), four, recv_rows.data(), four);
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  size_t sent = 0, received = 0;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    send_bytes[i] = static_cast<size_t>(send_rows[i]) * row;
    recv_bytes[i] = static_cast<size_t>(recv_rows[i]) * row;
    sent += send_bytes[i];
    received += recv_bytes[i];
    rows += recv_rows[i];
  }
  finish_copies();
  char* outgoing = in_.reserve(sent);
  char* incoming = out_.reserve(received);
  copy(outgoing, e.input, sent, "cudaMemcpyAsync to the staging buffer");
  finish_copies();
  host_.alltoall(r.process_set, comm, outgoing, send_bytes, incoming, recv_bytes);
  e.handle->output_shape = e.request.shape;
  e.handle->output_shape[0] = rows;
  e.handle->int_results = recv_rows;
  device_result(e, incoming, received);
}

void StagedCollectives::reducescatter(Communicator& comm, const Response& r, TensorEntry& e) {
  const int n = comm.size();
  const size_t esize = dtype_size(r.dtype);
  const size_t row_elements = row_bytes(r) / esize;
  std::vector<size_t> rows = even_split(static_cast<size_t>(r.shape[0]), n);
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = rows[i] * row_elements;
  const size_t total = static_cast<size_t>(element_count(r.shape));
  const size_t mine = counts[comm.rank()];
  finish_copies();
  char* work = in_.reserve(total * esize);
  char* result = out_.reserve(mine * esize);
  copy(work, e.input, total * esize, "cudaMemcpyAsync to the staging buffer");
  finish_copies();
  if (r.prescale != 1.0) scale_in_place(r.dtype, work, total, r.prescale);
  host_.reduce_scatter(r.process_set, comm, work, result, counts, r.dtype, reduce_kind(r.reduce_op));
  const double post = effective_postscale(r, n);
  if (post != 1.0) scale_in_place(r.dtype, result, mine, post);
  e.handle->output_shape = r.shape;
  e.handle->output_shape[0] = static_cast<int64_t>(rows[comm.rank()]);
  device_result(e, result, mine * esize);
}

void StagedCollectives::run(Communicator& comm, const std::vector<const Response*>& group,
                            std::vector<TensorEntry>& entries) {
  const Response& head = *group.front();
  switch (head.op) {
    case OpType::kAllreduce:
      allreduce(comm, group, entries);
      break;
    case OpType::kBroadcast:
      broadcast(comm, head, entries[0]);
      break;
    case OpType::kAllgather:
      allgather(comm, head, entries[0]);
      break;
    case OpType::kAlltoall:
      alltoall(comm, head, entries[0]);
      break;
    case OpType::kReducescatter:
      reducescatter(comm, head, entries[0]);
      break;
    default:
      throw Error(StatusCode::kInternal, std::string(op_name(head.op)) + " has no host-staged path");
  }
}

}  // namespace hvdlite
