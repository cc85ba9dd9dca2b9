// copy_bytes: memcpy, minus one pathological case.
//
// glibc's memcpy copies mid-sized blocks (about 4 KB to 1 MB) with `rep movsb`. On AMD EPYC (measured on a
// Zen 4 core with glibc 2.36) that runs 20-25x slower, about 2.3 GB/s against 45-70, when the destination lies
// 1-15 bytes after the source modulo 4 KB. Other distances are fast. The rings and fusion buffer
// put a transfer at whatever stream offset the bytes before it left, so every job met this case at some sizes and
// not others: the "slow mode" of docs/benchmarks.md. Near such distances this copies with plain 16-byte vector
// moves instead (about 20 GB/s in cache, at any distance).
#pragma once
#include <cstddef>

namespace hvdlite {

void copy_bytes(void* dst, const void* src, size_t n);

// Copies with non-temporal (streaming) stores, then fences them: for a destination that is not in cache and will
// not be read soon, this saves the read of every destination line before it is written.
void copy_bytes_streaming(void* dst, const void* src, size_t n);

}  // namespace hvdlite
