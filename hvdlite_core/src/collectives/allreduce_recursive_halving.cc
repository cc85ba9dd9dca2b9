// Recursive halving and doubling allreduce (Rabenseifner): a reduce-scatter by recursive vector halving, then an
// allgather by recursive vector doubling.
//
// With p the largest power of two <= n, the extra members fold in first and get the result last
// (power_of_two_fold.h). Then, at distance 1, 2, 4, ... each member sends the half of its current range that its
// partner keeps and reduces the half it keeps with what the partner sent; after log2 p steps it owns 1/p of the
// buffer, reduced over everyone. The allgather retraces the steps from the largest distance down, swapping owned
// ranges. Cost: 2 log2(p) latencies (+2 when n is not a power of two) and the ring's 2(p-1)/p of the buffer per
// member; the reduction runs after each receive instead of streaming. Each range is reduced by one member and then
// copied, so every member ends with the same bits.
#include "collectives/algorithms.h"
#include "collectives/power_of_two_fold.h"

namespace hvdlite {

void allreduce_recursive_halving(Communicator& comm, void* buffer, size_t count, DType dtype, ReduceKind kind,
                                 double postscale) {
  const size_t element = dtype_size(dtype);
  const size_t bytes = count * element;
  char* data = static_cast<char*>(buffer);
  char* incoming = comm.scratch(bytes);
  PowerOfTwoFold fold(comm, buffer, bytes, incoming,
                      [=](void* dst, const void* src) { reduce_into(dtype, kind, dst, src, count); });
  if (!fold.active()) return;
  Progress& progress = comm.progress();
  const int p = fold.size(), virtual_rank = fold.virtual_rank();

  // Partners hold the same range at every step; the lower member keeps the lower half. With count >= p every
  // range still has at least one element per member that will share it.
  struct Range {
    size_t first, count;
  };
  std::vector<Range> kept;  // the range this member keeps after each halving step
  Range range{0, count};
  for (int mask = 1; mask < p; mask <<= 1) {
    const size_t lower = range.count / 2;
    const bool keep_lower = (virtual_rank & mask) == 0;
    const Range mine = keep_lower ? Range{range.first, lower} : Range{range.first + lower, range.count - lower};
    const Range theirs = keep_lower ? Range{range.first + lower, range.count - lower} : Range{range.first, lower};
    Channel* channel = comm.channel(fold.member(virtual_rank ^ mask));
    progress.sendrecv(channel, data + theirs.first * element, theirs.count * element, channel, incoming,
                      mine.count * element);
    reduce_into(dtype, kind, data + mine.first * element, incoming, mine.count);
    kept.push_back(mine);
    range = mine;
  }
  if (postscale != 1.0) scale_in_place(dtype, data + range.first * element, range.count, postscale);

  // Back up the steps: swap owned ranges with the partner of each distance, largest first.
  for (int step = static_cast<int>(kept.size()) - 1; step >= 0; --step) {
    const int mask = 1 << step;
    const Range mine = kept[step];
    const Range parent = step == 0 ? Range{0, count} : kept[step - 1];
    const Range theirs = mine.first == parent.first ? Range{parent.first + mine.count, parent.count - mine.count}
                                                    : Range{parent.first, parent.count - mine.count};
    Channel* channel = comm.channel(fold.member(virtual_rank ^ mask));
    progress.sendrecv(channel, data + mine.first * element, mine.count * element, channel,
                      data + theirs.first * element, theirs.count * element);
  }
  fold.finish(buffer);
}

}  // namespace hvdlite
