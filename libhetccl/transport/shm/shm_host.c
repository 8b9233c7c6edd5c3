/* The host's copy profile: what one core moves with the ring's copy
 * (streaming stores, hetccl_shm_copy_stream) and with process_vm_readv, so
 * that the single-copy default (shm.c) follows the machine it runs on.
 *
 * Measured once per boot and shared by the host's ranks through a small
 * file, /dev/shm/hetccl-host-<boot id>: the first rank to need it takes
 * <file>.lock (O_EXCL), measures (8 MiB each way, best of three: about
 * 10 ms with the pages touched), writes the file under a temporary name and
 * renames it into place; the others wait for the file (at most
 * HOST_WAIT_MS; a lock older than HOST_STALE_S is a crashed rank's, and
 * taken over). Whoever cannot read or write /dev/shm measures for itself.
 *
 * Why these two figures: the ring copies each byte twice, once into a slot
 * that stays in cache and once out of it with streaming stores (two passes
 * over memory); process_vm_readv copies it once, in the kernel, with
 * ordinary stores (on some cores three passes: the destination is read for
 * ownership). Where the kernel's copy runs as fast as ours, one copy is
 * half the CPU work for the same memory traffic; where it runs well below,
 * the CPU was never the bound and the ring's lighter traffic wins (2-core
 * development VM: 7.4 against 12 GB/s, the ring ahead by 10-30 %).
 *
 * What the profile decides, single copy's default (hetccl_shm_cma_choice),
 * is here too, with the text that says why: shm.c logs it at a
 * communicator's init, and the transport's host_info (`hetccl info`)
 * shows it beside the receive helper's.
 *
 * Thread: the one creating a communicator (shm_ctx_create), or a tool's
 * (host_info); pure but for the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transport/shm/shm.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

#define HOST_MAGIC "hetccl-host-profile 1"
#define HOST_BYTES (8u << 20)
#define HOST_PIECE (2u << 20) /* as the data path's process_vm_readv pieces */
#define HOST_REPS 3
#define HOST_WAIT_MS 2000
#define HOST_STALE_S 10

static double seconds(void) { return (double)hetccl_shm_now_ns() * 1e-9; }

static int read_profile(const char *path, hetccl_shm_host_t *out) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char magic[64] = {0};
  hetccl_shm_host_t p = {0};
  int ok = fgets(magic, sizeof(magic), f) && !strncmp(magic, HOST_MAGIC, strlen(HOST_MAGIC)) &&
           fscanf(f, "stream_gbps %lf cma_gbps %lf", &p.stream_gbps, &p.cma_gbps) == 2 &&
           p.stream_gbps > 0;
  fclose(f);
  if (ok) *out = p;
  return ok;
}

/* The measurement itself: best of HOST_REPS, 0 for what cannot run. */
static void measure(hetccl_shm_host_t *out) {
  memset(out, 0, sizeof(*out));
  void *src = NULL, *dst = NULL;
  if (posix_memalign(&src, 2u << 20, HOST_BYTES) || posix_memalign(&dst, 2u << 20, HOST_BYTES)) {
    free(src);
    return;
  }
  /* Large buffers are huge-page backed where users' are (numpy, torch). */
  madvise(src, HOST_BYTES, MADV_HUGEPAGE);
  madvise(dst, HOST_BYTES, MADV_HUGEPAGE);
  memset(src, 1, HOST_BYTES);
  memset(dst, 2, HOST_BYTES);
  double best_stream = 1e9, best_cma = 1e9;
  int cma_ok = 1;
  for (int r = 0; r < HOST_REPS; r++) {
    double t = seconds();
    hetccl_shm_copy_stream(dst, src, HOST_BYTES);
    t = seconds() - t;
    if (t < best_stream) best_stream = t;
    t = seconds();
    for (size_t off = 0; off < HOST_BYTES && cma_ok; off += HOST_PIECE) {
      struct iovec l = {(char *)dst + off, HOST_PIECE}, rm = {(char *)src + off, HOST_PIECE};
      cma_ok = process_vm_readv(getpid(), &l, 1, &rm, 1, 0) == (ssize_t)HOST_PIECE;
    }
    t = seconds() - t;
    if (t < best_cma) best_cma = t;
  }
  out->stream_gbps = HOST_BYTES / best_stream / 1e9;
  out->cma_gbps = cma_ok ? HOST_BYTES / best_cma / 1e9 : 0;
  free(src);
  free(dst);
}

