// Unit tests of the core's pure pieces: cross-rank validation, fusion planning, dtype conversions and reductions,
// HMAC-SHA256, out-of-step detection, copies, the huge-page buffer and promotion (the algorithm choices:
// algorithm_choice_tests.cc; the shared-memory transport: transport_tests.cc; the tensor queue's name records and
// the handle table: queue_tests.cc; the response cache and the eager layout over it: cache_tests.cc). Built and run
// by tests/test_core_cpp.py (no framework; exits non-zero on failure).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "collectives/reduce_kernels.h"
#include "common/copy_bytes.h"
#include "common/dtype.h"
#include "common/hmac_sha256.h"
#include "common/huge_page_buffer.h"
#include "common/huge_page_promotion.h"
#include "common/ordered_worker.h"
#include "messages.h"
#include "runtime/desync.h"
#include "runtime/eager.h"
#include "runtime/fusion.h"
#include "runtime/recent_ops.h"
#include "runtime/response_cache.h"
#include "runtime/validation.h"
#include "transport/caller_spin.h"
#include "transport/lost_peers.h"

using namespace hvdlite;

int g_failures = 0;
int g_checks = 0;

// In algorithm_choice_tests.cc.
void test_select_fixed_rules();
void test_select_across_hosts();
void test_allreduce_table();
// In transport_tests.cc.
void test_receive_in_place();
void test_messages();
void test_handshake_verdicts();
void test_orphaned_inboxes();
// In queue_tests.cc.
void test_name_records();
void test_name_slots();
void test_handle_table();
void test_fast_slots();
void test_fast_slots_swept();
void test_fast_slots_process_sets();
// In cache_tests.cc.
void test_cache();
void test_eager_layout();

static bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

static void test_validation() {
  std::vector<int> members = {0, 1, 2};
  // Agreement: an allreduce response with the request's parameters.
  Response ok = build_response(
      {req(0, OpType::kAllreduce, DType::kFloat32, {4}), req(2, OpType::kAllreduce, DType::kFloat32, {4}),
       req(1, OpType::kAllreduce, DType::kFloat32, {4})},
      {}, members);
  CHECK(!ok.is_error);
  CHECK(ok.shape == std::vector<int64_t>({4}));
  CHECK(ok.cacheable);
  // Its element count travels with it, read back from the wire too; a response built by hand counts its shape.
  CHECK(ok.elements == 4 && element_count(ok) == 4);
  {
    WireWriter w;
    ok.write(w);
    WireReader r(w.bytes().data(), w.bytes().size());
    CHECK(element_count(Response::Read(r)) == 4);
    Response by_hand;
    by_hand.shape = {3, 5};
    CHECK(by_hand.elements == -1 && element_count(by_hand) == 15);
    // Counted before any check (a decoded message), a product that overflows or a negative dimension is unknown.
    CHECK(element_count_or_unknown({int64_t{1} << 62, 4}) == -1 && element_count_or_unknown({2, -3}) == -1);
  }

  // dtype mismatch names the tensor, the ranks and both values.
  Response bad = build_response(
      {req(0, OpType::kAllreduce, DType::kFloat32, {4}), req(1, OpType::kAllreduce, DType::kInt32, {4}),
       req(2, OpType::kAllreduce, DType::kFloat32, {4})},
      {}, members);
  CHECK(bad.is_error);
  CHECK(bad.error_code == static_cast<int>(StatusCode::kMismatch));
  CHECK(contains(bad.error, "'grad'"));
  CHECK(contains(bad.error, "ranks 0, 2: float32"));
  CHECK(contains(bad.error, "rank 1: int32"));
  CHECK(!bad.cacheable);

  // Operation mismatch is reported before anything else.
  Response op = build_response(
      {req(0, OpType::kAllreduce, DType::kFloat32, {4}), req(1, OpType::kAllgather, DType::kInt32, {4})}, {}, {0, 1});
  CHECK(op.is_error && contains(op.error, "collective operations") && contains(op.error, "allgather"));

  // Shapes, root, reduce op, scale factors.
  CHECK(contains(build_response({req(0, OpType::kAllreduce, DType::kFloat32, {4}),
                                 req(1, OpType::kAllreduce, DType::kFloat32, {5})},
                                {}, {0, 1})
                     .error,
                 "[4]"));
  Request a = req(0, OpType::kBroadcast, DType::kFloat32, {2}), b = req(1, OpType::kBroadcast, DType::kFloat32, {2});
  a.root_rank = 0;
  b.root_rank = 1;
  CHECK(contains(build_response({a, b}, {}, {0, 1}).error, "root ranks"));
  Request c = req(0, OpType::kAllreduce, DType::kFloat32, {2}), d = req(1, OpType::kAllreduce, DType::kFloat32, {2});
  d.reduce_op = ReduceOp::kMax;
  CHECK(contains(build_response({c, d}, {}, {0, 1}).error, "reduce ops"));
  d.reduce_op = ReduceOp::kSum;
  d.prescale = 0.5;
  CHECK(contains(build_response({c, d}, {}, {0, 1}).error, "prescale"));
  // Factors are compared as the message prints them (six significant digits): closer ones agree.
  d.prescale = 1.0 + 1e-9;
  CHECK(!build_response({c, d}, {}, {0, 1}).is_error);
  d.prescale = 1.0;
  d.postscale = 0.25;
  CHECK(contains(build_response({c, d}, {}, {0, 1}).error, "postscale factors"));
  // Packed tensors: the same size laid out differently is a mismatch, and a cached response matches only its layout.
  d.postscale = 1.0;
  c.layout = 0x1234;
  d.layout = 0xabcd;
  Response layouts = build_response({c, d}, {}, {0, 1});
  CHECK(layouts.is_error && layouts.error_code == static_cast<int>(StatusCode::kMismatch));
  CHECK(contains(layouts.error, "layouts of the packed tensors") && contains(layouts.error, "rank 0: 1234") &&
        contains(layouts.error, "rank 1: abcd"));
  d.layout = c.layout;
  Response packed = build_response({c, d}, {}, {0, 1});
  CHECK(!packed.is_error && packed.layout == 0x1234 && packed.matches(c, 0));
  d.layout = 0xabcd;
  CHECK(!packed.matches(d, 1));
  // A caller that has established the name skips only the names' comparison: everything else is still compared.
  Request renamed = c;
  renamed.name += ".other";
  CHECK(!packed.matches(renamed, 0) && packed.matches(renamed, 0, true));
  renamed.layout = 0xabcd;
  CHECK(!packed.matches(renamed, 0, true));
  // The digest travels with the request to the coordinator and with the response back.
  WireWriter w;
  d.write(w);
  packed.write(w);
  WireReader r(w.bytes().data(), w.bytes().size());
  CHECK(Request::Read(r).layout == 0xabcd && Response::Read(r).layout == 0x1234);

  // Allgather: first dimensions may differ, the rest may not; first_dims in member order.
  Response gather = build_response(
      {req(2, OpType::kAllgather, DType::kInt64, {3, 2}), req(0, OpType::kAllgather, DType::kInt64, {1, 2})}, {},
      {0, 2});
  CHECK(!gather.is_error);
  CHECK(gather.first_dims == std::vector<int64_t>({1, 3}));
  CHECK(build_response(
            {req(0, OpType::kAllgather, DType::kInt64, {3, 2}), req(1, OpType::kAllgather, DType::kInt64, {3, 3})},
            {}, {0, 1})
            .is_error);

  // Joined ranks: allreduce proceeds (with the joined list), alltoall is refused.
  Response joined = build_response({req(0, OpType::kAllreduce, DType::kFloat32, {4})}, {1}, {0, 1});
  CHECK(!joined.is_error && joined.joined == std::vector<int32_t>({1}) && !joined.cacheable);
  CHECK(build_response({req(0, OpType::kAlltoall, DType::kFloat32, {4})}, {1}, {0, 1}).is_error);
}

