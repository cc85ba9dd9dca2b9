// Unit tests of how the core chooses algorithms: the rules of the one function that decides (choice/select.h) and
// the tuned table they may read. Run from unit_tests.cc's main (tests/test_core_cpp.py builds both files into one
// binary).
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "choice/allreduce_table.h"
#include "choice/select.h"

using namespace hvdlite;

namespace {

Layout one_host(int size, bool single_copy = true) {
  Layout layout;
  layout.size = size;
  layout.per_host = size;
  layout.single_copy = single_copy;
  layout.world = true;
  return layout;
}

Layout across(int hosts, int per_host) {
  Layout layout;
  layout.size = hosts * per_host;
  layout.hosts = hosts;
  layout.per_host = per_host;
  layout.tiers = per_host > 1;
  layout.world = true;
  return layout;
}

constexpr size_t kKB = 1 << 10, kMB = 1 << 20;

}  // namespace

// The fixed rules on one host: recursive doubling below 64 KB, the ring, single copy from 16 MB where the members
// reach each other's memory; streaming stores from 64 MB; what the layout cannot run falls back.
void test_select_fixed_rules() {
  using A = AllreduceAlgorithm;
  const ChoiceSettings fixed;
  const Layout two = one_host(2);
  CHECK(select_flat_allreduce(two, 8, 2, fixed) == A::kRecursiveDoubling);
  CHECK(select_flat_allreduce(two, 64 * kKB - 1, 16 * kKB, fixed) == A::kRecursiveDoubling);
  CHECK(select_flat_allreduce(two, 64 * kKB, 16 * kKB, fixed) == A::kRing);
  CHECK(select_flat_allreduce(two, 16 * kMB - 1, 4 * kMB, fixed) == A::kRing);
  CHECK(select_flat_allreduce(two, 16 * kMB, 4 * kMB, fixed) == A::kSingleCopy);
  CHECK(select_flat_allreduce(one_host(2, false), 16 * kMB, 4 * kMB, fixed) == A::kRing);  // no cross-memory attach
  // The ring needs an element per member; recursive halving one per member of the largest power of two.
  CHECK(select_flat_allreduce(one_host(4), 64 * kKB, 3, fixed) == A::kRecursiveDoubling);
  ChoiceSettings halving = fixed;
  halving.forced = static_cast<int>(A::kRecursiveHalving);
  CHECK(select_flat_allreduce(one_host(6), 1 * kMB, 4, halving) == A::kRecursiveHalving);
  CHECK(select_flat_allreduce(one_host(6), 1 * kMB, 3, halving) == A::kRecursiveDoubling);
  // A named algorithm runs wherever it can, and single copy named without cross-memory attach runs the ring.
  ChoiceSettings ring = fixed;
  ring.forced = static_cast<int>(A::kRing);
  CHECK(select_flat_allreduce(two, 8, 2, ring) == A::kRing &&
        select_flat_allreduce(two, 64 * kMB, 16 * kMB, ring) == A::kRing);
  ChoiceSettings copy = fixed;
  copy.forced = static_cast<int>(A::kSingleCopy);
  CHECK(select_flat_allreduce(one_host(2, false), 8 * kKB, 2 * kKB, copy) == A::kRing);
  // SINGLE_COPY_ALLREDUCE_BYTES=0: never.
  ChoiceSettings never = fixed;
  never.single_copy_bytes = 0;
  CHECK(select_flat_allreduce(two, 256 * kMB, 64 * kMB, never) == A::kRing);
  // Streaming stores for large flat results only.
  CHECK(!select_allreduce(two, 32 * kMB, 8 * kMB, never).cold_output);
  CHECK(select_allreduce(two, 64 * kMB, 16 * kMB, never).cold_output);
  ChoiceSettings no_streaming = never;
  no_streaming.streaming_store_bytes = 0;
  CHECK(!select_allreduce(two, 256 * kMB, 64 * kMB, no_streaming).cold_output);
  // The same answer at every call: nothing is learnt between calls.
  for (int i = 0; i < 3; ++i) CHECK(select_allreduce(two, 16 * kMB, 4 * kMB, fixed).algorithm == A::kSingleCopy);
  CHECK(std::string(select_allreduce(two, 1 * kMB, 256 * kKB, fixed).label()) == "ring");
}

