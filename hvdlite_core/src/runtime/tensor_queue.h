// Hand-off from framework threads to the background thread: enqueue never blocks on communication and wakes
// nobody (a synchronous caller drives its operation itself, asynchronous work waits for the next cycle tick); the
// background thread sleeps until woken (work handed back, shutdown) or a cycle passes. It also keeps a record of
// each name (entry.h's NameRecord): whether it is in flight, so that a duplicate is refused at enqueue time on the
// rank that made the mistake, and what later lookups of the name found.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hvdlite.h"
#include "runtime/entry.h"
#include "runtime/fast_slots.h"
#include "runtime/recent_ops.h"

namespace hvdlite {

// Entries travel by pointer from enqueue to finish (queue, negotiation, execution), so that an operation's entry
// is written once and never copied; the queue owns them all, in flight or kept for reuse.
class TensorQueue {
 public:
  // slots: the names' slots (runtime/fast_slots.h), which outlive the queue; by default the queue's own.
  explicit TensorQueue(FastSlots* slots = nullptr) : slots_(slots ? *slots : own_slots_) {}
  // Names not in flight are forgotten (their records swept, their slots disarmed) once there are this many: the
  // response cache's default capacity, since a name's record and slot serve its cached response, and a name forgotten
  // takes its next two submissions the ordinary way.
  static constexpr size_t kNamesKept = size_t{1} << 16;
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;
  ~TensorQueue();
  // Queues every entry or none: duplicate names (in flight, or twice in the batch) refuse the whole batch.
  // Entries without a name are named once the batch is accepted (number_unnamed), so a refused batch never
  // advances the counters that keep those names equal across ranks. Accepted, the entries are in flight and
  // `entries` is emptied; refused, they stay with the caller (recycle them).
  // admitted (optional): the accepted entries are moved there instead of into the queue, in flight all the same.
  // caller_waits: the calling thread waits for them at once (a synchronous collective), so they wake nobody.
  Status push(std::vector<TensorEntry*>& entries, std::vector<TensorEntry*>* admitted = nullptr,
              bool caller_waits = false);
  // Submissions through their names' slots (FastSlots::submit_many), all or none: true with handles when taken,
  // false when they must be pushed. Like push, it wakes the background thread only from a long sleep.
  bool submit_fast(const hvdlite_request* requests, int count, int64_t* handles);
  // An unnamed operation that finished without being queued (the steady lane) still takes its number.
  void skip_unnamed(int32_t process_set, OpType op);
  // Records an operation that never became an entry (the steady lane's, when it fails) among the recent ones, as
  // submitted and pending, for the report of where this rank was.
  void note_submitted(const hvdlite_request& q);
  // Waits until something is queued, wake() is called, or timeout passes. push() wakes the waiter only when
  // wake_on_push is set (a long idle sleep) and no cycle ran within the last `quiet` (after_pause); otherwise new
  // work waits for the next cycle tick.
  void wait_for_work(std::chrono::microseconds timeout, bool wake_on_push = false,
                     std::chrono::microseconds quiet = std::chrono::microseconds(0));
  // Waits until wake() is called or timeout passes, whatever is queued; with wake_on_push, also until new work is
  // pushed after a pause that its caller does not wait for.
  void wait_for_wake(std::chrono::microseconds timeout, bool wake_on_push = false,
                     std::chrono::microseconds quiet = std::chrono::microseconds(0));
  // A cycle begins now (whoever runs it): submissions within the sleeper's quiet time after it are no pause.
  void note_cycle(Clock::time_point now) {
    last_cycle_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }
  // Moves everything queued into out (emptied first), without waiting, and claims the submitted slots' entries. The
  // two vectors trade buffers, so a steady state allocates neither.
  void drain(std::vector<TensorEntry*>& out);
  // Marks the entry's operation finished: frees its name and wakes its waiters. The entry comes back to the
  // queue for reuse (take_spare).
  void finish(TensorEntry* entry, Status status);
  // The same for an entry's contents moved out of it (work on a device, finished later elsewhere).
  void finish(TensorEntry&& contents, Status status);
  // The same for the entries of a group, under one lock; null ones are skipped.
  void finish_group(const std::vector<TensorEntry*>& entries, const Status& status);
  // Appends count entries to out for a new submission: finished ones kept for reuse (their strings and vectors
  // still allocated), else new ones.
  void take_spare(std::vector<TensorEntry*>& out, size_t count);
  // Takes back entries that were never queued (a refused submission) or whose contents were moved out.
  void recycle(const std::vector<TensorEntry*>& entries);
  void wake();
  // Without the lock: a caller that finds the queue empty just as work arrives leaves it to the next cycle tick,
  // as it would had the work come a moment later.
  bool empty() const { return queued_.load(std::memory_order_acquire) == 0 && !slots_.any_submitted(); }
  // How many submissions that no caller waited on at once have come so far: the background thread reads it twice,
  // a moment apart, to tell a caller still submitting from one that has stopped.
  uint64_t submissions() const { return submissions_.load(std::memory_order_relaxed); }
  // How many times a submission has woken the background thread from its long sleep (build_info's wake-ups).
  uint64_t submission_wakes() const { return submission_wakes_.load(std::memory_order_relaxed); }
  // Finishes every queued entry with status (shutdown, fatal error) and refuses new ones after that.
  void close(const Status& status);
  std::string recent_report(int rank);  // RecentOps::report

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  // The record an entry's token (TensorEntry::name_slot) names, if it is still that name's; else null.
  NameRecord* record_by_slot(uint64_t slot, size_t key_hash);
  // The record of a key, made if it has none; its name is marked in flight and a new record's token is written
  // where the entry's caller keeps it.
  NameRecord* mark_in_flight(TensorEntry& entry, size_t key_hash, NameRecord* known);
  void clear_in_flight(TensorEntry& entry);
  // For a named entry whose record is not in flight: whether its name's slot has an operation in flight. If not,
  // the slot takes no submission until the entry finishes (marked_ keeps it, to be unmarked if the push is refused).
  bool slot_in_flight(const NameRecord& record);
  // For an entry now in flight under its record: its name's slot takes no submission until it finishes, and for a
  // caller that keeps its request, the slot is armed for the next submission (runtime/fast_slots.h).
  void hold_slot(const TensorEntry& entry, NameRecord& record);
  FastSlots own_slots_;
  FastSlots& slots_;
  std::vector<FastSlot*> marked_;       // push's, reused
  void keep_spare(TensorEntry* entry);  // under the lock
  // Moves the submitted slots' entries into the queue, claimed and recorded among the recent operations (under
  // the lock): the drain takes them with the rest, and a report of this rank's last collectives names them.
  void claim_slots();
  // Forgets the records of names not in flight once there are many (unnamed operations get a new name each).
  void sweep_names();
  // Unnamed operations are named "<op>.noname.<n>", counted per (process set, operation) in submission order:
  // ranks that issue the same unnamed collectives in the same order agree on the names, even when other sets run
  // unnamed collectives in between. Under the lock.
  int64_t number_unnamed(int32_t process_set, OpType op) { return unnamed_counters_[{process_set, op}]++; }
  std::map<std::pair<int32_t, OpType>, int64_t> unnamed_counters_;