// A shape's key stands for it exactly, and matching falls back on the shapes themselves where either side has none.
static void test_shape_keys() {
  const int64_t big20 = (int64_t{1} << 20) - 1, big31 = (int64_t{1} << 31) - 1, big62 = (int64_t{1} << 62) - 1;
  const std::vector<std::vector<int64_t>> packed = {
      {},       {0},        {1},        {256},     {big62},     {0, 0},      {1, 256},
      {256, 1}, {big31, 1}, {1, big31}, {0, 0, 0}, {1, 1, 256}, {256, 1, 1}, {big20, big20, big20}};
  for (size_t i = 0; i < packed.size(); ++i) {
    CHECK(key_of_shape(packed[i]) != kUnknownShapeKey);
    for (size_t j = 0; j < i; ++j) CHECK(key_of_shape(packed[i]) != key_of_shape(packed[j]));
  }
  for (const std::vector<int64_t>& wide : std::vector<std::vector<int64_t>>{
           {big62 + 1}, {big31 + 1, 1}, {1, big31 + 1}, {big20 + 1, 1, 1}, {1, 1, big20 + 1}, {1, 1, 1, 1}, {-1}})
    CHECK(key_of_shape(wide) == kUnknownShapeKey);

  Request q = req(0, OpType::kAllreduce, DType::kFloat32, {2, 3});
  Response cached = build_response({q}, {}, {0});
  CHECK(!cached.is_error && cached.shape_key == key_of_shape(q.shape));
  q.shape_key = key_of_shape(q.shape);
  CHECK(cached.matches(q, 0));
  Request turned = req(0, OpType::kAllreduce, DType::kFloat32, {3, 2});  // the same count of elements
  CHECK(!cached.matches(turned, 0));                                     // no key: the shapes are compared
  turned.shape_key = key_of_shape(turned.shape);
  CHECK(!cached.matches(turned, 0));
  Request keyless = req(0, OpType::kAllreduce, DType::kFloat32, {2, 3});
  CHECK(cached.matches(keyless, 0));
  // Four dimensions have no key on either side.
  Request four = req(0, OpType::kAllreduce, DType::kFloat32, {1, 2, 3, 1});
  four.shape_key = key_of_shape(four.shape);
  Response cached_four = build_response({four}, {}, {0});
  CHECK(cached_four.matches(four, 0));
  four.shape = {1, 3, 2, 1};
  CHECK(!cached_four.matches(four, 0));
  // Read from the wire, both get their keys.
  WireWriter w;
  q.write(w);
  cached.write(w);
  WireReader r(w.bytes().data(), w.bytes().size());
  CHECK(Request::Read(r).shape_key == q.shape_key && Response::Read(r).shape_key == q.shape_key);
}

