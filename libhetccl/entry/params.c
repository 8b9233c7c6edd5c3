/* ncclParam*: NCCL's parameter API over hetccl's knob table (the core half
 * of the entry points, entry/dispatch.h).
 *
 * A key is a knob's environment name ("HETCCL_TIMEOUT", "NCCL_SOCKET_IFNAME");
 * a key without its prefix ("TIMEOUT") names the HETCCL_ knob, else the
 * NCCL_ one. Values are the effective ones (the default when unset).
 * Returned strings and tables live in per-thread buffers, valid until the
 * same function is next called on the same thread. Any thread; no locks
 * beyond the knob table's own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "entry/dispatch.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

struct ncclParamHandle {
  hetccl_knob_t id;
};

static const struct ncclParamHandle param_handles[HETCCL_KNOB_COUNT] = {
#define HETCCL_PARAM_HANDLE(id, env, type, def, lo, hi, help) {HETCCL_KNOB_##id},
    HETCCL_KNOBS(HETCCL_PARAM_HANDLE)
#undef HETCCL_PARAM_HANDLE
};

/* A per-thread buffer that grows as needed; one per returning function. */
typedef struct {
  char *data;
  size_t cap;
} tls_buf_t;

static _Thread_local tls_buf_t str_buf, param_buf;
static _Thread_local const char *key_table[HETCCL_KNOB_COUNT];

static ncclResult_t tls_buf_set(tls_buf_t *b, const char *s, const char *func) {
  size_t need = strlen(s) + 1;
  if (need > b->cap) {
    char *p = realloc(b->data, need);
    HETCCL_ARGCHECK(p != NULL, ncclSystemError, "%s: out of memory for %zu bytes", func, need);
    b->data = p;
    b->cap = need;
  }
  memcpy(b->data, s, need);
  return ncclSuccess;
}

static int knob_by_name(const char *name) {
  for (int i = 0; i < HETCCL_KNOB_COUNT; i++)
    if (strcmp(hetccl_knob_desc((hetccl_knob_t)i)->env, name) == 0) return i;
  return -1;
}

static ncclResult_t knob_lookup(const char *key, hetccl_knob_t *out, const char *func) {
  HETCCL_ARGCHECK(key != NULL, ncclInvalidArgument, "%s: key is NULL", func);
  int id = knob_by_name(key);
  char name[256];
  if (id < 0 && snprintf(name, sizeof(name), "HETCCL_%s", key) < (int)sizeof(name))
    id = knob_by_name(name);
  if (id < 0 && snprintf(name, sizeof(name), "NCCL_%s", key) < (int)sizeof(name))
    id = knob_by_name(name);
  HETCCL_ARGCHECK(id >= 0, ncclInvalidArgument,
                  "%s: unknown parameter '%s' (hetccl info lists the known ones)", func, key);
  *out = (hetccl_knob_t)id;
  return ncclSuccess;
}

static ncclResult_t handle_check(ncclParamHandle_t h, const char *func) {
  HETCCL_ARGCHECK(h >= param_handles && h < param_handles + HETCCL_KNOB_COUNT,
                  ncclInvalidArgument, "%s: handle %p was not returned by ncclParamBind", func,
                  (const void *)h);
  return ncclSuccess;
}

/* Effective value as text; INT knobs in decimal, STR and ENUM as text. */
static const char *knob_text(hetccl_knob_t id, char *tmp, size_t tmp_len) {
  if (hetccl_knob_desc(id)->type != HETCCL_KNOB_INT) return hetccl_knob_str(id);
  snprintf(tmp, tmp_len, "%lld", (long long)hetccl_knob_int(id));
  return tmp;
}

/* An INT knob's value, checked against [lo, hi] of the caller's type. */
static ncclResult_t param_get_int(ncclParamHandle_t h, int64_t lo, uint64_t hi, int64_t *out,
                                  const char *func) {
  HETCCL_CHECK(handle_check(h, func));
  const hetccl_knob_desc_t *d = hetccl_knob_desc(h->id);
  HETCCL_ARGCHECK(d->type == HETCCL_KNOB_INT, ncclInvalidArgument,
                  "%s: %s is a string parameter; use ncclParamGetStr", func, d->env);
  int64_t v = hetccl_knob_int(h->id);
  HETCCL_ARGCHECK(v >= lo && (v < 0 || (uint64_t)v <= hi), ncclInvalidArgument,
                  "%s: %s=%lld does not fit the requested type", func, d->env, (long long)v);
  *out = v;
  return ncclSuccess;
}

