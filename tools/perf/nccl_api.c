/* The NCCL API, resolved with dlopen/dlsym on one handle.
 *
 * $HETCCL_PERF_LIB names the library (a real libnccl.so.2 to measure NCCL
 * itself); otherwise $HETCCL_LIBRARY, which names hetccl's library for the
 * whole project (the Python package, `hetccl run`, which sets it for its
 * ranks and preloads it); otherwise hetccl's own library: beside the
 * executable (the installed Python package holds both), then ../libhetccl/
 * or ../../libhetccl/ (meson build tree: build/tools/perf), then the
 * loader's search path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf.h"

static void *open_candidate(const char *path)
{
  if (strchr(path, '/') && access(path, R_OK) != 0)
    return NULL;
  /* RTLD_GLOBAL: a library loaded under LD_PRELOAD is the same object. */
  return dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

static void *open_library(const char *exe_dir, char *tried, size_t tried_len)
{
  static const char *const named[] = {"HETCCL_PERF_LIB", "HETCCL_LIBRARY"};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
    const char *env = getenv(named[i]);
    if (!env || !*env)
      continue;
    void *h = dlopen(env, RTLD_NOW | RTLD_GLOBAL);
    if (!h)
      snprintf(tried, tried_len, "%s=%s: %s", named[i], env, dlerror());
    return h;
  }
  char path[4096];
  const char *rel[] = {"libhetccl.so", "../libhetccl/libhetccl.so",
                       "../../libhetccl/libhetccl.so"}; /* build/tools/perf */
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", exe_dir, rel[i]);
    void *h = open_candidate(path);
    if (h)
      return h;
  }
  void *h = open_candidate("libhetccl.so");
  if (!h)
    snprintf(tried, tried_len,
             "no libhetccl.so in %s, %s/../libhetccl, ../../libhetccl or the library path (%s); "
             "set HETCCL_PERF_LIB",
             exe_dir, exe_dir, dlerror());
  return h;
}

#define RESOLVE(api, name, required)                                           \
  do {                                                                         \
    *(void **)&(api)->name = dlsym((api)->handle, "nccl" #name);               \
    if (!(api)->name && (required)) {                                          \
      fprintf(stderr, "hetccl-perf: %s has no nccl" #name "\n", (api)->path);  \
      return -1;                                                               \
    }                                                                          \
  } while (0)

int perf_nccl_load(struct perf_nccl *api, const char *exe_dir)
{
  char why[8192] = "";
  memset(api, 0, sizeof *api);
  api->handle = open_library(exe_dir, why, sizeof why);
  if (!api->handle) {
    fprintf(stderr, "hetccl-perf: cannot load the NCCL library: %s\n", why);
    return -1;
  }
  struct link_map *map = NULL;
  if (dlinfo(api->handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name)
    snprintf(api->path, sizeof api->path, "%s", map->l_name);
  char *real = realpath(api->path, NULL);
  if (real) {
    snprintf(api->path, sizeof api->path, "%s", real);
    free(real);
  }
  RESOLVE(api, GetVersion, 1);
  RESOLVE(api, GetUniqueId, 1);
  RESOLVE(api, CommInitRank, 1);
  RESOLVE(api, CommInitAll, 1);
  RESOLVE(api, CommDestroy, 1);
  RESOLVE(api, GetErrorString, 1);
  RESOLVE(api, GetLastError, 0);
  RESOLVE(api, GroupStart, 1);
  RESOLVE(api, GroupEnd, 1);
  RESOLVE(api, AllReduce, 1);
  RESOLVE(api, AllGather, 1);
  RESOLVE(api, ReduceScatter, 1);
  RESOLVE(api, Broadcast, 1);
  RESOLVE(api, Reduce, 1);
  RESOLVE(api, Send, 1);
  RESOLVE(api, Recv, 1);
  RESOLVE(api, AlltoAll, 0);
  RESOLVE(api, Gather, 0);
  RESOLVE(api, Scatter, 0);
  RESOLVE(api, CommRegister, 0);
  RESOLVE(api, CommDeregister, 0);
  if (api->GetVersion(&api->version) != ncclSuccess)
    api->version = 0;
  return 0;
}
