// A stand-in for NCCL over host memory and files in /dev/shm, for testing hvdlite's NCCL data plane on machines
// without a GPU (pair it with fake_cudart.cc, whose "device" memory is host memory). Every call runs at once on
// the calling thread. A group (ncclGroupStart/End; a lone call is a group of one) runs in two phases between
// barriers of the communicator's ranks: each rank first writes what it sends to files, then reads what it
// receives. Semantics follow NCCL's documentation: in-place and out-of-place buffers, broadcast's copy on the
// root, reduce's result on the root only, PreMulSum, integer average truncating. A barrier fails (instead of
// hanging) when a member process is gone or after FAKE_NCCL_TIMEOUT seconds.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

enum Result {
  kSuccess = 0,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6
};
enum DataType {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9
};
enum RedOp { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kFirstCustom = 5 };
constexpr int kMaxRanks = 64;

struct UniqueId {
  char internal[128];
};

struct Control {
  std::atomic<int> arrived;
  std::atomic<int> generation;
  std::atomic<int> pids[kMaxRanks];
};

struct Op {
  enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv } kind;
  const void* send;
  void* recv;
  size_t count;
  int type;
  int op;
  int root;  // broadcast/reduce root; send/recv peer
};

struct Comm {
  std::string name;
  int nranks = 0, rank = 0;
  long groups = 0;
  Control* control = nullptr;
  bool aborted = false;
  std::map<int, double> premul;  // custom op -> scalar
  int next_custom = kFirstCustom;
};

thread_local int t_group_depth = 0;
thread_local std::vector<std::pair<Comm*, Op>> t_group;
std::atomic<long> g_ids{0};

size_t type_size(int t) {
  switch (t) {
    case kInt8:
    case kUint8:
      return 1;
    case kFloat16:
    case kBfloat16:
      return 2;
    case kInt32:
    case kUint32:
    case kFloat32:
      return 4;
    default:
      return 8;
  }
}

