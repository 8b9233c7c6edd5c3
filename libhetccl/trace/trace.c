/* The per-operation trace (trace.h): per-thread event buffers, and the
 * writer that turns them into one Chrome trace-event file per rank.
 *
 * Thread: recording runs on whichever thread reaches a trace point and
 * touches only that thread's buffer (its `used` count is published with a
 * release store, after the event's fields). The list of buffers and of
 * lanes is guarded by bufs_lock, taken at a thread's first event, at its
 * exit and by the writer; the writer (flush_lock) reads each buffer up to
 * its published count, never further, so it may run while others record. */
#include "trace/trace.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util/knobs.h"
#include "util/log.h"

/* Message lanes: tid LANE_BASE + 2 * peer (+ 1 for receives), above any
 * thread id Linux hands out (pid_max is at most 2^22). */
#define LANE_BASE (1 << 24)
/* pid of rank r: r + 1, as Perfetto takes pid 0 for the kernel's idle
 * task; process_name says "rank r". */
#define PID_OF(rank) ((rank) + 1)

int hetccl_trace_on;

typedef struct trace_event {
  uint64_t t0, t1;
  uint64_t comm, bytes;
  const char *name, *op, *dtype;
  int32_t rank, peer, root, step;
  uint32_t seq;
  int32_t tid;
  uint8_t kind;
} trace_event_t;

typedef struct trace_buf {
  struct trace_buf *next;
  trace_event_t *ev;
  uint32_t cap;
  uint32_t used;    /* written by the owner only; release-published */
  uint64_t dropped; /* relaxed atomics */
  int retired;      /* its thread exited: the next new thread takes it (bufs_lock) */
} trace_buf_t;

/* A thread that recorded, for its lane's name. */
typedef struct trace_lane {
  int32_t tid;
  const char *name;
} trace_lane_t;

typedef struct trace_ctx {
  int rank;
  uint64_t comm;
  uint32_t seq;
  int call_open;
} trace_ctx_t;

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static ncclResult_t setup_result;
static int setup_errno; /* why setup failed */
static const char *pattern; /* HETCCL_TRACE, kept by the knob table */
static uint32_t capacity;
static char host[64] = "?";

static pthread_mutex_t bufs_lock = PTHREAD_MUTEX_INITIALIZER;
static trace_buf_t *bufs;
static trace_lane_t *lanes;
static int nlanes, lanes_cap;
static uint64_t lost; /* events of threads whose buffer could not be allocated */
static pthread_key_t exit_key;

static pthread_mutex_t flush_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t flushed_total = UINT64_MAX; /* events + drops at the last write */

static __thread trace_buf_t *my_buf;
static __thread int my_lane = -1; /* index in lanes */
static __thread int32_t my_tid;
static __thread const char *my_name;
static __thread trace_ctx_t ctx = {.rank = HETCCL_TRACE_NONE, .seq = HETCCL_TRACE_NO_SEQ};

static const char *const kind_cat[HETCCL_TRACE_KIND_COUNT] = {
#define HETCCL_TRACE_KIND_CAT(id, cat) [HETCCL_TRACE_##id] = cat,
    HETCCL_TRACE_KINDS(HETCCL_TRACE_KIND_CAT)
#undef HETCCL_TRACE_KIND_CAT
};

uint64_t hetccl_trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- file names ------------------------------------------------------------------ */

/* The pattern with %r (rank), %p (pid), %h (host), %% expanded; with no
 * %r, ".<rank>" goes before a final ".json", else ".<rank>.json" after. */
