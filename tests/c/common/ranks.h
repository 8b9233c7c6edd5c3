/* Ranks as forked processes, below any bootstrap of the library: pids,
 * barriers and published blobs go through one anonymous shared mapping made
 * before the fork, so a test of a layer under the bootstrap (a transport)
 * needs nothing of the layers above it.
 *
 * Every rank is a process of its own, bounded by alarm(); a check that fails
 * prints the rank, file and line and ends the rank with status 1; the
 * parent reports each rank that did not exit 0. */
#ifndef HETCCL_TESTS_RANKS_H
#define HETCCL_TESTS_RANKS_H

#include <stdint.h>

#include "nccl.h"

#define TC_MAX_RANKS 8
#define TC_AREAS 16       /* blob exchange areas: one per context a test makes */
#define TC_BLOB_BYTES 128 /* per rank per area */

extern int tc_rank;   /* -1 in the parent */
extern int tc_nranks;
extern int tc_alive;  /* ranks that take part in tc_barrier(): lower it when one leaves */

__attribute__((noreturn, format(printf, 3, 4))) void tc_fail(const char *file, int line,
                                                            const char *fmt, ...);
#define FAIL(...) tc_fail(__FILE__, __LINE__, __VA_ARGS__)
#define CHK(call)                                                              \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) FAIL("%s -> %d", #call, (int)r_);                   \
  } while (0)

double tc_now_s(void); /* monotonic */

/* Forks nranks ranks (2..TC_MAX_RANKS), each running rank_main(arg) once
 * every pid is known and ending with exit(its result) (exit, not _exit: a
 * leak checker looks at each rank); waits for all of them. Returns 0 when
 * every rank exited 0. alarm_s bounds each rank. */
int tc_run(int nranks, unsigned alarm_s, int (*rank_main)(void *), void *arg);

/* Sleeps rather than spins (more ranks than cores); fails after 60 s. */
void tc_barrier(void);

int tc_pid(int rank);
/* Waits until `rank` has exited (a zombie until the parent reaps it): its
 * files and sockets are closed by then. Fails after `secs`. */
void tc_wait_exit(int rank, double secs);
/* TC_BLOB_BYTES of this rank's blob in `area`; read the others' after a
 * barrier. */
void tc_publish(int area, const void *blob);
const uint8_t *tc_blob(int area, int rank);
/* Shared words (TC_WORDS), zero at the start: one rank tells another how
 * far it got while both run. */
#define TC_WORDS 16
_Atomic uint64_t *tc_word(int i);

#endif