float half_to_float(uint16_t h) {
  int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  float v;
  if (exponent == 0)
    v = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31)
    v = mantissa ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  return sign ? -v : v;
}
uint16_t float_to_half(float f) {  // round to nearest even, through the exact float math
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  float a = std::fabs(f);
  if (std::isnan(f)) return 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < std::ldexp(1.0f, -14)) return sign | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0f, 24)));
  int e;
  std::frexp(a, &e);                                     // a = m * 2^e, m in [0.5, 1)
  float scaled = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits
  if (scaled >= 2048.0f) {
    scaled /= 2;
    ++e;
  }
  return sign | static_cast<uint16_t>(((e + 14) << 10) | (static_cast<int>(scaled) - 1024));
}
float bf16_to_float(uint16_t v) {
  uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

bool is_float(int t) { return t == kFloat16 || t == kBfloat16 || t == kFloat32 || t == kFloat64; }

double load_f(int t, const char* p) {
  switch (t) {
    case kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return half_to_float(h);
    }
    case kBfloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    }
    case kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
  }
}
void store_f(int t, char* p, double v) {
  switch (t) {
    case kFloat16: {
      uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case kBfloat16: {
      uint16_t h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    default:
      std::memcpy(p, &v, 8);
  }
}
int64_t load_i(int t, const char* p) {
  switch (t) {
    case kInt8:
      return *reinterpret_cast<const int8_t*>(p);
    case kUint8:
      return *reinterpret_cast<const uint8_t*>(p);
    case kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case kUint32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}
void store_i(int t, char* p, int64_t v) {  // wraps like the type
  switch (t) {
    case kInt8:
    case kUint8: {
      uint8_t b = static_cast<uint8_t>(v);
      std::memcpy(p, &b, 1);
      break;
    }
    case kInt32:
    case kUint32: {
      uint32_t b = static_cast<uint32_t>(v);
      std::memcpy(p, &b, 4);
      break;
    }
    default:
      std::memcpy(p, &v, 8);
  }
}

// inout = inout (op) in, element by element; values are rounded to the type after each step, like a device.
void combine(int t, int op, double scalar, char* inout, const char* in, size_t count, bool first) {
  const size_t es = type_size(t);
  for (size_t i = 0; i < count; ++i) {
    char* a = inout + i * es;
    const char* b = in + i * es;
    if (is_float(t)) {
      double y = load_f(t, b);
      if (op >= kFirstCustom) y *= scalar;  // the scalar was read in the tensor's own type
      if (first) {
        store_f(t, a, y);
        continue;
      }
      double x = load_f(t, a);
      double r = (op == kProd) ? x * y : op == kMax ? std::fmax(x, y) : op == kMin ? std::fmin(x, y) : x + y;
      store_f(t, a, r);
    } else {
      int64_t y = load_i(t, b);
      if (op >= kFirstCustom) y *= static_cast<int64_t>(scalar);
      if (first) {
        store_i(t, a, y);
        continue;
      }
      int64_t x = load_i(t, a);
      bool unsigned_type = t == kUint8 || t == kUint32 || t == kUint64;
      int64_t r;
      if (op == kProd)
        r = x * y;
      else if (op == kMax)
        r = unsigned_type ? (static_cast<uint64_t>(x) > static_cast<uint64_t>(y) ? x : y) : std::max(x, y);
      else if (op == kMin)
        r = unsigned_type ? (static_cast<uint64_t>(x) < static_cast<uint64_t>(y) ? x : y) : std::min(x, y);
      else
        r = x + y;
      store_i(t, a, r);
    }
  }
}

void finish_average(int t, char* data, size_t count, int n) {
  const size_t es = type_size(t);
  for (size_t i = 0; i < count; ++i) {
    if (is_float(t))
      store_f(t, data + i * es, load_f(t, data + i * es) / n);
    else
      store_i(t, data + i * es, load_i(t, data + i * es) / n);
  }
}

double timeout_seconds() {
  const char* text = std::getenv("FAKE_NCCL_TIMEOUT");
  return text ? std::atof(text) : 60.0;
}

double now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Result barrier(Comm* c) {
  Control* ctl = c->control;
  int generation = ctl->generation.load();
  if (ctl->arrived.fetch_add(1) + 1 == c->nranks) {
    ctl->arrived.store(0);
    ctl->generation.fetch_add(1);
    return kSuccess;
  }
  const double deadline = now() + timeout_seconds();
  long spins = 0;
  while (ctl->generation.load() == generation) {
    if (c->aborted) return kRemoteError;
    if (++spins % 1000 == 0) {
      for (int r = 0; r < c->nranks; ++r) {
        int pid = ctl->pids[r].load();
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
          std::fprintf(stderr, "fake NCCL: rank %d (pid %d) of %s is gone\n", r, pid, c->name.c_str());
          return kRemoteError;
        }
      }
      if (now() > deadline) {
        std::fprintf(stderr, "fake NCCL: barrier of %s timed out\n", c->name.c_str());
        return kRemoteError;
      }
    }
    struct timespec slice = {0, 20000};
    nanosleep(&slice, nullptr);
  }
  return kSuccess;
}

std::string file_of(Comm* c, const std::string& key) {
  return "/dev/shm" + c->name + "." + std::to_string(c->groups) + "." + key;
}

bool write_file(const std::string& path, const void* data, size_t bytes) {
  int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  if (fd < 0) return false;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n <= 0) {
      close(fd);
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  close(fd);
  return true;
}

bool read_file(const std::string& path, void* data, size_t bytes) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = read(fd, p, bytes);
    if (n <= 0) {
      close(fd);
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  close(fd);
  return true;
}

// Runs one communicator's share of a group.
Result run_group(Comm* c, const std::vector<Op>& ops) {
  if (c->aborted) return kRemoteError;
  const int me = c->rank, n = c->nranks;
  std::vector<std::string> written;
  std::map<int, int> sends_to, recvs_from;
  auto key = [](size_t k, int writer) { return std::to_string(k) + ".w" + std::to_string(writer); };
  // Phase 1: publish.
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    size_t bytes = op.count * type_size(op.type);
    std::string path;
    const void* data = op.send;
    switch (op.kind) {
      case Op::kAllReduce:
      case Op::kReduce:
      case Op::kAllGather:
        path = file_of(c, key(k, me));
        break;
      case Op::kReduceScatter:
        path = file_of(c, key(k, me));
        bytes *= n;
        break;
      case Op::kBroadcast:
        if (op.root == me) path = file_of(c, key(k, me));
        break;
      case Op::kSend:
        path = file_of(
            c, "p" + std::to_string(me) + "-" + std::to_string(op.root) + "." + std::to_string(sends_to[op.root]++));
        break;
      case Op::kRecv:
        break;
    }
    if (path.empty()) continue;
    if (!write_file(path, data, bytes)) return kSystemError;
    written.push_back(path);
  }
  Result r = barrier(c);
  if (r != kSuccess) return r;
  // Phase 2: consume.
  for (size_t k = 0; k < ops.size() && r == kSuccess; ++k) {
    const Op& op = ops[k];
    const size_t es = type_size(op.type), bytes = op.count * es;
    const double scalar = op.op >= kFirstCustom ? c->premul.at(op.op) : 1.0;
    switch (op.kind) {
      case Op::kAllReduce:
      case Op::kReduce:
      case Op::kReduceScatter: {
        if (op.kind == Op::kReduce && op.root != me) break;
        size_t total = op.kind == Op::kReduceScatter ? bytes * n : bytes;
        std::vector<char> acc(total), in(total);
        for (int w = 0; w < n && r == kSuccess; ++w) {
          if (!read_file(file_of(c, key(k, w)), in.data(), total))
            r = kSystemError;
          else
            combine(op.type, op.op, scalar, acc.data(), in.data(), total / es, w == 0);
        }
        if (op.op == kAvg) finish_average(op.type, acc.data(), total / es, n);
        if (op.kind == Op::kReduceScatter)
          std::memcpy(op.recv, acc.data() + me * bytes, bytes);
        else if (total)
          std::memcpy(op.recv, acc.data(), total);
        break;
      }
      case Op::kAllGather:
        for (int w = 0; w < n && r == kSuccess; ++w) {
          if (!read_file(file_of(c, key(k, w)), static_cast<char*>(op.recv) + w * bytes, bytes)) r = kSystemError;
        }
        break;
      case Op::kBroadcast:
        if (op.root == me) {
          if (op.send != op.recv && bytes) std::memmove(op.recv, op.send, bytes);
        } else if (!read_file(file_of(c, key(k, op.root)), op.recv, bytes))
          r = kSystemError;
        break;
      case Op::kRecv:
        if (!read_file(file_of(c, "p" + std::to_string(op.root) + "-" + std::to_string(me) + "." +
                                      std::to_string(recvs_from[op.root]++)),
                       op.recv, bytes)) {
          r = kSystemError;
        }
        break;
      case Op::kSend:
        break;
    }
  }
  if (r != kSuccess) std::fprintf(stderr, "fake NCCL: a group of %s failed to read its data\n", c->name.c_str());
  Result b = barrier(c);
  for (const std::string& path : written) unlink(path.c_str());
  ++c->groups;
  return r != kSuccess ? r : b;
}

Result submit(void* comm, const Op& op) {
  if (!comm) return kInvalidArgument;
  Comm* c = static_cast<Comm*>(comm);
  if (op.op >= kFirstCustom && !c->premul.count(op.op)) return kInvalidArgument;
  if (op.root < -1 || op.root >= c->nranks) return kInvalidArgument;
  if (t_group_depth > 0) {
    t_group.push_back({c, op});
    return kSuccess;
  }
  return run_group(c, {op});
}

}  // namespace

