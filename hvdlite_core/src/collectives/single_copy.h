// Helpers for single-copy algorithms on one host: publish buffer addresses to every member through the
// channels (which doubles as an arrival barrier), and read or write a peer's memory with process_vm_readv/writev.
#pragma once
#include <cstdint>
#include <vector>

#include "collectives/communicator.h"

namespace hvdlite {

struct PublishedBuffers {
  uint64_t input;
  uint64_t output;
};

// Every member sends its addresses to every other member; returns them by member index. Returns only once
// every member has called it, so it also orders "inputs are ready" before any remote read.
std::vector<PublishedBuffers> exchange_addresses(Communicator& comm, const void* input, const void* output);
// Copies bytes from member's address space at remote_address into local memory. Throws on failure.
void read_peer(Communicator& comm, int member, uint64_t remote_address, void* local, size_t bytes);
// Copies bytes from local memory into member's address space at remote_address. Throws on failure.
void write_peer(Communicator& comm, int member, const void* local, uint64_t remote_address, size_t bytes);

}  // namespace hvdlite
