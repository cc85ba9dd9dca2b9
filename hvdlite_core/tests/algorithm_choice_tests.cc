// Unit tests of how the core chooses algorithms: the two-tier cost model's predictions, the one-host allreduce
// table and its vote, the streaming-store vote, and the online choice of large allreduces. Run from unit_tests.cc's
// main (tests/test_core_cpp.py builds both files into one binary).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "choice/allreduce_adaptive.h"
#include "choice/allreduce_table.h"
#include "choice/cost_model.h"
#include "choice/streaming_choice.h"

using namespace hvdlite;

// The streaming-store vote: streaming holds at the probe unless more than half the measurements find ordinary stores
// clearly (10%) faster there; then it starts 4x further up. Figures as cache text and back, and nothing else.
void test_streaming_choice() {
  const size_t mb16 = 16 << 20;
  const StreamingProbe loses{mb16, 2.6e-3, 3.1e-3}, wins{mb16, 3.4e-3, 2.9e-3}, tie{mb16, 3.0e-3, 3.2e-3};
  CHECK(streaming_loses(loses) && !streaming_loses(wins) && !streaming_loses(tie));
  CHECK(!streaming_loses(StreamingProbe{}));
  CHECK(streaming_store_bytes_from({}) == -1);
  CHECK(streaming_store_bytes_from({StreamingProbe{}}) == -1);
  CHECK(streaming_store_bytes_from({loses}) == int64_t(64) << 20);
  CHECK(streaming_store_bytes_from({wins}) == int64_t(mb16) && streaming_store_bytes_from({tie}) == int64_t(mb16));
  CHECK(streaming_store_bytes_from({loses, loses, wins}) == int64_t(64) << 20);
  CHECK(streaming_store_bytes_from({loses, tie, wins}) == int64_t(mb16));           // one of three: the default holds
  CHECK(streaming_store_bytes_from({loses, StreamingProbe{1 << 20, 1, 2}}) == -1);  // other sizes: not weighed
  StreamingProbe read;
  CHECK(serialize_streaming(loses) == "16777216:0.0026,0.0031");
  CHECK(parse_streaming(serialize_streaming(loses), &read) && read.bytes == mb16 && read.plain == 2.6e-3 &&
        read.streamed == 3.1e-3);
  for (const char* bad : {"", "16777216:1", "16777216:1,2,3", "0:1,2", "-5:1,2", "16777216:-1,2", "16777216:nan,1",
                          "16777216;1,2", "16777216:1,2x", "x16777216:1,2", "16777216:1,"}) {
    StreamingProbe untouched{7, 1, 1};
    CHECK(!parse_streaming(bad, &untouched) && untouched.bytes == 7);
  }
}

static bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 + 1e-9 * std::fabs(b); }

