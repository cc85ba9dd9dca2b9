// How recursive doubling and recursive halving run on a member count that is not a power of two: with p the
// largest power of two <= n and rem = n - p, among the first 2*rem members each even one hands its data to its
// odd neighbour and sits out until that neighbour returns the result; the remaining p members run the algorithm
// under virtual ranks 0..p-1.
#pragma once
#include "collectives/algorithms.h"

namespace hvdlite {

// Who pairs with whom, without moving data: for algorithms whose messages the fold below cannot carry (the
// negotiation's, of varying length: runtime/vote_exchange.h).
struct FoldShape {
  FoldShape(int n, int rank);
  int p = 1, rem = 0;
  int virtual_rank = -1;  // -1: an even member among the first 2*rem, which sits out
  // The neighbour a member among the first 2*rem pairs with (-1 for the others).
  int neighbour = -1;
  // The member index behind a virtual rank.
  int member(int v) const { return v < rem ? v * 2 + 1 : v + rem; }
};

class PowerOfTwoFold {
 public:
  // Collective: call on every member before the algorithm. incoming: scratch of `bytes`.
  PowerOfTwoFold(Communicator& comm, void* buffer, size_t bytes, char* incoming, const BufferReducer& reduce);
  // False: this member sat out and its buffer already holds the result.
  bool active() const { return shape_.virtual_rank >= 0; }
  int size() const { return shape_.p; }
  int virtual_rank() const { return shape_.virtual_rank; }
  // The member index behind a virtual rank.
  int member(int virtual_rank) const { return shape_.member(virtual_rank); }
  // Call on every active member after the algorithm: returns the result to the member that sat out.
  void finish(void* buffer);

 private:
  Communicator& comm_;
  size_t bytes_;
  FoldShape shape_;
};

}  // namespace hvdlite