static void trace_path(char *out, size_t len, int rank) {
  size_t k = 0;
  int has_rank = 0;
  for (const char *s = pattern; *s && k + 1 < len; s++) {
    char piece[80];
    const char *add = piece;
    piece[0] = s[0];
    piece[1] = '\0';
    if (s[0] == '%' && s[1]) {
      s++;
      switch (*s) {
        case 'r': snprintf(piece, sizeof(piece), "%d", rank); has_rank = 1; break;
        case 'p': snprintf(piece, sizeof(piece), "%d", (int)getpid()); break;
        case 'h': add = host; break;
        case '%': piece[0] = '%'; break;
        default: snprintf(piece, sizeof(piece), "%%%c", *s); break;
      }
    }
    k += (size_t)snprintf(out + k, len - k, "%s", add);
    if (k >= len) k = len - 1;
  }
  out[k] = '\0';
  if (has_rank) return;
  size_t n = strlen(out);
  if (n >= 5 && strcmp(out + n - 5, ".json") == 0) out[n - 5] = '\0';
  n = strlen(out);
  snprintf(out + n, len - n, ".%d.json", rank);
}

/* --- set-up ------------------------------------------------------------------------ */

/* A thread exits: its buffer goes to the next thread that records. */
static void buf_retire(void *arg) {
  trace_buf_t *b = arg;
  pthread_mutex_lock(&bufs_lock);
  b->retired = 1;
  pthread_mutex_unlock(&bufs_lock);
}

static void at_exit(void) { hetccl_trace_flush(); }

static void setup(void) {
  pattern = hetccl_knob_str(HETCCL_KNOB_TRACE);
  if (!pattern[0]) return;
  capacity = (uint32_t)hetccl_knob_int(HETCCL_KNOB_TRACE_EVENTS);
  gethostname(host, sizeof(host) - 1);
  /* A file that could never be written fails init, as a bad knob does,
   * rather than vanishing at the end of the run. */
  char path[PATH_MAX], dir[PATH_MAX];
  trace_path(path, sizeof(path), 0);
  snprintf(dir, sizeof(dir), "%s", path);
  if (access(dirname(dir), W_OK) != 0) {
    setup_errno = errno;
    setup_result = ncclInvalidArgument;
    return;
  }
  if ((setup_errno = pthread_key_create(&exit_key, buf_retire)) != 0) {
    setup_result = ncclSystemError;
    return;
  }
  atexit(at_exit);
  __atomic_store_n(&hetccl_trace_on, 1, __ATOMIC_RELEASE);
}

ncclResult_t hetccl_trace_setup(void) {
  pthread_once(&setup_once, setup);
  if (setup_result == ncclInvalidArgument) {
    char path[PATH_MAX];
    trace_path(path, sizeof(path), 0);
    WARN("HETCCL_TRACE=%s: cannot write %s: its directory: %s", pattern, path,
         strerror(setup_errno));
  } else if (setup_result != ncclSuccess) {
    WARN("HETCCL_TRACE: pthread_key_create: %s", strerror(setup_errno));
  }
  return setup_result;
}

/* --- recording ------------------------------------------------------------------- */

/* Under bufs_lock. */
static int lane_add(int32_t tid, const char *name) {
  if (nlanes == lanes_cap) {
    int cap = lanes_cap ? 2 * lanes_cap : 16;
    trace_lane_t *l = realloc(lanes, (size_t)cap * sizeof(*l));
    if (!l) return -1;
    lanes = l;
    lanes_cap = cap;
  }
  lanes[nlanes] = (trace_lane_t){tid, name};
  return nlanes++;
}

/* This thread's buffer: a retired one, else a new one; NULL if none could
 * be allocated (the event is counted as lost). */
static trace_buf_t *buf_get(void) {
  if (my_buf) return my_buf;
  int32_t tid = (int32_t)syscall(SYS_gettid);
  pthread_mutex_lock(&bufs_lock);
  trace_buf_t *b = bufs;
  while (b && !b->retired) b = b->next;
  if (b) {
    b->retired = 0;
  } else if ((b = calloc(1, sizeof(*b))) != NULL) {
    b->ev = malloc((size_t)capacity * sizeof(*b->ev));
    if (!b->ev) {
      free(b);
      b = NULL;
    } else {
      b->cap = capacity;
      b->next = bufs;
      bufs = b;
    }
  }
  if (b) my_lane = lane_add(tid, my_name ? my_name : "API thread");
  my_tid = tid;
  pthread_mutex_unlock(&bufs_lock);
  if (!b) return NULL;
  pthread_setspecific(exit_key, b);
  my_buf = b;
  return b;
}

