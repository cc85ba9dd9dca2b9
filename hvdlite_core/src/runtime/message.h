// What ranks tell the coordinator (Request: "I have submitted this tensor, with these parameters") and what
// the coordinator answers (Response: "every member has it: execute", or "they disagree: fail with this
// message"). Responses are identical on every rank, which is what keeps execution order consistent.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "runtime/wire.h"

namespace hvdlite {

enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
  // Internal, never submitted through the C ABI: a rank leaving because of an error tells the others why
  // (Request.name carries the reason; the coordinator turns it into Outcome::peer_failure on every rank).
  kAbort = 9,
};
constexpr int kNumOpTypes = 9;  // operations the C ABI accepts (kAbort is not one)
const char* op_name(OpType op);
// What the core names an unnamed collective: "<op>.noname.<n>", n counting per (process set, op) in submission
// order. A caller's name of that form is refused: it could meet one the core gave.
void auto_name_into(std::string& out, OpType op, int64_t n);  // into out's capacity: no allocation once warm
bool has_auto_name_form(OpType op, const std::string& name);

// A shape of up to three dimensions of moderate size in one exact word (the count of dimensions in the top two bits,
// each dimension in a fixed width below), kUnknownShapeKey for any other or where it was not worked out. A cycle
// matches each request to its cached response by it: comparing the shapes themselves reads two more buffers a
// tensor, each a cache line of its own away from the structs.
constexpr uint64_t kUnknownShapeKey = ~uint64_t{0};
uint64_t key_of_shape(const int64_t* dims, size_t ndim);
inline uint64_t key_of_shape(const std::vector<int64_t>& shape) { return key_of_shape(shape.data(), shape.size()); }

// Values are the C ABI's hvdlite_reduce_op.
enum class ReduceOp : int32_t { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4, kAdasum = 5 };
const char* reduce_op_name(ReduceOp op);

struct Request {
  // What each cycle reads of a cached operation's request comes first: an entry's hot line ends with it.
  OpType op = OpType::kAllreduce;
  bool cacheable = true;
  // Named by the core (<op>.noname.<n>, a name that never repeats): cached under what it carries instead
  // (unnamed_cache_name), since that is what repeats from call to call.
  bool unnamed = false;
  bool on_device = false;  // CUDA memory (the NCCL data plane); negotiated, since every member must agree
  int32_t rank = 0;        // global rank of the submitter
  DType dtype = DType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root_rank = -1;
  int32_t process_set = 0;
  int32_t device = -1;  // this rank's CUDA device ordinal (local: ranks use different devices)
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  uint64_t shape_key = kUnknownShapeKey;  // key_of_shape(shape), set with it where a request is made or read
  std::vector<int32_t> ranks;             // add_process_set: members; remove_process_set: {id}
  std::string name;
  double waited_seconds = 0;  // how long the submitter has had it when sent (stall ages count from there)
  uint64_t layout = 0;        // allreduce of packed tensors: how they lie in the buffer (hvdlite_request.layout)

  void write(WireWriter& w) const;
  static Request Read(WireReader& r);
};

struct alignas(64) Response {
  // What a cycle reads of every cached response, pass after pass (the match against a request, the eager check,
  // fusion planning, execution), comes first and fills the first line: a response's other fields lie lines away,
  // and with thousands in flight each pass would miss on them again.
  bool is_error = false;
  bool cacheable = true;
  bool unnamed = false;    // of unnamed requests: cached by unnamed_cache_name, whatever its name
  bool on_device = false;  // runs on the NCCL data plane (runtime/gpu_executor.h)
  OpType op = OpType::kAllreduce;
  DType dtype = DType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t process_set = 0;
  // Local, not sent: where the response cache put this copy of it (-1: not the cache's), so that a cached
  // response finds the entry that was waiting for it without its name (Controller::take_pending).
  int32_t cache_position = -1;
  double prescale = 1.0;
  double postscale = 1.0;
  // element_count(shape), set where a response is built or read (-1: unknown, counted when asked): the cycle
  // reads it for every tensor, and the shape's own memory is one more cache line away.
  int64_t elements = -1;
  uint64_t shape_key = kUnknownShapeKey;  // key_of_shape(shape), set with elements
  uint64_t layout = 0;                    // allreduce of packed tensors: the digest every member submitted
  std::vector<int32_t> joined;            // global ranks that have joined and contribute zeros / nothing
  std::vector<int64_t> shape;  // the tensor shape (allgather/alltoall: of the first member; rows may differ)
  int32_t root_rank = -1;
  int32_t error_code = 0;  // a StatusCode when is_error
  std::string error;
  std::vector<int64_t> first_dims;  // allgather: rows of each member
  std::vector<int32_t> ranks;       // add/remove_process_set payload; join: {last rank to join}
  std::string name;

  void write(WireWriter& w) const;
  static Response Read(WireReader& r);
  // An error for every member that submitted the tensor `about`; never cached.
  static Response Failure(const Request& about, int32_t code, std::string message);
  // Whether a request from `rank` matches this (cached) response, i.e. can reuse it. same_name: the caller has
  // already established that the request's name is this response's, and the strings are not compared again.
  bool matches(const Request& request, int member_index, bool same_name = false) const;
  // No rank has joined. A response with joined ranks is never cacheable (build_response), so a cacheable one's
  // answer comes from its first line.
  bool none_joined() const { return cacheable || joined.empty(); }
  bool same_shape(const Request& request) const {
    if (shape_key != kUnknownShapeKey && request.shape_key != kUnknownShapeKey) return shape_key == request.shape_key;
    return request.shape == shape;
  }
};

static_assert(offsetof(Response, joined) == 64, "what a cycle reads of a response outgrows its first line");

// The name an unnamed operation's response is cached under: its operation and what every member submits alike
// (allgather and alltoall rows may differ by member and are left out). Readable, as a failure of the cached operation
// names it by it; the cache keys it apart from users' names (ResponseCache::key_of).
std::string unnamed_cache_name(const Request& request);
void append_unnamed_cache_name(std::string& out, const Request& request);  // the same, appended to out
std::string unnamed_cache_name(const Response& response);

int64_t element_count(const std::vector<int64_t>& shape);
// The same, or -1 (unknown) where a dimension is negative or the product overflows: for what is counted before
// anything has checked it (a message just decoded, requests being validated).
int64_t element_count_or_unknown(const std::vector<int64_t>& shape);
inline int64_t element_count(const Response& r) { return r.elements >= 0 ? r.elements : element_count(r.shape); }
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace hvdlite
