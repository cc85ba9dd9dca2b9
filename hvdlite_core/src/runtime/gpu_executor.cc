#include "runtime/gpu_executor.h"

#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "common/log.h"
#include "common/status.h"
#include "runtime/device_sharing.h"
#include "runtime/fusion.h"

namespace hvdlite {
namespace {

nccl::DataType nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return nccl::kUint8;
    case DType::kBool:
      return nccl::kUint8;
    case DType::kInt8:
      return nccl::kInt8;
    case DType::kInt32:
      return nccl::kInt32;
    case DType::kInt64:
      return nccl::kInt64;
    case DType::kFloat16:
      return nccl::kFloat16;
    case DType::kBFloat16:
      return nccl::kBfloat16;
    case DType::kFloat32:
      return nccl::kFloat32;
    case DType::kFloat64:
      return nccl::kFloat64;
    default:  // refused at enqueue (gpu_request_problem)
      throw Error(StatusCode::kInvalidArgument, std::string("NCCL has no reduction for ") + dtype_name(dtype));
  }
}

int64_t row_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

}  // namespace

// How a reduction runs on NCCL: the operator (a PreMulSum made for this launch when custom), and the scalings
// that cannot ride on it (min, max and product scale before and after).
struct GpuExecutor::Reduction {
  nccl::DataType type = nccl::kFloat32;
  nccl::RedOp op = nccl::kSum;
  bool custom = false;
  double pre = 1.0;
  double post = 1.0;
};

GpuExecutor::GpuExecutor(GpuContext& context, Backend& host, TensorQueue& queue, Timeline& timeline)
    : context_(context),
      cuda_(*context.gpu().cuda),
      nccl_(*context.gpu().nccl),
      device_(context.device()),
      host_(host),
      queue_(queue),
      timeline_(timeline),
      comms_(nccl_, host) {
  DeviceScope scope(cuda_, device_);
  check_cuda(cuda_, cuda_.StreamCreateWithFlags(&stream_, cuda::kStreamNonBlocking), "cudaStreamCreateWithFlags");
  completions_.reset(new CompletionQueue(context_, device_, [this]() {
    std::string error = comms_.async_error();
    if (!error.empty()) completions_->abort(Status(StatusCode::kRemoteError, error));
    return error;
  }));
}

GpuExecutor::~GpuExecutor() {
  completions_.reset();  // every launched collective finishes (or fails after an abort) first
  DeviceScope scope(cuda_, device_);
  if (fusion_) cuda_.Free(fusion_);
  if (stream_) cuda_.StreamDestroy(stream_);
}

void GpuExecutor::abort(const Status& why) {
  comms_.abort_all();
  completions_->abort(why);
}

char* GpuExecutor::fusion_buffer(size_t bytes) {
  if (bytes <= fusion_bytes_) return fusion_;
  // The old buffer may still be read by launched work: let the stream finish before freeing it.
  check_cuda(cuda_, cuda_.StreamSynchronize(stream_), "cudaStreamSynchronize");
  if (fusion_) cuda_.Free(fusion_);
  fusion_ = nullptr;
  fusion_bytes_ = 0;
  const size_t rounded = (bytes + (1 << 20) - 1) & ~static_cast<size_t>((1 << 20) - 1);
  void* p = nullptr;
  check_cuda(cuda_, cuda_.Malloc(&p, rounded), "cudaMalloc of the fusion buffer");
  fusion_ = static_cast<char*>(p);
  fusion_bytes_ = rounded;
  return fusion_;
}

