// Waiting without burning a core: spin briefly (the common case completes in microseconds), then sleep on a
// futex until woken or a short slice passes, so deadlines and dead peers are still noticed. On a 2-core
// machine a thread that spins for long steals the core the training step needs.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace hvdlite {

using Clock = std::chrono::steady_clock;

// Futex on a 32-bit word, shared across processes when the word lives in shared memory.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us);
void futex_wake_all(std::atomic<uint32_t>* word);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline int64_t micros_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

}  // namespace hvdlite
