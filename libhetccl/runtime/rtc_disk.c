/* Compiled reduction kernels kept on disk (rtc.h), so that only the first
 * process on a machine pays a variant's compile (0.1 to 1.4 s each with
 * NVRTC 13 on an H100 host), not every process's first call.
 *
 * A file per (vendor, target, compiler version, variant, kernel text):
 * the name holds a hash of all of them, so a changed kernel or compiler
 * never meets an old image. Written to a temporary name and renamed, so a
 * reader sees a whole file or none; a file that cannot be read or written
 * is only a miss (logged at INFO), never an error.
 *
 * Where: HETCCL_RTC_CACHE, else $XDG_CACHE_HOME/hetccl, else
 * ~/.cache/hetccl; HETCCL_RTC_CACHE=none turns it off.
 *
 * Thread: any (called with the compile lock held). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rtc.h"
#include "util/knobs.h"
#include "util/log.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
}

/* The cache directory (created), or 0 when there is none. */
static int cache_dir(char *out, size_t len) {
  const char *knob = hetccl_knob_str(HETCCL_KNOB_RTC_CACHE);
  if (!strcmp(knob, "none")) return 0;
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (knob[0]) snprintf(out, len, "%s", knob);
  else if (xdg && xdg[0]) snprintf(out, len, "%s/hetccl", xdg);
  else if (home && home[0]) snprintf(out, len, "%s/.cache/hetccl", home);
  else return 0;
  /* Each level; an existing one is fine. */
  for (char *p = out + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(out, 0700);
    *p = '/';
  }
  return mkdir(out, 0700) == 0 || errno == EEXIST;
}

static int cache_path(const char *vendor, const char *target, int version,
                      const hetccl_rtc_variant_t *v, char *out, size_t len) {
  char dir[512];
  if (!cache_dir(dir, sizeof(dir))) return 0;
  const char *defs[HETCCL_RTC_MAX_DEFINES];
  size_t nd = hetccl_rtc_defines(v, defs);
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv1a(h, hetccl_rtc_kernel_source, strlen(hetccl_rtc_kernel_source));
  for (size_t i = 0; i < nd; i++) h = fnv1a(h, defs[i], strlen(defs[i]) + 1);
  h = fnv1a(h, target, strlen(target) + 1);
  h = fnv1a(h, &version, sizeof(version));
  snprintf(out, len, "%s/%s-%s-%016" PRIx64 ".bin", dir, vendor, target, h);
  return 1;
}

int hetccl_rtc_disk_load(const char *vendor, const char *target, int version,
                         const hetccl_rtc_variant_t *v, char **image, size_t *bytes) {
  char path[768];
  if (!cache_path(vendor, target, version, v, path, sizeof(path))) return 0;
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  int ok = 0;
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (size > 0 && fseek(f, 0, SEEK_SET) == 0 && (*image = malloc((size_t)size))) {
    ok = fread(*image, 1, (size_t)size, f) == (size_t)size;
    if (ok) *bytes = (size_t)size;
    else free(*image), *image = NULL;
  }
  fclose(f);
  return ok;
}

void hetccl_rtc_disk_store(const char *vendor, const char *target, int version,
                           const hetccl_rtc_variant_t *v, const char *image, size_t bytes) {
  char path[768], tmp[800];
  if (!cache_path(vendor, target, version, v, path, sizeof(path))) return;
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int ok = fd >= 0 && write(fd, image, bytes) == (ssize_t)bytes;
  if (fd >= 0) ok = close(fd) == 0 && ok;
  if (ok) ok = rename(tmp, path) == 0;
  if (!ok) {
    INFO(HETCCL_RUNTIME, "device reduce: cannot keep a compiled kernel in %s: %s", path,
         strerror(errno));
    unlink(tmp);
  }
}
