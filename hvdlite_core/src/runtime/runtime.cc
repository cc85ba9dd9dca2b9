#include "runtime/runtime.h"

#include <algorithm>
#include <sstream>

#include "backends/mpi_backend.h"
#include "collectives/algorithms.h"
#include "common/huge_page_promotion.h"
#include "common/log.h"
#include "runtime/config_agreement.h"
#include "tuning/table_file.h"

namespace hvdlite {

Runtime::Runtime(const Config& config, const hvdlite_init_config& init, int listen_fd, HandleTable& handles,
                 FastSlots& slots)
    : config_(config), rank_(init.rank), size_(init.size), handles_(handles), slots_(slots) {
  std::vector<PeerInfo> peers(size_);
  for (int r = 0; r < size_; ++r) {
    peers[r].address = init.peer_addresses ? init.peer_addresses[r] : "";
    peers[r].host_id = init.host_ids ? init.host_ids[r] : 0;
    peers[r].pid = init.pids ? init.pids[r] : 0;
  }
  HandshakeKeys keys;
  keys.secret.assign(init.secret, init.secret + init.secret_len);
  keys.job_id = init.job_id ? init.job_id : "job";
  mesh_.reset(new Mesh(config_, rank_, std::move(peers), std::move(keys), listen_fd));
  if (!config_.timeline.empty()) start_timeline(config_.timeline, config_.timeline_mark_cycles);
  sets_.reset(new ProcessSetRegistry(mesh_.get(), &config_));
  // Collectives on the init thread, before any other traffic: the knobs every rank must share are compared
  // (config_agreement.h), then the chooser measures or reads what its choices need.
  Communicator* world = sets_->get(0);
  if (size_ > 1) check_config_agreement(*world, config_);
  // A tuned table is per machine: for a world on one host, and not where MPI runs its own algorithms.
  const bool tunable = size_ > 1 && config_.cpu_operations == 0 && world->host_count() == 1;
  chooser_.establish(*world, tunable ? read_tuned_table(*world, config_) : TunedTable());
  HVD_LOG(kInfo, "collective algorithms: " << chooser_.describe());
  backend_ =
      config_.cpu_operations == 1 ? make_mpi_backend(config_, *world, init.mpi_comm) : make_builtin_backend(chooser_);
  controller_.reset(new Controller(config_, rank_, size_, *sets_));
  executor_.reset(new Executor(config_, rank_, *sets_, *controller_, queue_, timeline_, *backend_, gpu_context_));
  thread_ = std::thread([this] { background_loop(); });
}

Runtime::~Runtime() { shutdown(); }

void Runtime::shutdown(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_reason_mutex_);  // the first caller's reason wins
    if (!shutdown_requested_.load() && !reason.empty()) abort_reason_ = reason;
    shutdown_requested_ = true;
  }
  queue_.wake();
  if (thread_.joinable()) thread_.join();
  // Every operation has finished by now (the last cycle failed what was pending).
  if (!slots_retired_) {
    slots_retired_ = true;
    slots_.retire(handles_);
  }
}

void Runtime::start_timeline(const std::string& path, bool mark_cycles) {
  // Horovod's rule: rank 0 writes the timeline. A path with "{rank}" in it asks every rank for its own file
  // (to see both sides of a step: bench/step_timeline.py).
  const std::string marker = "{rank}";
  const size_t at = path.find(marker);
  if (at != std::string::npos) {
    timeline_.open(path.substr(0, at) + std::to_string(rank_) + path.substr(at + marker.size()), mark_cycles);
  } else if (rank_ == 0) {
    timeline_.open(path, mark_cycles);
  }
}

void Runtime::stop_timeline() { timeline_.close(); }

bool Runtime::wait(HandleState& handle, int64_t timeout_us) {
  if (!handle.finished()) release_held_lock();  // it may drive cycles of other operations, or sleep
  active_waiters_.fetch_add(1);
  bool finished = wait_driving(handle, timeout_us);
  active_waiters_.fetch_sub(1);
  // Work enqueued meanwhile (asynchronous operations) is the background thread's again.
  if (!queue_.empty()) queue_.wake();
  return finished;
}

