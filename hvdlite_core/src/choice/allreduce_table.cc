#include "choice/allreduce_table.h"

#include <cstdlib>
#include <sstream>

namespace hvdlite {

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

AllreduceAlgorithm AllreduceTable::choose(size_t bytes) const {
  AllreduceAlgorithm chosen = bands_.front().algorithm;
  for (const Band& band : bands_) {
    if (bytes < band.min_bytes) break;
    chosen = band.algorithm;
  }
  return chosen;
}

}  // namespace hvdlite
