#include "common/wait.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace hvdlite {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  release_held_lock();
  struct timespec timeout;
  timeout.tv_sec = timeout_us / 1000000;
  timeout.tv_nsec = (timeout_us % 1000000) * 1000;
  // Not FUTEX_PRIVATE: the word may be in a segment mapped by several processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

HeldLock& held_lock() {
  thread_local HeldLock held;
  return held;
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
}

}  // namespace hvdlite