bool Runtime::wait_driving(HandleState& handle, int64_t timeout_us) {
  // The deadline counts from the first time it is checked, after a first try: a small collective finishes in one
  // cycle without reading the clock. Every try after that checks it, whether it ran cycles or slept.
  Clock::time_point start;
  bool started = false;
  auto elapsed_us = [&]() -> int64_t {
    if (started) return micros_since(start);
    start = Clock::now();
    started = true;
    return 0;
  };
  bool tried = false;
  while (!handle.finished()) {
    if (tried && timeout_us >= 0 && elapsed_us() >= timeout_us) return false;
    tried = true;
    uint32_t epoch = progress_epoch_.load(std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      bool first_cycle = true;
      while (!handle.finished() && !stopped_) {
        if (!first_cycle && timeout_us >= 0 && elapsed_us() >= timeout_us) break;
        first_cycle = false;
        run_cycle();
      }
      // Work of this rank left pending needs the background thread's cycles again, not its long sleep.
      const bool left_pending = controller_->has_pending();
      lock.unlock();
      announce_progress();
      if (left_pending && idle_cycles_.exchange(0) >= kIdleCyclesBeforeLongSleep) queue_.wake();
      continue;
    }
    // Another thread is mid-cycle. Sleep until it releases the lock (it then bumps the epoch): either our
    // handle is finished by then, or we take over. Sleeping on the handle alone would miss a holder that
    // leaves without finishing it (a cycle that drained the queue before our enqueue).
    int64_t slice = 100000;
    if (timeout_us >= 0) slice = std::max<int64_t>(1, std::min(slice, timeout_us - elapsed_us()));
    epoch_sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (!handle.finished() && progress_epoch_.load(std::memory_order_seq_cst) == epoch) {
      futex_wait(&progress_epoch_, epoch, slice);
    }
    epoch_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
  return true;
}

void Runtime::fail_everything(const Status& status) {
  stopped_ = true;
  executor_->abort_device_work(status);
  queue_.close(status);
  for (TensorEntry* entry : controller_->take_all_pending()) queue_.finish(entry, status);
}

Status Runtime::check_request(const hvdlite_request& q, Request* out, std::vector<int32_t>* splits) {
  auto invalid = [](const std::string& message) { return Status(StatusCode::kInvalidArgument, message); };
  if (q.op < 0 || q.op >= kNumOpTypes) return invalid("unknown operation " + std::to_string(q.op));
  out->op = static_cast<OpType>(q.op);
  out->rank = rank_;
  out->process_set = q.process_set_id;
  out->prescale = q.prescale_factor;
  out->postscale = q.postscale_factor;
  out->root_rank = q.root_rank;
  out->layout = q.layout;
  if (q.name && *q.name) {
    out->name = q.name;
  } else if (out->op == OpType::kJoin) {
    out->name = "hvdlite.join";
    out->cacheable = false;
  } else if (out->op == OpType::kBarrier) {
    out->name = "hvdlite.barrier";
    out->cacheable = false;
  } else {
    out->unnamed = true;  // named when queued (TensorQueue::push), once the whole call is valid
  }
  // Built only for an error message: valid requests (every gradient, every step) never pay for it.
  auto subject = [&]() {
    return std::string(op_name(out->op)) +
           (out->name.empty() ? " of an unnamed tensor" : " of tensor '" + out->name + "'");
  };
  // Set 0, every rank, lives as long as the runtime: its members are read in place. Another set may be removed
  // meanwhile by the background thread, so its members are copied under the registry's lock (into a per-thread
  // vector: a copy per request allocated).
  thread_local std::vector<int> copied_members;
  const std::vector<int>* set_members = &copied_members;
  if (q.process_set_id == 0) {
    set_members = &sets_->get(0)->members();
  } else if (!sets_->members(q.process_set_id, &copied_members)) {
    return invalid(subject() + ": process set " + std::to_string(q.process_set_id) + " does not exist");
  }
  const std::vector<int>& members = *set_members;
  if (std::find(members.begin(), members.end(), rank_) == members.end()) {
    return invalid(subject() + ": this rank (" + std::to_string(rank_) + ") is not a member of process set " +
                   std::to_string(q.process_set_id));
  }
  if (out->op == OpType::kAddProcessSet || out->op == OpType::kRemoveProcessSet) {
    if (q.process_set_id != 0) return invalid("process sets are added and removed by every rank (process set 0)");
    out->ranks.assign(q.splits, q.splits + std::max(q.nsplits, 0));
    out->cacheable = false;
    if (out->op == OpType::kAddProcessSet) {
      std::vector<int32_t> sorted(out->ranks);
      std::sort(sorted.begin(), sorted.end());
      if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
          sorted.back() >= size_) {
        return invalid("add_process_set needs distinct ranks in [0, " + std::to_string(size_) + ")");
      }
      out->ranks = sorted;
    }
    return Status::Ok();
  }
  if (out->op == OpType::kBarrier || out->op == OpType::kJoin) {
    if (out->op == OpType::kJoin && q.process_set_id != 0) return invalid("join is only supported on process set 0");
    return Status::Ok();
  }
  if (!dtype_valid(q.dtype)) return invalid(subject() + ": unsupported dtype " + std::to_string(q.dtype));
  out->dtype = static_cast<DType>(q.dtype);
  if (q.ndim < 0 || (q.ndim > 0 && !q.shape)) return invalid(subject() + ": bad shape");
  out->shape.assign(q.shape, q.shape + q.ndim);
  for (int64_t d : out->shape)
    if (d < 0) return invalid(subject() + ": negative dimension in " + shape_string(out->shape));
  out->shape_key = key_of_shape(out->shape);
  if (q.reduce_op < 0 || q.reduce_op > 5)
    return invalid(subject() + ": unknown reduce op " + std::to_string(q.reduce_op));
  out->reduce_op = static_cast<ReduceOp>(q.reduce_op);
  const size_t bytes = static_cast<size_t>(element_count(out->shape)) * dtype_size(out->dtype);
  if (bytes > 0 && !q.input) return invalid(subject() + ": input buffer is null");
  switch (out->op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      if (out->reduce_op == ReduceOp::kAdasum) {
        if (q.memory == HVDLITE_CUDA_MEMORY) {
          return invalid(subject() +
                         ": Adasum runs on host tensors only in hvdlite (Horovod's GPU Adasum is not "
                         "built); move the tensor to the CPU");
        }
        if (out->op != OpType::kAllreduce) return invalid(subject() + ": Adasum applies to allreduce only");
        if (!adasum_supports(out->dtype)) {
          return invalid(subject() +
                         ": Adasum needs a floating-point tensor (float16, bfloat16, float32, float64), "
                         "not " +
                         dtype_name(out->dtype));
        }
        const size_t n = members.size();
        if ((n & (n - 1)) != 0) {
          return invalid(subject() + ": Adasum needs a power-of-two number of ranks; process set " +
                         std::to_string(q.process_set_id) + " has " + std::to_string(n));
        }
      }
      if (out->dtype == DType::kBool && out->reduce_op == ReduceOp::kAverage) {
        return invalid(subject() + ": Average is not defined for bool tensors");
      }
      if (out->dtype == DType::kBool && (q.prescale_factor != 1.0 || q.postscale_factor != 1.0)) {
        return invalid(subject() + ": prescale_factor and postscale_factor do not apply to bool tensors");
      }
      if (out->op == OpType::kAllreduce && bytes > 0 && !q.output)
        return invalid(subject() + ": output buffer is null");
      if (out->op == OpType::kReducescatter && out->shape.empty())
        return invalid(subject() + ": needs at least one dimension");
      break;
    case OpType::kBroadcast:
      if (std::find(members.begin(), members.end(), q.root_rank) == members.end()) {
        std::ostringstream list;
        for (size_t i = 0; i < members.size(); ++i) list << (i ? ", " : "") << members[i];
        return invalid(subject() + ": root rank " + std::to_string(q.root_rank) + " is not a member of process set " +
                       std::to_string(q.process_set_id) + " (ranks " + list.str() + ")");
      }
      if (bytes > 0 && !q.output) return invalid(subject() + ": output buffer is null");
      break;
    case OpType::kAllgather:
      if (out->shape.empty()) return invalid(subject() + ": needs at least one dimension");
      break;
    case OpType::kAlltoall: {
      if (out->shape.empty()) return invalid(subject() + ": needs at least one dimension");
      const int n = static_cast<int>(members.size());
      if (q.splits) {
        if (q.nsplits != n) {
          return invalid(subject() + ": splits has " + std::to_string(q.nsplits) + " entries, the process set has " +
                         std::to_string(n) + " ranks");
        }
        int64_t sum = 0;
        for (int i = 0; i < n; ++i) {
          if (q.splits[i] < 0) return invalid(subject() + ": negative split " + std::to_string(q.splits[i]));
          sum += q.splits[i];
        }
        if (sum != out->shape[0]) {
          return invalid(subject() + ": splits sum to " + std::to_string(sum) + " but the first dimension is " +
                         std::to_string(out->shape[0]));
        }
        splits->assign(q.splits, q.splits + n);
      } else {
        if (out->shape[0] % n != 0) {
          return invalid(subject() + ": first dimension " + std::to_string(out->shape[0]) +
                         " does not divide evenly over " + std::to_string(n) + " ranks; pass splits");
        }
        splits->assign(n, static_cast<int32_t>(out->shape[0] / n));
      }
      break;
    }
    default:
      break;
  }
  if (q.memory == HVDLITE_CUDA_MEMORY) return check_device_request(q, *out, subject);
  if (q.memory != HVDLITE_HOST_MEMORY)
    return invalid(subject() + ": unknown memory kind " + std::to_string(q.memory));
  return Status::Ok();
}

