// The background loop: the steps every cycle takes (drain, negotiate and validate, fuse, execute, complete), who
// runs a cycle (this thread, or a caller waiting on a handle, whoever holds progress_mutex_), and when this thread
// sleeps between cycles.
#include <algorithm>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "runtime/runtime.h"

namespace hvdlite {

void Runtime::background_loop() {
  Progress::set_thread_spin(config_.background_spin_microseconds);
  while (!stopped_) {
    // HVDLITE_AUTOTUNE may change it between cycles.
    const auto cycle = std::chrono::microseconds(static_cast<int64_t>(executor_->tuner().cycle_time_ms() * 1000));
    // While a caller is inside wait() it drives progress (and drains the queue each cycle): only an explicit
    // hand-back or the cycle timer wakes us then, and during the long sleep new work nobody waits for, which may
    // come after that caller has left. Otherwise the cycle tick does, and new work only after a pause.
    const bool sleep_long = long_idle();
    const auto idle = std::chrono::microseconds(static_cast<int64_t>(config_.idle_cycle_time_ms * 1000));
    if (active_waiters_.load() > 0) {
      queue_.wait_for_wake(sleep_long ? idle : cycle, sleep_long, cycle);
    } else if (sleep_long) {
      queue_.wait_for_work(idle, true, cycle);
    } else {
      queue_.wait_for_work(cycle);
    }
    // A caller that has just enqueued is usually microseconds away from wait(); let it drive rather than
    // race it for the lock (each lost race costs two cross-thread wake-ups on a busy machine).
    mesh_->progress().stamp_alive();  // co-located peers read it to tell a stopped rank from a slow one
    if (sleep_long && !queue_.empty()) {
      // New work woke us from a long sleep. A synchronous caller is on its way to wait(), perhaps on the CPU this
      // wake-up took from it: sleeping rather than spinning lets it get there. Work nobody waits for starts 50 us
      // later.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      auto grace = Clock::now();
      while (active_waiters_.load() == 0 && micros_since(grace) < 10) cpu_relax();
    }
    if (defer_to_submitter(cycle)) continue;
    bool recent = Clock::now() - last_cycle_ < cycle;
    // Work that woke us from a long sleep and that a caller now waits on is the caller's to drive: a job whose
    // collectives are all synchronous then never has its steps interrupted by this thread's cycles.
    if (active_waiters_.load() > 0 && (recent || long_idle())) continue;
    std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) continue;  // a caller is driving; it hands back work it leaves behind
    // Idle wake-up, but a cycle ran recently: our peers are being served, skip the extra round.
    bool skip = queue_.empty() && Clock::now() - last_cycle_ < cycle;
    bool running = skip || run_cycle(true);
    lock.unlock();
    announce_progress();
    if (!running) return;
  }
}

// Where the job's ranks fill this machine's CPUs, a cycle is a meeting of threads that each take a CPU from some
// rank's caller: this thread's cycle waits for the peers' cycles, and every wake-up on the way preempts a caller.
// During a caller's run of asynchronous submissions (a loop of allreduce_async_) such a cycle also takes part of
// the run, which the caller's own wait() would take whole a moment later. So a tick that finds work queued and no
// caller waiting first watches the submissions for a moment: if they still come, it sleeps another cycle (a
// caller's hand-back cuts the sleep short) and leaves the work to the caller's wait. Work whose submitter has
// stopped (it computes before waiting) runs at that tick, as does everything once IDLE_CYCLE_TIME of deferrals has
// passed, which bounds how late this rank answers its peers during an endless run of submissions. Where CPUs are
// to spare, the cycle takes nobody's CPU and the tick runs as it comes.
bool Runtime::defer_to_submitter(std::chrono::microseconds cycle) {
  if (mesh_->cpus_to_spare() || active_waiters_.load() > 0 || queue_.empty() || shutdown_requested_.load()) {
    deferring_since_ = Clock::time_point{};
    return false;
  }
  const auto now = Clock::now();
  const auto bound = std::chrono::microseconds(static_cast<int64_t>(config_.idle_cycle_time_ms * 1000));
  if (deferring_since_ == Clock::time_point{}) deferring_since_ = now;
  if (now - deferring_since_ >= bound) {
    deferring_since_ = Clock::time_point{};
    return false;
  }
  // A cycle within the last tick means the ranks' work is moving (mostly by callers' waits, this thread's own
  // cycles being the ones put off), and the next wait takes this work too. Otherwise the submissions, watched for a
  // moment, tell whether a caller is still at it.
  if (now - last_cycle_ >= cycle) {
    const uint64_t before = queue_.submissions();
    std::this_thread::sleep_for(std::chrono::microseconds(kSubmissionWatchMicroseconds));
    if (active_waiters_.load() == 0 && queue_.submissions() == before) {
      deferring_since_ = Clock::time_point{};
      return false;
    }
  }
  // Work left to a caller is work all the same: the job is not idle, so no long sleep that its next submission
  // would have to wake this thread from.
  idle_cycles_.store(0);
  if (active_waiters_.load() == 0) queue_.wait_for_wake(cycle, false);  // a caller that waits drives
  return true;
}