extern "C" {

int ncclGetVersion(int* version) {
  *version = 21805;
  return kSuccess;
}
const char* ncclGetErrorString(int result) {
  switch (result) {
    case kSuccess:
      return "no error";
    case kSystemError:
      return "unhandled system error (fake NCCL)";
    case kInvalidArgument:
      return "invalid argument (fake NCCL)";
    case kRemoteError:
      return "remote process exited or there was a network error (fake NCCL)";
    default:
      return "fake NCCL error";
  }
}

int ncclGetUniqueId(UniqueId* id) {
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "/hvdfake_nccl_%d_%ld_%ld", getpid(), g_ids.fetch_add(1),
                static_cast<long>(now() * 1e6));
  return kSuccess;
}

int ncclCommInitRank(void** comm, int nranks, UniqueId id, int rank) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks || id.internal[0] != '/')
    return kInvalidArgument;
  auto* c = new Comm;
  c->name = id.internal;
  c->nranks = nranks;
  c->rank = rank;
  int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(Control)) != 0) {
    delete c;
    return kSystemError;
  }
  void* p = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    delete c;
    return kSystemError;
  }
  c->control = static_cast<Control*>(p);  // zero-filled by ftruncate
  c->control->pids[rank].store(getpid());
  Result r = barrier(c);
  if (rank == 0) shm_unlink(c->name.c_str());  // everyone has it mapped by now
  if (r != kSuccess) {
    munmap(p, sizeof(Control));
    delete c;
    return r;
  }
  *comm = c;
  return kSuccess;
}

