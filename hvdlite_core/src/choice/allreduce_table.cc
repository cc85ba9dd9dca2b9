#include "choice/allreduce_table.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace hvdlite {

namespace {

AllreduceAlgorithm fixed_rule(size_t bytes, size_t small_message_bytes) {
  return bytes < small_message_bytes ? AllreduceAlgorithm::kRecursiveDoubling : AllreduceAlgorithm::kRing;
}

// The probe's clear winner (kClearMargin against the fixed rules' choice); -1 when nothing was a candidate.
int probe_winner(const AllreduceProbe& probe, size_t small_message_bytes) {
  const double* seconds = probe.seconds;
  int best = -1;
  for (int a = 0; a < 3; ++a) {
    if (seconds[a] < 0) continue;
    if (best < 0 || seconds[a] < seconds[best]) best = a;
  }
  if (best < 0) return -1;
  const int fixed = static_cast<int>(fixed_rule(probe.bytes, small_message_bytes));
  if (seconds[fixed] >= 0 && !(seconds[best] < AllreduceTable::kClearMargin * seconds[fixed])) best = fixed;
  return best;
}

}  // namespace

bool probes_match(const std::vector<std::vector<AllreduceProbe>>& measurements) {
  if (measurements.empty() || measurements.front().empty()) return false;
  const std::vector<AllreduceProbe>& first = measurements.front();
  for (const std::vector<AllreduceProbe>& m : measurements) {
    if (m.size() != first.size()) return false;
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i].bytes != first[i].bytes) return false;
      for (int a = 0; a < 3; ++a) {
        if ((m[i].seconds[a] < 0) != (first[i].seconds[a] < 0)) return false;
      }
    }
  }
  return true;
}

AllreduceTable AllreduceTable::from_probes(const std::vector<AllreduceProbe>& probes, size_t small_message_bytes) {
  return from_measurements({probes}, small_message_bytes);
}

AllreduceTable AllreduceTable::from_measurements(const std::vector<std::vector<AllreduceProbe>>& measurements,
                                                 size_t small_message_bytes) {
  AllreduceTable table;
  if (!probes_match(measurements)) return table;
  const std::vector<AllreduceProbe>& probes = measurements.front();
  for (size_t i = 0; i < probes.size(); ++i) {
    int votes[3] = {0, 0, 0};
    for (const std::vector<AllreduceProbe>& m : measurements) {
      const int winner = probe_winner(m[i], small_message_bytes);
      if (winner >= 0) ++votes[winner];
    }
    const int first = probe_winner(probes[i], small_message_bytes);
    if (first < 0) continue;  // no candidate at this probe (the same in every measurement)
    const int fixed = static_cast<int>(fixed_rule(probes[i].bytes, small_message_bytes));
    int chosen = probes[i].seconds[fixed] >= 0 ? fixed : first;
    for (int a = 0; a < 3; ++a) {
      if (2 * votes[a] > static_cast<int>(measurements.size())) chosen = a;
    }
    const size_t start = i == 0 ? 0
                                : static_cast<size_t>(std::sqrt(static_cast<double>(probes[i - 1].bytes) *
                                                                static_cast<double>(probes[i].bytes)));
    const auto algorithm = static_cast<AllreduceAlgorithm>(chosen);
    if (!table.bands_.empty() && table.bands_.back().algorithm == algorithm) continue;
    table.bands_.push_back({table.bands_.empty() ? 0 : start, algorithm});
  }
  return table;
}

std::string AllreduceTable::serialize() const {
  std::ostringstream out;
  for (size_t i = 0; i < bands_.size(); ++i) {
    out << (i ? "," : "") << algorithm_name(bands_[i].algorithm) << "@" << bands_[i].min_bytes;
  }
  return out.str();
}

bool AllreduceTable::parse(const std::string& text, AllreduceTable* table) {
  AllreduceTable parsed;
  if (text.empty() || text.back() == ',') return false;  // getline would drop a trailing empty item
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    const size_t at = item.find('@');
    if (at == std::string::npos || at + 1 >= item.size()) return false;
    const std::string name = item.substr(0, at);
    char* end = nullptr;
    const unsigned long long min_bytes = std::strtoull(item.c_str() + at + 1, &end, 10);
    if (*end != '\0' || item[at + 1] == '-') return false;
    AllreduceAlgorithm algorithm;
    if (name == "rd")
      algorithm = AllreduceAlgorithm::kRecursiveDoubling;
    else if (name == "ring")
      algorithm = AllreduceAlgorithm::kRing;
    else if (name == "single_copy")
      algorithm = AllreduceAlgorithm::kSingleCopy;
    else if (name == "rhd")
      algorithm = AllreduceAlgorithm::kRecursiveHalving;
    else
      return false;
    if (parsed.bands_.empty() ? min_bytes != 0 : min_bytes <= parsed.bands_.back().min_bytes) return false;
    parsed.bands_.push_back({static_cast<size_t>(min_bytes), algorithm});
  }
  if (parsed.bands_.empty()) return false;
  *table = parsed;
  return true;
}

std::string serialize_probes(const std::vector<AllreduceProbe>& probes) {
  std::string text;
  for (const AllreduceProbe& probe : probes) {
    char item[128];
    std::snprintf(item, sizeof(item), "%s%zu:%.6g,%.6g,%.6g", text.empty() ? "" : ";", probe.bytes, probe.seconds[0],
                  probe.seconds[1], probe.seconds[2]);
    text += item;
  }
  return text;
}

bool parse_probes(const std::string& text, std::vector<AllreduceProbe>* probes) {
  std::vector<AllreduceProbe> parsed;
  if (text.empty() || text.back() == ';') return false;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ';');) {
    AllreduceProbe probe;
    const char* at = item.c_str();
    char* end = nullptr;
    if (!(*at >= '0' && *at <= '9')) return false;
    probe.bytes = static_cast<size_t>(std::strtoull(at, &end, 10));
    for (int a = 0; a < 3; ++a) {
      if (*end != (a == 0 ? ':' : ',')) return false;
      at = end + 1;
      probe.seconds[a] = std::strtod(at, &end);
      // A figure is a time or -1 (not a candidate); nothing else (nan, inf, other negatives) is a measurement.
      if (end == at || !(probe.seconds[a] == -1 || (probe.seconds[a] >= 0 && probe.seconds[a] < 1e6))) return false;
    }
    if (*end != '\0' || (!parsed.empty() && probe.bytes <= parsed.back().bytes)) return false;
    parsed.push_back(probe);
  }
  if (parsed.empty()) return false;
  *probes = parsed;
  return true;
}

AllreduceAlgorithm AllreduceTable::choose(size_t bytes) const {
  AllreduceAlgorithm chosen = bands_.front().algorithm;
  for (const Band& band : bands_) {
    if (bytes < band.min_bytes) break;
    chosen = band.algorithm;
  }
  return chosen;
}

}  // namespace hvdlite