// plan_fusion's groups as lists of response indices.
static std::vector<std::vector<size_t>> fusion_groups(const std::vector<Response>& list, int64_t threshold,
                                                      int64_t tensor_limit, FusionPlan& plan) {
  std::vector<const Response*> responses;
  for (const Response& r : list) responses.push_back(&r);
  plan_fusion(responses, threshold, tensor_limit, &plan);
  std::vector<std::vector<size_t>> groups;
  for (size_t g = 0; g < plan.groups(); ++g)
    groups.emplace_back(plan.members.begin() + plan.begin(g), plan.members.begin() + plan.end(g));
  return groups;
}

static void test_fusion() {
  std::vector<Response> list = {resp("a", 10), resp("b", 10, DType::kFloat64), resp("c", 10), resp("d", 1000),
                                resp("e", 10)};
  Response gather = resp("g", 10);
  gather.op = OpType::kAllgather;
  list.push_back(gather);
  FusionPlan plan;                                        // one plan reused throughout, as the executor does
  auto groups = fusion_groups(list, 200, 1 << 20, plan);  // bytes: a,c,e=40 each; d=4000 (alone)
  CHECK(groups.size() == 4);
  CHECK(groups[0] == std::vector<size_t>({0, 2, 4}));  // same dtype fused across a float64 in between
  CHECK(groups[1] == std::vector<size_t>({1}));
  CHECK(groups[2] == std::vector<size_t>({3}));
  CHECK(groups[3] == std::vector<size_t>({5}));
  auto tight = fusion_groups({resp("a", 10), resp("b", 10), resp("c", 10)}, 80, 1 << 20, plan);
  CHECK(tight.size() == 2 && tight[0] == std::vector<size_t>({0, 1}) && tight[1] == std::vector<size_t>({2}));
  // Tensors at or above the tensor limit are never fused, whatever the threshold.
  auto limited = fusion_groups({resp("a", 10), resp("big", 100), resp("c", 10)}, 1 << 20, 400, plan);
  CHECK(limited.size() == 2 && limited[0] == std::vector<size_t>({0, 2}) && limited[1] == std::vector<size_t>({1}));
  CHECK(fusion_groups({}, 200, 1 << 20, plan).empty());
  // Interleaved dtypes: each group keeps its members in response order.
  auto mixed =
      fusion_groups({resp("a", 1), resp("b", 1, DType::kFloat64), resp("c", 1), resp("d", 1, DType::kFloat64)},
                    1 << 20, 1 << 20, plan);
  CHECK(mixed.size() == 2 && mixed[0] == std::vector<size_t>({0, 2}) && mixed[1] == std::vector<size_t>({1, 3}));
}

// A fused group's pieces as the executor walks them: whole members, each piece starting where the last ended.
static void test_fusion_pieces() {
  FusedLayout layout;
  const std::vector<Response> members = {resp("a", 10), resp("b", 30), resp("c", 60), resp("d", 5), resp("e", 5)};
  std::vector<const Response*> group;
  for (const Response& r : members) group.push_back(&r);
  fused_layout(group, &layout);
  CHECK(layout.total == 110 && layout.offsets[2] == 40);
  auto pieces = [&](size_t piece_elements) {
    std::vector<size_t> ends;
    for (size_t first = 0; first < group.size(); first = ends.back())
      ends.push_back(piece_end(layout, first, piece_elements));
    return ends;
  };
  CHECK(pieces(40) == std::vector<size_t>({2, 3, 5}));  // c alone: larger than a piece, it is one of its own
  CHECK(pieces(39) == std::vector<size_t>({1, 2, 3, 5}));
  CHECK(pieces(110) == std::vector<size_t>({5}));  // the group whole
  CHECK(pieces(0) == std::vector<size_t>({1, 2, 3, 4, 5}));
  CHECK(fusion_piece_bytes(false) == 0);  // meetings that cost a switch or a network: the group runs whole
  CHECK(fusion_piece_bytes(true) >= 4096);
}

