// The init-time measurement behind AllreduceTable (allreduce_table.h). Collective over comm, whose members must
// all be on one host; about 0.1-0.8 s on 2-8 ranks (HVDLITE_LOG_LEVEL=info prints the figures).
#pragma once
#include "collectives/allreduce_table.h"
#include "collectives/communicator.h"

namespace hvdlite {

AllreduceTable measure_allreduce_table(Communicator& comm);

}  // namespace hvdlite
