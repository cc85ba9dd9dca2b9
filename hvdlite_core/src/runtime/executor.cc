#include "runtime/executor.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"
#include "common/copy_bytes.h"
#include "common/log.h"
#include "runtime/fusion.h"
#include "runtime/gpu_executor.h"

namespace hvdlite {
namespace {

double effective_postscale(const Response& r, int n) {
  return r.reduce_op == ReduceOp::kAverage ? r.postscale / n : r.postscale;
}

int64_t row_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Ends the tensor's negotiation span and covers its execution, for the timeline. The span is written when the
// collective has run, so that its label can say what ran (set_activity): the plan the backend executed, not a
// second guess at it. The row is the submitted request's name: a cached response of an unnamed operation carries
// the name of what it carries, not the one the negotiation span began under.
class TimelineSpan {
 public:
  // entry: this rank's submission (copied from, not kept), or nullptr (a response this rank did not submit):
  // then nothing is recorded.
  TimelineSpan(Timeline& timeline, const TensorEntry* entry, std::string activity) : timeline_(timeline) {
    if (!timeline_.enabled() || !entry) return;
    tensor_ = entry->request.name;
    activity_ = std::move(activity);
    start_ = std::chrono::steady_clock::now();
    timeline_.end(tensor_);
  }
  bool recording() const { return !tensor_.empty(); }
  void set_activity(std::string activity) { activity_ = std::move(activity); }
  ~TimelineSpan() {
    if (tensor_.empty() || !timeline_.enabled()) return;
    timeline_.begin(tensor_, activity_, start_);
    timeline_.end(tensor_);
  }

