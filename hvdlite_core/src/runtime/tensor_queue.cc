#include "runtime/tensor_queue.h"

namespace hvdlite {

namespace {
uint64_t token_of(const NameRecord& record) {
  return uint64_t{record.generation} << 32 | (uint64_t{record.slot} + 1);
}
}  // namespace

TensorQueue::~TensorQueue() {
  for (TensorEntry* entry : queue_) {
    if (!entry->fast_slot) delete entry;  // a slot's entry is the slot's
  }
  for (TensorEntry* entry : spare_entries_) delete entry;
}

Status TensorQueue::push(std::vector<TensorEntry*>& entries, std::vector<TensorEntry*>* admitted, bool caller_waits) {
  bool wake = false;
  for (TensorEntry* entry : entries) {
    if (!entry->request.name.empty()) entry_key_into(entry->key, entry->request.process_set, entry->request.name);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return closed_status_;
    // Only a grouped submission can repeat a name within itself. A name this rank has queued before is checked by
    // its record's mark, which allocates nothing; only names new to the rank go through a set.
    const bool grouped = entries.size() > 1;
    const uint64_t batch = grouped ? ++batches_ : 0;
    std::unordered_set<std::string_view> new_names;
    // A refused batch leaves its names' slots as it found them.
    marked_.clear();
    struct Unmark {
      std::vector<FastSlot*>& marked;
      ~Unmark() {
        for (FastSlot* slot : marked) slot->ordinary.store(0, std::memory_order_seq_cst);
      }
    } unmark{marked_};
    if (found_.size() < entries.size()) {  // grown only: a fill per push would cost a call per submission
      found_.resize(entries.size());
      key_hashes_.resize(entries.size());
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      const TensorEntry& entry = *entries[i];
      found_[i] = nullptr;
      key_hashes_[i] = 0;
      if (entry.request.name.empty()) continue;
      const std::string& key = entry.key;
      key_hashes_[i] = std::hash<std::string>{}(key);
      NameRecord* record = record_by_slot(entry.name_slot, key_hashes_[i]);
      if (!record) {
        auto it = names_.find(key);
        record = it != names_.end() ? &records_[it->second] : nullptr;
      }
      found_[i] = record;
      bool repeated = false;
      if (grouped && record) {
        repeated = record->batch == batch;
        record->batch = batch;
      } else if (grouped) {
        repeated = !new_names.insert(key).second;
      }
      if (!record &&
          has_auto_name_form(entry.request.op,
                             entry.request.name)) {  // checked once per name: a refused one is never recorded
        return Status(StatusCode::kInvalidArgument,
                      "the name '" + entry.request.name + "' has the form the core gives unnamed " +
                          op_name(entry.request.op) + "s; give the collective another name, or none");
      }
      if ((record && (record->in_flight || slot_in_flight(*record))) || repeated) {
        return Status(
            StatusCode::kInvalidArgument,
            "a collective named '" + entry.request.name + "' is already in flight on this rank" +
                (entry.request.process_set ? " in process set " + std::to_string(entry.request.process_set) : "") +
                "; wait for it (synchronize) before reusing the name, or give the new one another name");
      }
    }
    if (names_.size() + entries.size() > sweep_at_) {
      sweep_names();
      std::fill(found_.begin(), found_.begin() + entries.size(), nullptr);  // swept records are gone: look again
    }
    // Only the last few of a batch can be among the recent operations a report shows.
    const size_t first_recent = entries.size() > RecentOps::kKept ? entries.size() - RecentOps::kKept : 0;
    marked_.clear();  // accepted: the slots stay marked until their entries finish
    for (size_t i = 0; i < entries.size(); ++i) {
      TensorEntry& entry = *entries[i];
      if (entry.request.name.empty()) {
        // No record: the name never repeats, and no user's name can take its form (has_auto_name_form).
        auto_name_into(entry.request.name, entry.request.op,
                       number_unnamed(entry.request.process_set, entry.request.op));
        entry_key_into(entry.key, entry.request.process_set, entry.request.name);
      } else {
        entry.name_record = mark_in_flight(entry, key_hashes_[i], found_[i]);
        hold_slot(entry, *entry.name_record);
      }
      if (i >= first_recent) recent_.submitted(entry);
      if (admitted)
        admitted->push_back(&entry);
      else
        queue_.push_back(&entry);
    }
    entries.clear();
    queued_.store(queue_.size(), std::memory_order_release);
    wake = wake_on_push_ && !caller_waits && after_pause();
    woken_ = woken_ || wake;
  }
  if (!caller_waits) count_submission();
  // The background thread is in a long idle sleep (IDLE_CYCLE_TIME): work after a pause is taken up at once, unless
  // its caller waits for it now and so drives it.
  if (wake) {
    submission_wakes_.fetch_add(1, std::memory_order_relaxed);
    ready_.notify_one();
  }
  // Otherwise no wake-up here. A synchronous caller drives its own operation in wait(); asynchronous work is taken up
  // by the background thread at its next cycle tick (CYCLE_TIME), as in Horovod. A wake-up per enqueue would cost a
  // futex wake, a context switch and a thread competing for the caller's core, more than a small allreduce itself.
  return Status::Ok();
}

bool TensorQueue::submit_fast(const hvdlite_request* requests, int count, int64_t* handles) {
  thread_local std::vector<FastSlot*> reserved;  // reused: an optimizer submits a batch every step
  if (count == 1 ? !slots_.submit(requests[0], handles) : !slots_.submit_many(requests, count, handles, reserved))
    return false;
  count_submission();
  // After the submission is visible (FastSlots::any_submitted): a waiter that set the flag before it looked for
  // work either saw this one or is woken here.
  if (wake_on_push_.load(std::memory_order_seq_cst) && after_pause()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      woken_ = true;
    }
    submission_wakes_.fetch_add(1, std::memory_order_relaxed);
    ready_.notify_one();
  }
  return true;
}