void test_cost_model() {
  LinkCosts c;
  c.local_latency_s = 1e-6;
  c.local_bytes_per_s = 5e9;
  c.cross_latency_s = 50e-6;
  c.cross_bytes_per_s = 125e6;  // 1 Gbit/s
  const size_t small = 64 << 10, mb64 = 64 << 20;
  // Flat ring, 2 hosts x 2: 6 steps of 16 MiB at the cross link's pace.
  CHECK(near(predict_allreduce_flat(2, 2, mb64, small, c), 6 * (50e-6 + (16 << 20) / 125e6)));
  // Two-tier: 2 local steps of 32 MiB, then 2 steps in which both pairs send 16 MiB over the shared link.
  CHECK(near(predict_allreduce_hierarchical(2, 2, mb64, small, c),
             2 * (1e-6 + (32 << 20) / 5e9) + 2 * (50e-6 + 2.0 * (16 << 20) / 125e6)));
  // Pipelined over 4 MiB chunks (16 of them): the network tier of a chunk (2 steps of 2 x 1 MiB) is slower than its
  // host tier (2 steps of 2 MiB), so it runs back to back and one chunk's host tier is added.
  const double chunk_host = 2 * (1e-6 + (2 << 20) / 5e9), chunk_network = 2 * (50e-6 + 2.0 * (1 << 20) / 125e6);
  CHECK(near(predict_allreduce_hierarchical(2, 2, mb64, small, c, 4 << 20), 16 * chunk_network + chunk_host));
  CHECK(predict_allreduce_hierarchical(2, 2, mb64, small, c, 4 << 20) <
        predict_allreduce_hierarchical(2, 2, mb64, small, c));
  // A buffer no larger than one chunk is not cut.
  CHECK(near(predict_allreduce_hierarchical(2, 2, 4 << 20, small, c, 4 << 20),
             predict_allreduce_hierarchical(2, 2, 4 << 20, small, c)));
  // 256 hosts: a chunk's cross ring takes 510 steps, each paying the latency again; the model keeps one chunk.
  CHECK(choose_hierarchical_chunks(256, 8, mb64, small, c, 4 << 20) == 1);
  CHECK(choose_hierarchical_chunks(2, 2, mb64, small, c, 4 << 20) == 16);
  CHECK(choose_hierarchical_chunks(2, 2, mb64, small, LinkCosts(), 4 << 20) == 16);  // unmeasured: the knob
  CHECK(hierarchical_pipeline_chunks(mb64, 0) == 1 && hierarchical_pipeline_chunks(mb64 + 1, 1 << 20) == 64);
  // Recursive doubling below the threshold: 2 hosts x 4 = distances 1, 2 local, 4 across (4 ranks at once), each
  // step reducing the whole buffer (at the assumed 4 GB/s).
  CHECK(near(predict_allreduce_flat(2, 4, 1024, small, c),
             2 * (1e-6 + 1024 / 5e9) + 50e-6 + 4 * 1024 / 125e6 + 3 * 1024 / 4e9));
  // Large buffers on a slow network: two-tier wins, by up to 2(N-1)/N over 2(H-1)/H (1.75 for 2 x 4).
  double ratio = predict_allreduce_flat(2, 4, mb64, small, c) / predict_allreduce_hierarchical(2, 4, mb64, small, c);
  CHECK(ratio > 1.6 && ratio < 1.75);
  // Tiny buffers: the flat recursive doubling's log2(8) exchanges beat the local steps plus the cross exchange?
  // Not with these figures: the cross latency dominates both, so only check the predictions are positive.
  CHECK(predict_allreduce_hierarchical(2, 4, 8, small, c) > 0);
  // A network as fast as shared memory: two-tier loses (its cross phase shares each host's link 4 ways).
  LinkCosts flat_network = c;
  flat_network.cross_latency_s = c.local_latency_s;
  flat_network.cross_bytes_per_s = c.local_bytes_per_s;
  CHECK(predict_allreduce_flat(2, 4, mb64, small, flat_network) <
        predict_allreduce_hierarchical(2, 4, mb64, small, flat_network));
  // One host, or one rank per host: nothing to layer, the same prediction as flat.
  CHECK(near(predict_allreduce_hierarchical(1, 4, mb64, small, c), predict_allreduce_flat(1, 4, mb64, small, c)));
  CHECK(near(predict_allreduce_hierarchical(4, 1, mb64, small, c), predict_allreduce_flat(4, 1, mb64, small, c)));
  // Allgather of 64 MiB over 2 x 2: the flat ring's 3 steps of 16 MiB cross the link; two-tier: 1 local step of
  // 16 MiB, 1 cross step in which the two slices of the other host's 32 MiB share the link, 1 local step of 16 MiB.
  CHECK(near(predict_allgather_flat(2, 2, mb64, c), 3 * (50e-6 + (16 << 20) / 125e6)));
  CHECK(near(predict_allgather_hierarchical(2, 2, mb64, c),
             2 * (1e-6 + (16 << 20) / 5e9) + 50e-6 + (32 << 20) / 125e6));
  CHECK(predict_allgather_hierarchical(2, 2, mb64, c) < predict_allgather_flat(2, 2, mb64, c));
  CHECK(near(predict_allgather_hierarchical(1, 4, mb64, c), predict_allgather_flat(1, 4, mb64, c)));
  CHECK(c.known() && LinkCosts().describe().empty());
  CHECK(c.describe() ==
        "local_latency_us=1.00;local_gbytes_per_s=5.000;cross_latency_us=50.00;cross_gbytes_per_s=0.125");
}

