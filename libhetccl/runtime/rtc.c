/* Run-time compiled reduction kernels: the vendor-neutral part (rtc.h).
 *
 * Thread: any. The cache is read without a lock (entries are immutable once
 * published, the list only grows at its head) and written under its compile
 * mutex; a vendor's libraries are loaded under its hetccl_rtc_t's lock and
 * published with atomics; nothing else here keeps state. */
#include "runtime/rtc.h"
#include "runtime/runtime.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* The kernel reproduces the host's NaN results, and the host's rule depends
 * on its CPU (see the kernel text). Other CPUs get the x86-64 rule: their
 * results can then differ from the host's in NaN payloads only. */
#if defined(__aarch64__)
#define HOST_NAN_RULE "-DHK_NAN_ARM"
#else
#define HOST_NAN_RULE "-DHK_NAN_X86"
#endif

static const char *const type_defines[ncclNumTypes] = {
    [ncclInt8] = "-DHK_T_INT8",         [ncclUint8] = "-DHK_T_UINT8",
    [ncclInt32] = "-DHK_T_INT32",       [ncclUint32] = "-DHK_T_UINT32",
    [ncclInt64] = "-DHK_T_INT64",       [ncclUint64] = "-DHK_T_UINT64",
    [ncclFloat16] = "-DHK_T_FLOAT16",   [ncclFloat32] = "-DHK_T_FLOAT32",
    [ncclFloat64] = "-DHK_T_FLOAT64",   [ncclBfloat16] = "-DHK_T_BFLOAT16",
    [ncclFloat8e4m3] = "-DHK_T_E4M3",   [ncclFloat8e5m2] = "-DHK_T_E5M2",
};

static const char *const op_defines[] = {
    [HETCCL_RED_SUM] = "-DHK_OP_SUM", [HETCCL_RED_PROD] = "-DHK_OP_PROD",
    [HETCCL_RED_MAX] = "-DHK_OP_MAX", [HETCCL_RED_MIN] = "-DHK_OP_MIN",
};

static const char *const op_names[] = {
    [HETCCL_RED_SUM] = "sum", [HETCCL_RED_PROD] = "prod",
    [HETCCL_RED_MAX] = "max", [HETCCL_RED_MIN] = "min",
};

/* --- variant ---------------------------------------------------------------- */

ncclResult_t hetccl_rtc_variant_of(const hetccl_redop_t *op, unsigned flags, int unary,
                                   const char *who, hetccl_rtc_variant_t *v) {
  if (!op || (int)op->dtype < 0 || op->dtype >= ncclNumTypes || (unsigned)op->kind > HETCCL_RED_MIN) {
    WARN("%s: invalid reduction (type %d, operator %d)", who, op ? (int)op->dtype : -1,
         op ? (int)op->kind : -1);
    return ncclInvalidArgument;
  }
  if (flags & ~HETCCL_REDUCE_ALL_FLAGS) {
    WARN("%s: unknown flags 0x%x", who, flags & ~HETCCL_REDUCE_ALL_FLAGS);
    return ncclInvalidArgument;
  }
  /* Flags that change nothing select no variant of their own: the host
   * scales only with premul, and divides only by nranks > 1. */
  unsigned f = 0;
  if (op->premul) f |= flags & (HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_SCALE_B);
  if (op->average && op->nranks > 1) f |= flags & HETCCL_REDUCE_FINISH;
  if (unary) f |= HETCCL_RTC_UNARY;
  v->dtype = op->dtype;
  v->kind = op->kind;
  v->flags = f;
  v->scalar_dev = (f & (HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_SCALE_B)) && op->scalar_dev;
  return ncclSuccess;
}

void hetccl_rtc_variant_name(const hetccl_rtc_variant_t *v, char *out, size_t len) {
  snprintf(out, len, "%s %s%s%s%s%s%s", hetccl_dtype_name(v->dtype),
           v->flags & HETCCL_RTC_UNARY ? "unary" : op_names[v->kind],
           v->flags & HETCCL_REDUCE_SCALE_A ? " +scale_a" : "",
           v->flags & HETCCL_REDUCE_SCALE_B ? " +scale_b" : "",
           v->flags & HETCCL_REDUCE_FINISH ? " +finish" : "", v->scalar_dev ? " +devscalar" : "",
           "");
}

