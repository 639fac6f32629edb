// FTRUN_CHECK: for broken invariants only (a bug in ftrun), never for bad
// input or I/O failures, which return a Status. Prints and aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FTRUN_CHECK(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: FTRUN_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
