/* Ranks as forked processes, and a unique id made after the fork.
 *
 * A test forks its ranks before anything of the library runs: making a
 * unique id starts the bootstrap root thread, and a child forked from a
 * threaded parent can inherit a lock (malloc's, a sanitizer's) that another
 * thread held at the fork, and hang on it. So rank 0 makes the id (its
 * process then runs the root) and writes one copy per other rank into a
 * pipe made before the fork; each other rank reads one (a write this small
 * is atomic). If rank 0 dies first, the others read end-of-file. */
#ifndef HETCCL_TESTS_SHARE_ID_H
#define HETCCL_TESTS_SHARE_ID_H

#include <unistd.h>

#include "nccl.h"

/* In each rank after the fork; idpipe from pipe() before it; make is
 * ncclGetUniqueId or hetccl_bootstrap_root_create. 0 on success. */
static inline int share_id(ncclUniqueId *id, int idpipe[2], int rank, int nranks,
                           ncclResult_t (*make)(ncclUniqueId *)) {
  int ok = 1;
  if (rank == 0) {
    close(idpipe[0]);
    ok = make(id) == ncclSuccess;
    for (int r = 1; r < nranks && ok; r++)
      ok = write(idpipe[1], id, sizeof(*id)) == (ssize_t)sizeof(*id);
    close(idpipe[1]);
  } else {
    close(idpipe[1]);
    ok = read(idpipe[0], id, sizeof(*id)) == (ssize_t)sizeof(*id);
    close(idpipe[0]);
  }
  return ok ? 0 : -1;
}

#endif