static void test_dtypes() {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    CHECK(half_to_float(float_to_half(v)) == v);
  }
  CHECK(std::isinf(half_to_float(float_to_half(70000.0f))));
  CHECK(half_to_float(float_to_half(1.0f + 1.0f / 4096)) == 1.0f);  // round to nearest even
  CHECK(bf16_to_float(float_to_bf16(3.0f)) == 3.0f);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  // Reductions on half types go through float.
  uint16_t x[3] = {float_to_half(1.5f), float_to_half(-2.0f), float_to_half(4.0f)};
  uint16_t y[3] = {float_to_half(0.5f), float_to_half(3.0f), float_to_half(-8.0f)};
  reduce_into(DType::kFloat16, ReduceKind::kSum, x, y, 3);
  CHECK(half_to_float(x[0]) == 2.0f && half_to_float(x[1]) == 1.0f && half_to_float(x[2]) == -4.0f);
  uint8_t b1[2] = {1, 0}, b2[2] = {0, 0};
  reduce_into(DType::kBool, ReduceKind::kSum, b1, b2, 2);
  CHECK(b1[0] == 1 && b1[1] == 0);
  reduce_into(DType::kBool, ReduceKind::kProduct, b1, b2, 2);
  CHECK(b1[0] == 0);
  // Horovod's scaling rule: integers multiply in double and truncate toward zero.
  int32_t i1[2] = {7, -3};
  copy_scaled(DType::kInt32, i1, i1, 2, 0.5);
  CHECK(i1[0] == 3 && i1[1] == -1);
  int16_t s1[3] = {32000, -7, 5}, s2[3] = {1000, 2, -5};
  reduce_into(DType::kInt16, ReduceKind::kSum, s1, s2, 3);  // wraps like int16 arithmetic
  CHECK(s1[0] == static_cast<int16_t>(33000) && s1[1] == -5 && s1[2] == 0);
  copy_scaled(DType::kInt16, s1, s1, 3, 1.0 / 3);
  CHECK(s1[0] == static_cast<int16_t>(33000 - 65536) / 3 && s1[1] == -1 && s1[2] == 0);
  uint16_t u1[2] = {65535, 7}, u2[2] = {3, 9};
  reduce_into(DType::kUInt16, ReduceKind::kMax, u1, u2, 2);
  CHECK(u1[0] == 65535 && u1[1] == 9);
  copy_scaled(DType::kUInt16, u1, u1, 2, 0.5);
  CHECK(u1[0] == 32767 && u1[1] == 4);
  uint8_t small[2] = {5, 255};
  copy_scaled(DType::kUInt8, small, small, 2, 3.0);  // 765 wraps to 253, as uint8 arithmetic would
  CHECK(small[0] == 15 && small[1] == 253);
  int64_t huge[2] = {int64_t(1) << 62, -(int64_t(1) << 62)};
  copy_scaled(DType::kInt64, huge, huge, 2, 4.0);  // outside int64: INT64_MIN, as x86 converts
  CHECK(huge[0] == INT64_MIN && huge[1] == INT64_MIN);
  // Halves: widened to float, times the factor rounded to float, rounded back to nearest even.
  uint16_t h[1] = {float_to_half(3.0f)};
  copy_scaled(DType::kFloat16, h, h, 1, 1.0 / 3);
  CHECK(h[0] == float_to_half(3.0f * static_cast<float>(1.0 / 3)));
  uint16_t bh[1] = {float_to_bf16(7.0f)};
  copy_scaled(DType::kBFloat16, bh, bh, 1, 0.1);
  CHECK(bh[0] == float_to_bf16(7.0f * static_cast<float>(0.1)));
  CHECK(dtype_size(DType::kInt16) == 2 && dtype_size(DType::kUInt16) == 2 && dtype_valid(10) && !dtype_valid(11));
  CHECK(std::string(dtype_name(DType::kInt16)) == "int16" && std::string(dtype_name(DType::kUInt16)) == "uint16");
  int64_t w1[1] = {0x0f0fll}, w2[1] = {0x00ffll};
  reduce_into(DType::kInt64, ReduceKind::kBitwiseAnd, w1, w2, 1);
  CHECK(w1[0] == 0x000f);
}