std::shared_ptr<void> GpuExecutor::device_alloc(size_t bytes) {
  void* p = nullptr;
  check_cuda(cuda_, cuda_.Malloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc of a result");
  const cuda::Runtime* cuda = &cuda_;
  return std::shared_ptr<void>(p, [cuda](void* q) { cuda->Free(q); });
}

GpuExecutor::Reduction GpuExecutor::plan_reduction(const Response& r, int members, nccl::Comm comm) {
  Reduction plan;
  plan.type = nccl_type(r.dtype);
  const bool average = r.reduce_op == ReduceOp::kAverage;
  const double post = average ? r.postscale / members : r.postscale;
  switch (r.reduce_op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: {
      if (r.dtype == DType::kBool) {  // logical or, as on the host
        plan.op = nccl::kMax;
        return plan;
      }
      if (!dtype_is_floating(r.dtype)) {  // integers carry no scale factors on CUDA (refused at enqueue)
        plan.op = average ? nccl::kAvg : nccl::kSum;
        return plan;
      }
      const double factor = r.prescale * post;  // sum(pre * x) * post, in NCCL's one pass
      if (factor == 1.0) {
        plan.op = nccl::kSum;
        return plan;
      }
      // PreMulSum's scalar has the tensor's own type.
      union {
        double f64;
        float f32;
        uint16_t f16;
      } scalar;
      if (r.dtype == DType::kFloat64)
        scalar.f64 = factor;
      else if (r.dtype == DType::kFloat32)
        scalar.f32 = static_cast<float>(factor);
      else if (r.dtype == DType::kFloat16)
        scalar.f16 = float_to_half(static_cast<float>(factor));
      else
        scalar.f16 = float_to_bf16(static_cast<float>(factor));
      check_nccl(nccl_, nccl_.RedOpCreatePreMulSum(&plan.op, &scalar, plan.type, nccl::kScalarHostImmediate, comm),
                 "ncclRedOpCreatePreMulSum");
      plan.custom = true;
      return plan;
    }
    case ReduceOp::kMin:
      plan.op = nccl::kMin;
      break;  // bool: and
    case ReduceOp::kMax:
      plan.op = nccl::kMax;
      break;
    case ReduceOp::kProduct:
      plan.op = r.dtype == DType::kBool ? nccl::kMin : nccl::kProd;
      break;  // and
    default:
      throw Error(StatusCode::kInvalidArgument, std::string(reduce_op_name(r.reduce_op)) + " does not run on NCCL");
  }
  plan.pre = r.prescale;
  plan.post = post;
  return plan;
}

void GpuExecutor::scale(void* data, size_t count, DType dtype, double factor) {
  if (factor == 1.0 || count == 0) return;
  // PreMulSum over a communicator of this rank alone multiplies: a scaling kernel without compiling CUDA code.
  nccl::Comm self = comms_.self();
  Response like;
  like.dtype = dtype;
  like.reduce_op = ReduceOp::kSum;
  like.prescale = factor;
  Reduction plan = plan_reduction(like, 1, self);
  nccl::Result result = nccl_.AllReduce(data, data, count, plan.type, plan.op, self, stream_);
  if (plan.custom) nccl_.RedOpDestroy(plan.op, self);
  check_nccl(nccl_, result, "ncclAllReduce (scaling)");
}

void GpuExecutor::reduce(const Response& r, Communicator& comm, nccl::Comm nc, const void* in, void* out,
                         size_t count) {
  if (count == 0) return;
  Reduction plan = plan_reduction(r, comm.size(), nc);
  if (plan.pre != 1.0) {
    if (in != out) {
      check_cuda(cuda_, cuda_.MemcpyAsync(out, in, count * dtype_size(r.dtype), cuda::kMemcpyDefault, stream_),
                 "cudaMemcpyAsync");
    }
    scale(out, count, r.dtype, plan.pre);
    in = out;
  }
  nccl::Result result = nccl_.AllReduce(in, out, count, plan.type, plan.op, nc, stream_);
  if (plan.custom) nccl_.RedOpDestroy(plan.op, nc);
  check_nccl(nccl_, result, "ncclAllReduce");
  scale(out, count, r.dtype, plan.post);
}

void GpuExecutor::allreduce(Communicator& comm, nccl::Comm nc, const std::vector<const Response*>& group,
                            std::vector<TensorEntry>& entries) {
  const Response& head = *group.front();
  if (group.size() == 1) {
    reduce(head, comm, nc, entries[0].input, entries[0].output, static_cast<size_t>(element_count(head.shape)));
    return;
  }
  const size_t esize = dtype_size(head.dtype);
  const FusedLayout layout = fused_layout(group);
  char* buffer = fusion_buffer(layout.total * esize);
  for (size_t i = 0; i < group.size(); ++i) {
    if (layout.counts[i] == 0) continue;
    check_cuda(cuda_,
               cuda_.MemcpyAsync(buffer + layout.offsets[i] * esize, entries[i].input, layout.counts[i] * esize,
                                 cuda::kMemcpyDefault, stream_),
               "cudaMemcpyAsync into the fusion buffer");
  }
  reduce(head, comm, nc, buffer, buffer, layout.total);
  for (size_t i = 0; i < group.size(); ++i) {
    if (layout.counts[i] == 0) continue;
    check_cuda(cuda_,
               cuda_.MemcpyAsync(entries[i].output, buffer + layout.offsets[i] * esize, layout.counts[i] * esize,
                                 cuda::kMemcpyDefault, stream_),
               "cudaMemcpyAsync out of the fusion buffer");
  }
}

void GpuExecutor::broadcast(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e) {
  const size_t bytes = static_cast<size_t>(element_count(r.shape)) * dtype_size(r.dtype);
  if (bytes == 0) return;
  int root = -1;
  for (int i = 0; i < comm.size(); ++i)
    if (comm.global_rank(i) == r.root_rank) root = i;
  // The root sends its input (NCCL copies it into the root's output too); the others receive into output.
  const void* send = comm.rank() == root ? e.input : e.output;
  check_nccl(nccl_, nccl_.Broadcast(send, e.output, bytes, nccl::kUint8, root, nc, stream_), "ncclBroadcast");
}

void GpuExecutor::allgather(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e) {
  const size_t row_bytes = static_cast<size_t>(row_elements(r.shape)) * dtype_size(r.dtype);
  const int n = comm.size();
  std::vector<size_t> block(n), offset(n);
  size_t total = 0;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    block[i] = static_cast<size_t>(r.first_dims[i]) * row_bytes;
    offset[i] = total;
    total += block[i];
    rows += r.first_dims[i];
  }
  std::shared_ptr<void> output = device_alloc(total);
  char* out = static_cast<char*>(output.get());
  e.handle->device_output = output;
  e.handle->output_bytes = total;
  e.handle->output_shape = r.shape;
  e.handle->output_shape[0] = rows;
  if (total == 0) return;
  if (std::all_of(block.begin(), block.end(), [&](size_t b) { return b == block[0]; })) {
    check_nccl(nccl_, nccl_.AllGather(e.input, out, block[0], nccl::kUint8, nc, stream_), "ncclAllGather");
    return;
  }
  // Unequal blocks: each member broadcasts its own, all in one group.
  check_nccl(nccl_, nccl_.GroupStart(), "ncclGroupStart");
  nccl::Result result = nccl::kSuccess;
  for (int i = 0; i < n && result == nccl::kSuccess; ++i) {
    if (block[i] == 0) continue;
    result = nccl_.Broadcast(i == comm.rank() ? e.input : out + offset[i], out + offset[i], block[i], nccl::kUint8, i,
                             nc, stream_);
  }
  nccl::Result end = nccl_.GroupEnd();
  check_nccl(nccl_, result, "ncclBroadcast (allgather of unequal blocks)");
  check_nccl(nccl_, end, "ncclGroupEnd");
}

