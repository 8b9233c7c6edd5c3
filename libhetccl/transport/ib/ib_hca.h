/* Which verbs devices and ports the ib transport may use (HETCCL_IB_HCA,
 * else NCCL_IB_HCA, in NCCL's syntax): the table is at the top of
 * ib_hca.c. No verbs types here. */
#ifndef HETCCL_TRANSPORT_IB_HCA_H
#define HETCCL_TRANSPORT_IB_HCA_H

#include "nccl.h"

#define HETCCL_IB_HCA_MAX 32

typedef struct {
  char name[64];
  int port; /* 0: any */
} hetccl_ib_hca_entry_t;

typedef struct {
  char knob[32];  /* the variable it came from, for messages */
  char spec[512]; /* its value as given */
  int exclude;    /* '^': the entries are what is not allowed */
  int exact;      /* '=': names match whole, not as prefixes */
  int n;          /* 0: everything is allowed */
  hetccl_ib_hca_entry_t e[HETCCL_IB_HCA_MAX];
} hetccl_ib_hca_t;

/* Parse `spec` (NULL or "" allows everything); a malformed value is
 * ncclInvalidArgument with a WARN naming `knob`. */
ncclResult_t hetccl_ib_hca_parse(const char *knob, const char *spec, hetccl_ib_hca_t *out);
/* HETCCL_IB_HCA if set, else NCCL_IB_HCA, parsed. */
ncclResult_t hetccl_ib_hca_get(hetccl_ib_hca_t *out);
/* May the transport use port `port` of device `dev`? port 0: may it use
 * the device at all (some port of it)? */
int hetccl_ib_hca_allows(const hetccl_ib_hca_t *h, const char *dev, int port);

#endif
