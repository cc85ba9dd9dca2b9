// Waiting without burning a core: spin briefly (the common case completes in microseconds), then sleep on a
// futex until woken or a short slice passes, so deadlines and dead peers are still noticed. On a 2-core
// machine a thread that spins for long steals the core the training step needs.
#pragma once
#include <time.h>

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

// The monotonic clock as of the kernel's last tick, on Clock's time line: never ahead of Clock::now(), behind it by
// less than coarse_tick(). For ages checked against seconds (stalls, out-of-step ranks), where the precise clock
// would be read on every operation for nothing: on a VM a precise reading costs about 20 ns, a coarse one a few.
inline Clock::time_point coarse_now() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(now.tv_sec) +
                                                                       std::chrono::nanoseconds(now.tv_nsec)));
}

// The coarse clock's resolution: coarse_now() + coarse_tick() is never before the true time, so an age measured
// from such a stamp to a later coarse_now() never exceeds the true age (a limit is not reported early).
inline Clock::duration coarse_tick() {
  static const Clock::duration tick = [] {
    timespec resolution;
    clock_getres(CLOCK_MONOTONIC_COARSE, &resolution);
    return std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(resolution.tv_sec) +
                                                       std::chrono::nanoseconds(resolution.tv_nsec));
  }();
  return tick;
}

// A lock that a caller holds through its call into the core and that its process's other threads may need: Python's
// GIL, kept through a steady-state collective of a microsecond, of which giving it up and taking it back would be a
// noticeable part. The core gives it up, once, before the call may wait for long: a spin for a late peer past
// kHeldLockSpinMicroseconds, a sleep, a cycle driven for other operations. The caller takes it back after the call.
struct HeldLock {
  void (*release)(void*) = nullptr;  // null: no lock held, or given up already
  void* context = nullptr;
};
constexpr int64_t kHeldLockSpinMicroseconds = 20;
HeldLock& held_lock();  // this thread's
inline void release_held_lock() {
  HeldLock& held = held_lock();
  if (!held.release) return;
  void (*release)(void*) = held.release;
  held.release = nullptr;
  release(held.context);
}

inline int64_t micros_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

}  // namespace hvdlite
