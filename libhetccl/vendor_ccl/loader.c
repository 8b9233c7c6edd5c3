/* Vendor CCL: the real NCCL or RCCL, opened with dlopen and never by
 * global symbol. RCCL exports the NCCL API under the same names, so one
 * loader serves both, told apart by a descriptor (descs[] below: the knob,
 * the start of the vendor's file names, the names to try, the directories
 * of step 5).
 *
 * Where a vendor's library is looked for (the first library accepted wins):
 *   1. its knob, HETCCL_NCCL_LIBRARY or HETCCL_RCCL_LIBRARY (a path or a
 *      name). When set, it is the only candidate: if it cannot be opened or
 *      is refused, that is the answer.
 *   2. its soname (libnccl.so.2, librccl.so.1) already loaded in the
 *      process (PyTorch and CuPy link it), found with RTLD_NOLOAD.
 *   3. Any other object mapped in the process that defines ncclGetVersion
 *      (dl_iterate_phdr) and is not named for another vendor: the real
 *      library when hetccl answered to the soname in step 2.
 *   4. The usual names (libnccl.so.2, libnccl.so; librccl.so.1,
 *      librccl.so) as the loader finds them.
 *   5. When a name in 2 or 4 led back to hetccl (installed under the
 *      vendor's soname ahead of the real one), files of that soname in the
 *      directories of LD_LIBRARY_PATH and the vendor's system directories,
 *      other than hetccl's own file.
 *
 * A candidate is refused when its ncclGetVersion is hetccl's own (same
 * object as this code), when the object that defines it also defines
 * hetcclVersionString (another copy of hetccl), when a required slot is
 * missing, or when its ncclGetVersion fails. Slots it lacks get a per-slot
 * stub that WARNs "<function> is not provided by <path> (version N)" and
 * fails (ncclInvalidUsage; a fixed text for functions returning a string).
 *
 * Re-entry: under LD_PRELOAD the real library's calls to its own exported
 * names can bind to hetccl's definitions. HETCCL_VENDOR_CALL records per
 * thread which vendor a call is in progress to (hetccl_vendor_inside), and
 * hetccl_vendor_owns() tells whether a return address lies in a loaded
 * vendor's code, for calls the vendor makes from its own threads.
 *
 * One process normally loads one vendor (its device kind's); `hetccl info`
 * may load both. The first one loaded is the process's vendor
 * (hetccl_vendor_loaded), the one calls without a communicator go to.
 *
 * Threads: each vendor loads once per process (under its own lock); a
 * table is published with an atomic pointer and read-only afterwards. */
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
#include "vendor_ccl/vendor.h"

__thread const hetccl_vendor_t *hetccl_vendor_inside;

int hetccl_vendor_in_call(void) { return hetccl_vendor_inside != NULL; }

#define VENDOR_PATH_BYTES 1024
#define VENDOR_WHY_BYTES 2048

/* What tells one vendor's library from another's, and where to look. */
typedef struct vendor_desc {
  const char *name;     /* hetccl_vendor_t.name */
  const char *backend;  /* hetcclCommBackend of a communicator forwarded to it */
  const char *hier_backend; /* ... of a hierarchical one whose island it serves */
  const char *title;    /* in messages */
  hetccl_knob_t knob;   /* step 1 */
  const char *prefix;   /* its file names contain this (mapped-object probe, step 3) */
  const char *names[3]; /* steps 2 (the first: its soname), 4 and 5; NULL-ended */
  const char *dirs;     /* step 5, after LD_LIBRARY_PATH */
} vendor_desc_t;