// Where the ring takes over from recursive doubling, by communicator size: the knob for a pair, growing with the
// number of members (the ring's 2(n-1) latencies), never below the knob.
void test_ring_from_scales_with_the_job() {
  const size_t small = 64 << 10;
  const LinkCosts assumed = assumed_link_costs();
  CHECK(ring_from_bytes(2, 1, small, assumed) == small && ring_from_bytes(1, 2, small, assumed) == small);
  CHECK(ring_from_bytes(1, 1, small, LinkCosts()) == small);
  size_t previous = small;
  for (int hosts : {2, 4, 16, 64, 256, 2048}) {
    const size_t from = ring_from_bytes(hosts, 1, small, LinkCosts());  // unmeasured: the assumed figures
    CHECK(from >= previous);
    previous = from;
  }
  CHECK(ring_from_bytes(16, 1, small, assumed) > small);
  // 256 hosts x 8: a 64 KB allreduce takes recursive doubling's 11 steps, not the ring's 4,094.
  CHECK(ring_from_bytes(256, 8, small, assumed) > (64u << 10));
  CHECK(predict_allreduce_flat(256, 8, 64 << 10, ring_from_bytes(256, 8, small, assumed), assumed) <
        predict_allreduce_flat(256, 8, 64 << 10, small, assumed));
  // The knob scales: twice the knob, twice the size (where the model moves it at all).
  CHECK(ring_from_bytes(256, 1, 2 * small, assumed) / 2 == ring_from_bytes(256, 1, small, assumed) ||
        ring_from_bytes(256, 1, 2 * small, assumed) / 2 + 1 == ring_from_bytes(256, 1, small, assumed));
}

// Recursive halving and doubling: the band where the model prices it clearly below what the size rule runs.
void test_halving_band() {
  const size_t small = 64 << 10;
  const LinkCosts assumed = assumed_link_costs();
  // Fewer than 4 members: never (with 2 it moves what the ring moves, and reduces after receiving).
  CHECK(halving_band(2, 1, small, assumed).from == 0 && halving_band(2, 1, small, assumed).to == 0);
  CHECK(halving_band(3, 1, small, assumed).to == 0 && halving_band(1, 3, small, assumed).to == 0);
  for (int hosts : {16, 256, 2048}) {
    const size_t ring_from = ring_from_bytes(hosts, 1, small, assumed);
    const HalvingBand band = halving_band(hosts, 1, ring_from, assumed);
    CHECK(band.from > 0 && band.from < band.to);
    // At its first size it is priced at least 10% below what the size rule runs; at its end and half its start,
    // not.
    const double halving = predict_allreduce_halving(hosts, 1, band.from, assumed);
    CHECK(predict_allreduce_flat(hosts, 1, band.from, FlatRule(ring_from, band), assumed) == halving);
    CHECK(halving < 0.9 * predict_allreduce_flat(hosts, 1, band.from, ring_from, assumed));
    for (size_t outside : {band.from / 2, band.to}) {
      CHECK(!band.contains(outside));
      CHECK(predict_allreduce_halving(hosts, 1, outside, assumed) >=
            0.9 * predict_allreduce_flat(hosts, 1, outside, ring_from, assumed));
    }
    CHECK(band.from > 1024);
  }
  // With many members its band covers the middle sizes the ring's latencies and recursive doubling's bytes lose.
  const HalvingBand wide = halving_band(2048, 1, ring_from_bytes(2048, 1, small, assumed), assumed);
  CHECK(wide.contains(64 << 10) && wide.contains(1 << 20) && wide.contains(16 << 20));
  // The two-tier allreduce's cross tier runs recursive halving in the cross layout's band too (8 MB over 256 x 8:
  // 1 MB segments across).
  const size_t cross_from = ring_from_bytes(256, 1, small, assumed);
  const FlatRule cross(cross_from, halving_band(256, 1, cross_from, assumed));
  CHECK(cross.halving.contains(1 << 20));
  CHECK(predict_allreduce_hierarchical(256, 8, 8 << 20, cross, assumed) <
        0.9 * predict_allreduce_hierarchical(256, 8, 8 << 20, FlatRule(cross_from), assumed));
  // A non-power-of-two job pays two whole-buffer transfers more than the next power of two below it.
  CHECK(predict_allreduce_halving(5, 1, 1 << 20, assumed) > predict_allreduce_halving(4, 1, 1 << 20, assumed));
}

