// The init-time measurement behind AllreduceTable (allreduce_table.h). Collective over comm, whose members must
// all be on one host; about 0.1-0.5 s on 2-4 ranks. probes_out (optional) gets the figures it chose from.
#pragma once
#include <vector>

#include "collectives/allreduce_table.h"
#include "collectives/communicator.h"

namespace hvdlite {

AllreduceTable measure_allreduce_table(Communicator& comm, std::vector<AllreduceProbe>* probes_out = nullptr);

}  // namespace hvdlite
