#include "choice/streaming_choice.h"

#include <cstdio>
#include <cstdlib>

#include "choice/allreduce_table.h"

namespace hvdlite {

bool streaming_loses(const StreamingProbe& probe) {
  return probe.bytes > 0 && probe.plain >= 0 && probe.streamed >= 0 &&
         probe.plain < AllreduceTable::kClearMargin * probe.streamed;
}

int64_t streaming_store_bytes_from(const std::vector<StreamingProbe>& measurements) {
  size_t bytes = 0;
  int losses = 0, counted = 0;
  for (const StreamingProbe& probe : measurements) {
    if (probe.bytes == 0) continue;
    if (bytes != 0 && probe.bytes != bytes) return -1;  // figures of different sizes cannot be weighed together
    bytes = probe.bytes;
    ++counted;
    if (streaming_loses(probe)) ++losses;
  }
  if (counted == 0) return -1;
  return static_cast<int64_t>(2 * losses > counted ? kBeyondProbe * bytes : bytes);
}

std::string serialize_streaming(const StreamingProbe& probe) {
  char text[96];
  std::snprintf(text, sizeof(text), "%zu:%.6g,%.6g", probe.bytes, probe.plain, probe.streamed);
  return text;
}

bool parse_streaming(const std::string& text, StreamingProbe* probe) {
  const char* at = text.c_str();
  if (!(*at >= '1' && *at <= '9')) return false;
  char* end = nullptr;
  StreamingProbe parsed;
  parsed.bytes = static_cast<size_t>(std::strtoull(at, &end, 10));
  double* figures[2] = {&parsed.plain, &parsed.streamed};
  for (int i = 0; i < 2; ++i) {
    if (*end != (i == 0 ? ':' : ',')) return false;
    at = end + 1;
    *figures[i] = std::strtod(at, &end);
    if (end == at || !(*figures[i] >= 0 && *figures[i] < 1e6)) return false;  // a time: no nan, inf or negative
  }
  if (*end != '\0') return false;
  *probe = parsed;
  return true;
}

}  // namespace hvdlite
