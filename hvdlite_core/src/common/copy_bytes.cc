#include "common/copy_bytes.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace hvdlite {
namespace {

// The window avoided: distances of 1-15 bytes are the slow ones; up to 63 keeps a margin for other processors, at
// the price of a vector loop slower than memcpy's best.
constexpr uintptr_t kNearDistance = 64;
constexpr size_t kRepMovsbFrom = 2048;  // below this glibc copies with vector moves itself

#if defined(__x86_64__)
// Copies whole 64-byte blocks with 16-byte vector moves and returns the bytes copied; kStreaming stores them
// non-temporally (the destination must then be 16-byte aligned).
template <bool kStreaming>
size_t copy_blocks(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16 * k));
    for (int k = 0; k < 4; ++k) {
      auto* to = reinterpret_cast<__m128i*>(dst + i + 16 * k);
      if (kStreaming) {
        _mm_stream_si128(to, v[k]);
      } else {
        _mm_storeu_si128(to, v[k]);
      }
    }
  }
  return i;
}

void copy_vectors(char* dst, const char* src, size_t n) {
  const size_t i = copy_blocks<false>(dst, src, n);
  if (i < n) std::memcpy(dst + i, src + i, n - i);  // under 64 bytes: no rep movsb
}
#endif

}  // namespace

void copy_bytes_streaming(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  if (head) std::memcpy(d, s, head);
  const size_t i = head + copy_blocks<true>(d + head, s + head, n - head);
  if (i < n) std::memcpy(d + i, s + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: make them visible before the transfer is marked done
#else
  std::memcpy(dst, src, n);
#endif
}

void copy_bytes(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  const uintptr_t distance = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) % 4096;
  if (n >= kRepMovsbFrom && distance != 0 && distance < kNearDistance) {
    copy_vectors(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace hvdlite
