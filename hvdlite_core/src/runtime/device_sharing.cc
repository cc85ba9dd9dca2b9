#include "runtime/device_sharing.h"

#include <cstring>
#include <map>
#include <utility>

#include "collectives/communicator.h"
#include "common/status.h"

namespace hvdlite {
namespace {

constexpr size_t kBusIdBytes = 32;  // CUDA's own buffers for the id are 13 to 16 characters

std::string list_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace

std::string pci_bus_id(const cuda::Runtime& cuda, int device) {
  char id[kBusIdBytes] = {};
  check_cuda(cuda, cuda.DeviceGetPCIBusId(id, static_cast<int>(sizeof id) - 1, device), "cudaDeviceGetPCIBusId");
  return id;
}

std::vector<SharedDevice> shared_devices(Backend& host, int set, Communicator& comm, const std::string& my_bus_id) {
  const int n = comm.size();
  char mine[kBusIdBytes] = {};
  std::strncpy(mine, my_bus_id.c_str(), sizeof mine - 1);
  std::vector<char> all(kBusIdBytes * static_cast<size_t>(n));
  host.allgather(set, comm, mine, all.data(), std::vector<size_t>(n, kBusIdBytes));
  // Members by (host, device), in the order each device first appears.
  std::map<std::pair<int, std::string>, size_t> index;
  std::vector<SharedDevice> devices;
  for (int i = 0; i < n; ++i) {
    const char* text = &all[kBusIdBytes * static_cast<size_t>(i)];
    std::string bus(text, strnlen(text, kBusIdBytes));
    auto key = std::make_pair(comm.host_id(i), bus);
    auto found = index.find(key);
    if (found == index.end()) {
      found = index.emplace(key, devices.size()).first;
      devices.push_back(SharedDevice{bus, key.first, {}});
    }
    devices[found->second].ranks.push_back(comm.global_rank(i));
  }
  std::vector<SharedDevice> shared;
  for (SharedDevice& d : devices)
    if (d.ranks.size() > 1) shared.push_back(std::move(d));
  return shared;
}

std::string describe(const std::vector<SharedDevice>& shared) {
  std::string text;
  for (const SharedDevice& d : shared) {
    if (!text.empty()) text += "; ";
    text += "ranks " + list_ranks(d.ranks) + " share GPU " + d.pci_bus_id;
  }
  return text;
}

}  // namespace hvdlite
