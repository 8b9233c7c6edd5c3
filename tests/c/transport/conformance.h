/* The transport conformance test: the generic driver (conformance.c) and
 * what it cannot learn from the table alone, one section per transport
 * (conf_shm.c; conf_tcp.c for socket and ib). A new transport brings a
 * section: its staging unit, its answer where transport.h leaves a choice,
 * and hooks for the contracts that are its own. */
#ifndef HETCCL_TESTS_CONFORMANCE_H
#define HETCCL_TESTS_CONFORMANCE_H

#include <stddef.h>

#include "transport/transport.h"
#include "../common/ranks.h"

_Static_assert(TC_BLOB_BYTES == HETCCL_TRANSPORT_ADDR_BYTES, "one published blob per rank");

typedef struct conf_opts {
  int perf_only; /* the figures alone, with a size curve */
  int deny_cma;  /* shm: odd ranks may not process_vm_readv (seccomp) */
  size_t big;    /* the largest message (64 MiB; less in slow emulators) */
} conf_opts_t;

/* One context and its endpoints; `area` names the blob exchange area and
 * the communicator id. */
typedef struct conf_conn {
  int area;
  hetccl_transport_args_t args;
  hetccl_tctx_t *ctx;
  hetccl_ep_t *eps[TC_MAX_RANKS];
} conf_conn_t;

typedef struct conf_section {
  const char *name; /* the table's name */
  /* 0 when the transport cannot run on this machine: the test is skipped
   * (exit 77) after saying why. NULL: always. */
  int (*available)(void);
  /* The unit messages are cut into: sizes around it reach the piece edges. */
  size_t (*piece_bytes)(void);
  /* Its knob values, for the figures. */
  void (*describe)(char *buf, size_t len);
  int crosses_hosts; /* may can_connect say yes for two hosts? */
  /* connect with a peer that exited after ctx_create: the answer, and the
   * timeout_ms under which it comes */
  ncclResult_t gone_before_connect;
  int gone_timeout_ms;
  /* Optional hooks, each run in every rank of the phase. */
  void (*rank_start)(const conf_opts_t *o);        /* first thing in a rank */
  void (*before_connect)(const conf_conn_t *c);    /* blobs published, nobody connected */
  void (*after_connect)(const conf_conn_t *c, const conf_opts_t *o); /* all connected */
  void (*after_peer_gone)(int area, int gone);     /* a context made since rank `gone`
                                                    * exited before connecting */
} conf_section_t;

extern const conf_section_t conf_shm, conf_socket, conf_ib;

#endif