  std::vector<TensorEntry*> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), written under the lock
  // Records never move (a deque grows at its end), so entries hold pointers to them. A caller's kept request
  // finds its record by slot, in the order it submits, with no hashing of its name and no walk through scattered
  // hash nodes: that walk cost most of a submission once thousands of names are in flight. names_ finds the
  // slot of a name submitted without a token.
  std::deque<NameRecord> records_;
  std::vector<uint32_t> free_slots_;  // of swept records, reused with their generation advanced
  std::unordered_map<std::string, uint32_t> names_;
  size_t sweep_at_ = kNamesKept;    // names_.size() at which the next sweep_names runs
  std::vector<NameRecord*> found_;  // push's records of the batch, reused
  std::vector<size_t> key_hashes_;  // and their keys' hashes
  uint64_t batches_ = 0;            // grouped submissions so far (NameRecord::batch)
  // Finished entries, reused rather than freed, so that a steady state allocates nothing here. Stays below the
  // most operations ever in flight at once.
  std::vector<TensorEntry*> spare_entries_;
  bool closed_ = false;
  Status closed_status_;
  bool woken_ = false;
  // Atomic for submit_fast, which reads it without the lock; written under it.
  std::atomic<bool> wake_on_push_{false};
  // Whether a submission now comes after a pause, so that waking the long sleeper takes the work up sooner than its
  // callers would. In a loop of short steps that callers drive, a wake-up per step only preempts a caller; the
  // first submission that finds a cycle within the quiet time turns the question off until the next sleep (new
  // work then waits at most the sleep's IDLE_CYCLE_TIME), so the loop reads the clock once a sleep.
  bool after_pause();
  std::atomic<int64_t> last_cycle_ns_{0};      // note_cycle
  std::atomic<int64_t> quiet_ns_{0};           // the sleeper's quiet time
  std::atomic<bool> callers_drive_{false};     // after_pause found a recent cycle during this sleep
  std::atomic<uint64_t> submission_wakes_{0};  // submission_wakes()
  // Its own line: the caller writes it at every submission, the background thread reads it only at a cycle tick. A
  // count two submitting threads race on may lose one; it still moves, which is all it tells.
  alignas(64) std::atomic<uint64_t> submissions_{0};
  void count_submission() {
    submissions_.store(submissions_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  RecentOps recent_;
};

}  // namespace hvdlite