static const vendor_desc_t descs[HETCCL_VENDOR_COUNT] = {
    [HETCCL_VENDOR_NCCL] = {.name = "nccl", .backend = "vendor:nccl",
                            .hier_backend = "hierarchical:nccl", .title = "NCCL",
                            .knob = HETCCL_KNOB_NCCL_LIBRARY, .prefix = "libnccl",
                            .names = {"libnccl.so.2", "libnccl.so"},
                            .dirs = "/usr/local/lib:/usr/lib/x86_64-linux-gnu:/usr/lib64:"
                                    "/usr/lib:/usr/local/cuda/lib64"},
    [HETCCL_VENDOR_RCCL] = {.name = "rccl", .backend = "vendor:rccl",
                            .hier_backend = "hierarchical:rccl", .title = "RCCL",
                            .knob = HETCCL_KNOB_RCCL_LIBRARY, .prefix = "librccl",
                            .names = {"librccl.so.1", "librccl.so"},
                            .dirs = "/opt/rocm/lib:/usr/local/lib:/usr/lib/x86_64-linux-gnu:"
                                    "/usr/lib64:/usr/lib"},
};

/* One vendor's load: written once under lock, read-only once done. */
typedef struct vendor_state {
  const vendor_desc_t *desc;
  hetccl_vendor_t table;
  const hetccl_vendor_t *published; /* &table once accepted (atomic) */
  uintptr_t text_lo, text_hi;       /* its executable segments */
  char path[VENDOR_PATH_BYTES];
  pthread_mutex_t lock;
  int done;                         /* the search ran (atomic) */
  ncclResult_t result;
  char what[VENDOR_PATH_BYTES + 64]; /* the failure, in one line */
  char why[VENDOR_WHY_BYTES];       /* every candidate tried and why refused */
  char told[VENDOR_PATH_BYTES + 64 + VENDOR_WHY_BYTES]; /* what: why */
  int found_self;                   /* a name led back to hetccl (step 5 then runs) */
  int foreign;                      /* mapped in the process before we looked */
} vendor_state_t;

static vendor_state_t states[HETCCL_VENDOR_COUNT] = {
#define STATE_INIT(id)                                                                            \
  [HETCCL_VENDOR_##id] = {.desc = &descs[HETCCL_VENDOR_##id], .lock = PTHREAD_MUTEX_INITIALIZER,  \
                          .result = ncclSystemError},
    HETCCL_VENDORS(STATE_INIT)
#undef STATE_INIT
};

static const hetccl_vendor_t *first_loaded; /* the process's vendor (atomic) */
static __thread int load_running;           /* recursion guard for this thread */

const char *hetccl_vendor_name(hetccl_vendor_id_t id) { return descs[id].name; }
const char *hetccl_vendor_title(hetccl_vendor_id_t id) { return descs[id].title; }
hetccl_knob_t hetccl_vendor_knob(hetccl_vendor_id_t id) { return descs[id].knob; }

const hetccl_vendor_t *hetccl_vendor_loaded(void) {
  return __atomic_load_n(&first_loaded, __ATOMIC_ACQUIRE);
}

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Which vendor libraries (not hetccl) does the program link (PyTorch,
 * CuPy: libnccl.so.2; their ROCm builds: librccl.so.1)? Looked up once;
 * programs load them before their first call of the API. */
static pthread_once_t foreign_once = PTHREAD_ONCE_INIT;

static int find_foreign(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  const char *name = info->dlpi_name, *self = data;
  if (!name || !name[0] || (self && strcmp(name, self) == 0)) return 0;
  for (int v = 0; v < HETCCL_VENDOR_COUNT; v++)
    if (strstr(base_name(name), descs[v].prefix)) states[v].foreign = 1;
  return 0;
}

static void probe_foreign(void) {
  Dl_info self;
  const char *self_name = dladdr((const void *)&hetccl_vendor_in_call, &self) ? self.dli_fname : NULL;
  dl_iterate_phdr(find_foreign, (void *)self_name);
  /* Load them now, so that their calls into our names can be recognised. */
  for (int v = 0; v < HETCCL_VENDOR_COUNT; v++)
    if (states[v].foreign && hetccl_knob_int(HETCCL_KNOB_VENDOR))
      hetccl_vendor_load((hetccl_vendor_id_t)v, NULL);
}