bool TensorQueue::slot_in_flight(const NameRecord& record) {
  FastSlot* slot = slots_.find(record.slot);
  if (!slot) return false;
  // The mark first, then the state; a submission changes the state first, then reads the mark (FastSlots::submit):
  // at least one of the two sees the other.
  slot->ordinary.store(1, std::memory_order_seq_cst);
  const uint32_t state = slot->state.load(std::memory_order_seq_cst);
  if (state == FastSlot::kBusy || state == FastSlot::kSubmitted || state == FastSlot::kClaimed) {
    slot->ordinary.store(0, std::memory_order_seq_cst);
    return true;
  }
  marked_.push_back(slot);
  return false;
}

void TensorQueue::hold_slot(const TensorEntry& entry, NameRecord& record) {
  FastSlot* slot = slots_.find(record.slot);
  if (slot) slot->ordinary.store(1, std::memory_order_seq_cst);  // a new record's place may have an old slot
  // Armed only for a caller that keeps its request: it came back with the token its name was given.
  const Request& q = entry.request;
  const uint64_t token = token_of(record);
  if (entry.name_slot != token || q.op != OpType::kAllreduce || q.on_device || q.unnamed || !q.cacheable) return;
  // Armed again even where it holds this request already: an armed name comes this way only while its slot is not
  // idle or its request changed, and arming is a copy.
  if (!slot) {
    slot = slots_.make(record.slot);
    if (!slot) return;
    slot->ordinary.store(1, std::memory_order_seq_cst);
  }
  slots_.arm(*slot, entry, token);
}

void TensorQueue::skip_unnamed(int32_t process_set, OpType op) {
  std::lock_guard<std::mutex> lock(mutex_);
  number_unnamed(process_set, op);
}

