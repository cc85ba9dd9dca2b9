// The CUDA runtime and NCCL, loaded with dlopen at run time (never linked), so the core builds with a C++ compiler
// alone and one installation works with and without a GPU. The libraries come from the pip wheels
// (nvidia-cuda-runtime-cu12, nvidia-nccl-cu12, which torch's CUDA wheels install), a system CUDA, or the paths in
// HVDLITE_CUDART_LIBRARY / HVDLITE_NCCL_LIBRARY. The few types and constants the core needs are declared here with
// the values of CUDA's and NCCL's own headers (a stable ABI), so the build needs no CUDA toolkit.
#pragma once
#include <cstddef>
#include <string>

#include "common/config.h"

namespace hvdlite {
namespace cuda {

typedef int Error;     // cudaError_t
typedef void* Stream;  // cudaStream_t
typedef void* Event;   // cudaEvent_t
constexpr Error kSuccess = 0;
constexpr Error kNotReady = 600;  // cudaErrorNotReady
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;
constexpr int kMemcpyDefault = 4;  // cudaMemcpyDefault: direction from the pointers (unified addressing)

struct Runtime {
  Error (*GetDeviceCount)(int*);
  Error (*GetDevice)(int*);
  Error (*SetDevice)(int);
  Error (*RuntimeGetVersion)(int*);
  Error (*StreamCreateWithFlags)(Stream*, unsigned);
  Error (*StreamDestroy)(Stream);
  Error (*StreamSynchronize)(Stream);
  Error (*StreamWaitEvent)(Stream, Event, unsigned);
  Error (*EventCreateWithFlags)(Event*, unsigned);
  Error (*EventRecord)(Event, Stream);
  Error (*EventQuery)(Event);
  Error (*EventDestroy)(Event);
  Error (*Malloc)(void**, size_t);
  Error (*Free)(void*);
  Error (*Memcpy)(void*, const void*, size_t, int);
  Error (*MemcpyAsync)(void*, const void*, size_t, int, Stream);
  Error (*MemsetAsync)(void*, int, size_t, Stream);
  Error (*MallocHost)(void**, size_t);  // page-locked: the host-staged path's copies run at the link's full rate
  Error (*FreeHost)(void*);
  Error (*DeviceGetPCIBusId)(char*, int, int);  // a device's identity on its host, to find ranks sharing one
  const char* (*GetErrorString)(Error);
};

}  // namespace cuda

namespace nccl {

typedef int Result;    // ncclResult_t
typedef void* Comm;    // ncclComm_t
typedef int DataType;  // ncclDataType_t
typedef int RedOp;     // ncclRedOp_t
struct UniqueId {
  char internal[128];
};
constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;
enum : DataType {
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
enum : RedOp { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
constexpr int kScalarHostImmediate = 1;  // ncclScalarResidence_t

struct Library {
  Result (*GetVersion)(int*);
  Result (*GetUniqueId)(UniqueId*);
  Result (*CommInitRank)(Comm*, int, UniqueId, int);
  Result (*CommDestroy)(Comm);
  Result (*CommAbort)(Comm);
  Result (*CommGetAsyncError)(Comm, Result*);
  const char* (*GetErrorString)(Result);
  Result (*AllReduce)(const void*, void*, size_t, DataType, RedOp, Comm, cuda::Stream);
  Result (*Broadcast)(const void*, void*, size_t, DataType, int, Comm, cuda::Stream);
  Result (*Reduce)(const void*, void*, size_t, DataType, RedOp, int, Comm, cuda::Stream);
  Result (*AllGather)(const void*, void*, size_t, DataType, Comm, cuda::Stream);
  Result (*ReduceScatter)(const void*, void*, size_t, DataType, RedOp, Comm, cuda::Stream);
  Result (*Send)(const void*, size_t, DataType, int, Comm, cuda::Stream);
  Result (*Recv)(void*, size_t, DataType, int, Comm, cuda::Stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  Result (*RedOpCreatePreMulSum)(RedOp*, void*, DataType, int, Comm);
  Result (*RedOpDestroy)(RedOp, Comm);
};

}  // namespace nccl

// Whether this installation can run collectives on CUDA tensors, and if not, why; loaded once per process.
struct GpuAvailability {
  bool usable = false;
  std::string why_not;      // "" when usable
  std::string cudart_path;  // what was loaded
  std::string nccl_path;
  int nccl_version = 0;  // e.g. 22105 for 2.21.5
  int device_count = 0;
  const cuda::Runtime* cuda = nullptr;
  const nccl::Library* nccl = nullptr;
};
const GpuAvailability& gpu_availability(const Config& config);

// Throws Error(kInternal) naming the call and CUDA's message when status is not success.
void check_cuda(const cuda::Runtime& cuda, cuda::Error status, const char* call);
// Throws Error(kRemoteError) for NCCL failures (a peer's failure shows up here), naming the call.
void check_nccl(const nccl::Library& nccl, nccl::Result status, const char* call);

}  // namespace hvdlite
