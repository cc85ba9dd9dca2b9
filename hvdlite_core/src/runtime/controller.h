// Negotiation: each cycle, decide which submitted tensors every member of their process set has submitted,
// and in which order all ranks execute them.
//
// One cycle, on every rank (global rank 0 is the coordinator):
//   1. New entries are looked up in the response cache: a hit becomes a bit at the cache position; a miss (or
//      a hit with different parameters: a conflict) becomes a Request for the coordinator.
//   2. One bitwise-AND allreduce of [~flags | ~conflict bits | hit bits] gives everyone: whether anyone has
//      requests for the coordinator, wants to shut down or has joined (OR, via inverted bits); which cache
//      positions conflict somewhere (erased on every rank); which cached tensors are ready everywhere (AND;
//      ranks outside a tensor's process set vote yes).
//      Cached allreduces of a few bytes carry their data in the same exchange and are then already reduced
//      (runtime/eager.h).
//   3. Only if some rank has requests (or conflicts, or joins) do the ranks send them to the coordinator,
//      which matches them by (process set, name), validates complete sets (validation.h) and broadcasts the
//      ordered response list. Steady-state training never reaches this step.
// The responses are: ready cached ones in position order, then the coordinator's, identical on every rank.
#pragma once
#include <chrono>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "hvdlite.h"
#include "runtime/coordinator.h"
#include "runtime/eager.h"
#include "runtime/entry.h"
#include "runtime/process_sets.h"
#include "runtime/response_cache.h"
#include "runtime/vote_exchange.h"

namespace hvdlite {

class Controller {
 public:
  Controller(const Config& config, int rank, int size, ProcessSetRegistry& sets);

  struct Outcome {
    // What to run: the cache's responses (kept alive until the next cycle begins, even if this cycle's puts replace
    // them) and those the coordinator decided this cycle, held in decided. Pointers, not shared: a count per
    // response per cycle was a locked instruction on a line of its own, thousands of times a step.
    std::vector<const Response*> responses;
    std::vector<std::unique_ptr<const Response>> decided;
    std::vector<EagerResult> eager;  // reduced in the exchange: only to be copied out (valid until the next cycle)
    bool shutdown = false;
    std::string peer_failure;  // with shutdown: why the rank(s) that left did so, when they said ("" if not)
    // Nothing happened anywhere: no rank sent a request or a flag, nothing became ready, and this rank has
    // nothing waiting for negotiation (runtime.cc lengthens its cycle after a run of such cycles).
    bool idle = false;
  };
  // Takes ownership of fresh entries (kept as pending until executed). Collective over all ranks. A rank that
  // wants to shut down because of an error passes the reason, which every rank then finds in peer_failure.
  // outcome is overwritten; the caller reuses it from cycle to cycle.
  void negotiate(std::vector<TensorEntry*>& fresh, bool want_shutdown, const std::string& abort_reason,
                 Outcome& outcome);
  // The pending entry for a response, removed from the table; false if this rank has none (it joined, or
  // never submitted a tensor that failed validation).
  TensorEntry* take_pending(const Response& response);
  // Puts back an entry taken for execution whose execution hit a fatal error, so it fails with all the others.
  void return_pending(TensorEntry* entry);
  // Every pending entry, removed (for failing them all at shutdown or on a fatal error).
  std::vector<TensorEntry*> take_all_pending();
  // The names of this rank's pending entries, without removing them (for the note a leaving rank sends).
  std::vector<std::string> pending_names() const;
  // Whether this rank has operations waiting for negotiation or execution (under the progress lock).
  bool has_pending() const { return pending_count_ != 0 || !resend_.empty(); }
  bool joined() const { return joined_; }
  void clear_joined() { joined_ = false; }

  // A request without a name (an unnamed collective), as the C ABI gives it.
  static bool lane_unnamed(const hvdlite_request& q) { return !q.name || !*q.name; }
  // The steady lane (steady_lane.cc): a synchronous allreduce of a cached name that rides in the eager region,
  // submitted while nothing else is pending on this rank, votes and completes without an entry, a queue or a
  // handle. Its exchange is the same as a cycle's in which this rank's only hit is that tensor, so the other ranks
  // cannot tell the two apart.
  enum class LaneVote {
    kNotTaken,  // the lane does not apply; nothing was exchanged
    kDone,      // ready everywhere: the result is in q.output
    kNotReady,  // exchanged, and nothing happened anywhere: the operation goes the usual way, as if just submitted
    kOther,     // exchanged, and something else happened too: lane_adopt() must finish this cycle
  };
  // For the global process set's lane. allreduced_bytes: with kDone, what the autotuner counts.
  LaneVote lane_vote(const hvdlite_request& q, int64_t* allreduced_bytes);
  // After kOther: entry (the operation, now made an entry; null if it was refused) waits as the hit the lane voted,
  // and the exchanged votes are read as a cycle reads them.
  void lane_adopt(TensorEntry* entry, Outcome& outcome);