ncclResult_t hetccl_ParamBind(ncclParamHandle_t *out, const char *key) {
  hetccl_knob_t id;
  HETCCL_CHECK(knob_lookup(key, &id, "ncclParamBind"));
  *out = (ncclParamHandle_t)&param_handles[id];
  return ncclSuccess;
}

/* One getter per integer type: range-checked copy of the INT knob. */
#define HETCCL_PARAM_GETTER(suffix, ctype, lo, hi)                             \
  ncclResult_t hetccl_ParamGet##suffix(ncclParamHandle_t h, ctype *out) {      \
    int64_t v;                                                                 \
    HETCCL_CHECK(param_get_int(h, (lo), (hi), &v, "ncclParamGet" #suffix));    \
    *out = (ctype)v;                                                           \
    return ncclSuccess;                                                        \
  }

HETCCL_PARAM_GETTER(I8, int8_t, INT8_MIN, INT8_MAX)
HETCCL_PARAM_GETTER(I16, int16_t, INT16_MIN, INT16_MAX)
HETCCL_PARAM_GETTER(I32, int32_t, INT32_MIN, INT32_MAX)
HETCCL_PARAM_GETTER(I64, int64_t, INT64_MIN, INT64_MAX)
HETCCL_PARAM_GETTER(U8, uint8_t, 0, UINT8_MAX)
HETCCL_PARAM_GETTER(U16, uint16_t, 0, UINT16_MAX)
HETCCL_PARAM_GETTER(U32, uint32_t, 0, UINT32_MAX)
HETCCL_PARAM_GETTER(U64, uint64_t, 0, UINT64_MAX)
#undef HETCCL_PARAM_GETTER

ncclResult_t hetccl_ParamGetStr(ncclParamHandle_t h, const char **out) {
  HETCCL_CHECK(handle_check(h, "ncclParamGetStr"));
  char tmp[32];
  HETCCL_CHECK(tls_buf_set(&str_buf, knob_text(h->id, tmp, sizeof(tmp)), "ncclParamGetStr"));
  *out = str_buf.data;
  return ncclSuccess;
}

/* Raw bytes: an INT knob as a native int64_t, a STR knob as its text with
 * the terminating NUL. *len receives the size needed even when it does not
 * fit. */
ncclResult_t hetccl_ParamGet(ncclParamHandle_t h, void *out, int maxLen, int *len) {
  HETCCL_CHECK(handle_check(h, "ncclParamGet"));
  const hetccl_knob_desc_t *d = hetccl_knob_desc(h->id);
  int64_t ival = 0;
  const void *src;
  size_t need;
  if (d->type == HETCCL_KNOB_INT) {
    ival = hetccl_knob_int(h->id);
    src = &ival;
    need = sizeof(ival);
  } else {
    src = hetccl_knob_str(h->id);
    need = strlen(src) + 1;
  }
  if (len) *len = (int)need;
  HETCCL_ARGCHECK(maxLen >= 0 && (size_t)maxLen >= need, ncclInvalidArgument,
                  "ncclParamGet: %s needs %zu bytes, buffer has %d", d->env, need, maxLen);
  memcpy(out, src, need);
  return ncclSuccess;
}

ncclResult_t hetccl_ParamGetParameter(const char *key, const char **value, int *valueLen) {
  hetccl_knob_t id;
  HETCCL_CHECK(knob_lookup(key, &id, "ncclParamGetParameter"));
  char tmp[32];
  HETCCL_CHECK(tls_buf_set(&param_buf, knob_text(id, tmp, sizeof(tmp)), "ncclParamGetParameter"));
  *value = param_buf.data;
  if (valueLen) *valueLen = (int)strlen(param_buf.data);
  return ncclSuccess;
}

ncclResult_t hetccl_ParamGetAllParameterKeys(const char ***table, int *tableLen) {
  for (int i = 0; i < HETCCL_KNOB_COUNT; i++) key_table[i] = hetccl_knob_desc((hetccl_knob_t)i)->env;
  *table = key_table;
  *tableLen = HETCCL_KNOB_COUNT;
  return ncclSuccess;
}

/* Printed only when logging (INFO, subsystem ENV) is on, like any log. */
void hetccl_ParamDumpAll(void) {
  for (int i = 0; i < HETCCL_KNOB_COUNT; i++) {
    const hetccl_knob_desc_t *d = hetccl_knob_desc((hetccl_knob_t)i);
    char tmp[32];
    const char *value = knob_text((hetccl_knob_t)i, tmp, sizeof(tmp));
    INFO(HETCCL_ENV, "%s = %s%s (default %s)", d->env, value[0] ? value : "\"\"",
         hetccl_knob_is_set((hetccl_knob_t)i) ? "" : " [unset]", d->def[0] ? d->def : "\"\"");
  }
}
