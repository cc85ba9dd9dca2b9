#include "runtime/algorithm_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/measure_allreduce.h"
#include "common/hmac_sha256.h"
#include "common/log.h"
#include "common/version.h"

namespace hvdlite {
namespace {

constexpr const char* kHeader = "hvdlite allreduce table v1";
constexpr size_t kWireBytes = 1024;  // the broadcast table: far more than 3 algorithms x a few bands need

std::string processor_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 || line.rfind("Processor", 0) == 0 || line.rfind("CPU part", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const size_t start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? "unknown" : line.substr(start);
    }
  }
  return "unknown";
}

std::string cache_dir(const Config& config) {
  if (!config.algorithm_cache_dir.empty()) return config.algorithm_cache_dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) {
    if (*xdg) return std::string(xdg) + "/hvdlite";
  }
  if (const char* home = std::getenv("HOME")) {
    if (*home) return std::string(home) + "/.cache/hvdlite";
  }
  return "";
}

// What the key covers, in words: the cache file repeats it so a reader can tell what was measured where.
std::string key_text(const Communicator& world, const Config& config) {
  std::ostringstream text;
  text << "processor=" << processor_model() << ";cores=" << sysconf(_SC_NPROCESSORS_ONLN) << ";version=" << kVersion
       << ";ranks=" << world.size() << ";single_copy=" << (world.single_copy_local() ? 1 : 0)
       << ";shm_ring_bytes=" << config.shm_ring_bytes << ";shm_disable=" << (config.shm_disable ? 1 : 0);
  return text.str();
}

bool make_dirs(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at == path.size() || path[at] == '/') {
      const std::string prefix = path.substr(0, at);
      if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}

bool read_cache(const std::string& path, const std::string& key, AllreduceTable* table) {
  std::ifstream in(path);
  std::string header, stored_key, bands;
  if (!std::getline(in, header) || !std::getline(in, stored_key) || !std::getline(in, bands)) return false;
  return header == kHeader && stored_key == key && AllreduceTable::parse(bands, table);
}

void write_cache(const std::string& path, const std::string& key, const AllreduceTable& table) {
  const size_t slash = path.rfind('/');
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  {
    if (slash == std::string::npos || !make_dirs(path.substr(0, slash))) {
      HVD_LOG(kWarning, "cannot create " << path.substr(0, slash) << " for the allreduce table: "
                                         << std::strerror(errno) << " (it will be measured again next time)");
      return;
    }
    std::ofstream out(temporary);
    out << kHeader << "\n" << key << "\n" << table.serialize() << "\n";
    if (!out) {
      HVD_LOG(kWarning, "cannot write " << temporary << " (the allreduce table will be measured again next time)");
      std::remove(temporary.c_str());
      return;
    }
  }
  // Atomic: a job starting meanwhile reads the old file or the new one, never half of one.
  if (std::rename(temporary.c_str(), path.c_str()) != 0) std::remove(temporary.c_str());
}

// The file for a key: its first 8 bytes of SHA-256 in hex ("" when there is no cache directory).
std::string cache_path(const std::string& key, const Config& config) {
  const std::string dir = cache_dir(config);
  if (dir.empty()) return "";
  const Digest digest = sha256(reinterpret_cast<const uint8_t*>(key.data()), key.size());
  char name[64];
  std::snprintf(name, sizeof(name), "allreduce-%02x%02x%02x%02x%02x%02x%02x%02x.txt", digest[0], digest[1], digest[2],
                digest[3], digest[4], digest[5], digest[6], digest[7]);
  return dir + "/" + name;
}

}  // namespace

EstablishedTable establish_allreduce_table(Communicator& world, const Config& config) {
  EstablishedTable result;
  const std::string key = key_text(world, config);
  result.path = cache_path(key, config);
  // Rank 0's cached table, or nothing: broadcast as text so every rank takes the same decision.
  std::vector<char> wire(kWireBytes, '\0');
  if (world.rank() == 0 && !result.path.empty()) {
    AllreduceTable cached;
    if (read_cache(result.path, key, &cached)) {
      const std::string text = cached.serialize();
      if (text.size() < kWireBytes) std::memcpy(wire.data(), text.data(), text.size());
    }
  }
  broadcast(world, wire.data(), wire.size(), 0);
  if (wire[0] != '\0' && AllreduceTable::parse(std::string(wire.data()), &result.table)) {
    result.origin = "cached";
    return result;
  }
  result.table = measure_allreduce_table(world);
  result.origin = "measured";
  if (world.rank() == 0 && !result.path.empty()) write_cache(result.path, key, result.table);
  return result;
}

}  // namespace hvdlite