// Across hosts: two tiers wherever each host has several members, unless switched off, pipelined over chunks of
// HIERARCHICAL_PIPELINE_BYTES (at most 64, and never more than the elements a member's share holds).
void test_select_across_hosts() {
  using A = AllreduceAlgorithm;
  const ChoiceSettings settings;
  for (size_t bytes : {size_t{8}, 64 * kKB, 64 * kMB}) {
    const AllreducePlan plan = select_allreduce(across(2, 2), bytes, bytes / 4, settings);
    CHECK(plan.two_tier && std::string(plan.label()) == "hierarchical");
  }
  CHECK(select_allreduce(across(2, 2), 4 * kMB, kMB, settings).chunks == 1);
  CHECK(select_allreduce(across(2, 2), 16 * kMB, 4 * kMB, settings).chunks == 4);
  CHECK(select_allreduce(across(2, 2), 4 * kMB + 1, 4 * kMB / 4, settings).chunks == 2);
  CHECK(select_allreduce(across(2, 2), 1024 * kMB, 256 * kMB, settings).chunks == 64);
  CHECK(select_allreduce(across(2, 4), 64 * kMB, 4, settings).chunks == 1);  // 4 elements, 4 per host: 1 each
  ChoiceSettings flat = settings;
  flat.two_tier_allreduce = false;
  flat.two_tier_allgather = false;
  CHECK(!select_allreduce(across(2, 2), 64 * kMB, 16 * kMB, flat).two_tier);
  CHECK(select_allreduce(across(2, 2), 64 * kMB, 16 * kMB, flat).algorithm == A::kRing);
  // One member per host: nothing to gather within a host; the flat rules, without single copy across hosts.
  CHECK(!select_allreduce(across(4, 1), 64 * kMB, 16 * kMB, settings).two_tier);
  CHECK(select_flat_allreduce(across(4, 1), 32 * kMB, 8 * kMB, settings) == A::kRing);
  CHECK(select_allgather(across(2, 2), 8, settings) == AllgatherAlgorithm::kTwoTier);
  CHECK(select_allgather(across(2, 2), 8, flat) == AllgatherAlgorithm::kRing);
  CHECK(select_allgather(one_host(2), 64 * kKB, settings) == AllgatherAlgorithm::kSingleCopy);
  CHECK(select_allgather(one_host(2), 64 * kKB - 1, settings) == AllgatherAlgorithm::kRing);
  CHECK(select_broadcast(one_host(2), 8, settings) == BroadcastAlgorithm::kTree);
  CHECK(select_broadcast(one_host(2), 64 * kKB, settings) == BroadcastAlgorithm::kSingleCopy);
  CHECK(select_broadcast(across(2, 2), 64 * kKB, settings) == BroadcastAlgorithm::kChain);
  CHECK(pipeline_chunks(8 * kMB, 0) == 1 && pipeline_chunks(8 * kMB, 4 * kMB) == 2);
}

// A tuned table decides for the world on one host, before the fixed rules; a named algorithm before the table;
// process sets and communicators across hosts keep the fixed rules. Its text form round-trips, and nothing else
// parses.
void test_allreduce_table() {
  using A = AllreduceAlgorithm;
  AllreduceTable table;
  CHECK(AllreduceTable::parse("rd@0,single_copy@11585,ring@741455", &table));
  CHECK(table.serialize() == "rd@0,single_copy@11585,ring@741455");
  CHECK(table.choose(0) == A::kRecursiveDoubling && table.choose(11584) == A::kRecursiveDoubling);
  CHECK(table.choose(11585) == A::kSingleCopy && table.choose(741454) == A::kSingleCopy);
  CHECK(table.choose(741455) == A::kRing && table.choose(size_t{1} << 40) == A::kRing);
  for (const char* bad : {"", "ring@5", "ring@0,rd@0", "ring@0,rd@10,ring@9", "tree@0", "ring@", "ring@-1",
                          "ring@0x10", "ring", "ring@0,"}) {
    AllreduceTable untouched = table;
    CHECK(!AllreduceTable::parse(bad, &untouched) && untouched.serialize() == table.serialize());
  }
  ChoiceSettings tuned;
  tuned.table = table;
  const Layout world = one_host(2);
  CHECK(select_flat_allreduce(world, 20 * kKB, 5 * kKB, tuned) == A::kSingleCopy);
  CHECK(select_flat_allreduce(world, 32 * kMB, 8 * kMB, tuned) == A::kRing);  // the table, not the fixed rules
  Layout process_set = world;
  process_set.world = false;
  CHECK(select_flat_allreduce(process_set, 20 * kKB, 5 * kKB, tuned) == A::kRecursiveDoubling);
  CHECK(select_flat_allreduce(one_host(2, false), 20 * kKB, 5 * kKB, tuned) == A::kRing);  // what it can run
  tuned.forced = static_cast<int>(A::kRecursiveDoubling);
  CHECK(select_flat_allreduce(world, 32 * kMB, 8 * kMB, tuned) == A::kRecursiveDoubling);
}
