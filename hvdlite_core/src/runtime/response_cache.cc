#include "runtime/response_cache.h"

#include <algorithm>
#include <charconv>

#include "runtime/entry.h"

namespace hvdlite {

ResponseCache::ResponseCache(size_t capacity) : capacity_(capacity) {}

int ResponseCache::lowest_free() const {
  if (!free_.empty()) return *free_.begin();
  if (slots_.size() < capacity_) return static_cast<int>(slots_.size());
  return -1;
}

namespace {
// "<process set>|": the start of an unnamed operation's key, a separator no entry_key has.
void unnamed_key_prefix_into(std::string& out, int32_t process_set) {
  char number[16];
  out.assign(number, std::to_chars(number, number + sizeof number, process_set).ptr);
  out += '|';
}

std::string unnamed_key(int32_t process_set, const std::string& cache_name) {
  std::string key;
  unnamed_key_prefix_into(key, process_set);
  return key.append(cache_name);
}
}  // namespace

void ResponseCache::key_of_into(std::string& out, const Request& request) {
  if (!request.unnamed) {
    entry_key_into(out, request.process_set, request.name);
    return;
  }
  unnamed_key_prefix_into(out, request.process_set);
  append_unnamed_cache_name(out, request);
}

std::string ResponseCache::key_of(const Request& request) {
  std::string key;
  key_of_into(key, request);
  return key;
}

std::string ResponseCache::key_of(const Response& response) {
  return response.unnamed ? unnamed_key(response.process_set, unnamed_cache_name(response))
                          : entry_key(response.process_set, response.name);
}

std::string ResponseCache::key(const Response& cached) {
  return cached.unnamed ? unnamed_key(cached.process_set, cached.name) : entry_key(cached.process_set, cached.name);
}

ResponseCache::Lookup ResponseCache::lookup(const Request& request, int member_index, int* position) const {
  if (by_key_.empty()) return Lookup::kMiss;
  return lookup(key_of(request), request, member_index, position);
}

ResponseCache::Lookup ResponseCache::lookup(const std::string& key, const Request& request, int member_index,
                                            int* position) const {
  if (by_key_.empty()) return Lookup::kMiss;
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return Lookup::kMiss;
  *position = it->second;
  return slots_[it->second]->matches(request, member_index) ? Lookup::kHit : Lookup::kConflict;
}

int ResponseCache::put(const Response& response, int* displaced) {
  *displaced = -1;
  // An unnamed operation's response is kept under the name of what it carries: the next one that carries the same
  // finds it, and a failure while running it names what it carries rather than a number that will not recur.
  std::string k = key_of(response);
  auto it = by_key_.find(k);
  int position;
  if (it != by_key_.end()) {
    position = it->second;
    *displaced = position;
  } else {
    position = lowest_free();  // deterministic on every rank
    if (position < 0) {
      position = least_recent();
      *displaced = position;
      erase(position);
    }
    if (static_cast<size_t>(position) == slots_.size()) {
      slots_.emplace_back();
      stamps_.emplace_back();
      touched_at_.emplace_back();
    }
    free_.erase(position);
    by_key_[k] = position;
  }
  auto placed = std::make_unique<Response>(response);
  if (response.unnamed) placed->name = unnamed_cache_name(response);
  placed->cache_position = position;
  if (slots_[position]) retired_.push_back(std::move(slots_[position]));
  slots_[position] = std::move(placed);
  stamps_[position] = next_stamp_++;
  ++generation_;
  occupied_end_ = std::max(occupied_end_, static_cast<size_t>(position) + 1);
  touch(position);
  return position;
}

void ResponseCache::erase(int position) {
  if (!occupied(position)) return;
  by_key_.erase(key(*slots_[position]));
  retired_.push_back(std::move(slots_[position]));
  stamps_[position] = 0;
  free_.insert(position);
  ++generation_;
  while (occupied_end_ > 0 && !slots_[occupied_end_ - 1]) --occupied_end_;
}

void ResponseCache::touch(int position) {
  if (!occupied(position)) return;
  touched_at_[position] = ++touches_;
  touch_log_.push_back({position, touches_});
  if (touch_log_.size() > 2 * by_key_.size() + 64) compact_touches();
}

int ResponseCache::least_recent() {
  // Every occupied position has a current entry (put touches it), and the log is in the order of the counts.
  for (;; ++touches_from_) {
    const Touch& t = touch_log_[touches_from_];
    if (occupied(t.position) && touched_at_[t.position] == t.at) return t.position;
  }
}

void ResponseCache::compact_touches() {
  size_t kept = 0;
  for (size_t i = touches_from_; i < touch_log_.size(); ++i) {
    const Touch t = touch_log_[i];
    if (occupied(t.position) && touched_at_[t.position] == t.at) touch_log_[kept++] = t;
  }
  touch_log_.resize(kept);
  touches_from_ = 0;
}

}  // namespace hvdlite
