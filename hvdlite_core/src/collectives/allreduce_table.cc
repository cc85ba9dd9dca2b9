#include "collectives/allreduce_table.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace hvdlite {

const char* algorithm_name(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling: return "rd";
    case AllreduceAlgorithm::kRing: return "ring";
    case AllreduceAlgorithm::kSingleCopy: return "single_copy";
  }
  return "?";
}

AllreduceTable AllreduceTable::from_probes(const std::vector<AllreduceProbe>& probes, size_t small_message_bytes) {
  AllreduceTable table;
  for (size_t i = 0; i < probes.size(); ++i) {
    const double* seconds = probes[i].seconds;
    int best = -1;
    for (int a = 0; a < 3; ++a) {
      if (seconds[a] < 0) continue;
      if (best < 0 || seconds[a] < seconds[best]) best = a;
    }
    if (best < 0) continue;
    const int fixed = static_cast<int>(probes[i].bytes < small_message_bytes ? AllreduceAlgorithm::kRecursiveDoubling
                                                                             : AllreduceAlgorithm::kRing);
    if (seconds[fixed] >= 0 && !(seconds[best] < kClearMargin * seconds[fixed])) best = fixed;
    const size_t start = i == 0 ? 0
                                : static_cast<size_t>(std::sqrt(static_cast<double>(probes[i - 1].bytes) *
                                                                static_cast<double>(probes[i].bytes)));
    const auto algorithm = static_cast<AllreduceAlgorithm>(best);
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
    if (name == "rd") algorithm = AllreduceAlgorithm::kRecursiveDoubling;
    else if (name == "ring") algorithm = AllreduceAlgorithm::kRing;
    else if (name == "single_copy") algorithm = AllreduceAlgorithm::kSingleCopy;
    else return false;
    if (parsed.bands_.empty() ? min_bytes != 0 : min_bytes <= parsed.bands_.back().min_bytes) return false;
    parsed.bands_.push_back({static_cast<size_t>(min_bytes), algorithm});
  }
  if (parsed.bands_.empty()) return false;
  *table = parsed;
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
