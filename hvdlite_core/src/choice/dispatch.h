// The built-in backend's collectives: each asks the chooser (chooser.h) and runs the algorithm it names.
// Every member calls with matching arguments (negotiation guarantees it), so every member runs the same plan.
#pragma once
#include <cstddef>
#include <vector>

#include "choice/chooser.h"
#include "collectives/algorithms.h"

namespace hvdlite {

// output = reduce(input over members) * postscale. input may equal output. Returns the name of what ran (the
// timeline's label; "" when nothing was exchanged).
const char* allreduce(const Chooser& chooser, Communicator& comm, const void* input, void* output, size_t count,
                      DType dtype, ReduceKind kind, double postscale = 1.0);
// output = concatenation of every member's block; block_bytes[i] is member i's size. Returns what ran.
const char* allgather(const Chooser& chooser, Communicator& comm, const void* input, void* output,
                      const std::vector<size_t>& block_bytes);
void broadcast(const Chooser& chooser, Communicator& comm, void* buffer, size_t bytes, int root_index);

}  // namespace hvdlite
