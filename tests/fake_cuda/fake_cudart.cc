// A stand-in for the CUDA runtime, for testing hvdlite's NCCL data plane on machines without a GPU: "device"
// memory is host memory, every stream runs its work at once, and events complete at once (or after a few
// queries, FAKE_CUDA_EVENT_POLLS, so that the completion queue's waiting is exercised). It checks what a real
// runtime would reject and counts what the tests want to see: waits on the callers' events, records, devices.
// Each process has GPUs of its own (its pid in the PCI domain), unless FAKE_CUDA_SHARED_GPU=1 makes every process
// on the machine see the same ones, as ranks sharing a real GPU do.
// Only the functions hvdlite loads exist (hvdlite_core/src/gpu/cuda_api.h); the ABI is CUDA's.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace {

struct FakeStream {
  int magic = 0x57524541;
};
struct FakeEvent {
  int magic = 0x45564e54;
  bool recorded = false;
  int polls_left = 0;
};

std::mutex g_mutex;
std::set<void*> g_streams, g_events, g_allocations, g_pinned;
thread_local int t_device = 0;
std::atomic<long> g_waits{0}, g_records{0}, g_bad_waits{0}, g_set_device{0};

int device_count() {
  const char* text = std::getenv("FAKE_CUDA_DEVICES");
  return text ? std::atoi(text) : 1;
}

bool known(std::set<void*>& table, void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return table.count(p) != 0;
}

constexpr int kInvalidValue = 1, kInvalidDevice = 101, kInvalidHandle = 400, kNotReady = 600;

}  // namespace

extern "C" {

int cudaGetDeviceCount(int* n) {
  *n = device_count();
  return *n > 0 ? 0 : 100;  // cudaErrorNoDevice
}
int cudaGetDevice(int* d) {
  *d = t_device;
  return 0;
}
int cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return kInvalidDevice;
  t_device = d;
  ++g_set_device;
  return 0;
}
int cudaRuntimeGetVersion(int* v) {
  *v = 12040;
  return 0;
}

int cudaStreamCreateWithFlags(void** stream, unsigned) {
  auto* s = new FakeStream;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_streams.insert(s);
  *stream = s;
  return 0;
}
int cudaStreamDestroy(void* stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_streams.erase(stream)) return kInvalidHandle;
  delete static_cast<FakeStream*>(stream);
  return 0;
}
int cudaStreamSynchronize(void* stream) { return stream == nullptr || known(g_streams, stream) ? 0 : kInvalidHandle; }
int cudaStreamWaitEvent(void* stream, void* event, unsigned) {
  if ((stream && !known(g_streams, stream)) || !known(g_events, event)) return kInvalidHandle;
  // Waiting on an event never recorded is legal CUDA, but in hvdlite it would mean the caller's work is not
  // ordered before the collective: count it, the tests expect none.
  if (!static_cast<FakeEvent*>(event)->recorded) ++g_bad_waits;
  ++g_waits;
  return 0;
}

int cudaEventCreateWithFlags(void** event, unsigned) {
  auto* e = new FakeEvent;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.insert(e);
  *event = e;
  return 0;
}
int cudaEventRecord(void* event, void* stream) {
  if (!known(g_events, event) || (stream && !known(g_streams, stream))) return kInvalidHandle;
  auto* e = static_cast<FakeEvent*>(event);
  e->recorded = true;
  const char* polls = std::getenv("FAKE_CUDA_EVENT_POLLS");
  e->polls_left = polls ? std::atoi(polls) : 0;
  ++g_records;
  return 0;
}
int cudaEventQuery(void* event) {
  if (!known(g_events, event)) return kInvalidHandle;
  auto* e = static_cast<FakeEvent*>(event);
  if (e->polls_left > 0) {
    --e->polls_left;
    return kNotReady;
  }
  return 0;
}
int cudaEventDestroy(void* event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_events.erase(event)) return kInvalidHandle;
  delete static_cast<FakeEvent*>(event);
  return 0;
}

int cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return 2;  // cudaErrorMemoryAllocation
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations.insert(*p);
  return 0;
}
int cudaFree(void* p) {
  if (!p) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_allocations.erase(p)) return kInvalidValue;
  std::free(p);
  return 0;
}
int cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return 2;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pinned.insert(*p);
  return 0;
}
int cudaFreeHost(void* p) {
  if (!p) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_pinned.erase(p)) return kInvalidValue;
  std::free(p);
  return 0;
}
int cudaDeviceGetPCIBusId(char* id, int length, int device) {
  if (device < 0 || device >= device_count()) return kInvalidDevice;
  const char* shared = std::getenv("FAKE_CUDA_SHARED_GPU");
  const unsigned domain = shared && std::atoi(shared) ? 0u : static_cast<unsigned>(getpid()) & 0xffffu;
  std::snprintf(id, static_cast<size_t>(length), "%04X:%02X:00.0", domain, device + 1);
  return 0;
}
int cudaMemcpy(void* dst, const void* src, size_t n, int) {
  if (n) std::memmove(dst, src, n);
  return 0;
}
int cudaMemcpyAsync(void* dst, const void* src, size_t n, int, void* stream) {
  if (stream && !known(g_streams, stream)) return kInvalidHandle;
  if (n) std::memmove(dst, src, n);
  return 0;
}
int cudaMemsetAsync(void* p, int value, size_t n, void*) {
  std::memset(p, value, n);
  return 0;
}
const char* cudaGetErrorString(int error) {
  static thread_local char text[64];
  std::snprintf(text, sizeof text, "fake CUDA error %d", error);
  return text;
}

// For the tests (through ctypes): waits on callers' events, waits on never-recorded events, records, streams,
// allocations and page-locked host allocations still alive.
void fake_cuda_counters(long* out) {
  out[0] = g_waits;
  out[1] = g_bad_waits;
  out[2] = g_records;
  std::lock_guard<std::mutex> lock(g_mutex);
  out[3] = static_cast<long>(g_streams.size());
  out[4] = static_cast<long>(g_allocations.size());
  out[5] = static_cast<long>(g_pinned.size());
}

}  // extern "C"