size_t hetccl_rtc_defines(const hetccl_rtc_variant_t *v, const char **out) {
  size_t n = 0;
  out[n++] = type_defines[v->dtype];
  out[n++] = op_defines[v->kind];
  if (v->flags & HETCCL_REDUCE_SCALE_A) out[n++] = "-DHK_SCALE_A";
  if (v->flags & HETCCL_REDUCE_SCALE_B) out[n++] = "-DHK_SCALE_B";
  if (v->flags & HETCCL_REDUCE_FINISH) out[n++] = "-DHK_FINISH";
  if (v->flags & HETCCL_RTC_UNARY) out[n++] = "-DHK_UNARY";
  if (v->scalar_dev) out[n++] = "-DHK_SCALAR_DEV";
  out[n++] = HOST_NAN_RULE;
  return n;
}

/* --- launch plan ------------------------------------------------------------ */

static int dtype_signed(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}

/* Vectors need a, b and dst equally misaligned (then a scalar head aligns
 * all three); otherwise every element goes alone. */
static void plan_split(size_t size, const void *dst, const void *a, const void *b, size_t count,
                       uint64_t *head, uint64_t *nvec) {
  uintptr_t mis = (uintptr_t)a % 16;
  *head = 0;
  *nvec = 0;
  if ((uintptr_t)b % 16 != mis || (uintptr_t)dst % 16 != mis || mis % size) return;
  uint64_t h = ((16 - mis) % 16) / size;
  if (h > count) h = count;
  *head = h;
  *nvec = (count - h) / (16 / size);
}

static hetccl_rtc_scalars_t scalars_of(const hetccl_redop_t *op) {
  return (hetccl_rtc_scalars_t){
      .f = op->scalar_f,
      .u = dtype_signed(op->dtype) ? (uint64_t)op->scalar_i : op->scalar_u,
      .dev = op->scalar_dev,
      .nranks = op->nranks};
}

void hetccl_rtc_plan(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                     size_t count, int units, hetccl_rtc_launch_t *l) {
  size_t size = hetccl_dtype_size(op->dtype);
  memset(l, 0, sizeof(*l));
  l->dst = dst;
  l->a = a;
  l->b = b;
  l->count = count;
  plan_split(size, dst, a, b, count, &l->head, &l->nvec);
  uint64_t nscalar = count - l->nvec * (16 / size);
  uint64_t work = l->nvec > nscalar ? l->nvec : nscalar;
  uint64_t per_block = (uint64_t)HETCCL_RTC_THREADS * HETCCL_RTC_UNROLL;
  uint64_t blocks = (work + per_block - 1) / per_block;
  /* Enough blocks to fill the device a few times over; the grid-stride
   * loops take the rest. */
  uint64_t cap = units > 0 ? (uint64_t)units * HETCCL_RTC_BLOCKS_PER_UNIT : HETCCL_RTC_MAX_BLOCKS;
  l->grid = (unsigned)(blocks < 1 ? 1 : blocks > cap ? cap : blocks);
  l->block = HETCCL_RTC_THREADS;
  l->s = scalars_of(op);
  void *p[10] = {&l->dst,   &l->a,   &l->b,   &l->head,  &l->nvec,
                 &l->count, &l->s.f, &l->s.u, &l->s.dev, &l->s.nranks};
  memcpy(l->params, p, sizeof(p));
}

void hetccl_rtc_plan_run(const hetccl_redop_t *op, const hetccl_reduce_run_t *run,
                         hetccl_rtc_run_launch_t *l) {
  memset(l, 0, sizeof(*l));
  l->r = *run;
  if (!l->r.dep_slots) l->r.dep_slots = 1;
  l->s = scalars_of(op);
  l->grid = run->blocks ? run->blocks : 1;
  l->block = HETCCL_RTC_THREADS;
  hetccl_reduce_run_t *r = &l->r;
  void *p[23] = {&r->dst,       &r->local,     &r->stage,    &r->count,    &r->per,
                 &r->steps,     &r->swap,      &r->first,    &r->span,     &r->last_span,
                 &r->depth,     &r->slot_bytes, &r->staged,  &r->reduced,  &r->dep,
                 &r->dep_first, &r->dep_slots, &r->arrive,   &r->seen,     &l->s.f,
                 &l->s.u,       &l->s.dev,      &l->s.nranks};
  memcpy(l->params, p, sizeof(p));
}