int hetccl_vendor_foreign_mapped(hetccl_vendor_id_t id) {
  pthread_once(&foreign_once, probe_foreign);
  return states[id].foreign;
}

/* The loaded vendor whose code holds addr, or NULL. */
static const hetccl_vendor_t *vendor_at(const void *addr) {
  uintptr_t a = (uintptr_t)addr;
  for (int v = 0; v < HETCCL_VENDOR_COUNT; v++) {
    const vendor_state_t *st = &states[v];
    const hetccl_vendor_t *t = __atomic_load_n(&st->published, __ATOMIC_ACQUIRE);
    if (t && a >= st->text_lo && a < st->text_hi) return t;
  }
  return NULL;
}

const hetccl_vendor_t *hetccl_vendor_reentered(const void *caller) {
  const hetccl_vendor_t *inside = hetccl_vendor_inside;
  if (inside) return inside;
  if (!hetccl_vendor_loaded()) {
    pthread_once(&foreign_once, probe_foreign);
    if (!hetccl_vendor_loaded()) return NULL;
  }
  return vendor_at(caller);
}

int hetccl_vendor_owns(const void *addr) { return vendor_at(addr) != NULL; }

/* --- stubs for the slots a library lacks ---------------------------------------- */

enum { STUB_RESULT, STUB_STRING, STUB_INT, STUB_ZERO };

#define STUB_KIND(ret)                                                                            \
  (__builtin_types_compatible_p(ret, ncclResult_t)   ? STUB_RESULT                                \
   : __builtin_types_compatible_p(ret, const char *) ? STUB_STRING                                \
   : __builtin_types_compatible_p(ret, int)          ? STUB_INT                                   \
                                                     : STUB_ZERO)