void TensorQueue::note_submitted(const hvdlite_request& q) {
  const int64_t elements = q.shape ? element_count(std::vector<int64_t>(q.shape, q.shape + q.ndim)) : 1;
  std::lock_guard<std::mutex> lock(mutex_);
  recent_.submitted(static_cast<OpType>(q.op), q.process_set_id, q.name ? q.name : "",
                    elements * static_cast<int64_t>(dtype_size(static_cast<DType>(q.dtype))));
}

bool TensorQueue::after_pause() {
  if (callers_drive_.load(std::memory_order_relaxed)) return false;
  const int64_t now = Clock::now().time_since_epoch().count();
  if (now - last_cycle_ns_.load(std::memory_order_relaxed) >= quiet_ns_.load(std::memory_order_relaxed)) return true;
  callers_drive_.store(true, std::memory_order_relaxed);
  return false;
}

void TensorQueue::wait_for_work(std::chrono::microseconds timeout, bool wake_on_push,
                                std::chrono::microseconds quiet) {
  std::unique_lock<std::mutex> lock(mutex_);
  quiet_ns_.store(std::chrono::duration_cast<Clock::duration>(quiet).count(), std::memory_order_relaxed);
  callers_drive_.store(false, std::memory_order_relaxed);
  wake_on_push_ = wake_on_push;
  auto any = [this] { return !queue_.empty() || woken_ || slots_.any_submitted(); };
  if (!any()) ready_.wait_for(lock, timeout, any);
  wake_on_push_ = false;
  woken_ = false;
}

void TensorQueue::wait_for_wake(std::chrono::microseconds timeout, bool wake_on_push,
                                std::chrono::microseconds quiet) {
  std::unique_lock<std::mutex> lock(mutex_);
  quiet_ns_.store(std::chrono::duration_cast<Clock::duration>(quiet).count(), std::memory_order_relaxed);
  callers_drive_.store(false, std::memory_order_relaxed);
  wake_on_push_ = wake_on_push;
  if (!woken_) ready_.wait_for(lock, timeout, [this] { return woken_; });
  wake_on_push_ = false;
  woken_ = false;
}

void TensorQueue::drain(std::vector<TensorEntry*>& out) {
  out.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  claim_slots();
  out.swap(queue_);
  queued_.store(0, std::memory_order_release);
}

void TensorQueue::claim_slots() {
  const size_t claimed = slots_.claim(queue_);
  // As push records the last few of a batch.
  for (size_t i = queue_.size() - std::min(claimed, RecentOps::kKept); i < queue_.size(); ++i)
    recent_.submitted(*queue_[i]);
  queued_.store(queue_.size(), std::memory_order_release);
}

NameRecord* TensorQueue::record_by_slot(uint64_t slot, size_t key_hash) {
  if (slot == 0) return nullptr;
  const uint64_t index = (slot & 0xffffffffu) - 1;
  if (index >= records_.size()) return nullptr;
  NameRecord& record = records_[index];
  return record.generation == slot >> 32 && record.key_hash == key_hash ? &record : nullptr;
}

NameRecord* TensorQueue::mark_in_flight(TensorEntry& entry, size_t key_hash, NameRecord* known) {
  NameRecord* record = known;
  if (!record) {
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<uint32_t>(records_.size());
      records_.emplace_back();
    }
    record = &records_[slot];
    record->slot = slot;
    record->key_hash = key_hash;
    names_.emplace(entry.key, slot);
  }
  record->in_flight = true;
  // Written only when it changes, so that a kept request's steady state leaves the caller's memory alone. Relaxed
  // and atomic: threads that share a kept request may queue it at once (all but one are then refused).
  const uint64_t token = token_of(*record);
  if (entry.name_slot_home && entry.name_slot != token)
    __atomic_store_n(entry.name_slot_home, token, __ATOMIC_RELAXED);
  return record;
}

