// memcpy speed by distance between destination and source (modulo 4 KB), for one size.
//   cc -O2 -o /tmp/memcpy_distance bench/probes/memcpy_distance.c && /tmp/memcpy_distance 262144 0
// On an AMD EPYC (Zen 4) with glibc 2.36, 4 KB-1 MB copies ran at about 2 GB/s when the destination lay 1-15
// bytes after the source, against 40-70 GB/s at every other distance (hvdlite_core/src/common/copy_bytes.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  size_t n = argc > 1 ? (size_t)atol(argv[1]) : 262144;
  int source_offset = argc > 2 ? atoi(argv[2]) : 0;
  char* a = aligned_alloc(4096, n + 16384);
  char* b = aligned_alloc(4096, n + 16384);
  memset(a, 1, n + 16384);
  memset(b, 2, n + 16384);
  int slow = 0;
  for (int k = 0; k < 4096; k++) {
    char* s = a + source_offset;
    char* d = b + source_offset + k;
    memcpy(d, s, n);
    double t0 = now();
    for (int i = 0; i < 5; i++) memcpy(d, s, n);
    double gbs = n / ((now() - t0) / 5) / 1e9;
    if (gbs < 10) {
      slow++;
      printf("distance %4d: %.1f GB/s\n", k, gbs);
    }
  }
  printf("%zu bytes, source at +%d: %d of 4096 distances below 10 GB/s\n", n, source_offset, slow);
  return 0;
}
