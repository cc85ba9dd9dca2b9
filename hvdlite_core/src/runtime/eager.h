// Eager small allreduces: a cached allreduce of a few bytes or kilobytes rides on the negotiation's bit exchange.
//
// A cached allreduce otherwise takes two exchanges (the negotiation's bitwise-AND allreduce, then the executor's
// reduction), both pure latency for a few bytes, so its data goes along with the first.
//
// Layout: after the bit words, a head that every exchange carries, then a tail of which a member sends only the
// window that holds its data, if any (runtime/vote_exchange.h). Eligible ones are chosen smallest first while they
// fit EAGER_ALLREDUCE_BYTES: a scalar metric is the likeliest to wait on latency alone. The head takes the first of
// the chosen that fit kEagerHeadBytes, so that a small head keeps every cycle's exchange within a one-line message
// (transport/channel.h); the rest (a 1 KB gradient, say) make the tail, smallest first. Those in use come before idle
// ones (not touched while as many operations ran as the cache holds: not among every step's tensors), so that scalars
// reduced once at start-up do not keep a metric averaged every step out of the region. It depends only on the
// response cache and the agreed executions, identical on every rank (response_cache.h), and is rebuilt when the
// cache's contents change, or when an eligible response ran outside the region and would fit in the place of the idle
// ones. A rank that has submitted the tensor puts its (prescaled) input in the segment, any other rank zeros; the
// exchange reduces each segment with the tensor's dtype and op. If the ready bits say every rank had submitted, the
// segment holds the finished reduction and the executor copies it out with the postscale; otherwise it is ignored and
// the rank contributes again next cycle. Eligible: allreduces of the global process set in host memory with no joined
// ranks, any op but Adasum (which is not element-wise).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "runtime/message.h"
#include "runtime/response_cache.h"

namespace hvdlite {

// The part of the eager region every exchange carries.
constexpr size_t kEagerHeadBytes = 256;

// The element-wise reduction a reduce op performs (Average: Sum, then the executor's postscale).
ReduceKind reduce_kind(ReduceOp op);

struct EagerSegment {
  int position;   // in the response cache
  size_t offset;  // bytes from the start of the eager region; a multiple of 8
  size_t bytes;   // its padded size (a multiple of 8)
  size_t count;   // elements
  DType dtype;
  ReduceKind kind;
};

// An eager allreduce that every rank had submitted: data holds the reduction (before the postscale) until the
// next negotiation.
struct EagerResult {
  const Response* response;  // the cached response (alive until the next cycle: ResponseCache::release_retired)
  const char* data;
};

class EagerLayout {
 public:
  // Rebuilds the layout from the cache if the cache has changed since the last call (or budget_bytes has), or if a
  // response that missed the region (missed()) would fit in the space of the idle chosen ones and the free space.
  void update(const ResponseCache& cache, int64_t budget_bytes);
  // The response at a position was executed outside the region (on every rank alike: executions are agreed); it
  // counts if eligible. Read from the layout's table while the cache is as it was built from: a cycle runs thousands
  // of responses, and reading each one's fields and shape again would cost a miss or two apiece.
  void missed(const ResponseCache& cache, int position);
  const std::vector<EagerSegment>& segments() const { return segments_; }
  size_t words() const { return bytes_ / 8; }            // 8-byte words the eager region takes, tail included
  size_t head_words() const { return head_bytes_ / 8; }  // of which the head's
  // The segment of a cache position, or nullptr when that position does not ride along.
  const EagerSegment* find(int position) const;

  static bool eligible(const Response& r);
  // Not touched while as many operations ran as the cache holds responses.
  static bool idle(const ResponseCache& cache, int position);

 private:
  std::vector<EagerSegment> segments_;
  std::vector<int> index_of_;                              // by cache position: index into segments_, or -1
  std::vector<uint32_t> missable_;                         // by cache position: padded bytes if eligible, else 0
  std::vector<std::tuple<bool, size_t, int>> candidates_;  // update's (idle, padded bytes, position), reused
  size_t bytes_ = 0;
  size_t head_bytes_ = 0;
  uint64_t generation_ = ~0ull;
  int64_t budget_ = -1;
  // The smallest padded size that missed() saw since the last update (none: the maximum).
  size_t missed_bytes_ = std::numeric_limits<size_t>::max();
};

// dst (op)= src for every segment that lies within bytes [from, to) of the region; dst and src point at the start
// of an eager region.
void reduce_eager(const std::vector<EagerSegment>& segments, char* dst, const char* src, size_t from, size_t to);

}  // namespace hvdlite