void hetccl_trace_thread_name(const char *name) {
  my_name = name;
  if (my_lane < 0) return;
  pthread_mutex_lock(&bufs_lock);
  lanes[my_lane].name = name;
  pthread_mutex_unlock(&bufs_lock);
}

void hetccl_trace_record_span(uint64_t t0, uint64_t t1, const hetccl_trace_ev_t *ev) {
  trace_buf_t *b = buf_get();
  if (!b) {
    __atomic_add_fetch(&lost, 1, __ATOMIC_RELAXED);
    return;
  }
  uint32_t used = b->used;
  if (used >= b->cap) {
    __atomic_add_fetch(&b->dropped, 1, __ATOMIC_RELAXED);
    return;
  }
  trace_event_t *e = &b->ev[used];
  e->t0 = t0;
  e->t1 = t1 > t0 ? t1 : t0;
  e->comm = ev->comm ? ev->comm : ctx.comm;
  e->bytes = ev->bytes;
  e->name = ev->name;
  e->op = ev->op;
  e->dtype = ev->dtype;
  e->rank = ev->rank != HETCCL_TRACE_NONE ? ev->rank : ctx.rank;
  e->peer = ev->peer;
  e->root = ev->root;
  e->step = ev->step;
  e->seq = ev->seq != HETCCL_TRACE_NO_SEQ ? ev->seq : ctx.seq;
  e->kind = (uint8_t)ev->kind;
  e->tid = ev->kind == HETCCL_TRACE_SEND || ev->kind == HETCCL_TRACE_RECV
               ? LANE_BASE + 2 * ev->peer + (ev->kind == HETCCL_TRACE_RECV)
               : my_tid;
  __atomic_store_n(&b->used, used + 1, __ATOMIC_RELEASE);
}

void hetccl_trace_record(uint64_t t0, const hetccl_trace_ev_t *ev) {
  hetccl_trace_record_span(t0, hetccl_trace_now(), ev);
}

uint64_t hetccl_trace_context(int rank, uint64_t comm, uint32_t seq) {
  ctx.rank = rank;
  ctx.comm = comm;
  ctx.seq = seq;
  return hetccl_trace_now();
}

int hetccl_trace_context_rank(void) { return ctx.rank; }

uint64_t hetccl_trace_call_begin(int rank, uint64_t comm, uint32_t seq) {
  if (ctx.call_open) return 0;
  ctx.call_open = 1;
  return hetccl_trace_context(rank, comm, seq);
}

void hetccl_trace_call_end(uint64_t t0, const hetccl_trace_ev_t *ev) {
  hetccl_trace_record(t0, ev);
  ctx.call_open = 0;
}

uint32_t hetccl_trace_seq(void) { return ctx.seq; }

/* --- writing ------------------------------------------------------------------------ */

/* Rank, then start, then the longer first (an enclosing event before
 * what it encloses). */
static int by_rank_time(const void *a, const void *b) {
  const trace_event_t *x = *(trace_event_t *const *)a, *y = *(trace_event_t *const *)b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
  uint64_t dx = x->t1 - x->t0, dy = y->t1 - y->t0;
  return dx == dy ? 0 : dx > dy ? -1 : 1;
}

/* Microseconds with three decimals, exact. */
static void put_us(FILE *f, uint64_t ns) {
  fprintf(f, "%llu.%03llu", (unsigned long long)(ns / 1000), (unsigned long long)(ns % 1000));
}

static void put_text(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s >= 0x20) fputc(*s, f);
  }
  fputc('"', f);
}

