// Unit tests of the response cache (positions, eviction, stamps, the keys of named and unnamed operations) and
// of the eager layout planned over it. Run from unit_tests.cc's main (tests/test_core_cpp.py builds the files into
// one binary).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "messages.h"
#include "runtime/eager.h"
#include "runtime/response_cache.h"

using namespace hvdlite;

void test_cache() {
  ResponseCache cache(2);
  int displaced = -2;
  int p0 = cache.put(resp("a", 4), &displaced);
  CHECK(p0 == 0 && displaced == -1);
  int p1 = cache.put(resp("b", 4), &displaced);
  CHECK(p1 == 1 && displaced == -1);
  int position = -1;
  Request qa = req(0, OpType::kAllreduce, DType::kFloat32, {4}, "a");
  CHECK(cache.lookup(qa, 0, &position) == ResponseCache::Lookup::kHit && position == 0);
  Request qa_bad = req(0, OpType::kAllreduce, DType::kFloat32, {5}, "a");
  CHECK(cache.lookup(qa_bad, 0, &position) == ResponseCache::Lookup::kConflict && position == 0);
  Request qc = req(0, OpType::kAllreduce, DType::kFloat32, {4}, "c");
  CHECK(cache.lookup(qc, 0, &position) == ResponseCache::Lookup::kMiss);
  // "a" was used more recently than "b": inserting "c" evicts "b" at position 1.
  cache.touch(0);
  int p2 = cache.put(resp("c", 4), &displaced);
  CHECK(p2 == 1 && displaced == 1);
  CHECK(cache.occupied(0) && cache.at(0).name == "a" && cache.at(1).name == "c");
  cache.erase(0);
  CHECK(!cache.occupied(0));
  CHECK(cache.put(resp("d", 4), &displaced) == 0 && displaced == -1);  // lowest free position first
  // Same name in another process set is another entry.
  Request other = req(0, OpType::kAllreduce, DType::kFloat32, {4}, "c");
  other.process_set = 1;
  CHECK(cache.lookup(other, 0, &position) == ResponseCache::Lookup::kMiss);

  // occupied_end: one past the highest occupied position, kept through puts, evictions and erases.
  ResponseCache wide(8);
  CHECK(wide.occupied_end() == 0);
  for (int i = 0; i < 5; ++i) wide.put(resp("t" + std::to_string(i), 4), &displaced);
  CHECK(wide.occupied_end() == 5);
  wide.erase(2);
  CHECK(wide.occupied_end() == 5);  // a hole below the top changes nothing
  wide.erase(4);
  CHECK(wide.occupied_end() == 4);
  wide.erase(3);
  CHECK(wide.occupied_end() == 2);  // down past the hole at 2
  CHECK(wide.put(resp("u", 4), &displaced) == 2 && wide.occupied_end() == 3);
  wide.erase(0);
  wide.erase(1);
  wide.erase(2);
  CHECK(wide.occupied_end() == 0);

  // A large capacity is only a bound: positions are handed out lowest first as the cache fills, holes first.
  ResponseCache large(1 << 20);
  CHECK(large.capacity() == (1u << 20) && !large.occupied(5) && !large.occupied(1 << 19));
  for (int i = 0; i < 3000; ++i) CHECK(large.put(resp("g" + std::to_string(i), 4), &displaced) == i);
  large.erase(2999);
  large.erase(17);
  large.erase(1234);
  CHECK(large.put(resp("h0", 4), &displaced) == 17 && displaced == -1);
  CHECK(large.put(resp("h1", 4), &displaced) == 1234);
  CHECK(large.put(resp("h2", 4), &displaced) == 2999 && large.occupied_end() == 3000);
  CHECK(large.put(resp("h3", 4), &displaced) == 3000 && large.occupied_end() == 3001);

  // Stamps: a new one for every response put at a position, never reused; none for an empty position.
  ResponseCache stamped(2);
  const int sa = stamped.put(resp("a", 4), &displaced);
  const uint64_t first = stamped.stamp_at(sa);
  CHECK(first != 0 && stamped.stamp_at(1) == 0 && stamped.stamp_at(-1) == 0 && stamped.stamp_at(99) == 0);
  stamped.put(resp("a", 8), &displaced);  // replaced in place
  CHECK(stamped.stamp_at(sa) != 0 && stamped.stamp_at(sa) != first);
  const uint64_t second = stamped.stamp_at(sa);
  stamped.erase(sa);
  CHECK(stamped.stamp_at(sa) == 0);
  CHECK(stamped.put(resp("b", 4), &displaced) == sa && stamped.stamp_at(sa) != first &&
        stamped.stamp_at(sa) != second);

  // A response replaced or erased keeps its address and contents until release_retired(): a cycle runs the
  // responses it found while its own puts may replace them.
  const Response* held = &stamped.at(sa);
  stamped.put(resp("b", 8), &displaced);
  const Response* replacement = &stamped.at(sa);
  stamped.erase(sa);
  CHECK(held != replacement && held->name == "b" && held->shape == std::vector<int64_t>{4} &&
        replacement->shape == std::vector<int64_t>{8});
  stamped.release_retired();

  // Unnamed operations: cached under what they carry, whatever number the core gave them, apart from users' names.
  ResponseCache unnamed(8);
  Request u1 = req(0, OpType::kAllreduce, DType::kFloat32, {4}, "allreduce.noname.1");
  u1.unnamed = true;
  CHECK(unnamed.lookup(u1, 0, &position) == ResponseCache::Lookup::kMiss);
  Response ru = resp("allreduce.noname.1", 4);
  ru.unnamed = true;
  const int pu = unnamed.put(ru, &displaced);
  CHECK(unnamed.at(pu).name == "allreduce.noname(float32 [4] Sum)");
  Request u2 = u1;
  u2.name = "allreduce.noname.2";
  CHECK(unnamed.lookup(u2, 0, &position) == ResponseCache::Lookup::kHit && position == pu);
  Request u_wide = req(0, OpType::kAllreduce, DType::kFloat32, {5}, "allreduce.noname.3");
  u_wide.unnamed = true;
  CHECK(unnamed.lookup(u_wide, 0, &position) == ResponseCache::Lookup::kMiss);  // another key, not a conflict
  Request u_max = u2;
  u_max.reduce_op = ReduceOp::kMax;
  CHECK(unnamed.lookup(u_max, 0, &position) == ResponseCache::Lookup::kMiss);
  Request named_alike = req(0, OpType::kAllreduce, DType::kFloat32, {4}, "allreduce.noname(float32 [4] Sum)");
  CHECK(unnamed.lookup(named_alike, 0, &position) == ResponseCache::Lookup::kMiss);
  CHECK(unnamed.put(ru, &displaced) == pu && displaced == pu);  // the next of the same kind replaces it in place
  // Allgather: rows may differ by member; a member's own rows must match what was cached for it.
  Response gathered = resp("allgather.noname.4", 6);
  gathered.op = OpType::kAllgather;
  gathered.shape = {6, 3};
  gathered.first_dims = {2, 4};
  gathered.unnamed = true;
  const int pg = unnamed.put(gathered, &displaced);
  CHECK(unnamed.at(pg).name == "allgather.noname(float32 [*, 3])");
  Request g1 = req(1, OpType::kAllgather, DType::kFloat32, {4, 3}, "allgather.noname.5");
  g1.unnamed = true;
  CHECK(unnamed.lookup(g1, 1, &position) == ResponseCache::Lookup::kHit && position == pg);
  CHECK(unnamed.lookup(g1, 0, &position) == ResponseCache::Lookup::kConflict && position == pg);
  unnamed.erase(pg);
  CHECK(unnamed.lookup(g1, 1, &position) == ResponseCache::Lookup::kMiss);
  CHECK(unnamed.lookup(u2, 0, &position) == ResponseCache::Lookup::kHit);

  // Eviction against a model of least-recently-used order (a list of names, most recent first), through many more
  // touches, puts, replacements and erases than the cache holds, so that the touch log is compacted many times over.
  for (const size_t capacity : {1, 3, 17}) {
    ResponseCache lru(capacity);
    std::vector<std::string> model;  // front: most recent
    auto to_front = [&](const std::string& name) {
      model.erase(std::remove(model.begin(), model.end(), name), model.end());
      model.insert(model.begin(), name);
    };
    uint64_t state = 12345 + capacity;
    auto next = [&](uint64_t bound) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return (state >> 33) % bound;
    };
    for (int step = 0; step < 20000; ++step) {
      const std::string name = "n" + std::to_string(next(2 * capacity + 2));
      const uint64_t what = next(10);
      int at = -1;
      const bool held =
          lru.lookup(req(0, OpType::kAllreduce, DType::kFloat32, {4}, name), 0, &at) != ResponseCache::Lookup::kMiss;
      if (what < 5 && held) {
        lru.touch(at);
        to_front(name);
      } else if (what < 6 && held) {
        lru.erase(at);
        model.erase(std::remove(model.begin(), model.end(), name), model.end());
      } else {
        const std::string expected_out = !held && model.size() == capacity ? model.back() : "";
        if (!expected_out.empty()) {
          int p = -1;
          lru.lookup(req(0, OpType::kAllreduce, DType::kFloat32, {4}, expected_out), 0, &p);
          CHECK(p >= 0);
        }
        int evicted = -1;
        const int put_at = lru.put(resp(name, 4), &evicted);
        if (!expected_out.empty()) {
          model.pop_back();
          int p = -1;
          CHECK(lru.lookup(req(0, OpType::kAllreduce, DType::kFloat32, {4}, expected_out), 0, &p) ==
                ResponseCache::Lookup::kMiss);
          CHECK(evicted == put_at);
        } else {
          CHECK(evicted == (held ? put_at : -1));
        }
        to_front(name);
      }
      CHECK(lru.size() == model.size());
    }
  }
}