// The table in docs/architecture.md, printed for tests/test_core_cpp.py to compare (lines starting "TABLE").
void print_ring_from_table() {
  const size_t small = 64 << 10;
  const LinkCosts c = assumed_link_costs();
  std::printf(
      "TABLE | ranks (hosts x per host) | ring from | rhd from - to | 64 KB: rd / rhd / ring (us) | "
      "16 MB: rd / rhd / ring (ms) | chosen at 64 KB, 16 MB |\n");
  std::printf("TABLE |---|---|---|---|---|---|\n");
  const int layouts[][2] = {{2, 1}, {1, 8}, {16, 1}, {2, 8}, {256, 1}, {32, 8}, {2048, 1}, {256, 8}};
  auto size_text = [](size_t bytes) {
    char text[32];
    if (bytes == ~size_t{0}) return std::string("any");
    if (bytes >= (1u << 20)) {
      std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1048576.0);
    } else {
      std::snprintf(text, sizeof(text), "%.0f KB", bytes / 1024.0);
    }
    return std::string(text);
  };
  for (const auto& layout : layouts) {
    const int hosts = layout[0], per_host = layout[1];
    const size_t from = ring_from_bytes(hosts, per_host, small, c);
    const HalvingBand band = halving_band(hosts, per_host, from, c);
    const size_t k64 = 64 << 10, m16 = 16 << 20;
    auto chosen = [&](size_t bytes) { return band.contains(bytes) ? "rhd" : bytes < from ? "rd" : "ring"; };
    const std::string halving = band.to == 0 ? "-" : size_text(band.from) + " - " + size_text(band.to);
    std::printf("TABLE | %d (%d x %d) | %.0f KB | %s | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f | %s, %s |\n",
                hosts * per_host, hosts, per_host, from / 1024.0, halving.c_str(),
                predict_allreduce_flat(hosts, per_host, k64, ~size_t{0}, c) * 1e6,
                predict_allreduce_halving(hosts, per_host, k64, c) * 1e6,
                predict_allreduce_flat(hosts, per_host, k64, 0, c) * 1e6,
                predict_allreduce_flat(hosts, per_host, m16, ~size_t{0}, c) * 1e3,
                predict_allreduce_halving(hosts, per_host, m16, c) * 1e3,
                predict_allreduce_flat(hosts, per_host, m16, 0, c) * 1e3, chosen(k64), chosen(m16));
  }
}

