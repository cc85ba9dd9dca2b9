// The allreduce algorithm table (choice/allreduce_table.h) of a job whose ranks share one host: read from the
// per-machine cache, else measured (choice/measure_allreduce.h) and written there for the next job.
//
// The cache is one small text file per key under ALGORITHM_CACHE_DIR (default $XDG_CACHE_HOME/hvdlite, else
// ~/.cache/hvdlite). The key covers what changes the answer: the processor model and the cores online, the
// library version, the number of ranks, and the transport settings (shared-memory ring size, shm and cross-memory
// attach disabled or not). Rank 0 reads it and broadcasts the table, so every rank runs the same algorithms; a
// missing, unreadable or malformed file means a measurement, never an error.
//
// The first jobs on a machine each add a measurement until there are kMeasurementsKept, and the table is what most
// of them vote for (AllreduceTable::from_measurements), so one measurement on a loaded machine cannot decide it.
// Format v3: header, key, bands, then one line per measurement: "measured <probes> streaming <ring's store modes>"
// (serialize_probes, serialize_streaming). The store-mode figures vote on STREAMING_STORE_BYTES as the probes vote
// on the bands (choice/streaming_choice.h), recomputed when the file is read. A file with bands and no
// measurement lines was written by hand: it is obeyed as it is and leaves STREAMING_STORE_BYTES at its default.
#pragma once
#include <cstdint>
#include <string>

#include "choice/allreduce_table.h"
#include "collectives/communicator.h"
#include "common/config.h"

namespace hvdlite {

constexpr int kMeasurementsKept = 3;

struct EstablishedTable {
  AllreduceTable table;
  std::string origin;    // "cached" or "measured" (this job measured, and the table includes its figures)
  std::string path;      // the cache file (rank 0's view)
  int measurements = 0;  // how many measurements the table comes from (0: a table written by hand)
  // STREAMING_STORE_BYTES as the measurements voted (choice/streaming_choice.h); -1: none was measured.
  int64_t streaming_store_bytes = -1;
};

// Collective over world (every rank on one host, at least two ranks).
EstablishedTable establish_allreduce_table(Communicator& world, const Config& config);

}  // namespace hvdlite
