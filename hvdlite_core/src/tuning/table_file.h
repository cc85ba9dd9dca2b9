// The tuned table of a machine: which flat allreduce algorithm runs at which size on one host, and from which size
// streaming stores pay, as python -m hvdlite.tune measured them through jobs of this machine. Every job on one host
// reads it at init; without one, the fixed rules decide (choice/select.h).
//
// One small text file per key under ALGORITHM_CACHE_DIR (default $XDG_CACHE_HOME/hvdlite, else ~/.cache/hvdlite).
// The key covers what changes the answer: the processor model and the cores online, the library version, the
// number of ranks, and the transport settings (shared-memory ring size, shm and cross-memory attach disabled or
// not); build_info names the file and the key (allreduce_table_file, allreduce_table_key), which is how the tuner
// learns them. Rank 0 reads the file and broadcasts the table, so every rank runs the same algorithms; a file that
// does not parse is ignored with a warning. Format:
//   hvdlite allreduce table v4
//   <the key>
//   allreduce rd@0,ring@92681,single_copy@11863283
//   streaming_store_bytes 67108864      (optional)
//   measured ...                         (any number: the tuner's record of its figures, not read)
#pragma once
#include <cstdint>
#include <string>

#include "choice/allreduce_table.h"
#include "collectives/communicator.h"
#include "common/config.h"

namespace hvdlite {

// Collective over world (every rank on one host, at least two ranks): the file's table, or an empty one.
TunedTable read_tuned_table(Communicator& world, const Config& config);

}  // namespace hvdlite