static void put_event(FILE *f, const trace_event_t *e) {
  fputs("{\"name\":", f);
  put_text(f, e->name ? e->name : "?");
  fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":", kind_cat[e->kind]);
  put_us(f, e->t0);
  fputs(",\"dur\":", f);
  put_us(f, e->t1 - e->t0);
  fprintf(f, ",\"pid\":%d,\"tid\":%d,\"args\":{", PID_OF((int)e->rank), (int)e->tid);
  const char *sep = "";
  if (e->kind != HETCCL_TRACE_GROUP && e->kind != HETCCL_TRACE_STAGE) {
    fprintf(f, "\"bytes\":%llu", (unsigned long long)e->bytes);
    sep = ",";
  }
  if (e->op) fprintf(f, "%s\"op\":", sep), put_text(f, e->op), sep = ",";
  if (e->dtype) fprintf(f, "%s\"dtype\":", sep), put_text(f, e->dtype), sep = ",";
  if (e->comm) fprintf(f, "%s\"comm\":\"0x%016llx\"", sep, (unsigned long long)e->comm), sep = ",";
  if (e->seq != HETCCL_TRACE_NO_SEQ) fprintf(f, "%s\"seq\":%u", sep, e->seq), sep = ",";
  if (e->peer != HETCCL_TRACE_NONE) fprintf(f, "%s\"peer\":%d", sep, e->peer), sep = ",";
  if (e->root != HETCCL_TRACE_NONE) fprintf(f, "%s\"root\":%d", sep, e->root), sep = ",";
  if (e->step != HETCCL_TRACE_NONE) fprintf(f, "%s\"step\":%d", sep, e->step);
  fputs("}}", f);
}

/* The name of lane tid: a thread's (the last to hold that id), or a
 * message lane's. */
static void lane_name(int32_t tid, const trace_lane_t *ls, int n, char *buf, size_t len) {
  if (tid >= LANE_BASE) {
    int peer = (tid - LANE_BASE) / 2, recv = (tid - LANE_BASE) % 2;
    snprintf(buf, len, "%s rank %d", recv ? "recv from" : "send to", peer);
    return;
  }
  snprintf(buf, len, "thread %d", (int)tid);
  for (int i = n - 1; i >= 0; i--)
    if (ls[i].tid == tid) {
      snprintf(buf, len, "%s %d", ls[i].name, (int)tid);
      return;
    }
}

static void put_meta(FILE *f, const char *what, int pid, int tid, const char *key,
                     const char *text, long number) {
  fprintf(f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", what, pid,
          tid, key);
  if (text) put_text(f, text);
  else fprintf(f, "%ld", number);
  fputs("}},\n", f);
}

/* One rank's file: its events ev[0..n) (sorted), lanes named, metadata.
 * 0, or -1 with errno. */
