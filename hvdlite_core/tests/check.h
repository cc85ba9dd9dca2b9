// The unit tests' one assertion: counts checks and failures, prints each failure, never stops (no framework).
#pragma once
#include <cstdio>

extern int g_failures;
extern int g_checks;

#define CHECK(cond)                                                 \
  do {                                                              \
    ++g_checks;                                                     \
    if (!(cond)) {                                                  \
      ++g_failures;                                                 \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                               \
  } while (0)
