/* The vendor loader (libhetccl/vendor_ccl/loader.c) against stand-in libraries.
 *
 *   test_vendor [rccl-]MODE LIB
 *
 * Loading happens once per process, so each mode is its own process (one
 * meson test each). A mode loads NCCL, or with the rccl- prefix RCCL (the
 * same loader under RCCL's descriptor). LIB is what the vendor's knob
 * (HETCCL_NCCL_LIBRARY, HETCCL_RCCL_LIBRARY) is set to:
 *   slots     a fake NCCL: slots taken from it, absent ones answer with the
 *             stub's error, the re-entry guard forwards its calls to its own
 *             exported names back to it, 8 threads get the same answer
 *   required  a fake lacking ncclSend: refused, and refused again later
 *   self      the object this loader lives in: refused as hetccl itself
 *   hetccl    a fake that also defines hetcclVersionString: refused
 *   missing   a path that does not exist: the error names it
 *   loaded    (no HETCCL_NCCL_LIBRARY) LIB, a fake named libnccl.so.2, was
 *             loaded by the program first: found as already loaded
 *   mapped    (no HETCCL_NCCL_LIBRARY) LIB, a fake under another name, was
 *             loaded first: found among the mapped objects
 *   real      the real NCCL named by $HETCCL_TEST_REAL_NCCL (skipped when
 *             unset): loads and reports its version (no GPU needed)
 *   rccl-loaded  (no knob) LIB, a fake named librccl.so.1, was loaded
 *             first: RCCL finds it as already loaded, the mapped-object
 *             probe names it RCCL and not NCCL, and NCCL's search never
 *             takes it
 *   two       LIB is NCCL (knob) and fakes/librccl.so.1 (argument 3) is
 *             RCCL: both load, NCCL stays the process's vendor, and each
 *             one's calls to its own names go back to that one
 * Exit 0 pass, 1 fail, 77 skip. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "vendor_ccl/vendor.h"

extern int ut_fresh_calls, ut_reentered, ut_from_vendor;

static int failures;
static hetccl_vendor_id_t vendor = HETCCL_VENDOR_NCCL; /* what the mode loads */
static const char *knob_env = "";                       /* its knob's variable */

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      failures++;                                                              \
    }                                                                          \
  } while (0)

static void *load_thread(void *arg) {
  const hetccl_vendor_t *v = NULL;
  ncclResult_t res = hetccl_vendor_load(vendor, &v);
  *(const hetccl_vendor_t **)arg = res == ncclSuccess ? v : NULL;
  return NULL;
}

static void expect_refused(const char *lib, const char *why) {
  const hetccl_vendor_t *v = (const hetccl_vendor_t *)1;
  ncclResult_t res = hetccl_vendor_load(vendor, &v);
  EXPECT(res == ncclSystemError, "result %d", res);
  EXPECT(v == NULL, "vendor %p", (const void *)v);
  EXPECT(hetccl_vendor_loaded() == NULL, "a vendor was published");
  const char *msg = hetccl_last_error();
  EXPECT(strstr(msg, knob_env) && strstr(msg, lib) && strstr(msg, why),
         "message '%s' should name %s, %s and '%s'", msg, knob_env, lib, why);
  hetccl_last_error_clear();
  res = hetccl_vendor_load(vendor, &v); /* the same answer, and the message again */
  EXPECT(res == ncclSystemError && strstr(hetccl_last_error(), why), "second call: %d '%s'",
         res, hetccl_last_error());
  printf("refused as expected: %s\n", msg);
}

