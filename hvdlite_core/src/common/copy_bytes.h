// copy_bytes: memcpy, minus one pathological case. On some processors glibc's `rep movsb` path for mid-sized
// blocks (about 4 KB to 1 MB) runs many times slower when the destination lies just after the source modulo 4 KB;
// the rings and fusion buffer put transfers at whatever offset the stream reached, so jobs hit it at some sizes and
// not others. Near such distances this copies with plain 16-byte vector moves instead.
#pragma once
#include <cstddef>

namespace hvdlite {

void copy_bytes(void* dst, const void* src, size_t n);

// Copies with non-temporal (streaming) stores, then fences them: for a destination that is not in cache and will
// not be read soon, this saves the read of every destination line before it is written.
void copy_bytes_streaming(void* dst, const void* src, size_t n);

}  // namespace hvdlite
