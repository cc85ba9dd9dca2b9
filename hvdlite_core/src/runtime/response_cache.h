// The response cache: responses of tensors negotiated before, kept at fixed positions so that in steady state
// a rank announces "I have submitted the tensor at position p" with one bit, and one bitwise-AND allreduce of
// those bits tells every rank which tensors are ready everywhere, with no coordinator round-trip.
//
// Invariant: every rank's cache holds the same responses at the same positions. It holds because the cache only
// changes in response to the coordinator's response list (identical on all ranks) and in a fixed order: erase
// invalidated positions, then put/touch while executing; eviction is least-recently-used with ties impossible.
//
// Recency is a log of touches in order rather than a linked list: a cycle touches every response it runs, and a
// list's splice writes three nodes scattered over memory where the log appends one entry after the last.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/message.h"

namespace hvdlite {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity);
  size_t capacity() const { return capacity_; }
  // One past the highest occupied position (0 when empty): negotiation exchanges bits only up to it, and
  // scanning a 1024-slot cache for it on every cycle cost a microsecond of an 8-byte allreduce.
  size_t occupied_end() const { return occupied_end_; }
  // Changes whenever an entry is put or erased (not on touch): what is derived from the contents, such as the
  // eager layout (runtime/eager.h), is rebuilt only then.
  uint64_t generation() const { return generation_; }
  // Recency, the same on every rank (touches follow the agreed executions): how many touches there have been, when
  // a position was last touched (by that count), and how many responses the cache holds.
  uint64_t touch_count() const { return touches_; }
  uint64_t touched_at(int position) const { return touched_at_[position]; }
  size_t size() const { return by_key_.size(); }

  enum class Lookup { kMiss, kHit, kConflict };
  // kHit: the request matches the cached response at *position. kConflict: the name is cached with other
  // parameters (the entry must be invalidated everywhere). member_index: the submitter's index in the set.
  Lookup lookup(const Request& request, int member_index, int* position) const;
  // The same with the request's key (key_of) already built.
  Lookup lookup(const std::string& key, const Request& request, int member_index, int* position) const;
  // A request's key: entry_key(process set, name) for a named one; for an unnamed one, the key of what it carries
  // (unnamed_cache_name), with a separator no entry_key has.
  static std::string key_of(const Request& request);
  static void key_of_into(std::string& out, const Request& request);  // into out's capacity
  // The key put() keeps a response under: key_of of the requests it matches.
  static std::string key_of(const Response& response);
  bool occupied(int position) const {
    return static_cast<size_t>(position) < slots_.size() && slots_[position] != nullptr;
  }
  const Response& at(int position) const { return *slots_[position]; }
  // A number given to the response put at a position, never given again (0: the position is empty or beyond
  // the end): a lookup's position stays valid while the position's stamp is the one it saw.
  uint64_t stamp_at(int position) const {
    return static_cast<size_t>(position) < stamps_.size() ? stamps_[position] : 0;
  }
  // Responses replaced or erased stay alive, at their addresses, until release_retired(): a cycle's outcome points
  // at the responses it runs while the same cycle's puts may replace them.
  void release_retired() { retired_.clear(); }
  // Inserts (or replaces the entry of the same key); returns the position. *displaced is the position whose
  // previous entry was evicted to make room or replaced, or -1: ranks holding a hit on it must renegotiate.
  int put(const Response& response, int* displaced);
  void erase(int position);
  void touch(int position);

 private:
  static std::string key(const Response& cached);  // key_of for the requests a cached response matches
  // The lowest free position: below the high-water mark from free_, else the next never-used one, else -1.
  int lowest_free() const;
  // The occupied position touched least recently (the cache must not be empty).
  int least_recent();
  // Drops the entries a later touch or an erase has made stale (and those least_recent() passed), once the log holds
  // more than twice as many as the cache: each compaction follows at least as many touches as it copies entries.
  void compact_touches();
  size_t capacity_;
  // Grows with use up to capacity_, so a large capacity costs nothing until it is filled.
  std::vector<std::unique_ptr<const Response>> slots_;
  std::vector<std::unique_ptr<const Response>> retired_;  // see release_retired()
  std::vector<uint64_t> stamps_;                          // by position
  std::vector<uint64_t> touched_at_;                      // by position
  uint64_t touches_ = 0;
  uint64_t next_stamp_ = 1;
  std::set<int> free_;  // empty positions below slots_.size()
  std::unordered_map<std::string, int> by_key_;
  // Every touch in order, oldest first from touches_from_: an entry is current while its position is occupied and
  // was last touched at its count; the others are skipped, and dropped by compact_touches().
  struct Touch {
    int position;
    uint64_t at;
  };
  std::vector<Touch> touch_log_;
  size_t touches_from_ = 0;
  size_t occupied_end_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace hvdlite