static void mode_slots(const char *lib) {
  const hetccl_vendor_t *v = NULL;
  EXPECT(hetccl_vendor_loaded() == NULL, "published before loading");
  pthread_t th[8];
  const hetccl_vendor_t *seen[8];
  for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, load_thread, &seen[i]);
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  ncclResult_t res = hetccl_vendor_load(vendor, &v);
  EXPECT(res == ncclSuccess && v, "load: %d '%s'", res, hetccl_last_error());
  if (!v) return;
  for (int i = 0; i < 8; i++) EXPECT(seen[i] == v, "thread %d got %p", i, (const void *)seen[i]);
  EXPECT(hetccl_vendor_loaded() == v, "loaded() differs");
  EXPECT(v->version == 23203, "version %d", v->version);
  EXPECT(v->id == vendor && strcmp(v->name, hetccl_vendor_name(vendor)) == 0, "name %s", v->name);
  EXPECT(v->path && strstr(v->path, "fakenccl_full"), "path %s", v->path);

  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  EXPECT(h != NULL, "fake not loaded");
  if (!h) return;
  EXPECT((void *)v->AllReduce == dlsym(h, "ncclAllReduce"), "AllReduce not the fake's");
  EXPECT((void *)v->CommCount == dlsym(h, "ncclCommCount"), "CommCount not the fake's");
  int *allreduce_calls = dlsym(h, "fake_allreduce_calls");
  int *group_starts = dlsym(h, "fake_group_starts");
  int *group_ends = dlsym(h, "fake_group_ends");

  /* A forwarded call, with the guard held around it. */
  EXPECT(!hetccl_vendor_in_call(), "in a call before any");
  res = HETCCL_VENDOR_CALL(v, AllReduce, NULL, NULL, 12345, ncclFloat32, ncclSum, NULL, NULL);
  EXPECT(res == ncclSuccess && *allreduce_calls == 1, "AllReduce: %d calls %d", res,
         *allreduce_calls);
  EXPECT(*(size_t *)dlsym(h, "fake_last_count") == 12345, "count not passed through");
  EXPECT(!hetccl_vendor_in_call(), "depth not restored");
  int count = 0;
  EXPECT(HETCCL_VENDOR_CALL(v, CommCount, NULL, &count) == ncclSuccess && count == 7,
         "CommCount %d", count);

  /* The fake's CommInitRank calls its own exported ncclGroupStart/End;
   * they bind to ours (we are in the global scope) and must go back. */
  ncclComm_t comm = NULL;
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  res = HETCCL_VENDOR_CALL(v, CommInitRank, &comm, 2, id, 0);
  EXPECT(res == ncclSuccess && comm, "CommInitRank %d", res);
  EXPECT(ut_reentered == 2 && ut_fresh_calls == 0, "re-entered %d fresh %d", ut_reentered,
         ut_fresh_calls);
  EXPECT(*group_starts == 1 && *group_ends == 1, "vendor group calls %d/%d", *group_starts,
         *group_ends);
  EXPECT(ut_from_vendor == 2, "return address seen in the vendor %d times", ut_from_vendor);
  /* Without the guard, the same calls look like fresh API calls: the guard
   * is what sends them back. The return address still tells. */
  res = v->CommInitRank(&comm, 2, id, 0);
  EXPECT(ut_fresh_calls == 2 && ut_from_vendor == 4, "unguarded: fresh %d from vendor %d",
         ut_fresh_calls, ut_from_vendor);
  EXPECT(hetccl_vendor_owns((const void *)v->AllReduce), "AllReduce not in the vendor's code");
  EXPECT(!hetccl_vendor_owns((const void *)mode_slots), "our code counted as the vendor's");

  /* Absent slots: stubs, never NULL, failing with a message. */
  hetccl_last_error_clear();
  ncclComm_t newcomm = NULL;
  res = v->CommShrink(NULL, NULL, 0, &newcomm, NULL, 0);
  EXPECT(res == ncclInvalidUsage, "CommShrink stub returned %d", res);
  const char *msg = hetccl_last_error();
  EXPECT(strstr(msg, "ncclCommShrink is not provided by") && strstr(msg, "fakenccl_full") &&
             strstr(msg, "23203"),
         "stub message '%s'", msg);
  const char *s = v->GetLastError(NULL);
  EXPECT(s && s[0], "GetLastError stub returned %s", s ? "empty" : "NULL");
  EXPECT(v->TeamRankToWorld(NULL, (ncclTeam_t){0, 0, 0}, 0) == -1, "int stub not -1");
  ncclTeam_t t = v->TeamWorld(NULL);
  EXPECT(t.nRanks == 0 && t.rank == 0 && t.stride == 0, "struct stub not zero");
#define NOT_NULL(slot, ret, params) EXPECT(v->slot != NULL, "slot %s is NULL", #slot);
  HETCCL_VENDOR_SLOTS(NOT_NULL)
#undef NOT_NULL
}

/* The program loaded LIB itself before hetccl looked. */
static void mode_search(const char *lib, const char *how) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
  EXPECT(h != NULL, "dlopen %s: %s", lib, dlerror());
  if (!h) return;
  const hetccl_vendor_t *v = NULL;
  ncclResult_t res = hetccl_vendor_load(vendor, &v);
  EXPECT(res == ncclSuccess && v, "load: %d '%s'", res, hetccl_last_error());
  if (!v) return;
  EXPECT((void *)v->GetVersion == dlsym(h, "ncclGetVersion"), "not the program's library");
  EXPECT(strcmp(v->path, lib) == 0, "path %s", v->path);
  printf("%s: found %s (%s)\n", how, v->path, lib);
}

static void mode_real(void) {
  const char *path = getenv("HETCCL_TEST_REAL_NCCL");
  const hetccl_vendor_t *v = NULL;
  ncclResult_t res = hetccl_vendor_load(HETCCL_VENDOR_NCCL, &v);
  EXPECT(res == ncclSuccess && v, "load %s: %d '%s'", path, res, hetccl_last_error());
  if (!v) return;
  EXPECT(v->version >= 21800, "version %d", v->version);
  int again = 0;
  EXPECT(HETCCL_VENDOR_CALL(v, GetVersion, &again) == ncclSuccess && again == v->version,
         "GetVersion %d", again);
  const char *text = HETCCL_VENDOR_CALL(v, GetErrorString, ncclInvalidUsage);
  EXPECT(text && text[0], "GetErrorString");
  printf("real NCCL %d from %s\n", v->version, v->path);
}

/* After mode_search found LIB (a fake librccl.so.1) as RCCL: only RCCL
 * claims it. */