static int boot_id(char *buf, size_t len) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return 0;
  int ok = fgets(buf, (int)len, f) != NULL;
  fclose(f);
  buf[strcspn(buf, "\n")] = '\0';
  for (char *p = buf; *p; p++)
    if (*p == '/') *p = '_';
  return ok && buf[0];
}

static void publish(const char *path, const hetccl_shm_host_t *p) {
  char tmp[160];
  snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%s\nstream_gbps %.3f cma_gbps %.3f\n", HOST_MAGIC, p->stream_gbps, p->cma_gbps);
  if (fclose(f) == 0 && rename(tmp, path) == 0) return;
  unlink(tmp);
}

void hetccl_shm_host_profile(hetccl_shm_host_t *out) {
  char id[64], path[128], lock[140];
  if (!boot_id(id, sizeof(id))) {
    measure(out);
    return;
  }
  snprintf(path, sizeof(path), "/dev/shm/hetccl-host-%s", id);
  snprintf(lock, sizeof(lock), "%s.lock", path);
  int64_t start = hetccl_shm_now_ns();
  while (!read_profile(path, out)) {
    int fd = open(lock, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) {
      close(fd);
      measure(out);
      publish(path, out);
      unlink(lock);
      INFO(HETCCL_SHM | HETCCL_INIT, "shm: measured this host: streaming copy %.1f GB/s, "
           "process_vm_readv %.1f GB/s (%s)", out->stream_gbps, out->cma_gbps, path);
      return;
    }
    if (errno != EEXIST) { /* no /dev/shm to share it through */
      measure(out);
      return;
    }
    struct stat st;
    if (stat(lock, &st) == 0 && time(NULL) - st.st_mtime > HOST_STALE_S && unlink(lock) == 0)
      continue; /* a crashed rank's lock: retake it */
    if (hetccl_shm_now_ns() - start > (int64_t)HOST_WAIT_MS * 1000000) {
      measure(out); /* the measuring rank is slow or gone: do not wait on it */
      return;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* --- what the profile decides ------------------------------------------------------ */

int hetccl_shm_cma_choice(int local, char *why, size_t len) {
  if (hetccl_knob_is_set(HETCCL_KNOB_SHM_CMA)) {
    int on = (int)hetccl_knob_int(HETCCL_KNOB_SHM_CMA);
    snprintf(why, len, "single copy %s (HETCCL_SHM_CMA=%d)", on ? "on" : "off", on);
    return on;
  }
  long ncpu = hetccl_host_cpus();
  if (ncpu > 0 && local > ncpu) {
    snprintf(why, len, "single copy on by default here: %d ranks on %ld CPUs (the CPUs, not "
             "the memory, are what the ranks wait on)", local, ncpu);
    return 1;
  }
  if (ncpu < SHM_CMA_MIN_CPUS) {
    snprintf(why, len, "single copy off by default here: %ld CPUs (fewer than %d: the ring's "
             "copies are bound by memory, not by the CPUs)", ncpu, SHM_CMA_MIN_CPUS);
    return 0;
  }
  hetccl_shm_host_t h;
  hetccl_shm_host_profile(&h);
  int on = h.cma_gbps > 0 && h.cma_gbps >= SHM_CMA_RATIO * h.stream_gbps;
  snprintf(why, len, "single copy %s by default here: %ld CPUs, process_vm_readv %.1f GB/s, "
           "streaming copy %.1f GB/s (ratio %.2f, at least %.2f wanted)", on ? "on" : "off",
           ncpu, h.cma_gbps, h.stream_gbps, h.stream_gbps > 0 ? h.cma_gbps / h.stream_gbps : 0.0,
           SHM_CMA_RATIO);
  return on;
}

void hetccl_shm_host_info(int local, char *buf, size_t len) {
  char cma[256], help[192];
  hetccl_shm_cma_choice(local, cma, sizeof(cma));
  hetccl_shm_help_choice(local, help, sizeof(help));
  snprintf(buf, len, "%s; %s", cma, help);
}
