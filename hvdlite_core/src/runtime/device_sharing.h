// Which members of a process set would run their CUDA collectives on the same physical GPU. NCCL refuses a
// communicator whose ranks share a device, so the data plane asks this once per set, before it makes one, and
// stages such a set's collectives through host memory instead (runtime/staged_collectives.h). A device is known
// by its host (the bootstrap's host ids: equal hostnames) and its PCI bus id, which the CUDA runtime reports
// without any struct whose layout changes between CUDA versions.
#pragma once
#include <string>
#include <vector>

#include "backends/backend.h"
#include "gpu/cuda_api.h"

namespace hvdlite {

struct SharedDevice {
  std::string pci_bus_id;  // e.g. "0000:3B:00.0"
  int host_id = 0;
  std::vector<int> ranks;  // global ranks, two or more, ascending
};

// This process's device as "0000:3B:00.0"; throws Error(kInternal) when CUDA cannot say.
std::string pci_bus_id(const cuda::Runtime& cuda, int device);

// Collective over comm's members (through the host data plane): the devices two or more of them use, in the order
// of their first member. Every member gets the same answer.
std::vector<SharedDevice> shared_devices(Backend& host, int set, Communicator& comm, const std::string& my_bus_id);

// "ranks 0 and 1 share GPU 0000:3B:00.0; ranks 2, 3 and 5 share GPU 0000:5E:00.0"
std::string describe(const std::vector<SharedDevice>& shared);

}  // namespace hvdlite