static void rccl_only(void) {
  EXPECT(hetccl_vendor_foreign_mapped(HETCCL_VENDOR_RCCL), "librccl.so.1 not seen as mapped");
  EXPECT(!hetccl_vendor_foreign_mapped(HETCCL_VENDOR_NCCL), "librccl.so.1 seen as NCCL");
  const hetccl_vendor_t *n = NULL;
  ncclResult_t res = hetccl_vendor_load(HETCCL_VENDOR_NCCL, &n);
  EXPECT(res != ncclSuccess || !strstr(n->path, "librccl"), "NCCL's search took %s",
         n ? n->path : "");
  printf("NCCL: %s\n", res == ncclSuccess ? n->path : hetccl_last_error());
}

/* NCCL (the knob) and RCCL (loaded by the program) in one process. */
static void mode_two(const char *nccl_lib, const char *rccl_lib) {
  const hetccl_vendor_t *n = NULL, *r = NULL;
  EXPECT(hetccl_vendor_load(HETCCL_VENDOR_NCCL, &n) == ncclSuccess && n, "NCCL: %s",
         hetccl_last_error());
  void *h = dlopen(rccl_lib, RTLD_NOW | RTLD_GLOBAL);
  EXPECT(h != NULL, "dlopen %s: %s", rccl_lib, dlerror());
  EXPECT(hetccl_vendor_load(HETCCL_VENDOR_RCCL, &r) == ncclSuccess && r, "RCCL: %s",
         hetccl_last_error());
  if (!n || !r || !h) return;
  EXPECT(n != r && (void *)r->GroupStart == dlsym(h, "ncclGroupStart"), "RCCL not the fake");
  EXPECT(strstr(n->path, nccl_lib) && strcmp(n->backend, "vendor:nccl") == 0, "NCCL %s %s",
         n->path, n->backend);
  EXPECT(strstr(r->path, "librccl.so.1") && strcmp(r->backend, "vendor:rccl") == 0, "RCCL %s %s",
         r->path, r->backend);
  EXPECT(strcmp(n->hier_backend, "hierarchical:nccl") == 0 &&
             strcmp(r->hier_backend, "hierarchical:rccl") == 0,
         "hierarchical backends %s %s", n->hier_backend, r->hier_backend);
  EXPECT(hetccl_vendor_loaded() == n, "the process's vendor is not the first loaded");
  int *r_starts = dlsym(h, "fake_group_starts");
  int *n_starts = dlsym(dlopen(nccl_lib, RTLD_NOW | RTLD_NOLOAD), "fake_group_starts");
  ncclComm_t comm = NULL;
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  EXPECT(HETCCL_VENDOR_CALL(r, CommInitRank, &comm, 2, id, 0) == ncclSuccess, "RCCL init");
  EXPECT(*r_starts == 1 && *n_starts == 0, "RCCL's own group call went to %s",
         *n_starts ? "NCCL" : "nowhere");
  EXPECT(HETCCL_VENDOR_CALL(n, CommInitRank, &comm, 2, id, 0) == ncclSuccess, "NCCL init");
  EXPECT(*r_starts == 1 && *n_starts == 1, "NCCL's own group call: nccl %d rccl %d", *n_starts,
         *r_starts);
  EXPECT(hetccl_vendor_owns((const void *)r->AllReduce) &&
             hetccl_vendor_owns((const void *)n->AllReduce), "a vendor's code not recognised");
  EXPECT(hetccl_vendor_reentered((const void *)r->AllReduce) == r, "RCCL's code not RCCL's");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODE [LIB]\n", argv[0]);
    return 2;
  }
  const char *mode = argv[1], *lib = argc > 2 ? argv[2] : "";
  if (strncmp(mode, "rccl-", 5) == 0) {
    vendor = HETCCL_VENDOR_RCCL;
    mode += 5;
  }
  knob_env = hetccl_knob_desc(hetccl_vendor_knob(vendor))->env;
  if (strcmp(mode, "real") == 0 && vendor == HETCCL_VENDOR_NCCL) {
    lib = getenv("HETCCL_TEST_REAL_NCCL");
    if (!lib || !lib[0]) {
      printf("SKIP: set HETCCL_TEST_REAL_NCCL to a real libnccl.so.2\n");
      return 77;
    }
  }
  int search = strcmp(mode, "loaded") == 0 || strcmp(mode, "mapped") == 0;
  setenv(knob_env, search ? "" : lib, 1);
  if (strcmp(mode, "slots") == 0) mode_slots(lib);
  else if (strcmp(mode, "required") == 0) expect_refused(lib, "lacks ncclSend");
  else if (strcmp(mode, "self") == 0) expect_refused(lib, "hetccl itself");
  else if (strcmp(mode, "hetccl") == 0) expect_refused(lib, "is a hetccl library");
  else if (strcmp(mode, "missing") == 0) expect_refused(lib, "No such file");
  else if (strcmp(mode, "real") == 0) mode_real();
  else if (strcmp(mode, "two") == 0 && argc > 3) mode_two(lib, argv[3]);
  else if (search) {
    mode_search(lib, mode);
    if (vendor == HETCCL_VENDOR_RCCL) rccl_only();
  }
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  printf("%s: %s\n", mode, failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