void test_allreduce_table() {
  using A = AllreduceAlgorithm;
  // Fastest per probe where it beats the fixed rules' choice (rd below 64 KB, else ring) by 10%; bands meet at the
  // geometric midpoint between probes; equal neighbours merge; a probe with no candidate adds nothing.
  std::vector<AllreduceProbe> probes = {
      {4096, {1e-6, 2e-6, -1}},         {32768, {5e-6, 4e-6, 3e-6}},
      {262144, {-1, 30e-6, 20e-6}},     {2097152, {-1, 100e-6, 95e-6}},  // 5% better: a tie, the ring stays
      {16777216, {-1, 900e-6, 950e-6}}, {1 << 30, {-1, -1, -1}}};
  AllreduceTable table = AllreduceTable::from_probes(probes, 64 << 10);
  CHECK(table.serialize() == "rd@0,single_copy@11585,ring@741455");
  CHECK(AllreduceTable::from_probes({{32768, {5e-6, 4.6e-6, -1}}}, 64 << 10).serialize() == "rd@0");    // 8%: a tie
  CHECK(AllreduceTable::from_probes({{32768, {5e-6, 4.4e-6, -1}}}, 64 << 10).serialize() == "ring@0");  // 12%
  CHECK(table.choose(0) == A::kRecursiveDoubling && table.choose(11584) == A::kRecursiveDoubling);
  CHECK(table.choose(11585) == A::kSingleCopy && table.choose(741454) == A::kSingleCopy);
  CHECK(table.choose(741455) == A::kRing && table.choose(size_t{1} << 40) == A::kRing);
  AllreduceTable parsed;
  CHECK(AllreduceTable::parse(table.serialize(), &parsed) && parsed.serialize() == table.serialize());
  // Only what serialize() writes: the first band at 0, ascending, known names, plain numbers.
  for (const char* bad : {"", "ring@5", "ring@0,rd@0", "ring@0,rd@10,ring@9", "tree@0", "ring@", "ring@-1",
                          "ring@0x10", "ring", "ring@0,"}) {
    AllreduceTable untouched = table;
    CHECK(!AllreduceTable::parse(bad, &untouched) && untouched.serialize() == table.serialize());
  }
  // Measurements as cache lines: a round trip, and nothing but that form.
  std::vector<AllreduceProbe> read;
  CHECK(serialize_probes({{4096, {1.5e-6, 2e-6, -1}}, {32768, {5e-6, 4e-6, 3e-6}}}) ==
        "4096:1.5e-06,2e-06,-1;32768:5e-06,4e-06,3e-06");
  CHECK(parse_probes(serialize_probes(probes), &read) && serialize_probes(read) == serialize_probes(probes));
  for (const char* bad : {"", "4096:1,2", "4096:1,2,3;", "4096:1,2,3;4096:1,2,3", "4096:1,2,-2", "4096:1,2,nan",
                          "4096:1,2,3x", "x4096:1,2,3", "-1:1,2,3", "4096;1,2,3", "4096:1,,3"}) {
    std::vector<AllreduceProbe> untouched = {{1, {1, 1, 1}}};
    CHECK(!parse_probes(bad, &untouched) && untouched.size() == 1 && untouched[0].bytes == 1);
  }
  // Several measurements vote per probe: more than half must agree, else the fixed rules hold. Here single copy
  // wins clearly in two of three at 2 MB (the loaded one says ring), and the three disagree at 256 KB.
  const std::vector<AllreduceProbe> quiet = {{262144, {-1, 30e-6, 20e-6}}, {2 << 20, {-1, 1000e-6, 850e-6}}};
  const std::vector<AllreduceProbe> loaded = {{262144, {-1, 90e-6, 120e-6}}, {2 << 20, {-1, 2000e-6, 2400e-6}}};
  const std::vector<AllreduceProbe> far = {{262144, {-1, 50e-6, 60e-6}}, {2 << 20, {-1, 1100e-6, 800e-6}}};
  CHECK(AllreduceTable::from_probes(quiet, 64 << 10).serialize() == "single_copy@0");
  CHECK(AllreduceTable::from_measurements({quiet, loaded, far}, 64 << 10).serialize() == "ring@0,single_copy@741455");
  CHECK(AllreduceTable::from_measurements({quiet, loaded}, 64 << 10).serialize() == "ring@0");  // 1 of 2: no
  CHECK(AllreduceTable::from_measurements({quiet, far}, 64 << 10).serialize() == "ring@0,single_copy@741455");
  CHECK(AllreduceTable::from_measurements({quiet}, 64 << 10).serialize() == "single_copy@0");
  // Below the small-message size the fixed rule is recursive doubling: it holds when the ring wins only once.
  const std::vector<AllreduceProbe> a = {{32768, {5e-6, 4e-6, -1}}}, b = {{32768, {5e-6, 5e-6, -1}}};
  CHECK(AllreduceTable::from_measurements({a, b, b}, 64 << 10).serialize() == "rd@0");
  CHECK(AllreduceTable::from_measurements({a, a, b}, 64 << 10).serialize() == "ring@0");
  // Measurements of different probes, or of different candidates, are not weighed together.
  CHECK(probes_match({quiet, loaded, far}) && probes_match({quiet}));
  CHECK(!probes_match({quiet, {{262144, {-1, 1, 1}}}}) && !probes_match({a, {{32768, {5e-6, 4e-6, 1}}}}));
  CHECK(!probes_match({quiet, {}}) && !probes_match({}) && !probes_match({{}}));
  CHECK(AllreduceTable::from_measurements({quiet, a}, 64 << 10).empty());
}

// One cycle of the adaptive choice as rank 0 lives it: propose, apply the (own) word, run the band once.
static AllreduceAlgorithm adaptive_cycle(AdaptiveAllreduce& a, int band, size_t bytes, double ring_s, double copy_s) {
  a.apply(a.propose());
  AllreduceAlgorithm algorithm = a.take(band);
  a.observe(band, bytes, algorithm, algorithm == AllreduceAlgorithm::kRing ? ring_s : copy_s);
  return algorithm;
}

static int switches_of(const AdaptiveAllreduce& a) {
  const std::string text = a.describe();
  return std::stoi(text.substr(text.find("adaptive_switches=") + 18));
}