/* --- cache ------------------------------------------------------------------ */

const hetccl_rtc_entry_t *hetccl_rtc_cache_find(hetccl_rtc_cache_t *c, uint64_t where,
                                                const hetccl_rtc_variant_t *v) {
  for (const hetccl_rtc_entry_t *e = __atomic_load_n(&c->head, __ATOMIC_ACQUIRE); e; e = e->next)
    if (e->where == where && e->v.dtype == v->dtype && e->v.kind == v->kind &&
        e->v.flags == v->flags && e->v.scalar_dev == v->scalar_dev)
      return e;
  return NULL;
}

ncclResult_t hetccl_rtc_cache_get(hetccl_rtc_cache_t *c, uint64_t where,
                                  const hetccl_rtc_variant_t *v, hetccl_rtc_build_fn build,
                                  void *ctx, const hetccl_rtc_entry_t **out) {
  const hetccl_rtc_entry_t *e = hetccl_rtc_cache_find(c, where, v);
  ncclResult_t res = ncclSuccess;
  if (!e) {
    pthread_mutex_lock(&c->compile);
    e = hetccl_rtc_cache_find(c, where, v); /* built by another thread meanwhile? */
    if (!e) {
      hetccl_rtc_entry_t *n = calloc(1, sizeof(*n));
      res = n ? build(ctx, where, v, n) : ncclSystemError;
      if (!n) WARN("device reduce: out of memory for a kernel cache entry");
      if (res == ncclSuccess) {
        n->where = where;
        n->v = *v;
        n->next = c->head; /* writers are serialised by c->compile */
        __atomic_store_n(&c->head, n, __ATOMIC_RELEASE);
        e = n;
      } else {
        free(n);
      }
    }
    pthread_mutex_unlock(&c->compile);
  }
  if (res == ncclSuccess) *out = e;
  return res;
}

/* --- search ----------------------------------------------------------------- */

void *hetccl_rtc_open(const char *path, int noload, char *tried, size_t len) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | (noload ? RTLD_NOLOAD : 0));
  if (!h) {
    size_t off = strlen(tried);
    if (off + 1 < len) snprintf(tried + off, len - off, "%s%s", off ? ", " : "", path);
  }
  return h;
}

void *hetccl_rtc_open_in(const char *dir, const char *const *names, size_t n, char *tried,
                         size_t len) {
  if (!dir || !dir[0]) return NULL;
  for (size_t i = 0; i < n; i++) {
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    void *h = hetccl_rtc_open(path, 0, tried, len);
    if (h) return h;
  }
  return NULL;
}

void hetccl_rtc_dirname(const char *file, char *out, size_t len) {
  const char *slash = file ? strrchr(file, '/') : NULL;
  size_t n = slash ? (size_t)(slash - file) : 0;
  if (n >= len) n = len - 1;
  memmove(out, file, n); /* out may be file */
  out[n] = '\0';
}

double hetccl_rtc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --- entry: the compiler ------------------------------------------------------ */

/* Open the compiler by the rules of hetccl_rtc_vendor_t; the reason in
 * r->why when none. */
