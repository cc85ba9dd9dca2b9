// The init-time measurement behind AllreduceTable (allreduce_table.h). Collective over comm, whose members must
// all be on one host; about 0.2 s on 2 ranks and 0.9 s on 4 ranks of 2 cores (HVDLITE_LOG_LEVEL=info prints the
// figures). Every member returns the same probes (the slowest member's figures).
#pragma once
#include <vector>

#include "choice/allreduce_table.h"
#include "choice/streaming_choice.h"
#include "collectives/communicator.h"

namespace hvdlite {

struct AllreduceMeasurement {
  std::vector<AllreduceProbe> probes;  // the algorithms at each probe size
  StreamingProbe streaming;            // the ring at the largest probe, with ordinary and with streaming stores
};

AllreduceMeasurement measure_allreduce_probes(Communicator& comm);

// The probe sizes this build measures, ascending. Figures cached for other sizes came from another build's grid:
// the cache measures afresh rather than keep a table made on it.
std::vector<size_t> allreduce_probe_bytes();

}  // namespace hvdlite