Status Runtime::check_device_request(const hvdlite_request& q, Request& out,
                                     const std::function<std::string()>& subject) {
  auto invalid = [&](const std::string& why) { return Status(StatusCode::kInvalidArgument, subject() + ": " + why); };
  const bool reduces = out.op == OpType::kAllreduce || out.op == OpType::kReducescatter;
  if (out.op == OpType::kBarrier || out.op == OpType::kJoin || out.op == OpType::kAddProcessSet ||
      out.op == OpType::kRemoveProcessSet) {
    return invalid("takes no tensor; pass host memory");
  }
  if (reduces && (out.dtype == DType::kUInt16 || out.dtype == DType::kInt16)) {
    return invalid(std::string("NCCL cannot reduce ") + dtype_name(out.dtype) +
                   " tensors; use int32 or a float type");
  }
  if (reduces && !dtype_is_floating(out.dtype) && (out.prescale != 1.0 || out.postscale != 1.0)) {
    return invalid(std::string("prescale_factor and postscale_factor apply to floating-point CUDA tensors, not ") +
                   dtype_name(out.dtype));
  }
  out.on_device = true;
  out.device = q.device;
  return Status::Ok();
}

namespace {

struct EnqueueScratch {
  std::vector<TensorEntry*> entries;
  std::vector<std::shared_ptr<HandleState>> states;
};

// Out of line, so that enqueue finds the thread's buffers once: the compiler would otherwise look a thread_local of
// a dlopen'ed library up again (a call into the dynamic linker) at every use.
__attribute__((noinline)) EnqueueScratch& this_thread_enqueue_scratch() {
  thread_local EnqueueScratch scratch;
  return scratch;
}

}  // namespace