 private:
  Timeline& timeline_;
  std::string tensor_;
  std::string activity_;
  std::chrono::steady_clock::time_point start_;
};

// "ALLREDUCE (ring)": an activity and what ran, where the backend said.
std::string with_plan(std::string activity, const char* ran) {
  return ran && *ran ? activity + " (" + ran + ")" : activity;
}

bool is_transport_failure(const Error& e) {
  return e.code() == StatusCode::kRemoteError || e.code() == StatusCode::kTimeout ||
         e.code() == StatusCode::kInternal;
}

}  // namespace

Executor::Executor(const Config& config, int rank, ProcessSetRegistry& sets, Controller& controller,
                   TensorQueue& queue, Timeline& timeline, Backend& backend, GpuContext& gpu_context)
    : config_(config),
      rank_(rank),
      sets_(sets),
      controller_(controller),
      queue_(queue),
      timeline_(timeline),
      backend_(backend),
      gpu_context_(gpu_context),
      tuner_(config, rank),
      fusion_(static_cast<size_t>(std::max<int64_t>(0, config.huge_page_bytes))) {}

Executor::~Executor() = default;

void Executor::abort_device_work(const Status& why) {
  if (gpu_) gpu_->abort(why);
}

namespace {
std::string upper(const char* text) {
  std::string s(text);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

char* Executor::fusion_buffer(size_t bytes) { return fusion_.reserve(bytes); }

void Executor::execute(const std::vector<const Response*>& responses, const std::vector<EagerResult>& eager) {
  finish_eager(eager);
  plan_fusion(responses, tuner_.fusion_threshold_bytes(), config_.fusion_tensor_limit_bytes, &plan_);
  for (size_t g = 0; g < plan_.groups(); ++g) {
    const Response& head = *responses[plan_.members[plan_.begin(g)]];
    const bool on_device = head.on_device && !head.is_error;
    if (!on_device && plan_.end(g) - plan_.begin(g) == 1) {
      run_single(head);
      continue;
    }
    group_.clear();
    for (size_t m = plan_.begin(g); m < plan_.end(g); ++m) group_.push_back(responses[plan_.members[m]]);
    if (on_device)
      run_on_device(group_);
    else
      run_fused(group_);
  }
  // The autotuner's windows count every allreduce of the negotiated stream, member or not, eager ones too (a
  // window sized to a training step's gradients must close once per step): the same on every rank.
  auto bytes_of = [](const Response& r) { return element_count(r) * static_cast<int64_t>(dtype_size(r.dtype)); };
  int64_t allreduced = 0;
  for (const EagerResult& done : eager) allreduced += bytes_of(*done.response);
  for (const Response* r : responses) {
    if (!r->is_error && r->op == OpType::kAllreduce) allreduced += bytes_of(*r);
  }
  if (allreduced > 0) count_allreduced(allreduced);
}

void Executor::count_allreduced(int64_t bytes) {
  tuner_.record(bytes, [this](int32_t* choice) { backend_.broadcast(0, *sets_.get(0), choice, sizeof *choice, 0); });
}

void Executor::finish_eager(const std::vector<EagerResult>& results) {
  const int n = sets_.get(0)->size();
  for (const EagerResult& done : results) {
    const Response& r = *done.response;
    TensorEntry* entry = controller_.take_pending(r);
    if (!entry) continue;  // not reached: every rank had submitted it
    TimelineSpan span(timeline_, entry, timeline_.enabled() ? "ALLREDUCE (eager)" : "");
    copy_scaled(r.dtype, entry->output, done.data, static_cast<size_t>(element_count(r)), effective_postscale(r, n));
    queue_.finish(entry, Status::Ok());
  }
}

void Executor::run_single(const Response& r) {
  TensorEntry* e = controller_.take_pending(r);
  // Described only for the timeline: building the text cost more than a cached 8-byte allreduce's bookkeeping.
  std::string activity;
  if (timeline_.enabled()) activity = upper(op_name(r.op));
  TimelineSpan span(timeline_, e, activity);
  if (r.is_error) {
    if (e) queue_.finish(e, Status(static_cast<StatusCode>(r.error_code), r.error));
    return;
  }
  try {
    switch (r.op) {
      case OpType::kAddProcessSet:
      case OpType::kRemoveProcessSet:
        run_process_set_change(r, e);
        return;
      case OpType::kJoin:
        if (e) e->handle->int_results = r.ranks;
        controller_.clear_joined();
        break;
      case OpType::kBarrier:
        break;  // negotiation completed only once every member had arrived
      default: {
        Communicator* comm = sets_.get(r.process_set);
        if (!comm || comm->rank() < 0) return;  // not a member: nothing to do
        if (r.op == OpType::kAllreduce) {
          const char* ran = run_allreduce(*comm, r, e);
          if (span.recording()) span.set_activity(with_plan(upper(op_name(r.op)), ran));
        } else if (r.op == OpType::kAllgather) {
          const char* ran = run_allgather(*comm, r, e);
          if (span.recording()) span.set_activity(with_plan(upper(op_name(r.op)), ran));
        } else if (r.op == OpType::kBroadcast)
          run_broadcast(*comm, r, e);
        else if (r.op == OpType::kAlltoall && e)
          run_alltoall(*comm, r, e);
        else if (r.op == OpType::kReducescatter && e)
          run_reducescatter(*comm, r, e);
      }
    }
  } catch (const Error& error) {
    if (is_transport_failure(error)) {  // fatal: the runtime fails it with every other pending entry
      if (e) controller_.return_pending(e);
      throw;
    }
    if (e) queue_.finish(e, error.status());
    return;
  }
  if (e) queue_.finish(e, Status::Ok());
}

const char* Executor::run_allreduce(Communicator& comm, const Response& r, TensorEntry* e) {
  const size_t count = static_cast<size_t>(element_count(r));
  const size_t bytes = count * dtype_size(r.dtype);
  const void* input;
  void* output;
  if (e) {
    input = e->input;
    output = e->output;
  } else {  // joined: contribute zeros, discard the result
    if (zeros_.size() < bytes) zeros_.assign(bytes, 0);
    input = zeros_.data();
    output = fusion_buffer(bytes);
  }
  if (r.prescale != 1.0) {
    copy_scaled(r.dtype, output, input, count, r.prescale);
    input = output;
  }
  if (r.reduce_op == ReduceOp::kAdasum) {
    if (input != output && bytes > 0) copy_bytes(output, input, bytes);
    backend_.adasum(r.process_set, comm, output, {count}, r.dtype);
    if (r.postscale != 1.0) scale_in_place(r.dtype, output, count, r.postscale);
    return "adasum";
  }
  return backend_.allreduce(r.process_set, comm, input, output, count, r.dtype, reduce_kind(r.reduce_op),
                            effective_postscale(r, comm.size()));
}

void Executor::run_fused(const std::vector<const Response*>& group) {
  const Response& head = *group.front();
  Communicator* comm = sets_.get(head.process_set);
  std::vector<TensorEntry*>& entries = fused_entries_;  // null where this rank has none (it joined)
  entries.resize(group.size());
  for (size_t i = 0; i < group.size(); ++i) entries[i] = controller_.take_pending(*group[i]);
  if (!comm || comm->rank() < 0) return;
  const size_t esize = dtype_size(head.dtype);
  fused_layout(group, &fused_layout_);
  const std::vector<size_t>& counts = fused_layout_.counts;
  const std::vector<size_t>& offsets = fused_layout_.offsets;
  const size_t total = fused_layout_.total;
  std::vector<std::unique_ptr<TimelineSpan>> spans;
  const std::string fused = timeline_.enabled() ? "ALLREDUCE (fused x" + std::to_string(group.size()) : "";
  for (size_t i = 0; i < group.size(); ++i) {
    if (entries[i] && timeline_.enabled()) spans.emplace_back(new TimelineSpan(timeline_, entries[i], fused + ")"));
  }
  const bool adasum = head.reduce_op == ReduceOp::kAdasum;  // reduces the group as a whole
  const size_t piece_bytes = adasum ? 0 : fusion_piece_bytes(comm->cheap_meetings());
  const size_t piece_elements = piece_bytes ? piece_bytes / esize : total;
  const double post = effective_postscale(head, comm->size());
  try {
    const char* ran = "adasum";
    for (size_t first = 0, end; first < group.size(); first = end) {
      end = piece_end(fused_layout_, first, piece_elements);
      fused_pieces_.fetch_add(1, std::memory_order_relaxed);
      const size_t base = offsets[first];
      const size_t count = offsets[end - 1] + counts[end - 1] - base;
      char* buffer = fusion_buffer(count * esize);  // the same bytes for every piece: they stay in cache
      for (size_t i = first; i < end; ++i) {
        char* place = buffer + (offsets[i] - base) * esize;
        if (entries[i])
          copy_scaled(head.dtype, place, entries[i]->input, counts[i], head.prescale);
        else
          std::memset(place, 0, counts[i] * esize);
      }
      if (adasum)
        backend_.adasum(head.process_set, *comm, buffer, counts, head.dtype);
      else
        ran = backend_.allreduce(head.process_set, *comm, buffer, buffer, count, head.dtype,
                                 reduce_kind(head.reduce_op), 1.0);
      for (size_t i = first; i < end; ++i) {
        if (entries[i])
          copy_scaled(head.dtype, entries[i]->output, buffer + (offsets[i] - base) * esize, counts[i], post);
      }
    }
    if (!spans.empty() && ran && *ran) {
      for (auto& span : spans) span->set_activity(fused + ", " + ran + ")");
    }
  } catch (const Error&) {  // fatal: the runtime fails these with every other pending entry
    for (TensorEntry* entry : entries)
      if (entry) controller_.return_pending(entry);
    throw;
  }
  queue_.finish_group(entries, Status::Ok());
  entries.clear();
}

void Executor::run_on_device(const std::vector<const Response*>& group) {
  const Response& head = *group.front();
  // The device work outlives this cycle: its entries' contents move into it, and the entries go back at once.
  std::vector<TensorEntry> entries(group.size());
  std::vector<TensorEntry*> taken;
  bool all = true;
  for (size_t i = 0; i < group.size(); ++i) {
    TensorEntry* entry = controller_.take_pending(*group[i]);
    all = all && entry;
    if (!entry) continue;
    entries[i] = std::move(*entry);
    taken.push_back(entry);
  }
  queue_.recycle(taken);
  Communicator* comm = sets_.get(head.process_set);
  if (!comm || comm->rank() < 0) return;  // not a member: nothing to do
  // Every member submitted each tensor (negotiation refuses CUDA collectives while ranks have joined).
  if (!all) throw Error(StatusCode::kInternal, "a CUDA collective reached a member without its tensor");
  try {
    if (!gpu_) gpu_.reset(new GpuExecutor(gpu_context_, backend_, queue_, timeline_));
    // The execution span runs from the launch until the device is done: the completion queue ends it.
    if (timeline_.enabled()) {
      const std::string plane = gpu_->staged(head, *comm) ? "STAGED_" : "NCCL_";
      const std::string activity = plane + upper(op_name(head.op)) +
                                   (group.size() > 1 ? " (fused x" + std::to_string(group.size()) + ")" : "");
      for (const TensorEntry& e : entries) {  // the rows the negotiation spans began on (TimelineSpan)
        timeline_.end(e.request.name);
        timeline_.begin(e.request.name, activity);
      }
    }
    gpu_->run(*comm, group, entries);  // the entries finish when the device is done
  } catch (const Error& error) {
    for (const TensorEntry& e : entries) timeline_.end(e.request.name);
    if (is_transport_failure(error)) {  // fatal: the runtime fails them with every other pending entry
      taken.clear();
      queue_.take_spare(taken, entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        *taken[i] = std::move(entries[i]);
        controller_.return_pending(taken[i]);
      }
      throw;
    }
    for (TensorEntry& e : entries) {
      gpu_context_.release_event(e.ready);
      e.ready = nullptr;
      queue_.finish(std::move(e), error.status());
    }
  }
}

const char* Executor::run_allgather(Communicator& comm, const Response& r, TensorEntry* e) {
  const size_t row_bytes = static_cast<size_t>(row_elements(r.shape)) * dtype_size(r.dtype);
  std::vector<size_t> block_bytes(comm.size());
  int64_t rows = 0;
  size_t total = 0;
  for (int i = 0; i < comm.size(); ++i) {
    block_bytes[i] = static_cast<size_t>(r.first_dims[i]) * row_bytes;
    rows += r.first_dims[i];
    total += block_bytes[i];
  }
  char* output;
  if (e) {
    output = e->handle->allocate_output(total);
    e->handle->output_shape = r.shape;
    e->handle->output_shape[0] = rows;
  } else {
    output = fusion_buffer(total);
  }
  return backend_.allgather(r.process_set, comm, e ? e->input : nullptr, output, block_bytes);
}

void Executor::run_broadcast(Communicator& comm, const Response& r, TensorEntry* e) {
  const size_t bytes = static_cast<size_t>(element_count(r.shape)) * dtype_size(r.dtype);
  int root_index = -1;
  for (int i = 0; i < comm.size(); ++i)
    if (comm.global_rank(i) == r.root_rank) root_index = i;
  void* buffer = e ? e->output : fusion_buffer(bytes);
  if (rank_ == r.root_rank && e && e->input != e->output && bytes > 0) copy_bytes(e->output, e->input, bytes);
  backend_.broadcast(r.process_set, comm, buffer, bytes, root_index);
}

void Executor::run_alltoall(Communicator& comm, const Response& r, TensorEntry* e) {
  const int n = comm.size();
  const size_t row_bytes = static_cast<size_t>(row_elements(r.shape)) * dtype_size(r.dtype);
  std::vector<int32_t> send_rows(e->splits);
  std::vector<int32_t> recv_rows(n, 0);
  // First the row counts (each member learns what it will receive), then the rows themselves.
  std::vector<size_t> four(n, sizeof(int32_t));
  backend_.alltoall(r.process_set, comm, send_rows.data(), four, recv_rows.data(), four);
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  size_t total = 0;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    send_bytes[i] = static_cast<size_t>(send_rows[i]) * row_bytes;
    recv_bytes[i] = static_cast<size_t>(recv_rows[i]) * row_bytes;
    total += recv_bytes[i];
    rows += recv_rows[i];
  }
  char* output = e->handle->allocate_output(total);
  e->handle->output_shape = e->request.shape;
  e->handle->output_shape[0] = rows;
  e->handle->int_results = recv_rows;
  backend_.alltoall(r.process_set, comm, e->input, send_bytes, output, recv_bytes);
}

void Executor::run_reducescatter(Communicator& comm, const Response& r, TensorEntry* e) {
  const int n = comm.size();
  const size_t esize = dtype_size(r.dtype);
  const int64_t row_elems = row_elements(r.shape);
  std::vector<size_t> rows = even_split(static_cast<size_t>(r.shape[0]), n);
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = rows[i] * static_cast<size_t>(row_elems);
  const size_t total = static_cast<size_t>(element_count(r.shape));
  char* work = fusion_buffer(total * esize);
  copy_scaled(r.dtype, work, e->input, total, r.prescale);
  const size_t mine = counts[comm.rank()];
  char* output = e->handle->allocate_output(mine * esize);
  e->handle->output_shape = r.shape;
  e->handle->output_shape[0] = static_cast<int64_t>(rows[comm.rank()]);
  backend_.reduce_scatter(r.process_set, comm, work, output, counts, r.dtype, reduce_kind(r.reduce_op));
  const double post = effective_postscale(r, n);
  if (post != 1.0) scale_in_place(r.dtype, output, mine, post);
}

void Executor::run_process_set_change(const Response& r, TensorEntry* e) {
  Status status;
  if (r.op == OpType::kAddProcessSet) {
    std::vector<int> ranks(r.ranks.begin(), r.ranks.end());
    int existing = sets_.find(ranks);
    if (existing >= 0) {
      status = Status(StatusCode::kInvalidArgument,
                      "a process set with these ranks already exists (id " + std::to_string(existing) + ")");
    } else {
      int id = sets_.add(ranks);
      backend_.set_added(id, *sets_.get(id));
      if (e) e->handle->int_results = {id};
    }
  } else {
    int id = r.ranks.empty() ? -1 : r.ranks[0];
    if (!sets_.remove(id))
      status = Status(StatusCode::kInvalidArgument, "no process set with id " + std::to_string(id) + " to remove");
    else {
      backend_.set_removed(id);
      if (gpu_) gpu_->set_removed(id);
    }
  }
  if (e) queue_.finish(e, status);
}

}  // namespace hvdlite