 private:
  int member_index(int process_set) const;
  void begin_cycle(Outcome& outcome);  // clears the outcome and what the last cycle left
  // The second half of a cycle: everything after the exchange of bits_, for a cycle over `positions` cache
  // positions. requests: this rank's for the coordinator (hits sent back are added).
  void read_votes(std::vector<Request>& requests, size_t positions, bool vote_unnamed, Outcome& outcome);
  // The cache position of a response that still describes a lane request (lane_matches), or -1: a named one's
  // by the token its kept request carries, an unnamed one's among the cached unnamed allreduces (class_words_,
  // which must be up to date).
  int lane_position(const hvdlite_request& q);
  // Whether a cached response is a lane request's: what ResponseCache::lookup's match compares for an allreduce.
  static bool lane_matches(const Response& cached, const hvdlite_request& q);
  // The cache lookup of a fresh entry: a hit where the entry's request matched last (a slot's entry, whose request
  // stays), while that position still holds the same response; else look_up_by_name.
  ResponseCache::Lookup look_up(TensorEntry& entry, int* position);
  // Through the name's record while the position found last time still holds the same response, else by key (and
  // the record remembers what was found).
  ResponseCache::Lookup look_up_by_name(const TensorEntry& entry, int* position);
  // The exchange of bits_ (runtime/vote_exchange.h): the flags word, the conflict, ready and (vote_unnamed) unnamed
  // blocks of `words` words each, ANDed over all ranks, then the eager region reduced (its tail as far as every
  // rank sent one).
  void exchange_bits(size_t words, bool vote_unnamed);
  // Readies bits_ for a cycle's votes: bit_words of ones and the eager head zeroed. Returns the eager region.
  char* prepare_bits(size_t bit_words);
  // This rank sends the eager tail's bytes [begin_bytes, end_bytes) of the region: zeroed and announced (none when
  // end_bytes <= begin_bytes).
  void write_tail(char* eager_region, size_t begin_bytes, size_t end_bytes);
  // Step 3: this rank's requests to the coordinator and its ordered responses back (rank 0 runs coordinator_).
  std::vector<Response> coordinate(const std::vector<Request>& mine);
  void remember(const std::vector<Response>& responses);
  // Every rank removes a process set at the same point of the response order, and then erases the set's cached
  // responses: on a removed set every rank would count as an outsider and vote yes, so a hit still waiting there
  // would run on a set that no longer exists. Such a hit goes to the coordinator, which fails it as removed.
  void forget_removed_sets();
  // A cache hit waiting longer than the shortest of STALL_CHECK, STALL_SHUTDOWN and DESYNC_TIMEOUT.
  bool stalled_hit(const TensorEntry& entry, Clock::time_point now) const;

  const Config& config_;
  int rank_;
  int size_;
  ProcessSetRegistry& sets_;
  ResponseCache cache_;
  bool cache_enabled_;
  EagerLayout eager_;
  std::vector<uint64_t> bits_;         // the exchanged words: flags, conflict bits, ready bits, eager region
  VoteWindow tail_window_{};           // of the eager tail, what this rank sends (write_tail)
  VoteLayout vote_layout_;             // exchange_bits's, reused
  size_t whole_prefix_bit_words_ = 0;  // the blocks' words in a prefix sent whole
  static void reduce_whole_prefix(const void* self, uint64_t* dst, const uint64_t* src, size_t from, size_t to);

