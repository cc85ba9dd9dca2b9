#include "tuning/table_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "collectives/algorithms.h"
#include "common/hmac_sha256.h"
#include "common/log.h"
#include "common/version.h"

namespace hvdlite {
namespace {

constexpr const char* kHeader = "hvdlite allreduce table v4";
constexpr const char* kTablePrefix = "allreduce ";
constexpr const char* kStreamingPrefix = "streaming_store_bytes ";
constexpr const char* kMeasurementPrefix = "measured ";
constexpr size_t kWireBytes = 1024;  // the broadcast table: far more than 4 algorithms x a few bands need

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

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

// What the key covers, in words: the file repeats it so a reader can tell what was measured where. No ';', so
// that build_info ("key=value;...") can carry it.
std::string key_text(const Communicator& world, const Config& config) {
  std::string processor = processor_model();
  std::replace(processor.begin(), processor.end(), ';', ',');
  std::ostringstream text;
  text << "processor=" << processor << ",cores=" << sysconf(_SC_NPROCESSORS_ONLN) << ",version=" << kVersion
       << ",ranks=" << world.size() << ",single_copy=" << (world.single_copy_local() ? 1 : 0)
       << ",shm_ring_bytes=" << config.shm_ring_bytes << ",shm_disable=" << (config.shm_disable ? 1 : 0);
  return text.str();
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

// Rank 0's text, the same on every rank after this.
std::string broadcast_decision(Communicator& world, const std::string& text) {
  std::vector<char> wire(kWireBytes, '\0');
  if (world.rank() == 0 && text.size() < kWireBytes) std::memcpy(wire.data(), text.data(), text.size());
  broadcast_tree(world, wire.data(), wire.size(), 0);
  return std::string(wire.data());
}

// The whole file or nothing: a header or key that does not match, or a line that does not parse, means no table.
bool read_file(const std::string& path, const std::string& key, TunedTable* tuned, std::string* why) {
  std::ifstream in(path);
  if (!in) return false;
  std::string header, stored_key, line;
  if (!std::getline(in, header) || header != kHeader) {
    // Earlier versions measured at init and kept their figures here: not a tuned table, nothing to warn about.
    if (!starts_with(header, "hvdlite allreduce table v"))
      *why = "its first line is not '" + std::string(kHeader) + "'";
    return false;
  }
  if (!std::getline(in, stored_key) || stored_key != key) {
    *why = "it was tuned for another machine or setting";
    return false;
  }
  if (!std::getline(in, line) || !starts_with(line, kTablePrefix) ||
      !AllreduceTable::parse(line.substr(std::strlen(kTablePrefix)), &tuned->table)) {
    *why = "its third line is not 'allreduce <bands>', e.g. 'allreduce rd@0,ring@65536'";
    return false;
  }
  while (std::getline(in, line)) {
    char* end = nullptr;
    if (starts_with(line, kStreamingPrefix)) {
      const char* number = line.c_str() + std::strlen(kStreamingPrefix);
      tuned->streaming_store_bytes = std::strtoll(number, &end, 10);
      if (end == number || *end != '\0' || tuned->streaming_store_bytes < 0) {
        *why = "'" + line + "' is not a size in bytes";
        return false;
      }
    } else if (!starts_with(line, kMeasurementPrefix)) {
      *why = "'" + line.substr(0, 60) + "' is neither 'streaming_store_bytes <n>' nor 'measured ...'";
      return false;
    }
  }
  return true;
}

// Rank 0's table, broadcast as text so that every rank takes the same one: "<streaming store bytes> <bands>", or
// "" for none.
TunedTable share(Communicator& world, const TunedTable& mine) {
  std::string text;
  if (world.rank() == 0 && !mine.table.empty()) {
    text = std::to_string(mine.streaming_store_bytes) + " " + mine.table.serialize();
  }
  const std::string shared = broadcast_decision(world, text.size() < kWireBytes ? text : "");
  TunedTable tuned;
  tuned.path = mine.path;
  tuned.key = mine.key;
  const size_t space = shared.find(' ');
  if (space == std::string::npos || !AllreduceTable::parse(shared.substr(space + 1), &tuned.table)) return tuned;
  tuned.streaming_store_bytes = std::atoll(shared.c_str());
  return tuned;
}

}  // namespace

TunedTable read_tuned_table(Communicator& world, const Config& config) {
  const std::string key = key_text(world, config);
  TunedTable mine;
  mine.key = key;
  mine.path = cache_path(key, config);
  if (world.rank() == 0 && !mine.path.empty()) {
    std::string why;
    if (!read_file(mine.path, key, &mine, &why)) {
      if (!why.empty()) {
        HVD_LOG(kWarning, "ignoring the tuned table " << mine.path << ": " << why
                                                      << "; the fixed rules decide (python -m hvdlite.tune writes it "
                                                         "again)");
      }
      mine.table = AllreduceTable();
      mine.streaming_store_bytes = -1;
    }
  }
  return share(world, mine);
}

}  // namespace hvdlite