/* Log the missing function and write its failure value into out. */
static void stub_fail(const char *slot, void *out, size_t size, int kind) {
  /* A stub is shared by every vendor's table: the vendor is the one this
   * call went to, else the process's (a table called without the guard). */
  const hetccl_vendor_t *v = hetccl_vendor_inside ? hetccl_vendor_inside : hetccl_vendor_loaded();
  WARN("nccl%s is not provided by %s (version %d)", slot, v && v->path ? v->path : "the vendor",
       v ? v->version : 0);
  static const char text[] = "function not provided by the loaded vendor library";
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

static void why_add(vendor_state_t *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why_add(vendor_state_t *st, const char *fmt, ...) {
  size_t off = strlen(st->why);
  if (off + 3 >= sizeof(st->why)) return;
  if (off) off += snprintf(st->why + off, sizeof(st->why) - off, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->why + off, sizeof(st->why) - off, fmt, ap);
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

/* Take every slot from h, check it, ask its version. 1 if accepted (the
 * table filled and published); 0 with a reason added to st->why. */
static int try_handle(vendor_state_t *st, void *h, const char *what, const char *how) {
  void *getver = dlsym(h, "ncclGetVersion");
  const char *fname = NULL;
  void *base = object_of(getver, &fname);
  if (!getver || !base) {
    why_add(st, "%s: defines no ncclGetVersion", what);
    return 0;
  }
  if (base == self_base()) {
    why_add(st, "%s: is hetccl itself", what);
    st->found_self = 1;
    return 0;
  }
  /* what, and the file it resolved to when that says more */
  char who[VENDOR_PATH_BYTES];
  snprintf(who, sizeof(who), "%s%s%s%s", what, fname && strcmp(fname, what) ? " (" : "",
           fname && strcmp(fname, what) ? fname : "", fname && strcmp(fname, what) ? ")" : "");
  if (object_of(dlsym(h, "hetcclVersionString"), NULL) == base) {
    why_add(st, "%s: is a hetccl library, not %s", who, st->desc->title);
    st->found_self = 1;
    return 0;
  }
  hetccl_vendor_t v = {.id = (hetccl_vendor_id_t)(st - states), .name = st->desc->name,
                       .backend = st->desc->backend,
                       .hier_backend = st->desc->hier_backend, .handle = h};
  char missing[512] = "";
  int nmissing = 0, nslots = 0;
#define TAKE_SLOT(slot, ret, params)                                                              \
  {                                                                                               \
    void *p_ = dlsym(h, "nccl" #slot);                                                            \
    nslots++;                                                                                     \
    if (p_ && object_of(p_, NULL) != base) p_ = NULL; /* another object's, not this library's */ \
    if (p_) {                                                                                     \
      *(void **)&v.slot = p_;                                                                     \
      v.provided[HETCCL_VSLOT_##slot] = 1;                                                        \
    } else if (slot_required(#slot)) {                                                            \
      why_add(st, "%s: lacks nccl%s", who, #slot);                                                \
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
    why_add(st, "%s: ncclGetVersion failed (%d)", who, (int)res);
    return 0;
  }
  snprintf(st->path, sizeof(st->path), "%s", fname ? fname : what);
  v.path = st->path;
  v.version = version;
  st->table = v;
  text_range_t t = {.base = (uintptr_t)base};
  if (dl_iterate_phdr(find_text, &t)) {
    st->text_lo = t.lo;
    st->text_hi = t.hi;
  }
  int major = version >= 10000 ? version / 10000 : version / 1000;
  int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  INFO(HETCCL_VENDOR, "%s %d.%d.%d (%d) from %s (%s); %d of %d functions absent%s%s",
       st->desc->title, major, minor, version % 100, version, st->path, how, nmissing, nslots,
       nmissing ? ": " : "", missing);
  __atomic_store_n(&st->published, &st->table, __ATOMIC_RELEASE);
  const hetccl_vendor_t *none = NULL;
  __atomic_compare_exchange_n(&first_loaded, &none, &st->table, 0, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
  return 1;
}

/* Open name (flags added to RTLD_NOW | RTLD_LOCAL) and try it. A handle
 * refused is closed again. */
static int try_name(vendor_state_t *st, const char *name, int flags, const char *how) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL | flags);
  if (!h) {
    if (!(flags & RTLD_NOLOAD)) {
      const char *e = dlerror();
      why_add(st, "%s", e ? e : name);
    }
    return 0;
  }
  if (try_handle(st, h, name, how)) return 1;
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

/* Is path named for a vendor other than st's (librccl* when looking for
 * NCCL)? Both export ncclGetVersion: the name is what tells them apart. */
static int named_for_another(const vendor_state_t *st, const char *path) {
  for (int v = 0; v < HETCCL_VENDOR_COUNT; v++)
    if (&states[v] != st && strstr(base_name(path), descs[v].prefix)) return 1;
  return 0;
}

static int try_mapped(vendor_state_t *st) {
  name_list_t l = {0};
  dl_iterate_phdr(collect_names, &l);
  int ok = 0;
  void *self = self_base();
  for (int i = 0; i < l.n && !ok; i++) {
    if (named_for_another(st, l.names[i])) continue;
    void *h = dlopen(l.names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) continue;
    /* Only the object that itself defines ncclGetVersion, not one that
     * merely depends on it (dlsym searches dependencies too). */
    const char *fname = NULL;
    void *base = object_of(dlsym(h, "ncclGetVersion"), &fname);
    int candidate = base && base != self && fname && strcmp(fname, l.names[i]) == 0;
    ok = candidate && try_handle(st, h, l.names[i], "mapped in the process");
    if (!ok) dlclose(h);
  }
  for (int i = 0; i < l.n; i++) free(l.names[i]);
  free(l.names);
  return ok;
}

/* Step 5: files of the vendor's soname in the search directories that are
 * not hetccl's own file. */
static int try_files(vendor_state_t *st) {
  const char *self_name = NULL, *soname = st->desc->names[0];
  struct stat self_st = {0};
  object_of((const void *)&hetccl_vendor_in_call, &self_name);
  if (self_name) stat(self_name, &self_st);
  const char *ld = getenv("LD_LIBRARY_PATH"); /* the loader's variable, not a knob */
  size_t len = (ld ? strlen(ld) : 0) + strlen(st->desc->dirs) + 2;
  char *dirs = malloc(len);
  if (!dirs) return 0;
  snprintf(dirs, len, "%s%s%s", ld ? ld : "", ld ? ":" : "", st->desc->dirs);
  char how[128];
  snprintf(how, sizeof(how), "found beside hetccl's own %s", soname);
  int ok = 0;
  char *save = NULL;
  for (char *d = strtok_r(dirs, ":", &save); d && !ok; d = strtok_r(NULL, ":", &save)) {
    char path[VENDOR_PATH_BYTES];
    struct stat fst;
    snprintf(path, sizeof(path), "%s/%s", d[0] ? d : ".", soname);
    if (stat(path, &fst) != 0) continue;
    if (fst.st_dev == self_st.st_dev && fst.st_ino == self_st.st_ino) continue;
    ok = try_name(st, path, 0, how);
  }
  free(dirs);
  return ok;
}

static void search(vendor_state_t *st) {
  const vendor_desc_t *d = st->desc;
  const char *env = hetccl_knob_desc(d->knob)->env, *knob = hetccl_knob_str(d->knob);
  if (knob[0]) {
    if (try_name(st, knob, 0, env)) st->result = ncclSuccess;
    else snprintf(st->what, sizeof(st->what), "%s=%s cannot be used", env, knob);
    return;
  }
  int ok = try_name(st, d->names[0], RTLD_NOLOAD, "already loaded") || try_mapped(st);
  for (int i = 0; !ok && d->names[i]; i++) ok = try_name(st, d->names[i], 0, "by name");
  if (!ok && st->found_self) ok = try_files(st);
  if (ok) st->result = ncclSuccess;
  else snprintf(st->what, sizeof(st->what), "no usable %s library (set %s)", d->title, env);
}

static void search_and_tell(vendor_state_t *st) {
  search(st);
  if (st->result == ncclSuccess) return;
  /* "what: why", joined by hand: snprintf may not read the object it writes */
  size_t a = strlen(st->what), b = strlen(st->why);
  memcpy(st->told, st->what, a);
  memcpy(st->told + a, ": ", 2);
  memcpy(st->told + a + 2, st->why, b + 1);
}

/* Run the search once; 0 when this thread is already inside it. */
static int load_once(vendor_state_t *st) {
  if (__atomic_load_n(&st->done, __ATOMIC_ACQUIRE)) return 1;
  if (load_running) return 0; /* the vendor's own start-up came back here */
  load_running = 1;
  pthread_mutex_lock(&st->lock);
  if (!st->done) {
    search_and_tell(st);
    __atomic_store_n(&st->done, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&st->lock);
  load_running = 0;
  return 1;
}

ncclResult_t hetccl_vendor_load(hetccl_vendor_id_t id, const hetccl_vendor_t **out) {
  vendor_state_t *st = &states[id];
  if (!load_once(st)) {
    WARN("vendor: %s load re-entered while loading", st->desc->title);
    if (out) *out = NULL;
    return ncclInternalError;
  }
  if (st->result != ncclSuccess) {
    WARN("vendor: %s", st->told);
    if (out) *out = NULL;
    return st->result;
  }
  if (out) *out = st->published;
  return ncclSuccess;
}

const hetccl_vendor_t *hetccl_vendor_probe(hetccl_vendor_id_t id, const char **detail) {
  const hetccl_vendor_t *v = NULL;
  vendor_state_t *st = &states[id];
  hetccl_vendor_load(id, &v);
  if (detail) *detail = v ? v->path : st->done ? st->told : "load re-entered";
  return v;
}