void test_eager_layout() {
  // Eligible entries while they fit the budget, laid out in position order (a budget the head holds); the layout
  // follows the cache's contents.
  ResponseCache cache(8);
  int displaced = -1;
  cache.put(resp("a", 2), &displaced);                   // 8 bytes
  cache.put(resp("b", 3, DType::kFloat16), &displaced);  // 6 bytes, padded to 8
  Response other_set = resp("c", 1, DType::kFloat32, 1);
  cache.put(other_set, &displaced);  // not the global set: never eager
  Response gather = resp("d", 1);
  gather.op = OpType::kAllgather;
  cache.put(gather, &displaced);
  Response adasum = resp("e", 1);
  adasum.reduce_op = ReduceOp::kAdasum;
  cache.put(adasum, &displaced);
  cache.put(resp("f", 100), &displaced);  // 400 bytes: over the budget
  Response maxed = resp("g", 1, DType::kInt64);
  maxed.reduce_op = ReduceOp::kMax;
  cache.put(maxed, &displaced);  // fits after f was skipped
  EagerLayout layout;
  layout.update(cache, 24);
  CHECK(layout.segments().size() == 3);
  CHECK(layout.words() == 3);
  CHECK(layout.find(0) && layout.find(0)->offset == 0 && layout.find(0)->count == 2);
  CHECK(layout.find(1) && layout.find(1)->offset == 8 && layout.find(1)->dtype == DType::kFloat16);
  for (int p : {2, 3, 4, 5}) CHECK(layout.find(p) == nullptr);
  CHECK(layout.find(6) && layout.find(6)->offset == 16 && layout.find(6)->kind == ReduceKind::kMax);
  CHECK(layout.find(7) == nullptr && layout.find(100) == nullptr);
  cache.erase(0);  // a change of contents rebuilds the layout: b moves to the front of the region
  layout.update(cache, 24);
  CHECK(layout.find(0) == nullptr && layout.find(1)->offset == 0 && layout.find(6)->offset == 8);
  cache.touch(1);  // recency is not contents: no rebuild (and nothing would change)
  layout.update(cache, 24);
  CHECK(layout.words() == 2);
  layout.update(cache, 0);  // budget 0: off
  CHECK(layout.segments().empty() && layout.words() == 0);

  // The smallest are chosen first, whatever their positions, then laid out in position order.
  ResponseCache mixed(8);
  mixed.put(resp("large", 4), &displaced);  // 16 bytes, at position 0
  mixed.put(resp("m", 2), &displaced);      // 8 bytes
  mixed.put(resp("n", 1), &displaced);      // 4 bytes, padded to 8
  mixed.put(resp("o", 3), &displaced);      // 12 bytes, padded to 16
  EagerLayout smallest;
  smallest.update(mixed, 24);  // m and n, not large (which would have come first in position order)
  CHECK(smallest.segments().size() == 2 && smallest.words() == 2 && !smallest.find(0) && !smallest.find(3));
  CHECK(smallest.find(1) && smallest.find(1)->offset == 0 && smallest.find(2) && smallest.find(2)->offset == 8);
  smallest.update(mixed, 32);  // then the 16-byte ones, ties by position: large
  CHECK(smallest.segments().size() == 3 && smallest.find(0) && smallest.find(0)->offset == 0 && !smallest.find(3));

  // Scalars reduced once at start-up fill the budget before a metric averaged every step is cached. Once they have
  // not been touched while as many operations ran as the cache holds, the metric's misses bring it in.
  ResponseCache stale(64);
  for (int i = 0; i < 40; ++i) stale.put(resp("s" + std::to_string(i), 2), &displaced);  // 8 bytes each
  const int metric = stale.put(resp("metric", 2), &displaced);
  EagerLayout recent;
  recent.update(stale, 256);  // nothing idle yet: the smallest by position, s0 to s31
  CHECK(recent.segments().size() == 32 && recent.find(0) && recent.find(31) && !recent.find(metric));
  // Each s goes idle once a cache's worth of touches (41) passed it; the metric gets in when the ones still in use
  // leave it room, and stays.
  int joined_at = -1;
  for (int step = 0; step < 200; ++step) {
    stale.touch(metric);
    if (!recent.find(metric)) recent.missed(stale, metric);
    recent.update(stale, 256);
    if (recent.find(metric) && joined_at < 0) joined_at = step;
    CHECK(recent.segments().size() == 32 && (joined_at < 0 || recent.find(metric)));
  }
  CHECK(joined_at > 0 && joined_at < 41);
  CHECK(EagerLayout::idle(stale, 39) && !EagerLayout::idle(stale, metric));

  // Every scalar in use every step, more than fit: the misses change nothing, cycle after cycle.
  ResponseCache busy(64);
  for (int i = 0; i < 40; ++i) busy.put(resp("b" + std::to_string(i), 2), &displaced);
  EagerLayout full;
  full.update(busy, 256);
  for (int step = 0; step < 5; ++step) {
    for (int p = 0; p < 40; ++p) {
      busy.touch(p);
      if (!full.find(p)) full.missed(busy, p);
      full.update(busy, 256);
      CHECK(full.segments().size() == 32 && full.find(0) && full.find(31) && !full.find(32));
    }
  }

  // Past the head's 256 bytes the chosen make the tail: the head's in position order first, then the tail's
  // smallest first (a rank sends the tail from its first to its last segment with data).
  ResponseCache split(8);
  split.put(resp("kb", 256), &displaced);       // 1 KB
  split.put(resp("p", 2), &displaced);          // 8 bytes
  split.put(resp("half", 100), &displaced);     // 400 bytes
  split.put(resp("q", 60), &displaced);         // 240 bytes
  split.put(resp("too big", 300), &displaced);  // 1,200 bytes: over what is left
  EagerLayout tiered;
  tiered.update(split, 2048);
  CHECK(tiered.segments().size() == 4 && tiered.head_words() == 31 && tiered.words() == 31 + 50 + 128);
  CHECK(tiered.find(1)->offset == 0 && tiered.find(3)->offset == 8);  // p, q: the head
  CHECK(tiered.find(2)->offset == 248 && tiered.find(0)->offset == 648 && tiered.find(0)->bytes == 1024);
  CHECK(!tiered.find(4));
  tiered.update(split, 256);  // a budget the head holds: no tail
  CHECK(tiered.segments().size() == 2 && tiered.words() == tiered.head_words());

  // The region reduces each segment with its own dtype and op, those within the bytes asked for.
  std::vector<EagerSegment> segments = {{0, 0, 8, 2, DType::kFloat32, ReduceKind::kSum},
                                        {1, 8, 8, 1, DType::kInt64, ReduceKind::kMax}};
  alignas(8) char dst[16], src[16];
  float a[2] = {1.5f, 2.0f}, b[2] = {0.25f, -4.0f};
  int64_t x = 7, y = 9;
  std::memcpy(dst, a, 8);
  std::memcpy(dst + 8, &x, 8);
  std::memcpy(src, b, 8);
  std::memcpy(src + 8, &y, 8);
  reduce_eager(segments, dst, src, 8, 16);
  float sum[2];
  int64_t most;
  std::memcpy(sum, dst, 8);
  std::memcpy(&most, dst + 8, 8);
  CHECK(sum[0] == 1.5f && most == 9);  // the first segment lies outside [8, 16)
  reduce_eager(segments, dst, src, 0, 12);
  std::memcpy(sum, dst, 8);
  std::memcpy(&most, dst + 8, 8);
  CHECK(sum[0] == 1.75f && sum[1] == -2.0f && most == 9);  // the second does not fit in [0, 12)
}