static void *compiler_open(hetccl_rtc_t *r) {
  const hetccl_rtc_vendor_t *vd = r->vendor;
  const char *knob = hetccl_knob_str(vd->knob), *env = hetccl_knob_desc(vd->knob)->env;
  if (strcmp(knob, "none") == 0) {
    snprintf(r->why, sizeof(r->why), "disabled by %s=none", env);
    return NULL;
  }
  if (knob[0]) {
    void *h = dlopen(knob, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(r->why, sizeof(r->why), "%s=%s: %s", env, knob, dlerror());
    return h;
  }
  void *h = hetccl_gpu_open_loaded(vd->names, vd->nnames, vd->prefix);
  if (h) return h;
  char tried[1280] = "";
  h = vd->search(tried, sizeof(tried));
  if (!h)
    snprintf(r->why, sizeof(r->why), "no %s found (tried %s); set %s", vd->compiler, tried, env);
  return h;
}

/* Fill the compiler from h; 0 with the reason in r->why when it cannot serve. */
static int compiler_fill(hetccl_rtc_t *r, void *h) {
  const hetccl_rtc_vendor_t *vd = r->vendor;
  hetccl_gpu_where_loaded(dlsym(h, vd->compiler_calls.version), r->path, sizeof(r->path),
                          vd->fallback_path);
  const hetccl_gpu_sym_t shared[] = {
#define SHARED_SYM(slot, ret, params, cuda, hip) {vd->compiler_calls.slot, (void **)&r->cc.slot, 0},
      HETCCL_RTC_COMPILER_API(SHARED_SYM)
#undef SHARED_SYM
  };
  if (!hetccl_gpu_take(h, shared, sizeof(shared) / sizeof(shared[0]), r->path, r->why,
                       sizeof(r->why)) ||
      !hetccl_gpu_take(h, vd->compiler_own, vd->ncompiler_own, r->path, r->why, sizeof(r->why)))
    return 0;
  if (r->cc.version(&r->major, &r->minor) != 0) {
    snprintf(r->why, sizeof(r->why), "%s: %s failed", r->path, vd->compiler_calls.version);
    return 0;
  }
  r->handle = h;
  return 1;
}

const hetccl_rtc_t *hetccl_rtc_compiler(hetccl_rtc_t *r) {
  int s = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
  if (s) return s > 0 ? r : NULL;
  pthread_mutex_lock(&r->lock);
  if (!r->state) {
    void *h = compiler_open(r);
    if (h && !compiler_fill(r, h)) {
      dlclose(h);
      h = NULL;
    }
    if (h)
      INFO(HETCCL_RUNTIME, "%s: %s %d.%d from %s", r->vendor->tag, r->vendor->compiler, r->major,
           r->minor, r->path);
    else
      INFO(HETCCL_RUNTIME, "%s: no device reductions: %s", r->vendor->tag, r->why);
    __atomic_store_n(&r->state, h ? 1 : -1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&r->lock);
  return r->state > 0 ? r : NULL;
}

/* --- entry: the device library ------------------------------------------------ */

/* The device library the process loaded; NULL while there is none. */
static const hetccl_rtc_t *device_get(hetccl_rtc_t *r) {
  hetccl_rtc_t *d = __atomic_load_n(&r->dev_ready, __ATOMIC_ACQUIRE);
  if (d) return d;
  const hetccl_rtc_vendor_t *vd = r->vendor;
  pthread_mutex_lock(&r->lock);
  if (!r->dev_ready) {
    void *h = hetccl_gpu_open_loaded(vd->dev_names, vd->ndev_names, vd->dev_prefix);
    const hetccl_gpu_sym_t shared[] = {
#define SHARED_SYM(slot, ret, params, cuda, hip) {vd->module_calls.slot, (void **)&r->mod.slot, 0},
        HETCCL_RTC_MODULE_API(SHARED_SYM)
#undef SHARED_SYM
    };
    if (h && hetccl_gpu_take(h, shared, sizeof(shared) / sizeof(shared[0]), "", NULL, 0) &&
        hetccl_gpu_take(h, vd->dev_own, vd->ndev_own, "", NULL, 0)) {
      r->dev_handle = h;
      __atomic_store_n(&r->dev_ready, r, __ATOMIC_RELEASE);
    } else if (h) {
      dlclose(h); /* a library without these calls is too old to use */
    }
  }
  pthread_mutex_unlock(&r->lock);
  return r->dev_ready;
}

int hetccl_rtc_available(hetccl_rtc_t *r, char *why, size_t len) {
  const hetccl_rtc_t *n = hetccl_rtc_compiler(r);
  const hetccl_rtc_t *d = n ? device_get(r) : NULL;
  if (why && len) {
    if (!n) snprintf(why, len, "%s", r->why);
    else if (!d) snprintf(why, len, "%s", r->vendor->dev_absent);
    else snprintf(why, len, "%s %d.%d from %s", r->vendor->compiler, r->major, r->minor, r->path);
  }
  return n && d;
}

ncclResult_t hetccl_rtc_device_result(const hetccl_rtc_t *r, int err, const char *call,
                                      const hetccl_rtc_variant_t *v) {
  if (err == 0) return ncclSuccess;
  const char *text = r->vendor->error_text(err);
  char name[96];
  hetccl_rtc_variant_name(v, name, sizeof(name));
  WARN("%s: %s failed for the reduce kernel %s: %s (error %d)", r->vendor->tag, call, name,
       text ? text : "unknown error", err);
  return ncclUnhandledCudaError;
}

/* --- entry: compiling and loading --------------------------------------------- */

/* The adapter from a compiler error to ours, with the compiler's log when
 * there is a program. */
static ncclResult_t compiler_result(const hetccl_rtc_t *r, int err, const char *call,
                                    const hetccl_rtc_variant_t *v, const char *target, void *p) {
  if (err == 0) return ncclSuccess;
  char name[96], log[1024] = "";
  hetccl_rtc_variant_name(v, name, sizeof(name));
  size_t bytes = 0;
  char *text = p && r->cc.get_program_log_size(p, &bytes) == 0 && bytes > 1 ? malloc(bytes) : NULL;
  if (text && r->cc.get_program_log(p, text) == 0) snprintf(log, sizeof(log), "%s", text);
  free(text);
  for (size_t end = strlen(log); end && (log[end - 1] == '\n' || log[end - 1] == ' ');) log[--end] = '\0';
  WARN("%s: %s failed for the reduce kernel %s (%s, %s %d.%d from %s): %s%s%s", r->vendor->tag,
       call, name, target, r->vendor->compiler, r->major, r->minor, r->path,
       r->cc.get_error_string(err), log[0] ? ": " : "", log);
  return ncclUnhandledCudaError;
}

ncclResult_t hetccl_rtc_compile(const hetccl_rtc_t *r, const hetccl_rtc_variant_t *v,
                                const hetccl_rtc_compile_args_t *a, char **image, size_t *bytes) {
  const hetccl_rtc_vendor_t *vd = r->vendor;
  const hetccl_rtc_compiler_names_t *calls = &vd->compiler_calls;
  int version = r->major * 10 + r->minor;
  if (a->cached && hetccl_rtc_disk_load(vd->disk_name, a->target, version, v, image, bytes))
    return ncclSuccess;
  void *p = NULL;
  HETCCL_CHECK(compiler_result(r, r->cc.create_program(&p, hetccl_rtc_kernel_source,
                                                       vd->source_name, 0, NULL, NULL),
                               calls->create_program, v, a->target, NULL));
  ncclResult_t res;
  HETCCL_CHECK_GOTO(compiler_result(r, r->cc.compile_program(p, a->nopts, a->opts),
                                    calls->compile_program, v, a->target, p), res, destroy);
  HETCCL_CHECK_GOTO(compiler_result(r, a->size(p, bytes), a->size_call, v, a->target, NULL), res,
                    destroy);
  *image = malloc(*bytes ? *bytes : 1);
  if (!*image) {
    WARN("%s: reduce kernel: out of memory for %zu bytes of code", vd->tag, *bytes);
    res = ncclSystemError;
    goto destroy;
  }
  res = compiler_result(r, a->get(p, *image), a->get_call, v, a->target, NULL);
  if (res != ncclSuccess) {
    free(*image);
    *image = NULL;
  } else if (a->cached) {
    hetccl_rtc_disk_store(vd->disk_name, a->target, version, v, *image, *bytes);
  }
destroy:
  r->cc.destroy_program(&p);
  return res;
}

ncclResult_t hetccl_rtc_build(hetccl_rtc_t *r, const hetccl_rtc_variant_t *v,
                              const hetccl_rtc_compile_args_t *a, int units, hetccl_rtc_entry_t *e) {
  const hetccl_rtc_module_names_t *calls = &r->vendor->module_calls;
  char *image = NULL;
  size_t bytes = 0;
  double t0 = hetccl_rtc_now_ms();
  HETCCL_CHECK(hetccl_rtc_compile(r, v, a, &image, &bytes));
  double t1 = hetccl_rtc_now_ms();
  void *module = NULL;
  e->units = units;
  ncclResult_t res = hetccl_rtc_device_result(r, r->mod.module_load_data(&module, image),
                                              calls->module_load_data, v);
  free(image);
  HETCCL_CHECK(res);
  res = hetccl_rtc_device_result(
      r, r->mod.module_get_function(&e->function, module, HETCCL_RTC_KERNEL_NAME),
      calls->module_get_function, v);
  if (res == ncclSuccess)
    res = hetccl_rtc_device_result(
        r, r->mod.module_get_function(&e->run_function, module, HETCCL_RTC_RUN_KERNEL_NAME),
        calls->module_get_function, v);
  if (res != ncclSuccess) {
    r->mod.module_unload(module);
    return res;
  }
  char name[96];
  hetccl_rtc_variant_name(v, name, sizeof(name));
  INFO(HETCCL_RUNTIME, "%s: reduce kernel %s: compiled%s for %s by %s %d.%d in %.1f ms (%zu bytes), "
       "loaded in %.1f ms", r->vendor->tag, name, a->cached ? " (or read from the disk cache)" : "",
       a->target, r->vendor->compiler, r->major, r->minor, t1 - t0, bytes,
       hetccl_rtc_now_ms() - t1);
  return ncclSuccess;
}

/* --- entry: launching ---------------------------------------------------------- */

/* The kernel of v where the current thread's kernels load; the first call
 * of a (where, variant) pays the compile. */
static ncclResult_t kernel_get(hetccl_rtc_t *r, const hetccl_rtc_variant_t *v,
                               const hetccl_rtc_entry_t **out) {
  uint64_t where = 0;
  HETCCL_CHECK(r->vendor->where(r, v, &where));
  return hetccl_rtc_cache_get(&r->cache, where, v, r->vendor->build, r, out);
}

static ncclResult_t launch(const hetccl_rtc_t *r, void *fn, unsigned grid, unsigned block,
                           void *stream, void **params, const hetccl_rtc_variant_t *v) {
  return hetccl_rtc_device_result(
      r, r->mod.launch_kernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, NULL),
      r->vendor->module_calls.launch_kernel, v);
}

ncclResult_t hetccl_rtc_reduce_async(hetccl_rtc_t *r, const hetccl_redop_t *op, void *dst,
                                     const void *a, const void *b, size_t count, unsigned flags,
                                     void *stream) {
  if (!hetccl_rtc_compiler(r) || !device_get(r))
    return ncclInvalidUsage; /* no WARN: the caller falls back to the host */
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, b == NULL, r->vendor->async_who, &v));
  const hetccl_rtc_entry_t *e;
  HETCCL_CHECK(kernel_get(r, &v, &e)); /* count 0 too: it loads the kernel ahead */
  if (count == 0) return ncclSuccess;
  if (!b) b = a; /* unary: the kernel never reads it; the plan aligns on it */
  hetccl_rtc_launch_t l;
  hetccl_rtc_plan(op, dst, a, b, count, e->units, &l);
  return launch(r, e->function, l.grid, l.block, stream, l.params, &v);
}

ncclResult_t hetccl_rtc_reduce_run_async(hetccl_rtc_t *r, const hetccl_redop_t *op,
                                         unsigned flags, const hetccl_reduce_run_t *run,
                                         void *stream) {
  if (!hetccl_rtc_compiler(r) || !device_get(r)) return ncclInvalidUsage; /* as reduce_async */
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, 0, r->vendor->run_who, &v));
  const hetccl_rtc_entry_t *e;
  HETCCL_CHECK(kernel_get(r, &v, &e));
  if (run->steps == 0) return ncclSuccess;
  hetccl_rtc_run_launch_t l;
  hetccl_rtc_plan_run(op, run, &l);
  return launch(r, e->run_function, l.grid, l.block, stream, l.params, &v);
}
