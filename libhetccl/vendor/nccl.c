/* Vendor CCL: the real NCCL, opened with dlopen and never by global symbol.
 *
 * Where it is looked for (the first library accepted wins):
 *   1. HETCCL_NCCL_LIBRARY (a path or a name). When set, it is the only
 *      candidate: if it cannot be opened or is refused, that is the answer.
 *   2. libnccl.so.2 already loaded in the process (PyTorch and CuPy link
 *      it), found with RTLD_NOLOAD.
 *   3. Any other object mapped in the process that defines ncclGetVersion
 *      (dl_iterate_phdr): the real NCCL when hetccl answered to the name
 *      libnccl.so.2 in step 2.
 *   4. The usual names, libnccl.so.2 then libnccl.so, as the loader finds
 *      them.
 *   5. When a name in 2 or 4 led back to hetccl (installed as libnccl.so.2
 *      ahead of the real one), files named libnccl.so.2 in the directories
 *      of LD_LIBRARY_PATH and the system library directories, other than
 *      hetccl's own file.
 *
 * A candidate is refused when its ncclGetVersion is hetccl's own (same
 * object as this code), when the object that defines it also defines
 * hetcclVersionString (another copy of hetccl), when a required slot is
 * missing, or when its ncclGetVersion fails. Slots it lacks get a per-slot
 * stub that WARNs "<function> is not provided by <path> (version N)" and
 * fails (ncclInvalidUsage; a fixed text for functions returning a string).
 *
 * Re-entry: under LD_PRELOAD the real library's calls to its own exported
 * names can bind to hetccl's definitions. HETCCL_VENDOR_CALL counts calls in
 * progress per thread (hetccl_vendor_depth), and hetccl_vendor_owns() tells
 * whether a return address lies in the vendor's code, for calls the vendor
 * makes from its own threads.
 *
 * Threads: loading runs once per process (pthread_once); the table is
 * published with an atomic pointer and read-only afterwards. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"
#include "vendor/vendor.h"

__thread int hetccl_vendor_depth;

int hetccl_vendor_in_call(void) { return hetccl_vendor_depth > 0; }

#define VENDOR_PATH_BYTES 1024
#define VENDOR_WHY_BYTES 2048

static hetccl_vendor_t nccl;                /* filled by load_nccl, once */
static const hetccl_vendor_t *nccl_loaded;  /* &nccl once accepted (atomic) */
static char nccl_path[VENDOR_PATH_BYTES];
static uintptr_t text_lo, text_hi;          /* the vendor's executable segments */
static ncclResult_t load_result = ncclSystemError;
static char load_what[VENDOR_PATH_BYTES + 64]; /* the failure, in one line */
static char load_why[VENDOR_WHY_BYTES];     /* every candidate tried and why refused */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static __thread int load_running;           /* recursion guard for this thread */

const hetccl_vendor_t *hetccl_vendor_loaded(void) {
  return __atomic_load_n(&nccl_loaded, __ATOMIC_ACQUIRE);
}

/* Is an NCCL library other than hetccl mapped in the process (the program
 * links NCCL: PyTorch, CuPy)? Looked up once; programs load NCCL before
 * their first call of its API. */
static int foreign_nccl;
static pthread_once_t foreign_once = PTHREAD_ONCE_INIT;

static int find_foreign(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  const char *name = info->dlpi_name;
  if (!name || !strstr(name, "libnccl")) return 0;
  const char *self = data;
  if (self && strcmp(name, self) == 0) return 0;
  foreign_nccl = 1;
  return 1;
}

static void probe_foreign(void) {
  Dl_info self;
  const char *self_name = dladdr((const void *)&hetccl_vendor_in_call, &self) ? self.dli_fname : NULL;
  dl_iterate_phdr(find_foreign, (void *)self_name);
  /* Load it now, so that its calls into our names can be recognised. */
  if (foreign_nccl && hetccl_knob_int(HETCCL_KNOB_VENDOR)) hetccl_vendor_load_nccl(NULL);
}

int hetccl_vendor_foreign_mapped(void) {
  pthread_once(&foreign_once, probe_foreign);
  return foreign_nccl;
}

