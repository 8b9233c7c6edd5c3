/* Forked ranks over a shared mapping (ranks.h). */
#include "ranks.h"

#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct tc_shared {
  _Atomic int count, gen, go;
  int pids[TC_MAX_RANKS];
  uint8_t blobs[TC_AREAS][TC_MAX_RANKS][TC_BLOB_BYTES];
  _Atomic uint64_t words[TC_WORDS];
} tc_shared_t;

static tc_shared_t *S;
int tc_rank = -1, tc_nranks, tc_alive;

void tc_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL rank %d (%s:%d): ", tc_rank, file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  _exit(1);
}

double tc_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tc_barrier(void) {
  int gen = atomic_load(&S->gen);
  if (atomic_fetch_add(&S->count, 1) == tc_alive - 1) {
    atomic_store(&S->count, 0);
    atomic_fetch_add(&S->gen, 1);
    return;
  }
  double t0 = tc_now_s();
  for (int i = 0; atomic_load(&S->gen) == gen; i++) {
    if (i < 100) sched_yield();
    else usleep(100);
    if (tc_now_s() - t0 > 60) FAIL("barrier timed out");
  }
}

int tc_pid(int rank) { return S->pids[rank]; }

/* The state letter of /proc/pid/stat, or 0 when the process is gone. */
static char proc_state(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parens */
  return p && p[1] == ' ' ? p[2] : 0;
}

void tc_wait_exit(int rank, double secs) {
  double deadline = tc_now_s() + secs;
  for (char st; (st = proc_state(S->pids[rank])) != 0 && st != 'Z' && st != 'X';) {
    if (tc_now_s() > deadline) FAIL("rank %d still runs after %.0f s", rank, secs);
    usleep(1000);
  }
}

void tc_publish(int area, const void *blob) {
  memcpy(S->blobs[area][tc_rank], blob, TC_BLOB_BYTES);
}

const uint8_t *tc_blob(int area, int rank) { return S->blobs[area][rank]; }

_Atomic uint64_t *tc_word(int i) { return &S->words[i]; }

int tc_run(int nranks, unsigned alarm_s, int (*rank_main)(void *), void *arg) {
  if (nranks < 2 || nranks > TC_MAX_RANKS) return 1;
  S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(S, 0, sizeof(*S));
  tc_nranks = tc_alive = nranks;
  pid_t kids[TC_MAX_RANKS];
  for (int r = 0; r < nranks; r++) {
    kids[r] = fork();
    if (kids[r] == 0) {
      tc_rank = r;
      alarm(alarm_s);
      while (!atomic_load(&S->go)) usleep(100); /* until the parent published every pid */
      exit(rank_main(arg));
    }
    S->pids[r] = kids[r];
  }
  atomic_store(&S->go, 1);
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    int st = 0;
    if (waitpid(kids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
      bad = 1;
    }
  }
  munmap(S, sizeof(*S));
  return bad;
}