// Cycles are collective, so an idle job still wakes every rank's background thread every CYCLE_TIME, preempting
// the training computation where it fills the cores. After a run of this thread's own cycles in which nothing
// happened on any rank, each rank sleeps IDLE_CYCLE_TIME instead and new work wakes it at once: work submitted by
// every member of a set wakes each of them; a rank outside a process set, or a peer that stops, is answered within
// IDLE_CYCLE_TIME. Cycles that callers drive in wait() do not count: a job whose collectives are all synchronous
// (a Keras step's, a DistributedOptimizer that reduces in step()) needs no background cycles between them.
bool Runtime::long_idle() const {
  return idle_cycles_ >= kIdleCyclesBeforeLongSleep &&
         config_.idle_cycle_time_ms > executor_->tuner().cycle_time_ms();
}

// Why this rank is leaving, for the other ranks' errors: the abort reason if it failed; otherwise, if operations
// it submitted are still pending, their names, since a peer that then submits its side of them is stopped instead
// of completing them (a rank that left without waiting, e.g. with bounded staleness's averages not drained).
std::string Runtime::leaving_note(const std::vector<TensorEntry*>& fresh) const {
  if (!abort_reason_.empty()) return abort_reason_;
  std::vector<std::string> names = controller_->pending_names();
  for (const TensorEntry* e : fresh) names.push_back(e->request.name);
  if (names.empty()) return "";
  std::sort(names.begin(), names.end());
  constexpr size_t kNamed = 4;
  std::ostringstream note;
  note << "rank " << rank_ << " shut hvdlite down with " << names.size() << " of its operations still pending (";
  for (size_t i = 0; i < names.size() && i < kNamed; ++i) note << (i ? ", " : "") << names[i];
  if (names.size() > kNamed) note << ", and " << names.size() - kNamed << " more";
  note << "): every rank must wait for the operations it submits (synchronize them, or drain() an optimizer "
          "with staleness) before it shuts down";
  return note.str();
}

std::string Runtime::lost_peers_note() { return mesh_ ? mesh_->lost_peers_report() : ""; }

void Runtime::announce_progress() {
  progress_epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (epoch_sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&progress_epoch_);
}

bool Runtime::run_cycle(bool background) {
  if (stopped_) return false;
  // 1. Drain: what this process's callers enqueued since the last cycle.
  std::vector<TensorEntry*>& fresh = fresh_;
  queue_.drain(fresh);
  last_cycle_ = Clock::now();
  queue_.note_cycle(last_cycle_);
  if (timeline_.enabled()) {
    for (const TensorEntry* e : fresh) {
      timeline_.begin(e->request.name, std::string("NEGOTIATE_") + op_name(e->request.op), e->enqueued);
    }
  }
  try {
    // 2-3. Negotiate and validate (controller.h): which tensors every member of a set has submitted, in one order
    // on every rank, with mismatches turned into errors that name the ranks.
    const bool leaving = shutdown_requested_.load();
    controller_->negotiate(fresh, leaving, leaving ? leaving_note(fresh) : std::string(), outcome_);
  } catch (...) {
    stop_for_exception();
    return false;
  }
  return complete_cycle(outcome_, background);
}

bool Runtime::complete_cycle(Controller::Outcome& outcome, bool background) {
  try {
    if (background) {
      idle_cycles_.store(outcome.idle ? idle_cycles_.load() + 1 : 0);
      background_cycles_.fetch_add(1, std::memory_order_relaxed);
    }
    if (!outcome.responses.empty() || !outcome.eager.empty()) timeline_.mark_cycle();
    // 4-6. Fuse, run on the backend and complete the handles (executor.h).
    executor_->execute(outcome.responses, outcome.eager);
    if (timeline_.enabled()) timeline_.flush_if_due(outcome.idle);
    if (outcome.shutdown) {
      std::string why = "another rank shut hvdlite down before this operation completed";
      if (shutdown_requested_)
        why = "hvdlite was shut down before this operation completed";
      else if (!outcome.peer_failure.empty())
        why = outcome.peer_failure + "; hvdlite stopped on every rank";
      fail_everything(Status(StatusCode::kAborted, why));
      return false;
    }
    return true;
  } catch (...) {
    stop_for_exception();
  }
  return false;
}

Status Runtime::stop_for_exception() {
  Status status;
  try {
    throw;
  } catch (const Error& e) {
    std::string what = e.what() + lost_peers_note();
    std::string recent = queue_.recent_report(rank_);
    if (!recent.empty()) what += "; " + recent;
    HVD_LOG(kError, "background loop stopped: " << what);
    status = Status(e.code(), "hvdlite cannot continue: " + what);
  } catch (const std::exception& e) {
    status = Status(StatusCode::kInternal, std::string("hvdlite internal error: ") + e.what());
  }
  fail_everything(status);
  return status;
}

}  // namespace hvdlite
