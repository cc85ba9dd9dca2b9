// The process's side of CUDA collectives: the one device they use (fixed by the first CUDA tensor, as NCCL allows
// one device per rank and communicator), the pool of events that order a caller's stream before the data plane's
// stream, and a scope that switches the calling thread's current device and puts it back.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/cuda_api.h"

namespace hvdlite {

class GpuContext {
 public:
  explicit GpuContext(const Config& config) : config_(config) {}
  ~GpuContext();
  // For a request on CUDA memory: checks that the NCCL data plane can take it (libraries, device, the process's
  // device so far) and records an event on stream for the data plane to wait on. subject names the tensor.
  Status prepare(const std::string& subject, int device, void* stream, void** ready_out);
  // Events back to the pool (after the data plane's stream was told to wait on them).
  void release_event(void* event);
  cuda::Event acquire_event();  // on the process's device; the caller has it current
  int device() const { return device_; }
  const GpuAvailability& gpu() const { return gpu_availability(config_); }
  const Config& config() const { return config_; }

 private:
  const Config& config_;
  std::mutex mutex_;
  int device_ = -1;
  std::vector<cuda::Event> idle_events_;
};

// Makes device current on this thread for the scope (collectives may run on a caller's thread, whose own current
// device must not change under it).
class DeviceScope {
 public:
  DeviceScope(const cuda::Runtime& cuda, int device);
  ~DeviceScope();

 private:
  const cuda::Runtime& cuda_;
  int previous_ = -1;
};

}  // namespace hvdlite