// reduce_into_scaled must give exactly what reduce_into followed by scale_in_place gives, for every dtype and op, on
// lengths around its 4 KB blocks (it runs the same two operations a block at a time).
static void test_reduce_into_scaled() {
  const DType dtypes[] = {DType::kUInt8,   DType::kInt8,    DType::kUInt16,  DType::kInt16,
                          DType::kInt32,   DType::kInt64,   DType::kFloat16, DType::kBFloat16,
                          DType::kFloat32, DType::kFloat64, DType::kBool};
  const ReduceKind kinds[] = {ReduceKind::kSum, ReduceKind::kMin, ReduceKind::kMax, ReduceKind::kProduct};
  for (DType dtype : dtypes) {
    const size_t esize = dtype_size(dtype);
    for (size_t count :
         {size_t(0), size_t(1), size_t(7), 4096 / esize - 1, 4096 / esize, 4096 / esize + 1, 3 * 4096 / esize + 5}) {
      std::vector<uint8_t> a(count * esize), b(count * esize);
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = static_cast<uint8_t>((i * 37 + 11) % 251);
        b[i] = static_cast<uint8_t>((i * 91 + 3) % 241);
      }
      if (dtype == DType::kBool) {
        for (size_t i = 0; i < a.size(); ++i) a[i] &= 1, b[i] &= 1;
      }
      if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {  // keep the halves finite and not NaN
        for (size_t i = 1; i < a.size(); i += 2) a[i] &= 0x3f, b[i] &= 0x3f;
      }
      if (dtype == DType::kFloat32 || dtype == DType::kFloat64) {
        for (size_t i = esize - 1; i < a.size(); i += esize) a[i] &= 0x3f, b[i] &= 0x3f;
      }
      for (ReduceKind kind : kinds) {
        for (double factor : {1.0, 0.5, 1.0 / 3}) {
          if (dtype == DType::kBool && factor != 1.0) continue;  // bool takes no scale factor
          std::vector<uint8_t> two_passes = a, one_pass = a;
          reduce_into(dtype, kind, two_passes.data(), b.data(), count);
          if (factor != 1.0) scale_in_place(dtype, two_passes.data(), count, factor);
          reduce_into_scaled(dtype, kind, one_pass.data(), b.data(), count, factor);
          CHECK(one_pass == two_passes);
        }
      }
    }
  }
}

static std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t byte : d) {
    s += digits[byte >> 4];
    s += digits[byte & 15];
  }
  return s;
}

static void test_caller_spin() {
  Config config;  // the knob not given
  CHECK(caller_spin_microseconds(config, 2, 2) == kDedicatedCpuSpinUs);
  CHECK(caller_spin_microseconds(config, 1, 8) == kDedicatedCpuSpinUs);
  CHECK(caller_spin_microseconds(config, 3, 2) == config.spin_microseconds);  // ranks outnumber the CPUs
  config.spin_microseconds = 7;
  config.spin_microseconds_set = true;  // given: obeyed either way
  CHECK(caller_spin_microseconds(config, 2, 2) == 7);
  CHECK(caller_spin_microseconds(config, 3, 2) == 7);
  CHECK(usable_cpus() >= 1);
  // This process exists here; pid 0 and a negative one never count.
  CHECK(ranks_on_this_machine(2, {getpid(), 0, -1}) == 3);
}