void TensorQueue::clear_in_flight(TensorEntry& entry) {
  if (entry.name_record) {
    entry.name_record->in_flight = false;
    if (FastSlot* slot = slots_.find(entry.name_record->slot)) slot->ordinary.store(0, std::memory_order_seq_cst);
  }
  entry.name_record = nullptr;
}

void TensorQueue::sweep_names() {
  for (auto it = names_.begin(); it != names_.end();) {
    NameRecord& record = records_[it->second];
    FastSlot* fast = slots_.find(record.slot);
    if (record.in_flight || (fast && !slots_.disarm(*fast))) {  // a slot not idle still has its operation
      ++it;
      continue;
    }
    // A new generation: tokens callers still hold for the old name find nothing here and look their name up.
    const uint32_t slot = record.slot, generation = record.generation + 1;
    record = NameRecord();
    record.slot = slot;
    record.generation = generation;
    free_slots_.push_back(slot);
    it = names_.erase(it);
  }
  // Twice what is left: names in flight are never swept, so a table mostly in flight is not swept on every push.
  sweep_at_ = std::max(kNamesKept, 2 * names_.size());
}

void TensorQueue::keep_spare(TensorEntry* entry) {
  if (entry->fast_slot) return;  // its slot's for good
  // Bounded: a burst of many thousand operations once should not hold their memory for the rest of the job.
  constexpr size_t kMostSpare = 1 << 14;
  if (spare_entries_.size() >= kMostSpare) {
    delete entry;
    return;
  }
  entry->reset_keeping_capacity();
  spare_entries_.push_back(entry);
}

void TensorQueue::take_spare(std::vector<TensorEntry*>& out, size_t count) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (count > 0 && !spare_entries_.empty()) {
      out.push_back(spare_entries_.back());
      spare_entries_.pop_back();
      --count;
    }
  }
  for (; count > 0; --count) out.push_back(new TensorEntry());
}

void TensorQueue::recycle(const std::vector<TensorEntry*>& entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (TensorEntry* entry : entries) keep_spare(entry);
}

void TensorQueue::finish(TensorEntry* entry, Status status) {
  if (entry->fast_slot) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      recent_.finished(*entry, status.ok());
    }
    FastSlots::complete(*entry->fast_slot, status);
    return;
  }
  std::shared_ptr<HandleState> handle = std::move(entry->handle);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recent_.finished(*entry, status.ok());  // before its name record is let go: it finds its record by it
    clear_in_flight(*entry);
    keep_spare(entry);
  }
  if (handle) handle->finish(std::move(status));
}

void TensorQueue::finish(TensorEntry&& contents, Status status) {
  std::shared_ptr<HandleState> handle = std::move(contents.handle);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recent_.finished(contents, status.ok());
    clear_in_flight(contents);
  }
  if (handle) handle->finish(std::move(status));
}

void TensorQueue::finish_group(const std::vector<TensorEntry*>& entries, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (TensorEntry* entry : entries) {
      if (!entry) continue;
      recent_.finished(*entry, status.ok());
      if (!entry->fast_slot) clear_in_flight(*entry);
    }
  }
  for (TensorEntry* entry : entries) {
    if (!entry) continue;
    if (entry->fast_slot)
      FastSlots::complete(*entry->fast_slot, status);
    else if (entry->handle)
      entry->handle->finish(status);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (TensorEntry* entry : entries) {
    if (entry) keep_spare(entry);
  }
}

std::string TensorQueue::recent_report(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  claim_slots();  // operations submitted through their slots are this rank's latest too
  return recent_.report(rank);
}

void TensorQueue::wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  ready_.notify_one();
}

void TensorQueue::close(const Status& status) {
  std::vector<TensorEntry*> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      closed_ = true;
      closed_status_ = status;
    }
    left.swap(queue_);
    queued_.store(0, std::memory_order_release);
    slots_.close(left);
  }
  for (TensorEntry* entry : left) finish(entry, closed_status_);
}

}  // namespace hvdlite
