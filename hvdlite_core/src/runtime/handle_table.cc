#include "runtime/handle_table.h"

#include <algorithm>

namespace hvdlite {

namespace {

struct HandleRing {
  std::vector<std::shared_ptr<HandleState>> slots;
  size_t oldest = 0, count = 0;
};

// Out of line, so that a caller finds the thread's ring once: the compiler would otherwise look a thread_local of a
// dlopen'ed library up again (a call into the dynamic linker) at every use.
__attribute__((noinline)) HandleRing& this_thread_handle_ring() {
  thread_local HandleRing ring;
  return ring;
}

}  // namespace

std::shared_ptr<HandleState> fresh_handle_state() {
  // The states this thread handed out, oldest first, in a ring: the oldest is the likeliest to be free again.
  // Bounded, since the ring keeps them alive; a step of more operations than it holds allocates as before.
  constexpr size_t kRing = 4096;
  HandleRing& r = this_thread_handle_ring();
  if (r.slots.empty()) r.slots.resize(kRing);
  std::shared_ptr<HandleState> state;
  if (r.count > 0 && r.slots[r.oldest].use_count() == 1) {
    // The ring is its only owner, so nobody can take a new reference; the fence pairs with the releasing
    // decrement of its last other owner, whose writes (the finished status) are then complete.
    std::atomic_thread_fence(std::memory_order_acquire);
    state = std::move(r.slots[r.oldest]);
    state->reset();
  } else {
    state = std::make_shared<HandleState>();
    if (r.count == kRing) r.slots[r.oldest].reset();  // still in use: left to its owners
  }
  if (r.count > 0 && !r.slots[r.oldest]) {  // the oldest slot was emptied: the ring moves on
    r.oldest = (r.oldest + 1) % kRing;
    --r.count;
  }
  r.slots[(r.oldest + r.count) % kRing] = state;
  ++r.count;
  return state;
}

void HandleTable::pop_front() {
  std::shared_ptr<HandleState>& oldest = ring_[head_];
  if (oldest) stragglers_.emplace(first_id_, std::move(oldest));
  head_ = (head_ + 1) & mask_;
  ++first_id_;
  --count_;
}

void HandleTable::insert(std::shared_ptr<HandleState> state) {
  if (count_ == ring_.size()) {
    if (ring_.size() < window_bound_) {
      // Grown in order, oldest first, so ids keep their offsets from first_id_.
      std::vector<std::shared_ptr<HandleState>> grown(
          std::min(window_bound_, std::max<size_t>(64, 2 * ring_.size())));
      for (size_t i = 0; i < count_; ++i) grown[i] = std::move(ring_[(head_ + i) & mask_]);
      ring_.swap(grown);
      head_ = 0;
      mask_ = ring_.size() - 1;
    } else {
      pop_front();
    }
  }
  ring_[(head_ + count_) & mask_] = std::move(state);
  ++count_;
}

void HandleTable::erase(int64_t id) {
  if (id >= first_id_ && id < first_id_ + static_cast<int64_t>(count_)) {
    at(id).reset();
    while (count_ > 0 && !ring_[head_]) pop_front();
    return;
  }
  if (!stragglers_.empty()) stragglers_.erase(id);
}

int64_t HandleTable::add(std::shared_ptr<HandleState> state) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = first_id_ + static_cast<int64_t>(count_);
  insert(std::move(state));
  return id;
}

void HandleTable::add_many(const std::vector<std::shared_ptr<HandleState>>& states, int64_t* ids_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < states.size(); ++i) {
    ids_out[i] = first_id_ + static_cast<int64_t>(count_);
    insert(states[i]);
  }
}

std::shared_ptr<HandleState>* HandleTable::find(int64_t id) {
  if (id >= first_id_ && id < first_id_ + static_cast<int64_t>(count_)) {
    std::shared_ptr<HandleState>& slot = at(id);
    return slot ? &slot : nullptr;
  }
  if (id <= 0 || stragglers_.empty()) return nullptr;  // ids past the window: adopted ones (adopt)
  auto it = stragglers_.find(id);
  return it == stragglers_.end() ? nullptr : &it->second;
}

std::shared_ptr<HandleState> HandleTable::get(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<HandleState>* slot = find(id);
  return slot ? *slot : nullptr;
}

HandleTable::Outcome HandleTable::release_if_done(int64_t id, std::shared_ptr<HandleState>* state_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<HandleState>* slot = find(id);
  if (!slot) return Outcome::kUnknown;
  const HandleState& state = **slot;
  if (state.finished() && state.status.ok()) {
    erase(id);
    return Outcome::kReleased;
  }
  *state_out = *slot;
  return Outcome::kPending;
}

void HandleTable::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  erase(id);
}

void HandleTable::release_many(const int64_t* ids, int32_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int32_t i = 0; i < count; ++i) erase(ids[i]);
}

}  // namespace hvdlite