const hetccl_vendor_t *hetccl_vendor_reentered(const void *caller) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  if (hetccl_vendor_depth > 0) return v;
  if (!v) {
    if (!hetccl_vendor_foreign_mapped()) return NULL;
    v = hetccl_vendor_loaded();
    if (!v) return NULL;
  }
  uintptr_t a = (uintptr_t)caller;
  return a >= text_lo && a < text_hi ? v : NULL;
}

int hetccl_vendor_owns(const void *addr) {
  uintptr_t a = (uintptr_t)addr;
  return hetccl_vendor_loaded() && a >= text_lo && a < text_hi;
}

/* --- stubs for the slots a library lacks ---------------------------------------- */

enum { STUB_RESULT, STUB_STRING, STUB_INT, STUB_ZERO };

#define STUB_KIND(ret)                                                                            \
  (__builtin_types_compatible_p(ret, ncclResult_t)   ? STUB_RESULT                                \
   : __builtin_types_compatible_p(ret, const char *) ? STUB_STRING                                \
   : __builtin_types_compatible_p(ret, int)          ? STUB_INT                                   \
                                                     : STUB_ZERO)

/* Log the missing function and write its failure value into out. */
static void stub_fail(const char *slot, void *out, size_t size, int kind) {
  WARN("nccl%s is not provided by %s (version %d)", slot, nccl.path ? nccl.path : "the vendor",
       nccl.version);
  static const char text[] = "function not provided by the loaded NCCL library";
  const ncclResult_t usage = ncclInvalidUsage;
  const char *str = text;
  const int minus_one = -1;
  memset(out, 0, size);
  if (kind == STUB_RESULT && size == sizeof(usage)) memcpy(out, &usage, size);
  if (kind == STUB_STRING && size == sizeof(str)) memcpy(out, &str, size);
  if (kind == STUB_INT && size == sizeof(minus_one)) memcpy(out, &minus_one, size);
}

#define VENDOR_STUB(slot, ret, params)                                                            \
  static ret stub_##slot params {                                                                 \
    ret r_;                                                                                       \
    stub_fail(#slot, &r_, sizeof(r_), STUB_KIND(ret));                                            \
    return r_;                                                                                    \
  }
HETCCL_VENDOR_SLOTS(VENDOR_STUB)
#undef VENDOR_STUB

/* Without these a library cannot serve a forwarded communicator. */
#define REQUIRED_SLOTS(X)                                                                         \
  X(GetVersion) X(GetUniqueId) X(CommInitRank) X(CommInitRankConfig) X(CommDestroy)               \
  X(CommAbort) X(AllReduce) X(Broadcast) X(Reduce) X(AllGather) X(ReduceScatter) X(Send)          \
  X(Recv) X(GroupStart) X(GroupEnd)

static int slot_required(const char *slot) {
#define IS_REQUIRED(s) if (strcmp(slot, #s) == 0) return 1;
  REQUIRED_SLOTS(IS_REQUIRED)
#undef IS_REQUIRED
  return 0;
}

/* --- candidates ---------------------------------------------------------------- */

static void why_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void why_add(const char *fmt, ...) {
  size_t off = strlen(load_why);
  if (off + 3 >= sizeof(load_why)) return;
  if (off) off += snprintf(load_why + off, sizeof(load_why) - off, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(load_why + off, sizeof(load_why) - off, fmt, ap);
  va_end(ap);
}

/* Load base of the object holding addr, or NULL. */
static void *object_of(const void *addr, const char **fname) {
  Dl_info info;
  if (!addr || !dladdr(addr, &info)) return NULL;
  if (fname) *fname = info.dli_fname;
  return info.dli_fbase;
}

static void *self_base(void) { return object_of((const void *)&hetccl_vendor_in_call, NULL); }

/* Did a name lead back to hetccl? (Step 5 then searches by file.) */
static int found_self;

typedef struct {
  uintptr_t base;   /* load base of the vendor object */
  uintptr_t lo, hi; /* its executable PT_LOAD range */
} text_range_t;

static int find_text(struct dl_phdr_info *info, size_t size, void *data) {
  text_range_t *t = data;
  uintptr_t lo = UINTPTR_MAX, hi = 0, first = UINTPTR_MAX;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (start < first) first = start;
    if (!(ph->p_flags & PF_X)) continue;
    if (start < lo) lo = start;
    if (start + ph->p_memsz > hi) hi = start + ph->p_memsz;
  }
  /* dladdr's dli_fbase is the start of the first mapping, page-aligned. */
  if ((first & ~(uintptr_t)4095) != t->base && first != t->base) return 0;
  t->lo = lo;
  t->hi = hi;
  return 1;
}