void GpuExecutor::alltoall(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e) {
  const int n = comm.size();
  const size_t row_bytes = static_cast<size_t>(row_elements(r.shape)) * dtype_size(r.dtype);
  // The row counts are host values: they travel on the host data plane first.
  std::vector<int32_t> send_rows(e.splits), recv_rows(n, 0);
  std::vector<size_t> four(n, sizeof(int32_t));
  host_.alltoall(r.process_set, comm, send_rows.data(), four, recv_rows.data(), four);
  std::vector<size_t> send_offset(n), recv_offset(n);
  size_t sent = 0, total = 0;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    send_offset[i] = sent;
    sent += static_cast<size_t>(send_rows[i]) * row_bytes;
    recv_offset[i] = total;
    total += static_cast<size_t>(recv_rows[i]) * row_bytes;
    rows += recv_rows[i];
  }
  std::shared_ptr<void> output = device_alloc(total);
  char* out = static_cast<char*>(output.get());
  e.handle->device_output = output;
  e.handle->output_bytes = total;
  e.handle->output_shape = e.request.shape;
  e.handle->output_shape[0] = rows;
  e.handle->int_results = recv_rows;
  const char* in = static_cast<const char*>(e.input);
  const int me = comm.rank();
  const size_t mine = static_cast<size_t>(send_rows[me]) * row_bytes;
  if (mine > 0) {
    check_cuda(cuda_,
               cuda_.MemcpyAsync(out + recv_offset[me], in + send_offset[me], mine, cuda::kMemcpyDefault, stream_),
               "cudaMemcpyAsync (alltoall's own rows)");
  }
  check_nccl(nccl_, nccl_.GroupStart(), "ncclGroupStart");
  nccl::Result result = nccl::kSuccess;
  for (int peer = 0; peer < n && result == nccl::kSuccess; ++peer) {
    if (peer == me) continue;
    const size_t send_bytes = static_cast<size_t>(send_rows[peer]) * row_bytes;
    const size_t recv_bytes = static_cast<size_t>(recv_rows[peer]) * row_bytes;
    if (send_bytes > 0) result = nccl_.Send(in + send_offset[peer], send_bytes, nccl::kUint8, peer, nc, stream_);
    if (result == nccl::kSuccess && recv_bytes > 0) {
      result = nccl_.Recv(out + recv_offset[peer], recv_bytes, nccl::kUint8, peer, nc, stream_);
    }
  }
  nccl::Result end = nccl_.GroupEnd();
  check_nccl(nccl_, result, "ncclSend/ncclRecv (alltoall)");
  check_nccl(nccl_, end, "ncclGroupEnd");
}

