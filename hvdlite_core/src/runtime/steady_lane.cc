// The steady lane: a synchronous allreduce with a cached response that rides in the eager region, with nothing
// else pending on this rank, runs as one exchange on the caller's thread, with no entry, queue, handle or cycle
// around it. A named one finds its response through its kept request's token; an unnamed one by what it carries,
// among the cached unnamed allreduces, and votes as the only unnamed hit of its class (Controller's
// UnnamedClass), as it would in a cycle with nothing else pending.
//
// Its exchange is the one a cycle would make with that tensor as this rank's only hit: flags clear, no conflicts,
// the tensor's bit set, its prescaled input in its eager segment (runtime/eager.h; in the tail, a window of that
// segment alone). The other ranks, in the lane or in a cycle, see the same words either way. Reading them back:
//   - only that tensor became ready, and nothing else happened anywhere: the segment holds the reduction, copied
//     out with the postscale (what the executor does for an eager result);
//   - nothing happened anywhere: no rank acted on the vote, so the operation is submitted the usual way, as if it
//     had just been called;
//   - anything else (another rank's requests, a conflict, a join, a shutdown, other tensors ready): the operation
//     becomes an entry waiting as the hit it voted, and the cycle's second half reads the exchanged words as it
//     reads its own; from there it is an ordinary pending operation.
// A transport failure stops the runtime as a cycle's would, and the operation fails with the same error.
//
// Not marked in flight under its name while in the lane: another thread that submits the same name in those
// microseconds is not refused, where it would be while the operation waited in the queue. An unnamed one takes its
// number as it finishes (TensorQueue::skip_unnamed), not as it is called: the same for one thread, and threads
// that call unnamed collectives at once have no order that ranks could agree on anyway.
#include <cstring>

#include "collectives/reduce_kernels.h"
#include "runtime/controller.h"
#include "runtime/runtime.h"