void test_adaptive_allreduce() {
  using A = AllreduceAlgorithm;
  const size_t mb = 1 << 20;
  const int first = AdaptiveAllreduce::kMinTrialInterval, trial = AdaptiveAllreduce::kTrialRuns;
  AdaptiveAllreduce a(256 << 10, AllreduceTable(), 0);
  // Bands: a factor of 4 from the minimum; below it nothing is chosen online.
  CHECK(a.band(0) == -1 && a.band((256 << 10) - 1) == -1);
  CHECK(a.band(256 << 10) == 0 && a.band(mb - 1) == 0 && a.band(mb) == 1 && a.band(16 * mb) == 3);
  CHECK(a.band(size_t{1} << 62) == AdaptiveAllreduce::kBands - 1);
  CHECK(AdaptiveAllreduce(0, AllreduceTable(), 0).band(size_t{1} << 30) == -1);
  // Starts from the ring (no table), tries single copy for kTrialRuns runs after kMinTrialInterval, and moves to
  // it when the trial's median is clearly lower; the next trial (of the ring) comes kMinTrialInterval runs later.
  std::vector<A> ran;
  for (int i = 0; i < first + trial + first + trial; ++i) ran.push_back(adaptive_cycle(a, 3, 16 * mb, 7e-3, 3e-3));
  for (int i = 0; i < (int)ran.size(); ++i) {
    const bool ring_expected = i < first || i >= first + trial + first;
    CHECK((ran[i] == A::kRing) == ring_expected);
  }
  CHECK(switches_of(a) == 1);
  // Losing trials double the pause, up to kMaxTrialInterval: over 600 runs with the ring more than twice as slow, the
  // ring runs in 6 trials (after 16, 32, 64, 128, 128 and 128 runs), not in one run of every few.
  int ring_runs = 0;
  for (int i = 0; i < 600; ++i) ring_runs += adaptive_cycle(a, 3, 16 * mb, 7e-3, 3e-3) == A::kRing;
  CHECK(ring_runs == 6 * trial);
  CHECK(switches_of(a) == 1);
  // The machine changes: single copy runs 3x slower from now on. Three slow runs in a row show it (it was 128 runs
  // before the next trial), the ring is tried at once and takes over.
  int until_ring = 0;
  while (adaptive_cycle(a, 3, 16 * mb, 2e-3, 9e-3) != A::kRing && until_ring < 1000) ++until_ring;
  CHECK(until_ring == 3);
  int ring_after = 0;
  for (int i = 0; i < 40; ++i) ring_after += adaptive_cycle(a, 3, 16 * mb, 2e-3, 9e-3) == A::kRing;
  CHECK(ring_after >= 40 - 2 * trial);  // trial runs of single copy only
  CHECK(switches_of(a) == 2);
  // Noise: figures jumping by up to +-40% from run to run. Around a 30% difference the ring keeps its place (single
  // copy runs in its trials only); around a 5% one, where either choice costs little, the choice flips rarely.
  for (double copy_over_ring : {1.3, 1.05}) {
    AdaptiveAllreduce noisy(256 << 10, AllreduceTable(), 0);
    int noisy_copy_runs = 0;
    for (int i = 0; i < 400; ++i) {
      const double jitter = 1 + 0.4 * ((i * 7919) % 13 - 6) / 6.0;
      const double other = 1 + 0.4 * ((i * 104729) % 11 - 5) / 5.0;
      noisy_copy_runs +=
          adaptive_cycle(noisy, 0, mb / 2, 1e-4 * jitter, 1e-4 * copy_over_ring * other) == A::kSingleCopy;
    }
    CHECK(switches_of(noisy) <= 2);
    if (copy_over_ring > 1.2) CHECK(switches_of(noisy) == 0 && noisy_copy_runs <= 6 * trial);
  }
  // Bands are independent: band 0 of `a` never left the ring.
  CHECK(a.peek(0) == A::kRing);
  // One trial run per cycle: a cycle with three runs of a band in trial runs the other algorithm once.
  AdaptiveAllreduce b(256 << 10, AllreduceTable(), 0);
  for (int i = 0; i < first; ++i) adaptive_cycle(b, 1, mb, 1e-3, 2e-3);
  b.apply(b.propose());
  CHECK(b.peek(1) == A::kSingleCopy && b.take(1) == A::kSingleCopy);
  b.observe(1, mb, A::kSingleCopy, 2e-3);
  CHECK(b.take(1) == A::kRing && b.take(1) == A::kRing);
  // Every rank applies the same word, so a rank that is not the decider follows it whatever its own timings.
  AdaptiveAllreduce follower(256 << 10, AllreduceTable(), 0);
  follower.apply(1u << 2);
  CHECK(follower.take(2) == A::kSingleCopy && follower.take(0) == A::kRing);
  follower.apply((1u << 2) | (1u << (16 + 2)));
  CHECK(follower.take(2) == A::kRing && follower.take(2) == A::kSingleCopy);
  follower.observe(2, 4 * mb, A::kRing, 1e-3);
  follower.observe(2, 4 * mb, A::kSingleCopy, 1e-3);
  follower.observe(2, 4 * mb, A::kSingleCopy, 1e-3);
  CHECK(follower.describe() == "adaptive_allreduce=262144;adaptive_runs=ring:1,single_copy:2;adaptive_switches=1");
  // Warm-up: no trial before the chosen algorithms have moved warm_bytes (here 8 MB: 32 runs of 256 KB).
  AdaptiveAllreduce warming(256 << 10, AllreduceTable(), 8 * mb);
  int first_trial = 0;
  while (adaptive_cycle(warming, 0, 256 << 10, 3e-4, 1e-4) == A::kRing && first_trial < 1000) ++first_trial;
  CHECK(first_trial == 32);
  // A run whose time is not the algorithm's (seconds < 0: it also moved its buffers onto huge pages) counts as a
  // run, teaches nothing and leaves the trial owing that run: here single copy's trial starts with one, and still
  // takes kTrialRuns measured runs before it moves the band.
  AdaptiveAllreduce d(256 << 10, AllreduceTable(), 0);
  for (int i = 0; i < first; ++i) CHECK(adaptive_cycle(d, 1, mb, 7e-3, 3e-3) == A::kRing);
  d.apply(d.propose());
  CHECK(d.take(1) == A::kSingleCopy);
  d.observe(1, mb, A::kSingleCopy, -1.0);
  for (int i = 0; i < trial; ++i) {
    CHECK((d.propose() & (1u << 1)) == 0);  // the ring is still the choice: the trial is not complete
    CHECK(adaptive_cycle(d, 1, mb, 7e-3, 3e-3) == A::kSingleCopy);
  }
  CHECK((d.propose() & (1u << 1)) != 0);  // after kTrialRuns measured runs, single copy takes over
  CHECK(d.describe() == "adaptive_allreduce=262144;adaptive_runs=ring:8,single_copy:4;adaptive_switches=0");
  // Unset, the online choice starts where the table (or, without one, SMALL_MESSAGE_BYTES) first runs the ring or
  // single copy, at least at the floor.
  const size_t floor = 64 << 10, ring_from = 32 << 10;
  for (const auto& [text, expected] :
       std::vector<std::pair<std::string, size_t>>{{"rd@0,ring@92681,single_copy@2965820", 92681},
                                                   {"rd@0,ring@11585", floor},
                                                   {"rd@0,single_copy@16384,ring@1000000", floor},
                                                   {"single_copy@0", floor},
                                                   {"rd@0,single_copy@4194304", 4194304},
                                                   {"rd@0", 0}}) {
    AllreduceTable parsed;
    CHECK(AllreduceTable::parse(text, &parsed));
    CHECK(default_adaptive_bytes(parsed, ring_from, floor) == expected);
  }
  CHECK(default_adaptive_bytes(AllreduceTable(), ring_from, floor) == floor);  // no table: the fixed rules' ring
  CHECK(default_adaptive_bytes(AllreduceTable(), mb, floor) == mb);
  // A table that runs single copy at a band's lower end starts the band there.
  AllreduceTable table;
  CHECK(AllreduceTable::parse("rd@0,ring@11585,single_copy@4194304", &table));
  AdaptiveAllreduce c(256 << 10, table, 0);
  CHECK(c.peek(1) == A::kRing && c.peek(2) == A::kSingleCopy && c.peek(5) == A::kSingleCopy);
}
