// The one owned object of a process's hvdlite state: configuration, mesh, process sets, queue, negotiation,
// execution and the background thread that drives them. The C ABI holds at most one Runtime.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "choice/chooser.h"
#include "common/timeline.h"
#include "gpu/gpu_context.h"
#include "hvdlite.h"
#include "runtime/controller.h"
#include "runtime/executor.h"
#include "runtime/handle_table.h"
#include "runtime/process_sets.h"
#include "runtime/tensor_queue.h"
#include "transport/mesh.h"

namespace hvdlite {

class Runtime {
 public:
  // Connects the mesh (collective over all ranks) and starts the background thread.
  // handles and slots outlive it: at shutdown, its slots' unreleased handles move to the table.
  Runtime(const Config& config, const hvdlite_init_config& init, int listen_fd, HandleTable& handles,
          FastSlots& slots);
  ~Runtime();  // requests shutdown (collective) and joins the background thread

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Validates every request, then queues all of them or none (grouped collectives are atomic).
  // first_state_out (optional): the first operation's state, for a caller that waits on it at once. handles_out
  // may then be null: the operations get no handle (hvdlite_run registers one only when it must
  // return it). slot_homes (optional): for each request, the caller's kept request whose name_slot the core
  // updates, where requests are copies of it; by default the requests' own.
  // admitted (optional): the entries are marked in flight under their names but not queued; they are moved into
  // it for the caller to hand to negotiation itself (the steady lane's adopted operation).
  // caller_waits: the calling thread waits for them next (hvdlite_run), driving the cycles itself.
  Status enqueue(const hvdlite_request* requests, int count, int64_t* handles_out,
                 std::shared_ptr<HandleState>* first_state_out = nullptr, uint64_t* const* slot_homes = nullptr,
                 std::vector<TensorEntry*>* admitted = nullptr, bool caller_waits = false);
  // The steady lane (steady_lane.cc) for a synchronous operation: kDone, finished (its output written);
  // kTakeQueue, nothing happened, enqueue and wait as usual; kAdopted, an ordinary operation now, *state to wait
  // on; kFailed, with *failure. slot_home as for enqueue.
  enum class Steady { kDone, kTakeQueue, kAdopted, kFailed };
  Steady run_steady(const hvdlite_request& q, uint64_t* slot_home, std::shared_ptr<HandleState>* state,
                    Status* failure);
  // Whether a request may take the lane at all: the checks that need no lock. Larger ones than the eager region
  // can hold never pay for trying.
  // Asynchronous submissions through their names' slots (runtime/fast_slots.h), all or none: true with handles when
  // taken; false when they must be enqueued.
  bool submit_fast(const hvdlite_request* requests, int count, int64_t* handles) {
    // The timeline draws each operation's queued span from a precise reading: those take the queue.
    if (shutdown_requested_.load(std::memory_order_relaxed) || timeline_.enabled()) return false;
    return queue_.submit_fast(requests, count, handles);
  }
  bool steady_candidate(const hvdlite_request& q) const {
    // A named one needs its token (the kept request has been queued once); an unnamed one is found by what it
    // carries.
    if (q.op != HVDLITE_OP_ALLREDUCE || q.process_set_id != 0 || q.memory != HVDLITE_HOST_MEMORY ||
        (!Controller::lane_unnamed(q) && q.name_slot == 0) || q.ndim < 0 || (q.ndim > 0 && !q.shape) || !q.input ||
        !q.output || !dtype_valid(q.dtype))
      return false;
    int64_t bytes = dtype_size(static_cast<DType>(q.dtype));
    for (int32_t d = 0; d < q.ndim; ++d) {
      if (q.shape[d] < 0) return false;
      bytes *= q.shape[d];
      if (bytes > config_.eager_allreduce_bytes) return false;
    }
    return bytes <= config_.eager_allreduce_bytes;
  }
  ProcessSetRegistry& process_sets() { return *sets_; }
  std::string describe() const;
  // Collective: leaves the job; every rank's pending operations fail. With a reason (the caller leaves because of
  // an error), the other ranks' errors carry it instead of a bare "another rank shut hvdlite down".
  void shutdown(const std::string& reason = "");
  // "; connections closed by now: rank 0 (host), ..." for a fatal transport error ("" when none is closed).
  std::string lost_peers_note();
  // True once the runtime can do no more: a fatal error, or some rank's shutdown, ended it.
  bool stopped() const { return stopped_.load(); }
  // Rank 0 writes the timeline; on other ranks these succeed and record nothing (as in Horovod).
  void start_timeline(const std::string& path, bool mark_cycles);
  void stop_timeline();
  Timeline& timeline() { return timeline_; }
  // Blocks until the handle finishes or timeout_us passes (< 0: no limit); false on timeout. While the
  // background thread is idle the waiting thread runs negotiation cycles itself, which saves two thread
  // wake-ups per synchronous collective (MPI-style progress by the caller).
  bool wait(HandleState& handle, int64_t timeout_us);

