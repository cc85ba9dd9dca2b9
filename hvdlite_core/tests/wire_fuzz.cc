// Fuzz harness for the negotiation wire format: request lists (what every rank sends the coordinator) and
// response lists (what the coordinator broadcasts). Feeds valid messages, random bytes and mutations of valid
// messages (bit flips, overwritten bytes, interesting values, cut, grown and spliced buffers) to the decoders,
// then a decoded request list to the coordinator's validation. Each input must either decode to in-range values
// or fail with hvdlite::Error; anything else (a crash, a sanitizer report, another exception) fails the run.
// Built with -fsanitize=address,undefined by tests/test_fuzz.py; g++ has no libFuzzer, so the mutation loop is
// ours (seeded, reproducible): usage: wire_fuzz ITERATIONS SEED.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/message.h"
#include "runtime/validation.h"
#include "runtime/wire.h"

using namespace hvdlite;

namespace {

std::vector<char> encode_requests(const std::vector<Request>& list) {
  WireWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(list.size()));
  for (const Request& q : list) q.write(w);
  return w.bytes();
}

std::vector<char> encode_responses(const std::vector<Response>& list) {
  WireWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(list.size()));
  for (const Response& r : list) r.write(w);
  return w.bytes();
}

std::vector<std::vector<char>> seeds() {
  std::vector<std::vector<char>> out;
  std::vector<Request> requests;
  const OpType ops[] = {OpType::kAllreduce,     OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                        OpType::kReducescatter, OpType::kBarrier,   OpType::kJoin,      OpType::kAddProcessSet};
  for (int i = 0; i < 8; ++i) {
    Request q;
    q.rank = i % 3;
    q.op = ops[i];
    q.dtype = static_cast<DType>(i % 11);
    q.reduce_op = static_cast<ReduceOp>(i % (static_cast<int>(ReduceOp::kAdasum) + 1));
    q.root_rank = i % 2;
    q.shape = {4, i + 1};
    q.ranks = {0, 1, 2};
    q.name = "grad." + std::to_string(i);
    requests.push_back(q);
    out.push_back(encode_requests({q}));
  }
  out.push_back(encode_requests(requests));
  std::vector<Response> responses;
  for (const Request& q : requests) {
    Response r = build_response({q, q}, {}, {0, 1});
    responses.push_back(r);
  }
  responses.push_back(Response::Failure(requests[0], 5, "shape mismatch"));
  out.push_back(encode_responses(responses));
  return out;
}

template <typename T>
void check_range(const T& m) {
  int op = static_cast<int>(m.op), dtype = static_cast<int>(m.dtype), reduce = static_cast<int>(m.reduce_op);
  if (!((op >= 0 && op < kNumOpTypes) || m.op == OpType::kAbort) || dtype < 0 || dtype > 10 || reduce < 0 ||
      reduce > static_cast<int>(ReduceOp::kAdasum)) {
    std::fprintf(stderr, "decoded an out-of-range value: op %d dtype %d reduce %d\n", op, dtype, reduce);
    std::abort();
  }
}

// One input through both decoders (and validation when it is a request list). Returns true if it decoded.
bool feed(const std::vector<char>& input) {
  bool decoded = false;
  try {
    WireReader reader(input.data(), input.size());
    uint32_t count = reader.get<uint32_t>();
    std::vector<Request> list;
    for (uint32_t i = 0; i < count && i < 4096; ++i) {
      list.push_back(Request::Read(reader));
      check_range(list.back());
    }
    decoded = true;
    if (!list.empty() && list.size() < 64) {
      std::vector<int> members;
      for (size_t i = 0; i < list.size(); ++i) members.push_back(static_cast<int>(i));
      for (size_t i = 0; i < list.size(); ++i) list[i].rank = static_cast<int32_t>(i);
      build_response(list, {}, members);
    }
  } catch (const Error&) {
  }
  try {
    WireReader reader(input.data(), input.size());
    uint32_t count = reader.get<uint32_t>();
    for (uint32_t i = 0; i < count && i < 4096; ++i) check_range(Response::Read(reader));
    decoded = true;
  } catch (const Error&) {
  }
  return decoded;
}

std::vector<char> mutate(std::vector<char> data, const std::vector<std::vector<char>>& pool, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  const unsigned char interesting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, 0x40, 0x10};
  int rounds = 1 + static_cast<int>(rng() % 6);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!data.empty()) data[pick(data.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // random byte
        if (!data.empty()) data[pick(data.size())] = static_cast<char>(rng());
        break;
      case 2:  // interesting byte
        if (!data.empty()) data[pick(data.size())] = static_cast<char>(interesting[rng() % 8]);
        break;
      case 3:  // interesting 32-bit value (lengths, counts, enums)
        if (data.size() >= 4) {
          uint32_t values[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 11, 12, 4096, 65536};
          uint32_t v = values[rng() % 9];
          std::memcpy(&data[pick(data.size() - 3)], &v, 4);
        }
        break;
      case 4:  // cut
        data.resize(pick(data.size() + 1));
        break;
      case 5: {  // insert random bytes
        size_t at = pick(data.size() + 1), n = 1 + rng() % 16;
        std::vector<char> extra(n);
        for (char& c : extra) c = static_cast<char>(rng());
        data.insert(data.begin() + static_cast<long>(at), extra.begin(), extra.end());
        break;
      }
      case 6: {  // splice in part of another valid message
        const std::vector<char>& other = pool[pick(pool.size())];
        if (other.empty()) break;
        size_t from = pick(other.size()), n = 1 + pick(other.size() - from);
        size_t at = pick(data.size() + 1);
        data.insert(data.begin() + static_cast<long>(at), other.begin() + static_cast<long>(from),
                    other.begin() + static_cast<long>(from + n));
        break;
      }
      default: {  // erase a range
        if (data.empty()) break;
        size_t from = pick(data.size()), n = 1 + pick(data.size() - from);
        data.erase(data.begin() + static_cast<long>(from), data.begin() + static_cast<long>(from + n));
      }
    }
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 1000000;
  unsigned long seed = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<char>> pool = seeds();
  for (const auto& s : pool) {
    if (!feed(s)) {
      std::printf("a valid seed message failed to decode\n");
      return 1;
    }
  }
  long decoded = 0;
  for (long i = 0; i < iterations; ++i) {
    std::vector<char> input;
    if (rng() % 10 == 0) {  // plain random bytes
      input.resize(rng() % 256);
      for (char& c : input) c = static_cast<char>(rng());
    } else {
      input = mutate(pool[rng() % pool.size()], pool, rng);
    }
    if (feed(input)) {
      ++decoded;
      if (pool.size() < 4096 && rng() % 64 == 0) pool.push_back(input);  // decodable mutants breed further
    }
  }
  std::printf("%ld inputs, %ld decoded, %ld rejected with a clean error, 0 crashes\n", iterations, decoded,
              iterations - decoded);
  return 0;
}