void GpuExecutor::reducescatter(Communicator& comm, nccl::Comm nc, const Response& r, TensorEntry& e) {
  const int n = comm.size();
  const size_t esize = dtype_size(r.dtype);
  const int64_t row_elems = row_elements(r.shape);
  std::vector<size_t> rows = even_split(static_cast<size_t>(r.shape[0]), n);
  std::vector<size_t> counts(n), offsets(n);
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    counts[i] = rows[i] * static_cast<size_t>(row_elems);
    offsets[i] = total;
    total += counts[i];
  }
  const int me = comm.rank();
  std::shared_ptr<void> output = device_alloc(counts[me] * esize);
  char* out = static_cast<char*>(output.get());
  e.handle->device_output = output;
  e.handle->output_bytes = counts[me] * esize;
  e.handle->output_shape = r.shape;
  e.handle->output_shape[0] = static_cast<int64_t>(rows[me]);
  if (total == 0) return;
  // A copy of the input to reduce in (the input is the caller's and stays unchanged).
  char* work = fusion_buffer(total * esize);
  check_cuda(cuda_, cuda_.MemcpyAsync(work, e.input, total * esize, cuda::kMemcpyDefault, stream_),
             "cudaMemcpyAsync");
  Reduction plan = plan_reduction(r, n, nc);
  scale(work, total, r.dtype, plan.pre);
  nccl::Result result;
  const char* what;
  if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; })) {
    what = "ncclReduceScatter";
    result = nccl_.ReduceScatter(work, out, counts[0], plan.type, plan.op, nc, stream_);
  } else {  // unequal segments: one reduce to each segment's owner, in one group
    what = "ncclReduce (reducescatter of unequal segments)";
    result = nccl_.GroupStart();
    for (int i = 0; i < n && result == nccl::kSuccess; ++i) {
      if (counts[i] == 0) continue;
      result = nccl_.Reduce(work + offsets[i] * esize, i == me ? out : work + offsets[i] * esize, counts[i],
                            plan.type, plan.op, i, nc, stream_);
    }
    nccl::Result end = nccl_.GroupEnd();
    if (result == nccl::kSuccess) result = end;
  }
  if (plan.custom) nccl_.RedOpDestroy(plan.op, nc);
  check_nccl(nccl_, result, what);
  scale(out, counts[me], r.dtype, plan.post);
}

