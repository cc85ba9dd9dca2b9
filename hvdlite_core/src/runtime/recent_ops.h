// The last few collectives this rank submitted and what became of them, for errors after a timeout or a lost
// peer: each rank's error then shows where that rank was ("allreduce 'grad.7' (4 MB) pending"), so a user
// comparing the ranks' errors sees who was in which collective. Owned by TensorQueue, used under its lock.
#pragma once
#include <cstdint>
#include <deque>
#include <string>

#include "runtime/entry.h"

namespace hvdlite {

class RecentOps {
 public:
  static constexpr size_t kKept = 8;
  void submitted(const TensorEntry& entry);
  void finished(const TensorEntry& entry, bool ok);
  // "last 3 collectives on rank 1, oldest first: allreduce 'a' (16 KB, done), ..." ("" when none yet).
  std::string report(int rank) const;

 private:
  struct Op {
    std::string key;  // entry_key: names repeat every step, the newest record of a key is the live one
    std::string what;
    const char* state = "pending";
  };
  std::deque<Op> ops_;
};

}  // namespace hvdlite