namespace hvdlite {
namespace {
constexpr uint64_t kFlagWordMask = 0xffffffffull;  // as in controller.cc
}  // namespace

bool Controller::lane_matches(const Response& cached, const hvdlite_request& q) {
  // What ResponseCache::lookup's match compares for an allreduce; an unnamed one's cached name describes it.
  const bool unnamed = lane_unnamed(q);
  return !cached.is_error && cached.op == OpType::kAllreduce && cached.process_set == 0 && !cached.on_device &&
         cached.unnamed == unnamed && cached.dtype == static_cast<DType>(q.dtype) &&
         cached.reduce_op == static_cast<ReduceOp>(q.reduce_op) && cached.prescale == q.prescale_factor &&
         cached.postscale == q.postscale_factor && cached.layout == q.layout &&
         cached.shape.size() == static_cast<size_t>(q.ndim) &&
         std::equal(cached.shape.begin(), cached.shape.end(), q.shape) &&
         (unnamed || std::strcmp(cached.name.c_str(), q.name) == 0);
}

int Controller::lane_position(const hvdlite_request& q) {
  if (lane_unnamed(q)) {
    // An unnamed one: among the cached unnamed allreduces (a job has a few), the one that carries the same. Two
    // never do: the cache keys them by what they carry.
    auto held = class_words_.find(class_of(0, OpType::kAllreduce));
    if (held == class_words_.end()) return -1;
    for (size_t w = 0; w < held->second.size(); ++w) {
      for (uint64_t word = held->second[w]; word; word &= word - 1) {
        const int position = static_cast<int>(w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
        if (lane_matches(cache_.at(position), q)) return position;
      }
    }
    return -1;
  }
  // The token's slot and generation (TensorQueue): slots are dense, so a vector indexed by slot finds the place
  // with no hashing; a token of another generation (the slot's record was swept and reused) looks the name up.
  const uint64_t slot = (q.name_slot & 0xffffffffu) - 1;
  if (slot < lane_places_.size()) {
    const LanePlace& place = lane_places_[slot];
    if (place.token == q.name_slot && place.stamp != 0 && cache_.stamp_at(place.position) == place.stamp)
      return lane_matches(cache_.at(place.position), q) ? place.position : -1;
  }
  if (slot > (1u << 24)) return -1;  // not a token the queue handed out
  Request request;
  request.op = OpType::kAllreduce;
  request.dtype = static_cast<DType>(q.dtype);
  request.shape.assign(q.shape, q.shape + q.ndim);
  request.shape_key = key_of_shape(request.shape);
  request.reduce_op = static_cast<ReduceOp>(q.reduce_op);
  request.prescale = q.prescale_factor;
  request.postscale = q.postscale_factor;
  request.layout = q.layout;
  request.name = q.name;
  int position = -1;  // a hit: the cached response matches the request, as lane_matches() compares
  if (cache_.lookup(request, member_index(0), &position) != ResponseCache::Lookup::kHit) return -1;
  if (slot >= lane_places_.size()) lane_places_.resize(slot + 1);
  lane_places_[slot] = {q.name_slot, position, cache_.stamp_at(position)};
  return position;
}

Controller::LaneVote Controller::lane_vote(const hvdlite_request& q, int64_t* allreduced_bytes) {
  // Nothing of this rank's may be waiting (it would vote too), nor anything that changes the cycle's first half.
  if (!cache_enabled_ || pending_count_ != 0 || !resend_.empty() || joined_ || sets_.version() != cache_sets_version_)
    return LaneVote::kNotTaken;
  const size_t positions = cache_.occupied_end();
  const size_t words = (positions + 63) / 64;
  update_position_masks(words);
  const int p = lane_position(q);
  if (p < 0) return LaneVote::kNotTaken;
  const Response& cached = cache_.at(p);
  // The coordinator (rank 0) forces a round when a collective waiting there is due to fail: with one waiting, a
  // cycle decides (round_due, which must run once a cycle).
  if (rank_ == 0 && coordinator_.waiting()) return LaneVote::kNotTaken;
  eager_.update(cache_, config_.eager_allreduce_bytes);
  const EagerSegment* segment = eager_.find(p);
  if (!segment) return LaneVote::kNotTaken;

  unready_all();
  // While the cache holds unnamed operations, every exchange carries a vote on their positions too. This rank has
  // nothing else pending, so its only unnamed hit can be this one: it votes there as a cycle holding that hit
  // alone would.
  const bool vote_unnamed = !class_words_.empty();
  const std::vector<uint64_t>* held_class = nullptr;
  if (cached.unnamed) held_class = &class_words_.at(class_of(0, OpType::kAllreduce));
  const size_t bit_words = 1 + (vote_unnamed ? 3 : 2) * words;
  char* const eager_region = prepare_bits(bit_words);
  bits_[0] = kFlagWordMask;  // no flags
  for (size_t w = 0; w < words; ++w) bits_[1 + words + w] = outsider_words_[w];
  if (vote_unnamed) {
    for (size_t w = 0; w < words; ++w) {
      bits_[1 + 2 * words + w] =
          ~unnamed_words_[w] | outsider_words_[w] | (held_class && w < held_class->size() ? (*held_class)[w] : 0);
    }
  }
  const size_t word = static_cast<size_t>(p) / 64;
  const uint64_t bit = 1ull << (p % 64);
  bits_[1 + words + word] |= bit;
  if (segment->offset >= eager_.head_words() * 8)
    write_tail(eager_region, segment->offset, segment->offset + segment->bytes);
  copy_scaled(segment->dtype, eager_region + segment->offset, q.input, segment->count, cached.prescale);
  exchange_bits(words, vote_unnamed);

  lane_voted_ = p;
  lane_voted_positions_ = positions;
  lane_voted_unnamed_ = vote_unnamed;
  if ((~bits_[0] & kFlagWordMask) != 0) return LaneVote::kOther;
  if (vote_unnamed) {  // a class whose hits did not meet is a conflict (read_votes)
    find_split_classes(words);
    for (size_t w = 0; w < words; ++w) {
      if (split_words_[w] != 0) return LaneVote::kOther;
    }
  }
  // Reduced over every word without an early exit, so that the compiler vectorizes them: with thousands of cached
  // names these loops are most of what the lane adds to the exchange.
  uint64_t no_conflict = ~0ull, others_ready = 0;
  for (size_t w = 0; w < words; ++w) no_conflict &= bits_[1 + w];
  for (size_t w = 0; w < words; ++w) others_ready |= bits_[1 + words + w] & (w == word ? ~bit : ~0ull);
  if (no_conflict != ~0ull || others_ready != 0) return LaneVote::kOther;  // a conflict, or other tensors ready
  if (!(bits_[1 + words + word] & bit)) return LaneVote::kNotReady;
  lane_voted_ = -1;
  const int n = sets_.get(0)->size();
  const double postscale = cached.reduce_op == ReduceOp::kAverage ? cached.postscale / n : cached.postscale;
  copy_scaled(cached.dtype, q.output, eager_region + segment->offset, segment->count, postscale);
  cache_.touch(p);
  *allreduced_bytes = static_cast<int64_t>(segment->count * dtype_size(cached.dtype));
  return LaneVote::kDone;
}

void Controller::lane_adopt(TensorEntry* entry, Outcome& outcome) {
  begin_cycle(outcome);
  if (entry) {
    ++pending_count_;
    if (entry->request.unnamed) ++unnamed_[class_of(entry->request.process_set, entry->request.op)].pending;
    add_hit(lane_voted_, entry);
  }
  lane_voted_ = -1;
  std::vector<Request> requests;
  read_votes(requests, lane_voted_positions_, lane_voted_unnamed_, outcome);
}

Runtime::Steady Runtime::run_steady(const hvdlite_request& q, uint64_t* slot_home,
                                    std::shared_ptr<HandleState>* state, Status* failure) {
  std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
  // Another thread is mid-cycle, or work waits in the queue: that cycle, not the lane, comes next.
  if (!lock.owns_lock() || stopped_ || shutdown_requested_ || timeline_.enabled() || !queue_.empty())
    return Steady::kTakeQueue;
  Steady result = Steady::kTakeQueue;
  try {
    int64_t allreduced = 0;
    switch (controller_->lane_vote(q, &allreduced)) {
      case Controller::LaneVote::kNotTaken:
        break;
      case Controller::LaneVote::kNotReady:
        last_cycle_ = Clock::now();
        break;
      case Controller::LaneVote::kDone:
        if (Controller::lane_unnamed(q)) queue_.skip_unnamed(0, OpType::kAllreduce);
        executor_->count_allreduced(allreduced);
        {
          // Written only under progress_mutex_: no atomic increment needed.
          const uint64_t runs = steady_runs_.load(std::memory_order_relaxed) + 1;
          steady_runs_.store(runs, std::memory_order_relaxed);
          // The background thread reads last_cycle_ against its cycle time of a millisecond or more, while a
          // precise clock reading is a large part of a lane run: a run of lane calls stamps it every 16th call.
          if (runs % 16 == 1) last_cycle_ = Clock::now();
        }
        result = Steady::kDone;
        break;
      case Controller::LaneVote::kOther: {
        // Now an ordinary operation: an entry, marked in flight under its name, waiting as the hit it voted.
        std::vector<TensorEntry*> admitted;
        uint64_t* const homes[1] = {slot_home};
        const Status admitted_status = enqueue(&q, 1, nullptr, state, slot_home ? homes : nullptr, &admitted);
        if (admitted_status.ok()) {
          result = Steady::kAdopted;
        } else {
          // Refused (its name is in flight from another thread): its vote still counted where it was ready, and
          // the other ranks' results have its contribution; the caller gets the refusal.
          result = Steady::kFailed;
          *failure = admitted_status;
        }
        steady_adopted_.fetch_add(1, std::memory_order_relaxed);
        release_held_lock();  // the cycle runs what every rank voted ready, of any size
        controller_->lane_adopt(admitted.empty() ? nullptr : admitted[0], outcome_);
        last_cycle_ = Clock::now();
        complete_cycle(outcome_);  // a failure there fails the adopted entry's handle too
        break;
      }
    }
  } catch (...) {
    // Where the report of this rank's last collectives names it (pending), as it would have from the queue.
    if (result != Steady::kAdopted) queue_.note_submitted(q);
    *failure = stop_for_exception();
    result = Steady::kFailed;
  }
  lock.unlock();
  announce_progress();
  return result;
}

}  // namespace hvdlite