 private:
  void background_loop();
  // One drain-negotiate-execute cycle; the caller holds progress_mutex_. False once the runtime stopped.
  // background: run by the background thread, whose own cycles alone count toward its long sleep.
  bool run_cycle(bool background = false);
  // A cycle's second half, after negotiation: execute the outcome, fail everything on a shutdown. False once the
  // runtime stopped.
  bool complete_cycle(Controller::Outcome& outcome, bool background = false);
  // Inside a catch block: stops the runtime for the exception in flight (every pending operation fails) and
  // returns the status they fail with.
  Status stop_for_exception();
  bool long_idle() const;  // whether the background thread may sleep IDLE_CYCLE_TIME
  // The background thread's tick, while this rank's caller is still submitting: true when it left the work to the
  // caller (and slept), false when it should run the cycle.
  bool defer_to_submitter(std::chrono::microseconds cycle);
  static constexpr int64_t kSubmissionWatchMicroseconds = 20;
  Clock::time_point deferring_since_{};  // the first tick of the current run of deferrals; background thread only
  static constexpr int kIdleCyclesBeforeLongSleep = 16;
  std::string leaving_note(const std::vector<TensorEntry*>& fresh) const;  // the reason sent with shutdown
  void fail_everything(const Status& status);
  Status check_request(const hvdlite_request& request, Request* out, std::vector<int32_t>* splits);
  // The NCCL data plane's limits, for a request on CUDA memory (marks it on_device).
  Status check_device_request(const hvdlite_request& request, Request& out,
                              const std::function<std::string()>& subject);

  const Config config_;  // as read from the environment; what init derives is the chooser's (choice/chooser.h)
  GpuContext gpu_context_{config_};  // CUDA tensors' device and events; outlives the executor
  int rank_;
  int size_;
  Timeline timeline_;
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<ProcessSetRegistry> sets_;
  Chooser chooser_{config_};          // how each collective of the built-in backend runs
  std::unique_ptr<Backend> backend_;  // the data plane (HVDLITE_CPU_OPERATIONS)
  HandleTable& handles_;
  FastSlots& slots_;
  bool slots_retired_ = false;  // by shutdown(), once its thread is joined
  TensorQueue queue_{&slots_};
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Executor> executor_;

  std::atomic<bool> shutdown_requested_{false};
  std::mutex abort_reason_mutex_;
  std::string abort_reason_;  // written before shutdown_requested_ is set, read by the cycle after it is
  std::atomic<bool> stopped_{false};
  std::mutex progress_mutex_;
  // Bumped each time a thread releases progress_mutex_ (after finishing handles or not); waiters sleep on it.
  std::atomic<uint32_t> progress_epoch_{0};
  std::atomic<uint32_t> epoch_sleepers_{0};
  void announce_progress();
  std::atomic<int> active_waiters_{0};  // threads inside wait(): they drive progress themselves
  bool wait_driving(HandleState& handle, int64_t timeout_us);
  Clock::time_point last_cycle_;  // written under progress_mutex_
  // A cycle's drained entries and negotiated outcome, reused from cycle to cycle (under progress_mutex_).
  std::vector<TensorEntry*> fresh_;
  Controller::Outcome outcome_;
  // Consecutive cycles of the background thread in which nothing happened anywhere; a caller that leaves work
  // pending resets it (written under progress_mutex_, read without it).
  std::atomic<int> idle_cycles_{0};
  // What the steady lane did (describe()): operations it finished, and those it handed to a cycle.
  std::atomic<uint64_t> steady_runs_{0};
  std::atomic<uint64_t> steady_adopted_{0};
  std::atomic<uint64_t> background_cycles_{0};  // cycles the background thread ran itself
  std::thread thread_;
};

}  // namespace hvdlite
