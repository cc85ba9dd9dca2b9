#include "runtime/controller.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <unordered_set>

#include "collectives/algorithms.h"
#include "common/log.h"
#include "runtime/vote_exchange.h"

namespace hvdlite {
namespace {
// Calls visit(p) for every set bit p < limit of the words, in increasing order.
template <typename Visit>
void for_each_bit(const uint64_t* words, size_t limit, Visit visit) {
  for (size_t w = 0; w * 64 < limit; ++w) {
    uint64_t word = words[w];
    if (limit - w * 64 < 64) word &= (1ull << (limit - w * 64)) - 1;
    while (word) {
      visit(w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
      word &= word - 1;
    }
  }
}
template <typename Visit>
void for_each_bit(const std::vector<uint64_t>& words, size_t limit, Visit visit) {
  for_each_bit(words.data(), std::min(limit, words.size() * 64), visit);
}
static_assert(kMaxCachePositions / 64 <= static_cast<int64_t>(kMaxWindowedWords), "cache blocks outgrow windows");
constexpr uint64_t kFlagRequests = 1, kFlagShutdown = 2, kFlagJoined = 4;
constexpr uint64_t kFlagWordMask = 0xffffffffull;  // the flags' half of word 0; the other half is zero
constexpr size_t kWholeBlockWords = 2;             // vote blocks of up to 128 cache positions are sent whole

// The vote sections' reducers (runtime/vote_exchange.h).
void and_words(const void*, uint64_t* dst, const uint64_t* src, size_t from, size_t to) {
  for (size_t w = from; w < to; ++w) dst[w] &= src[w];
}
void reduce_eager_head(const void* layout, uint64_t* dst, const uint64_t* src, size_t from, size_t to) {
  reduce_eager(static_cast<const EagerLayout*>(layout)->segments(), reinterpret_cast<char*>(dst),
               reinterpret_cast<const char*>(src), from * 8, to * 8);
}
// Handed the tail's start, where the segments' offsets count from the region's.
void reduce_eager_tail(const void* layout, uint64_t* dst, const uint64_t* src, size_t from, size_t to) {
  const EagerLayout& eager = *static_cast<const EagerLayout*>(layout);
  const size_t head = eager.head_words() * 8;
  reduce_eager(eager.segments(), reinterpret_cast<char*>(dst) - head, reinterpret_cast<const char*>(src) - head,
               head + from * 8, head + to * 8);
}
}  // namespace

Controller::Controller(const Config& config, int rank, int size, ProcessSetRegistry& sets)
    : config_(config),
      rank_(rank),
      size_(size),
      sets_(sets),
      cache_(static_cast<size_t>(std::max<int64_t>(config.cache_capacity, 0))),
      cache_enabled_(config.cache_capacity > 0),
      coordinator_(config, size, sets) {}

int Controller::member_index(int process_set) const {
  Communicator* comm = sets_.get(process_set);
  return comm ? comm->rank() : -1;
}

void Controller::exchange_bits(size_t words, bool vote_unnamed) {
  Communicator* world = sets_.get(0);
  if (world->size() == 1) return;
  // In the order bits_ holds them (prepare_bits): the flags word, the blocks of cache positions, the eager region.
  const bool eager = !eager_.segments().empty();
  const size_t blocks = vote_unnamed ? 3 : 2, head_words = eager_.head_words();
  VoteLayout& layout = vote_layout_;
  layout.section_count = 0;
  size_t offset = 1;
  auto next = [&](VoteSection::Kind kind, size_t count) -> VoteSection& {
    VoteSection& s = layout.sections[layout.section_count++];
    s = VoteSection{};
    s.kind = kind;
    s.offset = offset;
    s.count = count;
    offset += count;
    return s;
  };
  if (words <= kWholeBlockWords) {
    // Blocks of a few words cost less sent whole than announced and picked apart: they and the eager head go as
    // one prefix, reduced in one pass, as a cycle of a small cache's votes always went.
    offset = layout.prefix_words = 1 + blocks * words + (eager ? head_words : 0);
    layout.reduce_prefix = reduce_whole_prefix;
    layout.prefix_context = this;
  } else {
    layout.prefix_words = 1;
    next(VoteSection::Kind::kSpan, words);  // conflicts: every member's default is none (all ones)
    next(VoteSection::Kind::kOverlap, words).reduce = and_words;
    if (vote_unnamed) next(VoteSection::Kind::kSpan, words).baseline = named_words_.data();
    if (eager) {
      VoteSection& head = next(VoteSection::Kind::kWhole, head_words);
      head.reduce = reduce_eager_head;
      head.context = &eager_;
    }
  }
  if (eager) {
    VoteSection& tail = next(VoteSection::Kind::kOverlapUnread, eager_.words() - head_words);
    tail.reduce = reduce_eager_tail;
    tail.context = &eager_;
    tail.given = tail_window_;
  }
  whole_prefix_bit_words_ = blocks * words;
  exchange_votes(*world, bits_.data(), layout);
}

void Controller::reduce_whole_prefix(const void* self, uint64_t* dst, const uint64_t* src, size_t from, size_t to) {
  const Controller& c = *static_cast<const Controller*>(self);
  const size_t bits_end = 1 + c.whole_prefix_bit_words_;
  for (size_t w = from; w < bits_end; ++w) dst[w] &= src[w];
  if (to > bits_end) {
    reduce_eager(c.eager_.segments(), reinterpret_cast<char*>(dst + bits_end),
                 reinterpret_cast<const char*>(src + bits_end), 0, (to - bits_end) * 8);
  }
}

char* Controller::prepare_bits(size_t bit_words) {
  // The tail is not cleared: a rank writes only the part it sends (write_tail), and nobody reads past what the
  // exchange kept.
  const size_t total = bit_words + eager_.words();
  if (bits_.size() < total) bits_.resize(total);
  std::fill_n(bits_.data(), bit_words, ~0ull);
  std::fill_n(bits_.data() + bit_words, eager_.head_words(), 0);
  tail_window_ = {};
  return reinterpret_cast<char*>(bits_.data() + bit_words);
}

void Controller::write_tail(char* eager_region, size_t begin_bytes, size_t end_bytes) {
  const size_t head = eager_.head_words() * 8;
  if (end_bytes <= begin_bytes) return;
  std::memset(eager_region + begin_bytes, 0, end_bytes - begin_bytes);
  tail_window_ = {(begin_bytes - head) / 8, (end_bytes - head) / 8};
}

void Controller::begin_cycle(Outcome& outcome) {
  outcome.responses.clear();
  outcome.decided.clear();
  outcome.eager.clear();
  cache_.release_retired();  // the last cycle's outcome has run
  outcome.shutdown = false;
  outcome.peer_failure.clear();
  outcome.idle = false;
  unready_all();
}

void Controller::negotiate(std::vector<TensorEntry*>& fresh, bool want_shutdown, const std::string& abort_reason,
                           Outcome& outcome) {
  begin_cycle(outcome);
  if (sets_.version() != cache_sets_version_) forget_removed_sets();
  std::vector<Request> requests;
  requests.swap(resend_);
  if (want_shutdown && !abort_reason.empty()) {
    Request reason;
    reason.op = OpType::kAbort;
    reason.rank = rank_;
    reason.name = abort_reason;
    reason.cacheable = false;
    requests.push_back(reason);
  }
  std::vector<int> conflicts;
  for (TensorEntry* placed : fresh) {
    TensorEntry& entry = *placed;
    const Request& q = entry.request;
    if (q.op == OpType::kJoin) joined_ = true;
    int position = -1;
    ResponseCache::Lookup found = ResponseCache::Lookup::kMiss;
    bool may_hit = cache_enabled_ && q.cacheable;
    if (q.unnamed && unnamed_[class_of(q.process_set, q.op)].pending++ > 0) may_hit = false;
    if (may_hit) found = look_up(entry, &position);
    if (found != ResponseCache::Lookup::kHit) {
      if (found == ResponseCache::Lookup::kConflict) conflicts.push_back(position);
      requests.push_back(q);
    }
    ++pending_count_;
    if (found == ResponseCache::Lookup::kHit)
      add_hit(position, placed);
    else
      index_pending(placed);
  }
  fresh.clear();

  // A cached tensor that some member never submits would wait on its hit bit forever, out of the coordinator's
  // sight: past the stall time it is invalidated (a conflict: erased everywhere, its hits resent as requests),
  // so that the coordinator reports it and fails it like any stalled tensor. The limits are seconds: looking
  // every 100 ms keeps the scan of every waiting hit out of each cycle.
  const auto now = coarse_now();  // one reading for the cycle's age checks, which count seconds
  if (hit_count_ > 0 && now - last_hit_stall_check_ >= std::chrono::milliseconds(100)) {
    last_hit_stall_check_ = now;
    for_each_bit(hit_words_, hit_words_.size() * 64, [&](size_t p) {
      if (stalled_hit(*hit_entries_[p], now)) conflicts.push_back(static_cast<int>(p));
    });
  }

  // Only positions up to the highest occupied one are exchanged; that bound is the same on every rank.
  const size_t positions = cache_.occupied_end();
  const size_t words = (positions + 63) / 64;
  update_position_masks(words);
  // Unnamed operations in flight that do not wait as hits keep their classes' cached positions from serving anyone.
  for (const auto& [klass, mine] : unnamed_) {
    if (mine.pending <= (mine.hit >= 0 ? 1 : 0)) continue;
    auto cached = class_words_.find(klass);
    if (cached == class_words_.end()) continue;
    for_each_bit(cached->second, positions, [&](size_t p) { conflicts.push_back(static_cast<int>(p)); });
  }
  // The vote on unnamed positions (whether every member holds a hit of the position's class somewhere) is exchanged
  // only while the cache holds some: whether it does is the same on every rank.
  const bool vote_unnamed = !class_words_.empty();
  const size_t bit_words = 1 + (vote_unnamed ? 3 : 2) * words;
  if (cache_enabled_) eager_.update(cache_, config_.eager_allreduce_bytes);
  char* const eager_region = prepare_bits(bit_words);
  // The coordinator forces a round trip when a waiting tensor is due to fail: in a typical hang nobody submits
  // anything new, and the error responses still have to reach the members.
  const bool failure_due = rank_ == 0 && coordinator_.round_due(now);
  uint64_t flags = (requests.empty() && !failure_due ? 0 : kFlagRequests) | (want_shutdown ? kFlagShutdown : 0) |
                   (joined_ ? kFlagJoined : 0);
  bits_[0] = ~flags & kFlagWordMask;
  for (int p : conflicts) bits_[1 + p / 64] &= ~(1ull << (p % 64));
  // A yes vote: this rank holds a hit there, or is not in the tensor's process set. Hits and outsiders lie only
  // at occupied positions, so free positions vote no.
  for (size_t w = 0; w < words; ++w) {
    const uint64_t hits = w < hit_words_.size() ? hit_words_[w] : 0;
    bits_[1 + words + w] = hits | outsider_words_[w];
  }
  if (vote_unnamed) {
    for (size_t w = 0; w < words; ++w) bits_[1 + 2 * words + w] = ~unnamed_words_[w] | outsider_words_[w];
    for (const auto& [klass, mine] : unnamed_) {
      if (mine.hit < 0) continue;
      auto held = class_words_.find(klass);
      if (held == class_words_.end()) continue;
      for (size_t w = 0; w < words && w < held->second.size(); ++w) bits_[1 + 2 * words + w] |= held->second[w];
    }
  }
  // The others' segments stay zero; of the tail, this rank sends the part from its first to its last segment with
  // data there.
  const size_t head = eager_.head_words() * 8;
  size_t tail_begin = SIZE_MAX, tail_end = 0;
  for (const EagerSegment& segment : eager_.segments()) {
    if (segment.offset < head || !hit_at(segment.position)) continue;
    tail_begin = std::min(tail_begin, segment.offset);
    tail_end = segment.offset + segment.bytes;
  }
  write_tail(eager_region, tail_begin, tail_end);
  for (const EagerSegment& segment : eager_.segments()) {
    const TensorEntry* hit = hit_at(segment.position);
    if (!hit) continue;
    copy_scaled(segment.dtype, eager_region + segment.offset, hit->input, segment.count,
                cache_.at(segment.position).prescale);
  }
  exchange_bits(words, vote_unnamed);
  read_votes(requests, positions, vote_unnamed, outcome);
}

void Controller::read_votes(std::vector<Request>& requests, size_t positions, bool vote_unnamed, Outcome& outcome) {
  const size_t words = (positions + 63) / 64;
  const size_t bit_words = 1 + (vote_unnamed ? 3 : 2) * words;
  char* const eager_region = reinterpret_cast<char*>(bits_.data() + bit_words);
  const uint64_t any = ~bits_[0] & kFlagWordMask;
  if (vote_unnamed) find_split_classes(words);
  bool any_conflict = false;
  for (size_t w = 0; w < words; ++w) {
    const uint64_t conflicted = ~bits_[1 + w] | (vote_unnamed ? split_words_[w] : 0);
    if (conflicted == 0) continue;
    // Not ready this cycle, even where every member voted a hit: the hits there go to the coordinator instead.
    bits_[1 + words + w] &= ~conflicted;
    for_each_bit(&conflicted, std::min<size_t>(64, positions - w * 64), [&](size_t b) {
      const int p = static_cast<int>(w * 64 + b);
      any_conflict = true;
      send_hit_back(p, requests);
      // An unnamed operation's entry stays: it still describes what it carries, and the coordinator's answer
      // replaces it if that changed. Erased, alternating forms of one class would each miss in turn.
      if (!(unnamed_words_[w] & (1ull << b))) cache_.erase(p);
    });
  }

  outcome.shutdown = (any & kFlagShutdown) != 0;
  const bool any_joined = (any & kFlagJoined) != 0;
  if (any_joined) {
    // Joined ranks contribute without submitting; only the coordinator can account for them.
    for_each_bit(hit_words_, hit_words_.size() * 64, [&](size_t p) {
      requests.push_back(hit_entries_[p]->request);
      index_pending(hit_entries_[p]);
    });
    clear_hits();
  } else {
    for_each_bit(bits_.data() + 1 + words, positions, [&](size_t position) {
      const int p = static_cast<int>(position);
      if (!cache_.occupied(p)) return;
      const EagerSegment* eager = eager_.find(p);
      if (eager) {
        outcome.eager.push_back({&cache_.at(p), eager_region + eager->offset});
      } else {
        outcome.responses.push_back(&cache_.at(p));
        if (cache_enabled_) eager_.missed(cache_, p);
      }
      cache_.touch(p);
      if (TensorEntry* hit = drop_hit(p)) {
        if (position >= ready_.size()) ready_.resize(position + 1);
        ready_[position] = {&cache_.at(p), hit};
        ready_positions_.push_back(p);
      }
    });
  }
  if ((any & kFlagRequests) || any_conflict || any_joined) {
    for (Request& q : requests) {
      entry_key_into(key_scratch_, q.process_set, q.name);
      auto it = by_key_.find(key_scratch_);
      if (it != by_key_.end())
        q.waited_seconds = std::chrono::duration<double>(Clock::now() - it->second->enqueued).count();
    }
    std::vector<Response> decided = coordinate(requests);
    remember(decided);
    for (Response& r : decided) {
      if (r.op == OpType::kAbort) {
        outcome.peer_failure = r.error;
      } else {
        outcome.decided.push_back(std::make_unique<const Response>(std::move(r)));
        outcome.responses.push_back(outcome.decided.back().get());
      }
    }
  }
  outcome.idle = any == 0 && !any_conflict && outcome.responses.empty() && outcome.eager.empty() &&
                 pending_count_ == 0 && resend_.empty();
}

ResponseCache::Lookup Controller::look_up(TensorEntry& entry, int* position) {
  if (entry.matched_stamp != 0 && cache_.stamp_at(entry.matched_position) == entry.matched_stamp) {
    *position = entry.matched_position;
    return ResponseCache::Lookup::kHit;
  }
  const ResponseCache::Lookup found = look_up_by_name(entry, position);
  if (found == ResponseCache::Lookup::kHit) {
    entry.matched_position = *position;
    entry.matched_stamp = cache_.stamp_at(*position);
  }
  return found;
}

ResponseCache::Lookup Controller::look_up_by_name(const TensorEntry& entry, int* position) {
  const int member = member_index(entry.request.process_set);
  if (entry.request.unnamed) {  // its name never repeats: found by what it carries
    ResponseCache::key_of_into(unnamed_key_, entry.request);
    return cache_.lookup(unnamed_key_, entry.request, member, position);
  }
  NameRecord* record = entry.name_record;
  if (record && record->cache_stamp != 0 && cache_.stamp_at(record->cache_position) == record->cache_stamp) {
    *position = record->cache_position;
    // The record took that position and stamp from a lookup by this name, and the stamp says the position holds
    // the same response since: the names are equal.
    return cache_.at(*position).matches(entry.request, member, true) ? ResponseCache::Lookup::kHit
                                                                     : ResponseCache::Lookup::kConflict;
  }
  ResponseCache::Lookup found = cache_.lookup(entry.key, entry.request, member, position);
  if (record && found != ResponseCache::Lookup::kMiss) {
    record->cache_position = *position;
    record->cache_stamp = cache_.stamp_at(*position);
  }
  return found;
}

void Controller::add_hit(int position, TensorEntry* entry) {
  const size_t p = static_cast<size_t>(position);
  if (p >= hit_entries_.size()) {
    hit_entries_.resize(std::max(p + 1, hit_entries_.size() * 2), nullptr);
    hit_words_.resize((hit_entries_.size() + 63) / 64, 0);
  }
  if (!hit_entries_[p]) ++hit_count_;
  if (entry->request.unnamed) unnamed_[class_of(entry->request.process_set, entry->request.op)].hit = position;
  hit_entries_[p] = entry;
  hit_words_[p / 64] |= 1ull << (p % 64);
}

TensorEntry* Controller::hit_at(int position) const {
  const size_t p = static_cast<size_t>(position);
  return p < hit_entries_.size() ? hit_entries_[p] : nullptr;
}

TensorEntry* Controller::drop_hit(int position) {
  TensorEntry* entry = hit_at(position);
  if (!entry) return nullptr;
  if (entry->request.unnamed) unnamed_[class_of(entry->request.process_set, entry->request.op)].hit = -1;
  const size_t p = static_cast<size_t>(position);
  hit_entries_[p] = nullptr;
  hit_words_[p / 64] &= ~(1ull << (p % 64));
  --hit_count_;
  return entry;
}

void Controller::send_hit_back(int position, std::vector<Request>& requests) {
  if (TensorEntry* hit = drop_hit(position)) {
    requests.push_back(hit->request);
    index_pending(hit);
  }
}

void Controller::clear_hits() {
  for (auto& [klass, mine] : unnamed_) mine.hit = -1;
  std::fill(hit_entries_.begin(), hit_entries_.end(), nullptr);
  std::fill(hit_words_.begin(), hit_words_.end(), 0);
  hit_count_ = 0;
}

void Controller::find_split_classes(size_t words) {
  // Every member holds one hit at most of a class: a class whose members all hold one, with no position where all
  // of them do, is split.
  split_words_.assign(words, 0);
  const uint64_t* all_hit = bits_.data() + 1 + words;
  const uint64_t* class_held = bits_.data() + 1 + 2 * words;
  for (const auto& [klass, of_class] : class_words_) {
    bool held = false, met = false;
    for (size_t w = 0; w < words; ++w) {
      held = held || (of_class[w] & class_held[w]) != 0;
      met = met || (of_class[w] & all_hit[w]) != 0;
    }
    if (!held || met) continue;
    for (size_t w = 0; w < words; ++w) split_words_[w] |= of_class[w];
  }
}

void Controller::update_position_masks(size_t words) {
  const uint64_t generation = cache_.generation(), version = sets_.version();
  if (outsider_words_.size() == words && generation == outsider_generation_ && version == outsider_sets_version_)
    return;
  outsider_generation_ = generation;
  outsider_sets_version_ = version;
  outsider_words_.assign(words, 0);
  unnamed_words_.assign(words, 0);
  class_words_.clear();
  for (size_t p = 0; p < cache_.occupied_end(); ++p) {
    const int position = static_cast<int>(p);
    if (!cache_.occupied(position)) continue;
    const Response& cached = cache_.at(position);
    const uint64_t bit = 1ull << (p % 64);
    if (cached.process_set != 0 && member_index(cached.process_set) < 0) outsider_words_[p / 64] |= bit;
    if (cached.unnamed) {
      unnamed_words_[p / 64] |= bit;
      std::vector<uint64_t>& of_class = class_words_[class_of(cached.process_set, cached.op)];
      of_class.resize(words, 0);
      of_class[p / 64] |= bit;
    }
  }
  named_words_.resize(words);
  for (size_t w = 0; w < words; ++w) named_words_[w] = ~unnamed_words_[w];
}

bool Controller::stalled_hit(const TensorEntry& entry, Clock::time_point now) const {
  double limit = 0;  // the shortest of the limits that are on
  for (double l : {config_.stall_warning_seconds, config_.stall_shutdown_seconds, config_.desync_timeout_seconds}) {
    if (l > 0 && (limit <= 0 || l < limit)) limit = l;
  }
  return limit > 0 && std::chrono::duration<double>(now - entry.enqueued).count() > limit;
}

void Controller::forget_removed_sets() {
  cache_sets_version_ = sets_.version();
  for (size_t p = 0; p < cache_.occupied_end(); ++p) {
    const int position = static_cast<int>(p);
    if (!cache_.occupied(position)) continue;
    const int32_t set = cache_.at(position).process_set;
    if (set == 0 || sets_.get(set)) continue;
    send_hit_back(position, resend_);
    cache_.erase(position);
  }
}

void Controller::remember(const std::vector<Response>& responses) {
  if (!cache_enabled_) return;
  // Of several unnamed responses in the list that carry the same, only the last is kept: each would replace the one
  // before (a burst of unnamed operations of one kind would otherwise rewrite its position once per operation).
  std::vector<bool> replaced(responses.size(), false);
  std::unordered_set<std::string> later;
  for (size_t i = responses.size(); i-- > 0;) {
    const Response& r = responses[i];
    if (r.unnamed && r.cacheable && !r.is_error) replaced[i] = !later.insert(ResponseCache::key_of(r)).second;
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = responses[i];
    if (!r.cacheable || r.is_error || replaced[i]) continue;
    int displaced = -1;
    cache_.put(r, &displaced);
    if (displaced >= 0) send_hit_back(displaced, resend_);
  }
}

std::vector<Response> Controller::coordinate(const std::vector<Request>& mine) {
  Communicator* world = sets_.get(0);
  Progress& progress = world->progress();
  WireWriter writer;
  writer.put<uint32_t>(static_cast<uint32_t>(mine.size()));
  for (const Request& q : mine) q.write(writer);
  std::vector<char>& payload = writer.bytes();

  std::vector<char> answer;
  if (rank_ == 0) {
    std::vector<uint64_t> lengths(size_, 0);
    std::vector<Transfer> transfers;
    for (int r = 1; r < size_; ++r) transfers.push_back(Transfer::Recv(world->channel(r), &lengths[r], 8));
    progress.run(transfers);
    std::vector<std::vector<char>> blobs(size_);
    transfers.clear();
    for (int r = 1; r < size_; ++r) {
      blobs[r].resize(lengths[r]);
      transfers.push_back(Transfer::Recv(world->channel(r), blobs[r].data(), lengths[r]));
    }
    progress.run(transfers);
    blobs[0] = payload;
    for (int r = 0; r < size_; ++r) {
      WireReader reader(blobs[r].data(), blobs[r].size());
      uint32_t count = reader.get<uint32_t>();
      for (uint32_t i = 0; i < count; ++i) coordinator_.ingest(Request::Read(reader));
    }
    std::vector<Response> decided = coordinator_.decide();
    WireWriter out;
    out.put<uint32_t>(static_cast<uint32_t>(decided.size()));
    for (const Response& r : decided) r.write(out);
    answer = std::move(out.bytes());
    uint64_t length = answer.size();
    transfers.clear();
    for (int r = 1; r < size_; ++r) {
      transfers.push_back(Transfer::Send(world->channel(r), &length, 8));
      transfers.push_back(Transfer::Send(world->channel(r), answer.data(), answer.size()));
    }
    progress.run(transfers);
    return decided;
  }
  uint64_t length = payload.size();
  Transfer send[2] = {Transfer::Send(world->channel(0), &length, 8),
                      Transfer::Send(world->channel(0), payload.data(), payload.size())};
  progress.run(send, 2);
  uint64_t answer_length = 0;
  Transfer recv_length = Transfer::Recv(world->channel(0), &answer_length, 8);
  progress.run(&recv_length, 1);
  answer.resize(answer_length);
  Transfer recv = Transfer::Recv(world->channel(0), answer.data(), answer.size());
  progress.run(&recv, 1);
  WireReader reader(answer.data(), answer.size());
  uint32_t count = reader.get<uint32_t>();
  std::vector<Response> decided;
  decided.reserve(count);
  for (uint32_t i = 0; i < count; ++i) decided.push_back(Response::Read(reader));
  return decided;
}

void Controller::index_pending(TensorEntry* entry) { by_key_.emplace(std::string_view(entry->key), entry); }

void Controller::unready_all() {
  for (int p : ready_positions_) {
    if (ready_[p].entry) index_pending(ready_[p].entry);
    ready_[p] = Ready();
  }
  ready_positions_.clear();
}

TensorEntry* Controller::take_pending(const Response& response) {
  TensorEntry* entry = nullptr;
  const int p = response.cache_position;
  if (p >= 0 && static_cast<size_t>(p) < ready_.size() && ready_[p].response == &response && ready_[p].entry) {
    entry = ready_[p].entry;
    ready_[p] = Ready();
  } else {
    entry_key_into(key_scratch_, response.process_set, response.name);
    auto it = by_key_.find(key_scratch_);
    if (it == by_key_.end()) return nullptr;
    entry = it->second;
    by_key_.erase(it);
  }
  --pending_count_;
  forget_unnamed(*entry);
  return entry;
}

void Controller::forget_unnamed(const TensorEntry& entry) {
  if (!entry.request.unnamed) return;
  // Kept at zero rather than erased: the few classes a job uses would otherwise be allocated again each call.
  auto it = unnamed_.find(class_of(entry.request.process_set, entry.request.op));
  if (it != unnamed_.end() && it->second.pending > 0) --it->second.pending;
}

void Controller::return_pending(TensorEntry* entry) {
  ++pending_count_;
  if (entry->request.unnamed) ++unnamed_[class_of(entry->request.process_set, entry->request.op)].pending;
  index_pending(entry);
}

std::vector<TensorEntry*> Controller::take_all_pending() {
  unready_all();
  std::vector<TensorEntry*> live;
  for (const auto& kv : by_key_) live.push_back(kv.second);
  for (TensorEntry* hit : hit_entries_) {
    if (hit) live.push_back(hit);
  }
  by_key_.clear();
  clear_hits();
  unnamed_.clear();
  pending_count_ = 0;
  return live;
}

std::vector<std::string> Controller::pending_names() const {
  std::vector<std::string> names;
  for (const auto& kv : by_key_) names.push_back(kv.second->request.name);
  for (const TensorEntry* hit : hit_entries_) {
    if (hit) names.push_back(hit->request.name);
  }
  for (int p : ready_positions_) {
    if (ready_[p].entry) names.push_back(ready_[p].entry->request.name);
  }
  return names;
}

}  // namespace hvdlite