void GpuExecutor::run_on_nccl(Communicator& comm, nccl::Comm nc, const std::vector<const Response*>& group,
                              std::vector<TensorEntry>& entries) {
  const Response& head = *group.front();
  switch (head.op) {
    case OpType::kAllreduce:
      allreduce(comm, nc, group, entries);
      break;
    case OpType::kBroadcast:
      broadcast(comm, nc, head, entries[0]);
      break;
    case OpType::kAllgather:
      allgather(comm, nc, head, entries[0]);
      break;
    case OpType::kAlltoall:
      alltoall(comm, nc, head, entries[0]);
      break;
    case OpType::kReducescatter:
      reducescatter(comm, nc, head, entries[0]);
      break;
    default:
      throw Error(StatusCode::kInternal, std::string(op_name(head.op)) + " has no CUDA path");
  }
}

bool GpuExecutor::staged(const Response& head, Communicator& comm) {
  const int set = head.process_set;
  const int choice = context_.config().gpu_operations;
  if (choice == Config::kGpuHost) return true;
  if (comm.size() == 1) return false;
  auto found = planes_.find(set);
  if (found == planes_.end()) {
    std::string bus;
    try {
      DeviceScope scope(cuda_, device_);
      bus = pci_bus_id(cuda_, device_);
    } catch (const Error&) {  // still takes part in the exchange, as a device no one else has
      bus = "unknown device of rank " + std::to_string(comm.global_rank(comm.rank()));
    }
    const std::vector<SharedDevice> shared = shared_devices(host_, set, comm, bus);
    Plane plane;
    const std::string where = set == 0 ? std::string("the job's") : "process set " + std::to_string(set) + "'s";
    if (!shared.empty() && choice == Config::kGpuNccl) {
      plane.refusal = "HVDLITE_GPU_OPERATIONS=nccl, but " + describe(shared) +
                      ", and NCCL takes one GPU per rank. Give each rank its own GPU "
                      "(torch.cuda.set_device(hvd.local_rank())), or unset HVDLITE_GPU_OPERATIONS to stage " +
                      where + " CUDA collectives through host memory";
    } else if (!shared.empty()) {
      plane.staged = true;
      if (comm.rank() == 0) {
        HVD_LOG(kWarning, describe(shared) << ", and NCCL takes one GPU per rank: " << where
                                           << " CUDA collectives are staged through host memory, at host speed. Give "
                                              "each rank its own GPU for NCCL, or set HVDLITE_GPU_OPERATIONS=host "
                                              "to stage without this warning");
      }
    }
    found = planes_.emplace(set, plane).first;
  }
  if (!found->second.refusal.empty()) {
    throw Error(StatusCode::kInvalidArgument,
                std::string(op_name(head.op)) + " of tensor '" + head.name + "': " + found->second.refusal);
  }
  return found->second.staged;
}

void GpuExecutor::run(Communicator& comm, const std::vector<const Response*>& group,
                      std::vector<TensorEntry>& entries) {
  const Response& head = *group.front();
  const bool host_staged = staged(head, comm);
  DeviceScope scope(cuda_, device_);
  nccl::Comm nc = host_staged ? nullptr : comms_.get(head.process_set, comm);
  for (TensorEntry& e : entries) {
    if (!e.ready) continue;
    check_cuda(cuda_, cuda_.StreamWaitEvent(stream_, e.ready, 0), "cudaStreamWaitEvent on the caller's event");
    context_.release_event(e.ready);  // the wait holds the event's current record; it may be recorded again
    e.ready = nullptr;
  }
  if (host_staged) {
    if (!staged_) staged_.reset(new StagedCollectives(cuda_, host_, stream_));
    staged_->run(comm, group, entries);
  } else {
    run_on_nccl(comm, nc, group, entries);
  }
  cuda::Event done = context_.acquire_event();
  check_cuda(cuda_, cuda_.EventRecord(done, stream_), "cudaEventRecord");
  auto batch = std::make_shared<std::vector<TensorEntry>>(std::move(entries));
  TensorQueue* queue = &queue_;
  Timeline* timeline = &timeline_;
  completions_->push(done, [queue, timeline, batch](const Status& status) {
    for (TensorEntry& e : *batch) {
      timeline->end(e.request.name);  // before finish: the name cannot be submitted again until then
      queue->finish(std::move(e), status);
    }
  });
}

}  // namespace hvdlite