static void test_hmac() {
  // FIPS 180-4 and RFC 4231 test vectors.
  CHECK(hex(sha256(reinterpret_cast<const uint8_t*>("abc"), 3)) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256(nullptr, 0)) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  std::string long_input(1000, 'a');
  CHECK(hex(sha256(reinterpret_cast<const uint8_t*>(long_input.data()), long_input.size())) ==
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  const std::string key = "Jefe", data = "what do ya want for nothing?";
  CHECK(hex(hmac_sha256(reinterpret_cast<const uint8_t*>(key.data()), key.size(),
                        reinterpret_cast<const uint8_t*>(data.data()), data.size())) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  std::vector<uint8_t> long_key(131, 0xaa);
  const std::string text = "Test Using Larger Than Block-Size Key - Hash Key First";
  CHECK(hex(hmac_sha256(long_key.data(), long_key.size(), reinterpret_cast<const uint8_t*>(text.data()),
                        text.size())) == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  Digest a = sha256(reinterpret_cast<const uint8_t*>("x"), 1), b = a;
  CHECK(digest_equal(a, b));
  b[31] ^= 1;
  CHECK(!digest_equal(a, b));
}

static IncompleteCollective waiting(std::string what, std::vector<int> submitters, std::vector<int> missing,
                                    double age = 10) {
  IncompleteCollective c;
  c.description = std::move(what);
  c.submitters = std::move(submitters);
  c.missing = std::move(missing);
  c.age_seconds = age;
  return c;
}

static void test_out_of_step() {
  // Two ranks in different collectives: each waits on the other.
  std::vector<IncompleteCollective> crosswise = {waiting("allgather of tensor 'x'", {0}, {1}),
                                                 waiting("barrier of tensor 'hvdlite.barrier'", {1}, {0})};
  CHECK(find_out_of_step(crosswise, 5) == std::vector<size_t>({0, 1}));
  std::string message = describe_out_of_step(crosswise, {0, 1}, 5);
  CHECK(contains(message, "allgather of tensor 'x' was submitted by rank(s) 0 but not by rank(s) 1"));
  CHECK(contains(message, "barrier of tensor 'hvdlite.barrier' was submitted by rank(s) 1 but not by rank(s) 0"));
  CHECK(contains(message, "HVDLITE_DESYNC_TIMEOUT_SECONDS"));
  // Not yet old enough, or the check is off.
  CHECK(find_out_of_step(crosswise, 20).empty());
  CHECK(find_out_of_step(crosswise, 0).empty());
  crosswise[1].age_seconds = 1;
  CHECK(find_out_of_step(crosswise, 5).empty());
  // A slow rank: 0 and 1 wait on 2, which has submitted nothing they lack (it is computing): not out of step.
  CHECK(find_out_of_step({waiting("allreduce of tensor 'g'", {0, 1}, {2})}, 5).empty());
  // A chain is not a cycle: 0 waits on 1, 1 waits on 2, 2 waits on nobody.
  CHECK(find_out_of_step({waiting("a", {0}, {1}), waiting("b", {1}, {2})}, 5).empty());
  // A three-rank cycle, beside a collective outside it (3 waits on 4, which is just slow).
  std::vector<IncompleteCollective> ring = {waiting("a", {0}, {1}), waiting("b", {1}, {2}), waiting("c", {2}, {0}),
                                            waiting("d", {3}, {4})};
  CHECK(find_out_of_step(ring, 5) == std::vector<size_t>({0, 1, 2}));
  // Members of the cycle that submitted part of a collective: rank 0 and 2 in 'a', lacking 1; 1 waits on 0 in 'b'.
  CHECK(find_out_of_step({waiting("a", {0, 2}, {1}), waiting("b", {1}, {0, 2})}, 5) == std::vector<size_t>({0, 1}));
}

static void test_recent_ops() {
  RecentOps recent;
  CHECK(recent.report(3).empty());
  TensorEntry grad;
  grad.request = req(3, OpType::kAllreduce, DType::kFloat32, {4096}, "grad");
  TensorEntry gather;
  gather.request = req(3, OpType::kAllgather, DType::kInt64, {1}, "rows");
  gather.request.process_set = 2;
  NameRecord grad_record, rows_record;  // as the queue sets them: an entry keeps its name's record while in flight
  grad.name_record = &grad_record;
  gather.name_record = &rows_record;
  for (int step = 0; step < 10; ++step) {  // names repeat every step: only the newest record of one is updated
    recent.submitted(grad);
    recent.finished(grad, true);
  }
  recent.submitted(gather);
  recent.submitted(grad);
  recent.finished(gather, false);
  std::string report = recent.report(3);
  CHECK(contains(report, "last 8 collectives on rank 3, oldest first: allreduce 'grad' (16 KB, done)"));
  CHECK(contains(report, "allgather 'rows' (8 B, process set 2, failed), allreduce 'grad' (16 KB, pending)"));
  // The same name under another record (its first one was swept meanwhile) is another operation: the kept
  // record's state stays.
  TensorEntry other = grad;
  NameRecord other_record;
  other.name_record = &other_record;
  recent.finished(other, false);
  CHECK(contains(recent.report(3), "allreduce 'grad' (16 KB, pending)"));
  // An operation without a record (an unnamed one) is found by its name among the kept ones.
  TensorEntry unnamed;
  unnamed.request = req(3, OpType::kBroadcast, DType::kFloat32, {2}, "noname.broadcast.4");
  recent.submitted(unnamed);
  recent.submitted(grad);
  recent.finished(unnamed, true);
  CHECK(contains(recent.report(3), "broadcast 'noname.broadcast.4' (8 B, done), allreduce 'grad' (16 KB, pending)"));
  // A named operation is found through its record's place while it is the oldest kept.
  recent.submitted(grad);
  for (int i = 0; i < 7; ++i) recent.submitted(gather);
  recent.finished(grad, false);
  CHECK(contains(recent.report(3), "oldest first: allreduce 'grad' (16 KB, failed), allgather 'rows'"));
}

static void test_lost_peers() {
  // Host .23 is cut: rank 0's heartbeat has expired, rank 1's (same host, its own port) not yet. Both are named
  // unreachable; rank 2, which exited, is named closed; rank 3 is well and not named.
  std::vector<PeerCondition> peers = {{PeerCondition::kUnreachable, 0, "10.0.0.23:45893"},
                                      {PeerCondition::kAlive, 1, "10.0.0.23:33065"},
                                      {PeerCondition::kClosed, 2, "10.0.0.24:46579"},
                                      {PeerCondition::kAlive, 3, "10.0.0.24:40001"}};
  std::string report = describe_lost_peers(peers, 3);
  CHECK(contains(report, "; connections closed by now: rank 2 (10.0.0.24:46579)"));
  CHECK(contains(report,
                 "unreachable (no heartbeat answer for 3 s: host down or network cut): "
                 "rank 0 (10.0.0.23:45893), rank 1 (10.0.0.23:33065)"));
  CHECK(!contains(report, "rank 3"));
  // A silent peer on a reachable host; nothing lost at all.
  CHECK(describe_lost_peers({{PeerCondition::kSilent, 5, "[::1]:7"}}, 3) ==
        "; not responding for over 1 s (stopped or hung): rank 5 ([::1]:7)");
  CHECK(describe_lost_peers({{PeerCondition::kAlive, 1, "h:1"}}, 3).empty());
}

static void test_ordered_worker() {
  // Jobs run one at a time in submission order, on another thread; wait(i) sees job i's effects.
  std::vector<int> ran;
  {
    OrderedWorker worker;
    for (int i = 0; i < 50; ++i) worker.submit([&ran, i] { ran.push_back(i); });
    worker.wait(49);
    CHECK(ran.size() == 50);
    for (int i = 0; i < 50; ++i) CHECK(ran[i] == i);
  }
  // A failing job: waiting on it or any later job rethrows, later jobs do not run, and the destructor joins.
  std::vector<int> after;
  bool threw = false, later_threw = false;
  {
    OrderedWorker worker;
    worker.submit([] {});
    worker.submit([] { throw std::runtime_error("tier failed"); });
    worker.submit([&after] { after.push_back(2); });
    try {
      worker.wait(1);
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "tier failed";
    }
    try {
      worker.wait(2);
    } catch (const std::runtime_error&) {
      later_threw = true;
    }
  }
  CHECK(threw && later_threw && after.empty());
  // Destroyed with work still queued (the caller's own stage failed): returns without running what was queued.
  {
    OrderedWorker worker;
    worker.submit([] {});
  }
}

static void test_copy_bytes() {
  // Every distance around the avoided window (and none), sizes around the thresholds and the 64-byte loop's tail.
  std::vector<unsigned char> source(80000 + 4096), target(80000 + 8192);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t distance : {0, 1, 7, 15, 16, 63, 64, 65, 4095}) {
    for (size_t n : {0, 1, 63, 64, 65, 2047, 2048, 2049, 5000, 70001}) {
      std::fill(target.begin(), target.end(), 0xEE);
      const unsigned char* from = source.data() + 3;
      unsigned char* to = target.data() + 3 + distance;
      copy_bytes(to, from, n);
      CHECK(std::memcmp(to, from, n) == 0);
      CHECK(to[n] == 0xEE && to[-1] == 0xEE);  // nothing written outside
    }
  }
  // Streaming stores: every destination alignment within a cache line, lengths around the aligned head and the
  // 64-byte loop.
  for (size_t shift = 0; shift < 64; ++shift) {
    for (size_t n : {0, 1, 15, 63, 64, 65, 127, 128, 129, 4096, 70001}) {
      std::fill(target.begin(), target.end(), 0xEE);
      const unsigned char* from = source.data() + 5;
      unsigned char* to = target.data() + 64 + shift;
      copy_bytes_streaming(to, from, n);
      CHECK(std::memcmp(to, from, n) == 0);
      CHECK(to[n] == 0xEE && to[-1] == 0xEE);
    }
  }
}

static void test_huge_page_buffer() {
  constexpr size_t kHuge = 2 << 20;
  HugePageBuffer buffer(4 * kHuge);  // huge pages from 8 MB
  CHECK(buffer.data() == nullptr && buffer.capacity() == 0);
  char* first = buffer.reserve(1000);
  CHECK(first != nullptr && buffer.capacity() == 4096 && !buffer.advised());  // small: whole 4 KB pages, no advice
  for (size_t i = 0; i < 1000; ++i) first[i] = static_cast<char>(i % 251);
  CHECK(buffer.reserve(4096) == first);  // fits: the same memory
  char* grown = buffer.reserve(4 * kHuge + 1);
  CHECK(buffer.capacity() == 5 * kHuge && reinterpret_cast<uintptr_t>(grown) % kHuge == 0);  // whole huge pages
  bool kept = true;
  for (size_t i = 0; i < 1000; ++i) kept = kept && grown[i] == static_cast<char>(i % 251);
  CHECK(kept);                               // growing keeps the contents
  std::memset(grown, 7, buffer.capacity());  // all of it is writable
  CHECK(grown[buffer.capacity() - 1] == 7);
  // Where the kernel offers transparent huge pages on request, the advice is taken.
  char mode[128] = {0};
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {
    if (std::fgets(mode, sizeof(mode), f) && (contains(mode, "[always]") || contains(mode, "[madvise]"))) {
      CHECK(buffer.advised());
    }
    std::fclose(f);
  }
  HugePageBuffer never(0);  // HUGE_PAGE_BYTES=0
  never.reserve(5 * kHuge);
  CHECK(!never.advised() && never.capacity() == 5 * kHuge);
}

static void test_huge_page_promotion() {
  constexpr uintptr_t kHuge = 2 << 20;
  std::vector<std::pair<uintptr_t, size_t>> calls;
  int answer = 0;
  double now = 0, collapse_takes = 6 * 15e-6;  // 15 us a page: a fast answer
  HugePagePromoter promoter(
      [&](void* address, size_t bytes) {
        calls.push_back({reinterpret_cast<uintptr_t>(address), bytes});
        now += collapse_takes;
        return answer;
      },
      [&] { return now; });
  const uintptr_t base = 1000 * kHuge + 4096;  // not aligned at either end: the interior is huge pages [1001, 1007)
  const void* buffer = reinterpret_cast<const void*>(base);
  const size_t bytes = 8 * kHuge - 8192;
  promoter.note_use(buffer, bytes, 4 << 20);
  CHECK(calls.empty());  // the first use: maybe a one-off buffer
  promoter.note_use(buffer, bytes, 4 << 20);
  CHECK(calls.size() == 1 && calls[0].first == 1001 * kHuge && calls[0].second == 6 * kHuge);
  CHECK(promoter.collapsed() == 1);
  for (int use = 3; use < HugePagePromoter::kRecheckEvery; ++use) promoter.note_use(buffer, bytes, 4 << 20);
  CHECK(calls.size() == 1);                   // left alone between re-checks
  promoter.note_use(buffer, bytes, 4 << 20);  // use 64: a fast re-check, still huge
  CHECK(calls.size() == 2 && promoter.given_up() == 0);
  collapse_takes = 6 * 25e-6;  // the next re-check is slow (25 us a page): the memory was mapped afresh
  for (int use = 0; use < HugePagePromoter::kRecheckEvery; ++use) promoter.note_use(buffer, bytes, 4 << 20);
  CHECK(calls.size() == 3 && promoter.given_up() == 1);
  for (int use = 0; use < 3 * HugePagePromoter::kRecheckEvery; ++use) promoter.note_use(buffer, bytes, 4 << 20);
  CHECK(calls.size() == 3);  // given up: never collapsed again
  // Too small, or no whole huge page inside: ignored however often used.
  for (int use = 0; use < 5; ++use) {
    promoter.note_use(reinterpret_cast<const void*>(base), 1 << 20, 4 << 20);
    promoter.note_use(reinterpret_cast<const void*>(base), 2 * kHuge - 8192, 1 << 20);
  }
  CHECK(calls.size() == 3);
  // A refusal (EINVAL: no MADV_COLLAPSE, EAGAIN: no huge page free) leaves that buffer alone from then on.
  answer = EAGAIN;
  const void* other = reinterpret_cast<const void*>(3000 * kHuge);
  for (int use = 0; use < 2 * HugePagePromoter::kRecheckEvery + 2; ++use)
    promoter.note_use(other, 4 * kHuge, 4 << 20);
  CHECK(calls.size() == 4 && promoter.refused() == 1 && promoter.collapsed() == 1);
  // The same address with another length is another buffer.
  answer = 0;
  promoter.note_use(other, 6 * kHuge, 4 << 20);
  promoter.note_use(other, 6 * kHuge, 4 << 20);
  CHECK(calls.size() == 5 && calls.back().second == 6 * kHuge && promoter.collapsed() == 2);
  CHECK(promoter.wasted() == 0);  // the first buffer was used far more than kPaidBackUses times after its collapse

  // Gradients freed and allocated every step come back at one of a few addresses in turn. Each new address is
  // collapsed on its second use; one left for kAbandonedAfter uses of others, having been used fewer than
  // kPaidBackUses times since, was wasted work. After kWasteTolerance of those, nothing more is collapsed.
  calls.clear();
  HugePagePromoter rotating(
      [&](void* address, size_t bytes) {
        calls.push_back({reinterpret_cast<uintptr_t>(address), bytes});
        return 0;
      },
      [&] { return now; });
  auto use = [&](uintptr_t slot) {
    rotating.note_use(reinterpret_cast<const void*>((5000 + 10 * slot) * kHuge), 4 * kHuge, 4 << 20);
  };
  const void* stable = reinterpret_cast<const void*>(4000 * kHuge);  // a bucket reused at one address throughout
  uintptr_t slot = 0;
  for (int step = 0; step < 40; ++step) {
    rotating.note_use(stable, 4 * kHuge, 4 << 20);
    if (step % 2 == 0) ++slot;  // each gradient address serves two steps, then the next one
    use(slot);
    for (int other = 0; other < HugePagePromoter::kAbandonedAfter / 4; ++other) {
      rotating.note_use(stable, 4 * kHuge, 4 << 20);
    }
  }
  CHECK(rotating.wasted() == HugePagePromoter::kWasteTolerance && rotating.stopped());
  // The stable buffer and the first kWasteTolerance + 1 gradient addresses were collapsed, nothing after.
  CHECK(rotating.collapsed() == 1 + HugePagePromoter::kWasteTolerance + 1);
  CHECK(static_cast<int64_t>(calls.size()) >= rotating.collapsed());
}

int main() {
  test_validation();
  test_name_records();
  test_name_slots();
  test_handle_table();
  test_fast_slots();
  test_fast_slots_swept();
  test_fast_slots_process_sets();
  test_cache();
  test_eager_layout();
  test_fusion();
  test_fusion_pieces();
  test_dtypes();
  test_reduce_into_scaled();
  test_hmac();
  test_caller_spin();
  test_out_of_step();
  test_shape_keys();
  test_recent_ops();
  test_select_fixed_rules();
  test_select_across_hosts();
  test_lost_peers();
  test_ordered_worker();
  test_allreduce_table();
  test_receive_in_place();
  test_messages();
  test_handshake_verdicts();
  test_orphaned_inboxes();
  test_copy_bytes();
  test_huge_page_buffer();
  test_huge_page_promotion();
  std::printf("%d passed, %d failed\n", g_checks - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}
