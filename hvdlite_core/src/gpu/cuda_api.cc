#include "gpu/cuda_api.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "common/status.h"

namespace hvdlite {
namespace {

// The first of these that dlopen finds (a path, or a name the dynamic linker searches for), preferring one the
// process has loaded already: a framework's CUDA runtime is the one whose streams the callers hand over.
void* open_first(const std::vector<std::string>& candidates, std::string* opened, std::string* tried) {
  for (const std::string& name : candidates) {
    if (name.empty()) continue;
    if (void* loaded = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      *opened = name;
      return loaded;
    }
  }
  for (const std::string& name : candidates) {
    if (name.empty()) continue;
    // RTLD_GLOBAL is not needed (nothing resolves symbols through these); RTLD_NOW fails early on a broken one.
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library) {
      *opened = name;
      return library;
    }
    const char* why = dlerror();
    *tried += (tried->empty() ? "" : "; ") + name + ": " + (why ? why : "not found");
  }
  return nullptr;
}

// Fills each function pointer from its symbol; names the first missing symbol.
template <typename Table>
bool bind(void* library, Table* table, const std::vector<std::pair<void**, const char*>>& symbols,
          std::string* missing) {
  for (const auto& s : symbols) {
    *s.first = dlsym(library, s.second);
    if (!*s.first) {
      *missing = s.second;
      return false;
    }
  }
  return true;
}

#define SYMBOL(table, field, name) {reinterpret_cast<void**>(&(table).field), name}

GpuAvailability probe(const Config& config) {
  GpuAvailability a;
  static cuda::Runtime cuda_table;
  static nccl::Library nccl_table;
  std::string tried;
  void* cudart =
      open_first({config.cudart_library, "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"},
                 &a.cudart_path, &tried);
  if (!cudart) {
    a.why_not = "no CUDA runtime library could be loaded (" + tried +
                "); install one (pip install "
                "nvidia-cuda-runtime-cu12, or a CUDA build of torch) or set HVDLITE_CUDART_LIBRARY";
    return a;
  }
  std::string missing;
  if (!bind(cudart, &cuda_table,
            {SYMBOL(cuda_table, GetDeviceCount, "cudaGetDeviceCount"),
             SYMBOL(cuda_table, GetDevice, "cudaGetDevice"),
             SYMBOL(cuda_table, SetDevice, "cudaSetDevice"),
             SYMBOL(cuda_table, RuntimeGetVersion, "cudaRuntimeGetVersion"),
             SYMBOL(cuda_table, StreamCreateWithFlags, "cudaStreamCreateWithFlags"),
             SYMBOL(cuda_table, StreamDestroy, "cudaStreamDestroy"),
             SYMBOL(cuda_table, StreamSynchronize, "cudaStreamSynchronize"),
             SYMBOL(cuda_table, StreamWaitEvent, "cudaStreamWaitEvent"),
             SYMBOL(cuda_table, EventCreateWithFlags, "cudaEventCreateWithFlags"),
             SYMBOL(cuda_table, EventRecord, "cudaEventRecord"),
             SYMBOL(cuda_table, EventQuery, "cudaEventQuery"),
             SYMBOL(cuda_table, EventDestroy, "cudaEventDestroy"),
             SYMBOL(cuda_table, Malloc, "cudaMalloc"),
             SYMBOL(cuda_table, Free, "cudaFree"),
             SYMBOL(cuda_table, Memcpy, "cudaMemcpy"),
             SYMBOL(cuda_table, MemcpyAsync, "cudaMemcpyAsync"),
             SYMBOL(cuda_table, MemsetAsync, "cudaMemsetAsync"),
             SYMBOL(cuda_table, MallocHost, "cudaMallocHost"),
             SYMBOL(cuda_table, FreeHost, "cudaFreeHost"),
             SYMBOL(cuda_table, DeviceGetPCIBusId, "cudaDeviceGetPCIBusId"),
             SYMBOL(cuda_table, GetErrorString, "cudaGetErrorString")},
            &missing)) {
    a.why_not = a.cudart_path + " has no " + missing + ": not a CUDA runtime library hvdlite can use";
    return a;
  }
  tried.clear();
  void* library = open_first({config.nccl_library, "libnccl.so.2", "libnccl.so"}, &a.nccl_path, &tried);
  if (!library) {
    a.why_not = "no NCCL library could be loaded (" + tried +
                "); install one (pip install nvidia-nccl-cu12, or a "
                "CUDA build of torch) or set HVDLITE_NCCL_LIBRARY";
    return a;
  }
  if (!bind(library, &nccl_table,
            {SYMBOL(nccl_table, GetVersion, "ncclGetVersion"), SYMBOL(nccl_table, GetUniqueId, "ncclGetUniqueId"),
             SYMBOL(nccl_table, CommInitRank, "ncclCommInitRank"), SYMBOL(nccl_table, CommDestroy, "ncclCommDestroy"),
             SYMBOL(nccl_table, CommAbort, "ncclCommAbort"),
             SYMBOL(nccl_table, CommGetAsyncError, "ncclCommGetAsyncError"),
             SYMBOL(nccl_table, GetErrorString, "ncclGetErrorString"), SYMBOL(nccl_table, AllReduce, "ncclAllReduce"),
             SYMBOL(nccl_table, Broadcast, "ncclBroadcast"), SYMBOL(nccl_table, Reduce, "ncclReduce"),
             SYMBOL(nccl_table, AllGather, "ncclAllGather"), SYMBOL(nccl_table, ReduceScatter, "ncclReduceScatter"),
             SYMBOL(nccl_table, Send, "ncclSend"), SYMBOL(nccl_table, Recv, "ncclRecv"),
             SYMBOL(nccl_table, GroupStart, "ncclGroupStart"), SYMBOL(nccl_table, GroupEnd, "ncclGroupEnd"),
             SYMBOL(nccl_table, RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum"),
             SYMBOL(nccl_table, RedOpDestroy, "ncclRedOpDestroy")},
            &missing)) {
    a.why_not = a.nccl_path + " has no " + missing +
                ": hvdlite needs NCCL 2.11 or later (send/recv and "
                "ncclRedOpCreatePreMulSum)";
    return a;
  }
  nccl_table.GetVersion(&a.nccl_version);
  cuda::Error status = cuda_table.GetDeviceCount(&a.device_count);
  if (status != cuda::kSuccess || a.device_count <= 0) {
    a.why_not = std::string("the CUDA runtime sees no device") +
                (status != cuda::kSuccess ? std::string(" (") + cuda_table.GetErrorString(status) + ")" : "");
    a.device_count = 0;
    return a;
  }
  a.cuda = &cuda_table;
  a.nccl = &nccl_table;
  a.usable = true;
  return a;
}

#undef SYMBOL

}  // namespace

const GpuAvailability& gpu_availability(const Config& config) {
  // Probed once: a process's libraries and devices do not change, and dlopen is not cheap.
  static std::once_flag once;
  static GpuAvailability availability;
  std::call_once(once, [&]() { availability = probe(config); });
  return availability;
}

void check_cuda(const cuda::Runtime& cuda, cuda::Error status, const char* call) {
  if (status == cuda::kSuccess) return;
  throw Error(StatusCode::kInternal, std::string(call) + " failed: " + cuda.GetErrorString(status) + " (CUDA error " +
                                         std::to_string(status) + ")");
}

void check_nccl(const nccl::Library& nccl, nccl::Result status, const char* call) {
  if (status == nccl::kSuccess) return;
  throw Error(StatusCode::kRemoteError, std::string(call) + " failed: " + nccl.GetErrorString(status) +
                                            " (NCCL error " + std::to_string(status) + ")");
}

}  // namespace hvdlite
