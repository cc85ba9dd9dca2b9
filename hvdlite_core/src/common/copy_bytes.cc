#include "common/copy_bytes.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace hvdlite {
namespace {

// The window avoided: 1-15 bytes is what was measured slow; up to 63 keeps a margin for other cores, where the
// vector loop costs at most about half of memcpy's best.
constexpr uintptr_t kNearDistance = 64;
constexpr size_t kRepMovsbFrom = 2048;  // below this glibc copies with vector moves itself

#if defined(__x86_64__)
void copy_vectors(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
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
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
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
