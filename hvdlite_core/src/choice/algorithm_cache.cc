#include "choice/algorithm_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "choice/measure_allreduce.h"
#include "collectives/algorithms.h"
#include "common/hmac_sha256.h"
#include "common/log.h"
#include "common/version.h"

namespace hvdlite {
namespace {

constexpr const char* kHeader = "hvdlite allreduce table v3";
constexpr const char* kMeasurementPrefix = "measured ";
constexpr const char* kStreamingSeparator = " streaming ";  // a measurement line's second part (v3)
constexpr size_t kWireBytes = 1024;  // the broadcast decision: far more than 3 algorithms x a few bands need

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

struct CacheFile {
  AllreduceTable table;
  std::vector<std::vector<AllreduceProbe>> measurements;
  std::vector<StreamingProbe> streaming;  // one per measurement, in the same order
};

std::vector<size_t> probe_sizes(const std::vector<AllreduceProbe>& probes) {
  std::vector<size_t> sizes;
  for (const AllreduceProbe& probe : probes) sizes.push_back(probe.bytes);
  return sizes;
}

// The whole file or nothing: a header, key or table line that does not match, a measurement that does not parse,
// more measurements than are kept, or measurements of different probes (from each other or from this build's
// grid) all mean "measure from scratch".
bool read_cache(const std::string& path, const std::string& key, CacheFile* file) {
  std::ifstream in(path);
  std::string header, stored_key, bands;
  if (!std::getline(in, header) || !std::getline(in, stored_key) || !std::getline(in, bands)) return false;
  if (header != kHeader || stored_key != key || !AllreduceTable::parse(bands, &file->table)) return false;
  const std::string prefix = kMeasurementPrefix;
  for (std::string line; std::getline(in, line);) {
    std::vector<AllreduceProbe> probes;
    StreamingProbe streaming;
    const size_t split = line.find(kStreamingSeparator);
    if (line.compare(0, prefix.size(), prefix) != 0 || split == std::string::npos ||
        !parse_probes(line.substr(prefix.size(), split - prefix.size()), &probes) ||
        !parse_streaming(line.substr(split + std::strlen(kStreamingSeparator)), &streaming)) {
      return false;
    }
    file->measurements.push_back(probes);
    file->streaming.push_back(streaming);
  }
  if (file->measurements.size() > static_cast<size_t>(kMeasurementsKept)) return false;
  if (file->measurements.empty()) return true;  // a table written by hand
  return probes_match(file->measurements) && probe_sizes(file->measurements.front()) == allreduce_probe_bytes();
}

void write_cache(const std::string& path, const std::string& key, const CacheFile& file) {
  const size_t slash = path.rfind('/');
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  {
    if (slash == std::string::npos || !make_dirs(path.substr(0, slash))) {
      HVD_LOG(kWarning, "cannot create " << path.substr(0, slash) << " for the allreduce table: "
                                         << std::strerror(errno) << " (it will be measured again next time)");
      return;
    }
    std::ofstream out(temporary);
    out << kHeader << "\n" << key << "\n" << file.table.serialize() << "\n";
    for (size_t i = 0; i < file.measurements.size(); ++i) {
      out << kMeasurementPrefix << serialize_probes(file.measurements[i]) << kStreamingSeparator
          << serialize_streaming(file.streaming[i]) << "\n";
    }
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

// Rank 0's decision, broadcast as text so that every rank takes the same one: "T<measurements> <bands>" runs that
// table, "M" measures.
std::string broadcast_decision(Communicator& world, const std::string& text) {
  std::vector<char> wire(kWireBytes, '\0');
  if (world.rank() == 0 && text.size() < kWireBytes) std::memcpy(wire.data(), text.data(), text.size());
  broadcast_tree(world, wire.data(), wire.size(), 0);
  return std::string(wire.data());
}

// "T<measurements> <streaming store bytes, -1: not measured> <bands>"
bool parse_decision(const std::string& text, EstablishedTable* result) {
  const size_t first = text.find(' ');
  const size_t second = first == std::string::npos ? std::string::npos : text.find(' ', first + 1);
  if (text.size() < 2 || text[0] != 'T' || second == std::string::npos) return false;
  result->measurements = std::atoi(text.c_str() + 1);
  result->streaming_store_bytes = std::atoll(text.c_str() + first + 1);
  return AllreduceTable::parse(text.substr(second + 1), &result->table);
}

std::string table_decision(const CacheFile& file) {
  return "T" + std::to_string(file.measurements.size()) + " " +
         std::to_string(streaming_store_bytes_from(file.streaming)) + " " + file.table.serialize();
}

}  // namespace

EstablishedTable establish_allreduce_table(Communicator& world, const Config& config) {
  EstablishedTable result;
  const std::string key = key_text(world, config);
  result.path = cache_path(key, config);
  CacheFile file;  // rank 0's
  std::string decision = "M";
  if (world.rank() == 0 && !result.path.empty()) {
    if (!read_cache(result.path, key, &file)) file = CacheFile();
    const size_t kept = file.measurements.size();
    if (!file.table.empty() && (kept == 0 || kept >= static_cast<size_t>(kMeasurementsKept))) {
      decision = table_decision(file);
    }
  }
  if (parse_decision(broadcast_decision(world, decision), &result)) {
    result.origin = "cached";
    return result;
  }
  // Measure, add the figures to the file's, and run the table they vote for.
  const AllreduceMeasurement measured = measure_allreduce_probes(world);
  const std::vector<AllreduceProbe>& probes = measured.probes;
  if (world.rank() == 0) {
    file.measurements.push_back(probes);
    file.streaming.push_back(measured.streaming);
    if (!probes_match(file.measurements)) {  // older figures of other probes: dropped
      file.measurements = {probes};
      file.streaming = {measured.streaming};
    }
    file.table =
        AllreduceTable::from_measurements(file.measurements, static_cast<size_t>(config.small_message_bytes));
    if (!result.path.empty()) write_cache(result.path, key, file);
    decision = table_decision(file);
  }
  if (!parse_decision(broadcast_decision(world, decision), &result)) {
    // No table (no probe had a candidate, or it did not fit the wire): every rank sees the same text, so every
    // rank keeps the fixed rules alike.
    result.table = AllreduceTable();
  }
  result.origin = "measured";
  return result;
}

}  // namespace hvdlite