  // Hits are kept by cache position as bit words, so that a cycle's votes are built and read a word (64
  // positions) at a time, whatever the number of tensors in flight.
  void add_hit(int position, TensorEntry* entry);
  TensorEntry* hit_at(int position) const;  // this rank's entry awaiting at position, or nullptr
  TensorEntry* drop_hit(int position);      // the same, no longer awaiting
  // This rank's hit at position, if any, no longer awaits there: its request goes to the coordinator instead.
  void send_hit_back(int position, std::vector<Request>& requests);
  void clear_hits();
  // Positions this rank votes yes for without submitting: cached tensors of process sets it is not in; and where
  // the cache holds unnamed operations, by class. Recomputed only when the cache's contents or the process sets
  // change.
  void update_position_masks(size_t words);

  // Unnamed operations are numbered per class (process set, operation) in call order, so every rank's n-th of a
  // class is the same operation. While it is this rank's only one of its class in flight, it may wait as a hit on
  // the cached response of what it carries: all members holding a hit there are then at the same n, because each
  // class's operations complete together everywhere. Otherwise (several in flight, a miss, a hit sent back) it
  // goes to the coordinator by its name, and this rank marks its class's cached positions as conflicting until
  // then, so that no other rank waits on a hit for it (a conflict sends the hits at an unnamed position to the
  // coordinator but keeps the entry). Members whose hits of one class lie at different positions (they carry
  // different things) are found by a second vote and sent to the coordinator too, which names what differs, as it
  // would have at once without the cache.
  struct UnnamedClass {
    int pending = 0;  // this rank's operations of the class held here
    int hit = -1;     // the cache position its hit waits at, if one does
  };
  static uint64_t class_of(int32_t process_set, OpType op) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(process_set)) << 8) | static_cast<uint64_t>(op);
  }
  void forget_unnamed(const TensorEntry& entry);  // a pending entry leaves (executed, failed)
  // split_words_: the positions of classes whose members all hold a hit of the class, not all at one position
  // (from this cycle's exchanged votes).
  void find_split_classes(size_t words);

  // Pending entries (the queue's, held here between drain and execution) are found in one of three ways,
  // exclusively: by key while they await the coordinator (by_key_), by cache position while they are hits
  // (hit_entries_), and by cache position and response while their cached response is ready this cycle
  // (ready_). A cached tensor's steady state thus hashes no key here.
  size_t pending_count_ = 0;
  std::unordered_map<std::string_view, TensorEntry*> by_key_;  // views of the entries' own keys
  struct Ready {
    const Response* response = nullptr;
    TensorEntry* entry = nullptr;
  };
  std::vector<Ready> ready_;               // by cache position
  std::vector<int> ready_positions_;       // where ready_ is set
  void index_pending(TensorEntry* entry);  // findable by key from now on
  // Back to by-key: this cycle's ready hits that were never taken (not expected; they would otherwise be lost).
  void unready_all();
  std::vector<uint64_t> hit_words_;        // bit p: this rank's hit at cache position p awaits
  std::vector<TensorEntry*> hit_entries_;  // by position: that hit's entry
  size_t hit_count_ = 0;
  std::vector<uint64_t> outsider_words_;
  std::vector<uint64_t> unnamed_words_;                              // positions of unnamed operations
  std::vector<uint64_t> named_words_;                                // the complement: the unnamed vote's default
  std::unordered_map<uint64_t, std::vector<uint64_t>> class_words_;  // the same by class
  std::vector<uint64_t> split_words_;
  std::unordered_map<uint64_t, UnnamedClass> unnamed_;  // this rank's, by class
  std::string unnamed_key_;                             // look_up's buffer for an unnamed request's cache key, reused
  uint64_t outsider_generation_ = ~0ull;
  uint64_t outsider_sets_version_ = ~0ull;
  uint64_t cache_sets_version_ = 0;  // the process sets' version forget_removed_sets() last saw
  Clock::time_point last_hit_stall_check_;
  std::vector<Request> resend_;  // hits whose cache entry was displaced
  std::string key_scratch_;      // take_pending's key, reused
  bool joined_ = false;

  // The lane's memory of where each kept request's name lies in the cache, by its token's slot: the stamp says
  // whether the position still holds the response found there.
  struct LanePlace {
    uint64_t token = 0;
    int position = -1;
    uint64_t stamp = 0;
  };
  std::vector<LanePlace> lane_places_;
  int lane_voted_ = -1;              // the position the last kOther voted for
  size_t lane_voted_positions_ = 0;  // and the cycle's bound
  bool lane_voted_unnamed_ = false;  // and whether it voted on unnamed positions

  Coordinator coordinator_;  // used on global rank 0 only
};

}  // namespace hvdlite
