// The last few collectives this rank submitted and what became of them, for errors after a timeout or a lost
// peer: each rank's error then shows where that rank was ("allreduce 'grad.7' (4 MB) pending"), so a user
// comparing the ranks' errors sees who was in which collective. Owned by TensorQueue, used under its lock.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "runtime/entry.h"

namespace hvdlite {

class RecentOps {
 public:
  static constexpr size_t kKept = 8;
  static_assert((uint64_t{1} << 32) % kKept == 0, "an entry keeps its place's low 32 bits (finished)");
  void submitted(TensorEntry& entry);
  void submitted(OpType op, int32_t process_set, const char* name, int64_t bytes);  // with no entry or record
  void finished(TensorEntry& entry, bool ok);
  // "last 3 collectives on rank 1, oldest first: allreduce 'a' (16 KB, done), ..." ("" when none yet).
  std::string report(int rank) const;

 private:
  // Kept raw and described only in report(): recording runs for every collective, reporting after a failure.
  struct Op {
    OpType op;
    int32_t process_set;
    std::string name;  // with process_set, the key: names repeat every step, the newest record is the live one
    // The entry's name record when submitted. A named operation finds its place through its entry's recent_seq,
    // so that the many operations no longer among the kept ones cost one comparison each, not a walk.
    const NameRecord* record;
    int64_t bytes;
    const char* state;
  };
  // The next place in the ring, its name left to the caller: a record's name string keeps its capacity, so
  // recording allocates nothing once the ring has seen names as long.
  Op& place(OpType kind, int32_t process_set, int64_t bytes, const NameRecord* record);
  Op& newest(size_t age) { return ring_[(submitted_ - 1 - age) % kKept]; }  // age 0: the newest
  const Op& newest(size_t age) const { return ring_[(submitted_ - 1 - age) % kKept]; }
  std::array<Op, kKept> ring_{};  // oldest overwritten
  uint64_t submitted_ = 0;        // records made; the newest is at (submitted_ - 1) % kKept
  size_t count_ = 0;              // records kept (at most kKept)
};

}  // namespace hvdlite