/* Take every slot from h, check it, ask its version. 1 if accepted (nccl
 * filled and published); 0 with a reason added to load_why. */
static int try_handle(void *h, const char *what, const char *how) {
  void *getver = dlsym(h, "ncclGetVersion");
  const char *fname = NULL;
  void *base = object_of(getver, &fname);
  if (!getver || !base) {
    why_add("%s: defines no ncclGetVersion", what);
    return 0;
  }
  if (base == self_base()) {
    why_add("%s: is hetccl itself", what);
    found_self = 1;
    return 0;
  }
  /* what, and the file it resolved to when that says more */
  char who[VENDOR_PATH_BYTES];
  snprintf(who, sizeof(who), "%s%s%s%s", what, fname && strcmp(fname, what) ? " (" : "",
           fname && strcmp(fname, what) ? fname : "", fname && strcmp(fname, what) ? ")" : "");
  if (object_of(dlsym(h, "hetcclVersionString"), NULL) == base) {
    why_add("%s: is a hetccl library, not NCCL", who);
    found_self = 1;
    return 0;
  }
  hetccl_vendor_t v = {.name = "nccl", .handle = h};
  char missing[512] = "";
  int nmissing = 0, nslots = 0;
#define TAKE_SLOT(slot, ret, params)                                                              \
  {                                                                                               \
    void *p_ = dlsym(h, "nccl" #slot);                                                            \
    nslots++;                                                                                     \
    if (p_ && object_of(p_, NULL) != base) p_ = NULL; /* another object's, not this library's */ \
    if (p_) {                                                                                     \
      *(void **)&v.slot = p_;                                                                     \
    } else if (slot_required(#slot)) {                                                            \
      why_add("%s: lacks nccl%s", who, #slot);                                                    \
      return 0;                                                                                   \
    } else {                                                                                      \
      v.slot = stub_##slot;                                                                       \
      size_t off_ = strlen(missing);                                                              \
      if (off_ + 2 < sizeof(missing))                                                             \
        snprintf(missing + off_, sizeof(missing) - off_, "%s%s", nmissing ? "," : "", #slot);    \
      nmissing++;                                                                                 \
    }                                                                                             \
  }
  HETCCL_VENDOR_SLOTS(TAKE_SLOT)
#undef TAKE_SLOT
  int version = 0;
  ncclResult_t res = HETCCL_VENDOR_CALL(&v, GetVersion, &version);
  if (res != ncclSuccess || version <= 0) {
    why_add("%s: ncclGetVersion failed (%d)", who, (int)res);
    return 0;
  }
  snprintf(nccl_path, sizeof(nccl_path), "%s", fname ? fname : what);
  v.path = nccl_path;
  v.version = version;
  nccl = v;
  text_range_t t = {.base = (uintptr_t)base};
  if (dl_iterate_phdr(find_text, &t)) {
    text_lo = t.lo;
    text_hi = t.hi;
  }
  int major = version >= 10000 ? version / 10000 : version / 1000;
  int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  INFO(HETCCL_VENDOR, "NCCL %d.%d.%d (%d) from %s (%s); %d of %d functions absent%s%s", major,
       minor, version % 100, version, nccl_path, how, nmissing, nslots, nmissing ? ": " : "",
       missing);
  __atomic_store_n(&nccl_loaded, &nccl, __ATOMIC_RELEASE);
  return 1;
}

/* Open name (flags added to RTLD_NOW | RTLD_LOCAL) and try it. A handle
 * refused is closed again. */
static int try_name(const char *name, int flags, const char *how) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL | flags);
  if (!h) {
    if (!(flags & RTLD_NOLOAD)) {
      const char *e = dlerror();
      why_add("%s", e ? e : name);
    }
    return 0;
  }
  if (try_handle(h, name, how)) return 1;
  dlclose(h);
  return 0;
}

/* Step 3: names of every mapped object, collected first (no dlopen while
 * dl_iterate_phdr holds the loader's lock). */
typedef struct {
  char **names;
  int n, cap;
} name_list_t;

static int collect_names(struct dl_phdr_info *info, size_t size, void *data) {
  name_list_t *l = data;
  if (!info->dlpi_name || !info->dlpi_name[0]) return 0;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    char **grown = realloc(l->names, cap * sizeof(*grown));
    if (!grown) return 1;
    l->names = grown;
    l->cap = cap;
  }
  l->names[l->n] = strdup(info->dlpi_name);
  if (l->names[l->n]) l->n++;
  return 0;
}

static int try_mapped(void) {
  name_list_t l = {0};
  dl_iterate_phdr(collect_names, &l);
  int ok = 0;
  void *self = self_base();
  for (int i = 0; i < l.n && !ok; i++) {
    void *h = dlopen(l.names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) continue;
    /* Only the object that itself defines ncclGetVersion, not one that
     * merely depends on it (dlsym searches dependencies too). */
    const char *fname = NULL;
    void *base = object_of(dlsym(h, "ncclGetVersion"), &fname);
    int candidate = base && base != self && fname && strcmp(fname, l.names[i]) == 0;
    ok = candidate && try_handle(h, l.names[i], "mapped in the process");
    if (!ok) dlclose(h);
  }
  for (int i = 0; i < l.n; i++) free(l.names[i]);
  free(l.names);
  return ok;
}

/* Step 5: libnccl.so.2 files in the search directories that are not
 * hetccl's own file. */
static int try_files(void) {
  const char *self_name = NULL;
  struct stat self_st = {0};
  object_of((const void *)&hetccl_vendor_in_call, &self_name);
  if (self_name) stat(self_name, &self_st);
  static const char *const system_dirs =
      "/usr/local/lib:/usr/lib/x86_64-linux-gnu:/usr/lib64:/usr/lib:/usr/local/cuda/lib64";
  const char *ld = getenv("LD_LIBRARY_PATH"); /* the loader's variable, not a knob */
  size_t len = (ld ? strlen(ld) : 0) + strlen(system_dirs) + 2;
  char *dirs = malloc(len);
  if (!dirs) return 0;
  snprintf(dirs, len, "%s%s%s", ld ? ld : "", ld ? ":" : "", system_dirs);
  int ok = 0;
  char *save = NULL;
  for (char *d = strtok_r(dirs, ":", &save); d && !ok; d = strtok_r(NULL, ":", &save)) {
    char path[VENDOR_PATH_BYTES];
    struct stat st;
    snprintf(path, sizeof(path), "%s/libnccl.so.2", d[0] ? d : ".");
    if (stat(path, &st) != 0) continue;
    if (st.st_dev == self_st.st_dev && st.st_ino == self_st.st_ino) continue;
    ok = try_name(path, 0, "found beside hetccl's own libnccl.so.2");
  }
  free(dirs);
  return ok;
}

static void load_nccl(void) {
  const char *knob = hetccl_knob_str(HETCCL_KNOB_NCCL_LIBRARY);
  if (knob[0]) {
    if (!try_name(knob, 0, "HETCCL_NCCL_LIBRARY")) {
      snprintf(load_what, sizeof(load_what), "HETCCL_NCCL_LIBRARY=%s cannot be used", knob);
      return;
    }
    load_result = ncclSuccess;
    return;
  }
  if (try_name("libnccl.so.2", RTLD_NOLOAD, "already loaded") || try_mapped() ||
      try_name("libnccl.so.2", 0, "by name") || try_name("libnccl.so", 0, "by name") ||
      (found_self && try_files())) {
    load_result = ncclSuccess;
    return;
  }
  snprintf(load_what, sizeof(load_what), "no usable NCCL library (set HETCCL_NCCL_LIBRARY)");
}

ncclResult_t hetccl_vendor_load_nccl(const hetccl_vendor_t **out) {
  if (load_running) {
    /* The vendor's own start-up came back here: never wait on ourselves. */
    WARN("vendor: NCCL load re-entered while loading");
    if (out) *out = NULL;
    return ncclInternalError;
  }
  load_running = 1;
  int err = pthread_once(&load_once, load_nccl);
  load_running = 0;
  if (err != 0) {
    WARN("vendor: pthread_once: %s", strerror(err));
    return ncclSystemError;
  }
  if (load_result != ncclSuccess) {
    WARN("vendor: %s: %s", load_what, load_why);
    if (out) *out = NULL;
    return load_result;
  }
  if (out) *out = hetccl_vendor_loaded();
  return ncclSuccess;
}
