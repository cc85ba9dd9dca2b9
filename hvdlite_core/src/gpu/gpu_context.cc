#include "gpu/gpu_context.h"

namespace hvdlite {

GpuContext::~GpuContext() {
  if (idle_events_.empty()) return;
  const cuda::Runtime* cuda = gpu().cuda;
  for (cuda::Event e : idle_events_) cuda->EventDestroy(e);
}

Status GpuContext::prepare(const std::string& subject, int device, void* stream, void** ready_out) {
  const GpuAvailability& g = gpu();
  if (!g.usable) {
    return Status(StatusCode::kInvalidArgument,
                  subject + " is in CUDA memory, but this process cannot run collectives on CUDA tensors: " +
                      g.why_not + " (hvdlite-run --check-build shows what the installation has)");
  }
  if (device < 0 || device >= g.device_count) {
    return Status(StatusCode::kInvalidArgument, subject + " is on CUDA device " + std::to_string(device) +
                                                    ", but this process sees " + std::to_string(g.device_count) +
                                                    " device(s)");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device_ >= 0 && device != device_) {
      return Status(StatusCode::kInvalidArgument,
                    subject + " is on CUDA device " + std::to_string(device) +
                        ", but this process's collectives "
                        "run on device " +
                        std::to_string(device_) +
                        " (its first CUDA tensor's): NCCL takes one device "
                        "per rank, so pin each process to one GPU (torch.cuda.set_device(hvd.local_rank()))");
    }
    device_ = device;
  }
  try {
    DeviceScope scope(*g.cuda, device);
    cuda::Event ready = acquire_event();
    check_cuda(*g.cuda, g.cuda->EventRecord(ready, stream), "cudaEventRecord on the caller's stream");
    *ready_out = ready;
  } catch (const Error& e) {
    return Status(StatusCode::kInvalidArgument, subject + ": " + e.what());
  }
  return Status::Ok();
}

cuda::Event GpuContext::acquire_event() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_events_.empty()) {
      cuda::Event e = idle_events_.back();
      idle_events_.pop_back();
      return e;
    }
  }
  const cuda::Runtime& cuda = *gpu().cuda;
  cuda::Event e = nullptr;
  check_cuda(cuda, cuda.EventCreateWithFlags(&e, cuda::kEventDisableTiming), "cudaEventCreateWithFlags");
  return e;
}

void GpuContext::release_event(void* event) {
  if (!event) return;
  std::lock_guard<std::mutex> lock(mutex_);
  idle_events_.push_back(event);
}

DeviceScope::DeviceScope(const cuda::Runtime& cuda, int device) : cuda_(cuda) {
  cuda_.GetDevice(&previous_);
  if (previous_ != device)
    check_cuda(cuda_, cuda_.SetDevice(device), "cudaSetDevice");
  else
    previous_ = -1;  // nothing to restore
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cuda_.SetDevice(previous_);
}

}  // namespace hvdlite