Status Runtime::enqueue(const hvdlite_request* requests, int count, int64_t* handles_out,
                        std::shared_ptr<HandleState>* first_state_out, uint64_t* const* slot_homes,
                        std::vector<TensorEntry*>* admitted, bool caller_waits) {
  if (shutdown_requested_) return Status(StatusCode::kPrecondition, "hvdlite has been shut down");
  // Per calling thread and reused, with the finished entries the queue hands back: a steady state of named
  // tensors allocates no entry, name, shape or key here.
  EnqueueScratch& scratch = this_thread_enqueue_scratch();
  std::vector<TensorEntry*>& entries = scratch.entries;
  std::vector<std::shared_ptr<HandleState>>& states = scratch.states;
  struct Cleared {  // whatever the outcome, nothing of this call stays in the thread's buffers
    TensorQueue& queue;
    EnqueueScratch& scratch;
    ~Cleared() {
      // Refused ones go back (push empties the list of those it queues).
      if (!scratch.entries.empty()) queue.recycle(scratch.entries);
      scratch.entries.clear();
      scratch.states.clear();
    }
  } cleared{queue_, scratch};
  queue_.take_spare(entries, static_cast<size_t>(count));
  // The timeline draws the queued span from this reading; the stall checks need only its second, and never early.
  const Clock::time_point now = timeline_.enabled() ? Clock::now() : coarse_now() + coarse_tick();
  for (int i = 0; i < count; ++i) {
    TensorEntry& entry = *entries[i];
    Status status = check_request(requests[i], &entry.request, &entry.splits);
    if (!status.ok()) return status;
    entry.input = requests[i].input;
    entry.output = requests[i].output;
    // The ABI's one write into the caller's request (TensorQueue::push), into memory the caller owns.
    entry.name_slot_home = slot_homes ? slot_homes[i] : const_cast<uint64_t*>(&requests[i].name_slot);
    entry.name_slot = __atomic_load_n(entry.name_slot_home, __ATOMIC_RELAXED);
    // Results in the caller's buffers (a gradient's allreduce, a broadcast): a reused state. The others carry an
    // output the core owns, freed with a state that is not kept for reuse.
    const bool in_callers_buffers = entry.request.op == OpType::kAllreduce || entry.request.op == OpType::kBroadcast;
    entry.handle = in_callers_buffers ? fresh_handle_state() : std::make_shared<HandleState>();
    entry.enqueued = now;
  }
  // CUDA tensors: the data plane's stream must wait for the work that produces them on the caller's stream.
  auto release_events = [&]() {
    for (TensorEntry* entry : entries) gpu_context_.release_event(entry->ready);
  };
  for (int i = 0; i < count; ++i) {
    TensorEntry& entry = *entries[i];
    if (!entry.request.on_device) continue;
    entry.stream = const_cast<void*>(requests[i].stream);
    std::string subject =
        std::string(op_name(entry.request.op)) +
        (entry.request.name.empty() ? " of an unnamed tensor" : " of tensor '" + entry.request.name + "'");
    Status prepared = gpu_context_.prepare(subject, entry.request.device, entry.stream, &entry.ready);
    if (!prepared.ok()) {
      release_events();
      return prepared;
    }
  }
  for (const TensorEntry* entry : entries) states.push_back(entry->handle);
  Status status = queue_.push(entries, admitted, caller_waits);
  if (!status.ok()) {
    release_events();
    return status;
  }
  if (handles_out) handles_.add_many(states, handles_out);
  if (first_state_out && count > 0) *first_state_out = states[0];
  return Status::Ok();
}

