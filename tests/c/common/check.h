/* A check that counts failures and goes on, for single-process C unit
 * tests: CHECK(cond, fmt, ...) prints "FAIL file:line: message" when cond
 * is false; main returns failures != 0. */
#ifndef HETCCL_TESTS_CHECK_H
#define HETCCL_TESTS_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      failures++;                                          \
    }                                                      \
  } while (0)

#endif
