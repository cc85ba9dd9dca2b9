// Two processes bounce one cache line back and forth through shared memory, with no hvdlite: the machine's own
// cross-core round trip, the floor under every small collective between two ranks.
//   cc -O2 -o /tmp/cacheline_pingpong bench/machine_state/cacheline_pingpong.c && /tmp/cacheline_pingpong 200000
// Prints the median round trip of 20 batches and the CPU each process ran on.
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const long trips = argc > 1 ? atol(argv[1]) : 200000;
  const int batches = 20;
  // ping and pong on separate cache lines, so each write moves exactly one line to the other core
  _Atomic uint64_t* shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  _Atomic uint64_t* ping = shared;
  _Atomic uint64_t* pong = shared + 8;
  atomic_store(ping, 0);
  atomic_store(pong, 0);
  pid_t child = fork();
  if (child == 0) {
    for (uint64_t i = 1; i <= (uint64_t)trips * batches; ++i) {
      while (atomic_load_explicit(ping, memory_order_acquire) != i) {
      }
      atomic_store_explicit(pong, i, memory_order_release);
    }
    printf("responder on cpu %d\n", sched_getcpu());
    return 0;
  }
  double per_trip[20];
  uint64_t i = 0;
  for (int b = 0; b < batches; ++b) {
    double start = now_ns();
    for (long k = 0; k < trips; ++k) {
      ++i;
      atomic_store_explicit(ping, i, memory_order_release);
      while (atomic_load_explicit(pong, memory_order_acquire) != i) {
      }
    }
    per_trip[b] = (now_ns() - start) / trips;
  }
  int cpu = sched_getcpu();
  waitpid(child, NULL, 0);
  qsort(per_trip, batches, sizeof per_trip[0], by_value);
  printf("round trip ns: median %.0f, min %.0f, max %.0f (initiator on cpu %d)\n", per_trip[batches / 2], per_trip[0],
         per_trip[batches - 1], cpu);
  return 0;
}
