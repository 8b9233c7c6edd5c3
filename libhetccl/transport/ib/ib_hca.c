/* Which verbs devices and ports the ib transport may use: HETCCL_IB_HCA,
 * else NCCL's NCCL_IB_HCA, read as NCCL reads it.
 *
 *   value                 allows
 *   (unset or empty)      every device, every port
 *   mlx5                  every device whose name starts with "mlx5"
 *   mlx5_0:1,mlx5_1:1     port 1 of the devices named so (a comma list)
 *   =mlx5_0               the device named exactly "mlx5_0"
 *   ^mlx5_2               every device but those the list names
 *   ^=mlx5_2:1            every device and port but port 1 of mlx5_2
 *
 * A name matches as a prefix unless the list starts with '=' (after the
 * '^', if any); ":port" (1..255) narrows an entry to that port. The
 * transport opens, in the verbs device list's order, every device the list
 * allows with an allowed active port, HETCCL_IB_RAILS at most, one port
 * each (ib_dev.c): its rails (ib.h, docs/transports.md).
 *
 * No verbs here: built in every configuration, and unit-tested
 * (tests/c/transport/test_ib_hca.c). */
#include "transport/ib/ib_hca.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/knobs.h"
#include "util/log.h"

static ncclResult_t entry_parse(const char *knob, const char *spec, const char *s, size_t n,
                                hetccl_ib_hca_entry_t *e) {
  const char *colon = memchr(s, ':', n);
  size_t name_len = colon ? (size_t)(colon - s) : n;
  e->port = 0;
  if (colon) {
    char digits[8];
    size_t dn = n - name_len - 1;
    char *end = NULL;
    long p = 0;
    if (dn > 0 && dn < sizeof(digits)) {
      memcpy(digits, colon + 1, dn);
      digits[dn] = '\0';
      p = strtol(digits, &end, 10);
    }
    if (dn == 0 || dn >= sizeof(digits) || *end != '\0' || p < 1 || p > 255) {
      WARN("%s=%s: \"%.*s\" is not a device name followed by :port (1-255)", knob, spec, (int)n,
           s);
      return ncclInvalidArgument;
    }
    e->port = (int)p;
  }
  if (name_len == 0 || name_len >= sizeof(e->name)) {
    WARN("%s=%s: \"%.*s\" is not a device name (1-%zu characters), optionally followed by :port",
         knob, spec, (int)n, s, sizeof(e->name) - 1);
    return ncclInvalidArgument;
  }
  memcpy(e->name, s, name_len);
  e->name[name_len] = '\0';
  return ncclSuccess;
}

ncclResult_t hetccl_ib_hca_parse(const char *knob, const char *spec, hetccl_ib_hca_t *out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->knob, sizeof(out->knob), "%s", knob);
  snprintf(out->spec, sizeof(out->spec), "%s", spec ? spec : "");
  const char *s = out->spec;
  if (*s == '^') {
    out->exclude = 1;
    s++;
  }
  if (*s == '=') {
    out->exact = 1;
    s++;
  }
  if (*s == '\0') {
    if (out->exclude || out->exact) {
      WARN("%s=%s: a list of devices must follow '^' or '='", knob, out->spec);
      return ncclInvalidArgument;
    }
    return ncclSuccess; /* everything */
  }
  while (*s) {
    const char *comma = strchr(s, ',');
    size_t n = comma ? (size_t)(comma - s) : strlen(s);
    if (out->n == HETCCL_IB_HCA_MAX) {
      WARN("%s=%s: more than %d entries", knob, out->spec, HETCCL_IB_HCA_MAX);
      return ncclInvalidArgument;
    }
    ncclResult_t res = entry_parse(knob, out->spec, s, n, &out->e[out->n]);
    if (res != ncclSuccess) return res;
    out->n++;
    s += n;
    if (*s == ',') s++;
  }
  return ncclSuccess;
}

static int entry_names(const hetccl_ib_hca_t *h, const hetccl_ib_hca_entry_t *e,
                       const char *dev) {
  return h->exact ? strcmp(dev, e->name) == 0 : strncmp(dev, e->name, strlen(e->name)) == 0;
}

int hetccl_ib_hca_allows(const hetccl_ib_hca_t *h, const char *dev, int port) {
  if (h->n == 0) return 1;
  int named = 0;
  for (int i = 0; i < h->n && !named; i++) {
    const hetccl_ib_hca_entry_t *e = &h->e[i];
    /* port 0 asks about the device: an entry naming one port of it names it */
    named = entry_names(h, e, dev) && (port == 0 || e->port == 0 || e->port == port);
    /* excluding one port of a device leaves the device, with its other ports */
    if (named && h->exclude && port == 0 && e->port != 0) named = 0;
  }
  return h->exclude ? !named : named;
}

ncclResult_t hetccl_ib_hca_get(hetccl_ib_hca_t *out) {
  hetccl_knob_t id = hetccl_knob_or_nccl(HETCCL_KNOB_IB_HCA, HETCCL_KNOB_NCCL_IB_HCA);
  return hetccl_ib_hca_parse(hetccl_knob_desc(id)->env, hetccl_knob_str(id), out);
}
