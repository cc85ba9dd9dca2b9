// Where streaming stores start paying, chosen from measurements of this machine. A ring can receive into its
// result with non-temporal stores (STREAMING_STORE_BYTES, common/copy_bytes.h), which skip reading each destination
// line before overwriting it. That pays only once the result no longer fits the cache the job gets, and where that
// is differs by processor, so the one-host measurement at init (measure_allreduce.cc) also times the ring at its
// largest probe both ways, and the first jobs on a machine vote (algorithm_cache.h) as for the algorithm table.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdlite {

// One measurement: the ring at `bytes`, receiving with ordinary and with streaming stores (seconds, the slowest
// member's median). bytes == 0: not measured.
struct StreamingProbe {
  size_t bytes = 0;
  double plain = -1;
  double streamed = -1;
};

// Whether a measurement says streaming stores lose at its size: ordinary stores clearly faster (by the table's
// margin, AllreduceTable::kClearMargin). A tie keeps streaming, the default.
bool streaming_loses(const StreamingProbe& probe);

// The STREAMING_STORE_BYTES the measurements vote for: the probe's size, or kBeyondProbe times it when more than
// half of them say streaming loses there (a guess past the cache, since probing larger would cost every first job
// a larger buffer). -1 when there is no measurement.
constexpr size_t kBeyondProbe = 4;
int64_t streaming_store_bytes_from(const std::vector<StreamingProbe>& measurements);

// "16777216:0.0026,0.0031" and back; parse accepts exactly that form.
std::string serialize_streaming(const StreamingProbe& probe);
bool parse_streaming(const std::string& text, StreamingProbe* probe);

}  // namespace hvdlite