int ncclCommDestroy(void* comm) {
  Comm* c = static_cast<Comm*>(comm);
  if (!c) return kInvalidArgument;
  munmap(c->control, sizeof(Control));
  delete c;
  return kSuccess;
}
int ncclCommAbort(void* comm) { return ncclCommDestroy(comm); }
int ncclCommGetAsyncError(void* comm, int* result) {
  *result = kSuccess;
  return comm ? kSuccess : kInvalidArgument;
}

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* comm, void*) {
  return submit(comm, Op{Op::kAllReduce, s, r, n, t, op, -1});
}
int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, void* comm, void*) {
  return submit(comm, Op{Op::kBroadcast, s, r, n, t, kSum, root});
}
int ncclReduce(const void* s, void* r, size_t n, int t, int op, int root, void* comm, void*) {
  return submit(comm, Op{Op::kReduce, s, r, n, t, op, root});
}
int ncclAllGather(const void* s, void* r, size_t n, int t, void* comm, void*) {
  return submit(comm, Op{Op::kAllGather, s, r, n, t, kSum, -1});
}
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, void* comm, void*) {
  return submit(comm, Op{Op::kReduceScatter, s, r, n, t, op, -1});
}
int ncclSend(const void* s, size_t n, int t, int peer, void* comm, void*) {
  return submit(comm, Op{Op::kSend, s, nullptr, n, t, kSum, peer});
}
int ncclRecv(void* r, size_t n, int t, int peer, void* comm, void*) {
  return submit(comm, Op{Op::kRecv, nullptr, r, n, t, kSum, peer});
}

int ncclGroupStart() {
  ++t_group_depth;
  return kSuccess;
}
int ncclGroupEnd() {
  if (t_group_depth == 0) return kInvalidUsage;
  if (--t_group_depth > 0) return kSuccess;
  std::vector<std::pair<Comm*, Op>> group;
  group.swap(t_group);
  // One communicator per group in hvdlite's use; a group over several runs them one after another.
  std::map<Comm*, std::vector<Op>> by_comm;
  std::vector<Comm*> order;
  for (auto& entry : group) {
    if (!by_comm.count(entry.first)) order.push_back(entry.first);
    by_comm[entry.first].push_back(entry.second);
  }
  for (Comm* c : order) {
    Result r = run_group(c, by_comm[c]);
    if (r != kSuccess) return r;
  }
  return kSuccess;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence, void* comm) {
  Comm* c = static_cast<Comm*>(comm);
  if (!c || residence != 1) return kInvalidArgument;  // hvdlite passes host-immediate scalars
  double value = is_float(type) ? load_f(type, static_cast<const char*>(scalar))
                                : static_cast<double>(load_i(type, static_cast<const char*>(scalar)));
  *op = c->next_custom++;
  c->premul[*op] = value;
  return kSuccess;
}
int ncclRedOpDestroy(int op, void* comm) {
  Comm* c = static_cast<Comm*>(comm);
  if (!c || !c->premul.erase(op)) return kInvalidArgument;
  return kSuccess;
}

}  // extern "C"