std::string Runtime::describe() const {
  const HugePagePromoter* promoter = huge_page_promoter();
  const std::string huge_pages =
      promoter ? "huge_page_buffers=" + std::to_string(promoter->collapsed()) + " collapsed, " +
                     std::to_string(promoter->refused()) + " refused, " + std::to_string(promoter->given_up()) +
                     " given up, " + std::to_string(promoter->wasted()) + " wasted" +
                     (promoter->stopped() ? " (stopped: the application moves its buffers);" : ";")
               : "huge_page_buffers=off (transparent huge pages are off);";
  return mesh_->describe() + ";" + backend_->describe() + ";" + executor_->tuner().describe() + ";" +
         chooser_.describe() + ";" + huge_pages + "steady_lane_runs=" + std::to_string(steady_runs_.load()) +
         ";steady_lane_adopted=" + std::to_string(steady_adopted_.load()) +
         ";background_cycles=" + std::to_string(background_cycles_.load()) +
         ";submission_wakes=" + std::to_string(queue_.submission_wakes()) +
         ";fusion_piece_bytes=" + std::to_string(fusion_piece_bytes(sets_->get(0)->cheap_meetings())) +
         ";fused_pieces=" + std::to_string(executor_->fused_pieces()) + ";" + config_.Describe();
}

}  // namespace hvdlite
