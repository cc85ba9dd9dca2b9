// How recursive doubling and recursive halving run on a member count that is not a power of two: with p the
// largest power of two <= n and rem = n - p, among the first 2*rem members each even one hands its data to its
// odd neighbour and sits out until that neighbour returns the result; the remaining p members run the algorithm
// under virtual ranks 0..p-1.
#pragma once
#include "collectives/algorithms.h"

namespace hvdlite {

class PowerOfTwoFold {
 public:
  // Collective: call on every member before the algorithm. incoming: scratch of `bytes`.
  PowerOfTwoFold(Communicator& comm, void* buffer, size_t bytes, char* incoming, const BufferReducer& reduce);
  // False: this member sat out and its buffer already holds the result.
  bool active() const { return virtual_rank_ >= 0; }
  int size() const { return p_; }
  int virtual_rank() const { return virtual_rank_; }
  // The member index behind a virtual rank.
  int member(int virtual_rank) const { return virtual_rank < rem_ ? virtual_rank * 2 + 1 : virtual_rank + rem_; }
  // Call on every active member after the algorithm: returns the result to the member that sat out.
  void finish(void* buffer);

 private:
  Communicator& comm_;
  size_t bytes_;
  int p_ = 1, rem_ = 0, virtual_rank_ = -1;
};

}  // namespace hvdlite