static int write_rank(const char *path, trace_event_t **ev, size_t n, const trace_lane_t *ls,
                      int nls, uint64_t dropped) {
  int rank = ev[0]->rank;
  char tmp[PATH_MAX + 32], name[64];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fputs("{\"traceEvents\":[\n", f);
  snprintf(name, sizeof(name), "rank %d", rank);
  put_meta(f, "process_name", PID_OF(rank), 0, "name", name, 0);
  put_meta(f, "process_sort_index", PID_OF(rank), 0, "sort_index", NULL, rank);
  int32_t seen[256];
  int nseen = 0;
  for (size_t i = 0; i < n; i++) {
    int k = 0;
    while (k < nseen && seen[k] != ev[i]->tid) k++;
    if (k < nseen || nseen == (int)(sizeof(seen) / sizeof(seen[0]))) continue;
    seen[nseen++] = ev[i]->tid;
    lane_name(ev[i]->tid, ls, nls, name, sizeof(name));
    put_meta(f, "thread_name", PID_OF(rank), ev[i]->tid, "name", name, 0);
    /* Threads first, in the order they first recorded; message lanes after. */
    put_meta(f, "thread_sort_index", PID_OF(rank), ev[i]->tid, "sort_index", NULL,
             ev[i]->tid >= LANE_BASE ? ev[i]->tid - LANE_BASE + 1000 : nseen);
  }
  for (size_t i = 0; i < n; i++) {
    put_event(f, ev[i]);
    fputs(i + 1 < n ? ",\n" : "\n", f);
  }
  fprintf(f, "],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"tool\":\"hetccl\",\"rank\":%d,"
          "\"host\":", rank);
  put_text(f, host);
  fprintf(f, ",\"pid\":%d,\"clock\":\"CLOCK_MONOTONIC\",\"events\":%zu,"
          "\"dropped_events\":%llu,\"events_per_thread\":%u}}\n",
          (int)getpid(), n, (unsigned long long)dropped, capacity);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    int err = errno ? errno : EIO;
    unlink(tmp);
    errno = err;
    return -1;
  }
  if (rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    errno = err;
    return -1;
  }
  return 0;
}

/* Every buffer's published events, sorted; *dropped: the process's drops.
 * NULL with *n = 0 when there are none (or no memory, with a WARN). */
static trace_event_t **snapshot(size_t *n, uint64_t *dropped, trace_lane_t **ls, int *nls) {
  size_t total = 0;
  *dropped = __atomic_load_n(&lost, __ATOMIC_RELAXED);
  *ls = NULL;
  *nls = 0;
  pthread_mutex_lock(&bufs_lock);
  for (trace_buf_t *b = bufs; b; b = b->next) {
    total += __atomic_load_n(&b->used, __ATOMIC_ACQUIRE);
    *dropped += __atomic_load_n(&b->dropped, __ATOMIC_RELAXED);
  }
  trace_event_t **ev = total ? malloc(total * sizeof(*ev)) : NULL;
  *ls = nlanes ? malloc((size_t)nlanes * sizeof(**ls)) : NULL;
  size_t k = 0;
  if (ev && (*ls || !nlanes)) {
    for (trace_buf_t *b = bufs; b; b = b->next) {
      uint32_t used = __atomic_load_n(&b->used, __ATOMIC_ACQUIRE);
      for (uint32_t i = 0; i < used && k < total; i++) ev[k++] = &b->ev[i];
    }
    if (nlanes) memcpy(*ls, lanes, (size_t)nlanes * sizeof(**ls));
    *nls = nlanes;
  }
  pthread_mutex_unlock(&bufs_lock);
  if (total && (!ev || (nlanes && !*ls))) {
    WARN("trace: out of memory writing %zu events", total);
    free(ev);
    free(*ls);
    *ls = NULL;
    *n = 0;
    return NULL;
  }
  qsort(ev, k, sizeof(*ev), by_rank_time);
  *n = k;
  return ev;
}

void hetccl_trace_flush(void) {
  if (!HETCCL_TRACE_ON()) return;
  pthread_mutex_lock(&flush_lock);
  size_t n;
  uint64_t dropped;
  trace_lane_t *ls;
  int nls;
  trace_event_t **ev = snapshot(&n, &dropped, &ls, &nls);
  if (n + dropped != flushed_total) {
    flushed_total = n + dropped;
    for (size_t i = 0, j; i < n; i = j) {
      for (j = i; j < n && ev[j]->rank == ev[i]->rank; j++) {}
      if (ev[i]->rank < 0) continue; /* recorded outside any call: no rank to file it under */
      char path[PATH_MAX];
      trace_path(path, sizeof(path), ev[i]->rank);
      if (write_rank(path, ev + i, j - i, ls, nls, dropped) != 0)
        WARN("trace: cannot write %s: %s", path, strerror(errno));
    }
  }
  free(ev);
  free(ls);
  pthread_mutex_unlock(&flush_lock);
}
