#include "runtime/handle_table.h"

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

void HandleTable::insert(int64_t id, std::shared_ptr<HandleState> state) {
  if (spare_.empty()) {
    states_.emplace(id, std::move(state));
    return;
  }
  States::node_type node = std::move(spare_.back());
  spare_.pop_back();
  node.key() = id;
  node.mapped() = std::move(state);
  states_.insert(std::move(node));  // ids are never reused: always placed
}

void HandleTable::erase(int64_t id) {
  States::node_type node = states_.extract(id);
  if (node.empty()) return;
  node.mapped().reset();
  spare_.push_back(std::move(node));
}

int64_t HandleTable::add(std::shared_ptr<HandleState> state) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t id = next_id_++;
  insert(id, std::move(state));
  return id;
}

void HandleTable::add_many(const std::vector<std::shared_ptr<HandleState>>& states, int64_t* ids_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < states.size(); ++i) {
    ids_out[i] = next_id_++;
    insert(ids_out[i], states[i]);
  }
}

std::shared_ptr<HandleState> HandleTable::get(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(id);
  return it == states_.end() ? nullptr : it->second;
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
