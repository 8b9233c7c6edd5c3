/* The shm section of the conformance test: a segment per rank, named in
 * /dev/shm only until connect returns; single copy (CMA) per direction; a
 * peer's death seen through its pid. */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "conformance.h"
#include "util/knobs.h"

static size_t shm_piece(void) {
  size_t chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_SHM_CHUNK) & ~(size_t)63;
  return chunk < 64 ? 64 : chunk;
}

/* Unset, the knob follows oversubscription, which these contexts never claim. */
static int shm_cma_knob(void) {
  return hetccl_knob_is_set(HETCCL_KNOB_SHM_CMA) ? (int)hetccl_knob_int(HETCCL_KNOB_SHM_CMA) : 0;
}

static void shm_describe(char *buf, size_t len) {
  snprintf(buf, len, "cma=%d chunk=%lld slots=%lld", shm_cma_knob(),
           (long long)hetccl_knob_int(HETCCL_KNOB_SHM_CHUNK),
           (long long)hetccl_knob_int(HETCCL_KNOB_SHM_SLOTS));
}

/* Make process_vm_readv fail with EPERM in this process, as a restrictive
 * ptrace policy would: the CMA probe must fail and the ring carry all. */
static void cma_forbid(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
    FAIL("seccomp filter: %s", strerror(errno));
}

static void shm_rank_start(const conf_opts_t *o) {
  if (o->deny_cma && (tc_rank & 1)) cma_forbid(); /* odd ranks cannot read the others */
}

/* The segment name in an address blob (white-box: addr_blob_t in shm.c). */
static void blob_name(char *name, const uint8_t *blob) {
  memcpy(name, blob + 8, HETCCL_TRANSPORT_ADDR_BYTES - 8);
  name[HETCCL_TRANSPORT_ADDR_BYTES - 8] = '\0';
}

static void check_gone(int area, int rank, const char *what) {
  char name[HETCCL_TRANSPORT_ADDR_BYTES];
  blob_name(name, tc_blob(area, rank));
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd >= 0 || errno != ENOENT) FAIL("segment %s %s", name, what);
}

/* Names gone once connect returned everywhere; a sender goes by CMA
 * (pull_min half a slot) exactly where CMA is on and the receiver may read
 * it: with denycma, never towards an odd rank. */
static void shm_after_connect(const conf_conn_t *c, const conf_opts_t *o) {
  const hetccl_transport_t *t = hetccl_transport_get(HETCCL_TRANSPORT_shm);
  check_gone(c->area, tc_rank, "still exists after connect");
  for (int p = 0; p < tc_nranks; p++) {
    if (c->eps[p] == NULL) continue;
    int pulls = shm_cma_knob() && !(o->deny_cma && (p & 1));
    size_t want = pulls ? shm_piece() / 2 : SIZE_MAX, got = t->pull_min(c->eps[p]);
    if (got != want) FAIL("pull_min towards rank %d is %zu, expected %zu", p, got, want);
  }
}

/* The next ctx_create on the host swept the segment a dead rank left. */
static void shm_after_peer_gone(int area, int gone) {
  check_gone(area, gone, "of a dead rank was not removed");
}

const conf_section_t conf_shm = {
    .name = "shm",
    .piece_bytes = shm_piece,
    .describe = shm_describe,
    .crosses_hosts = 0,
    .gone_before_connect = ncclRemoteError, /* the peer's pid says so, long before a timeout */
    .gone_timeout_ms = 20000,
    .rank_start = shm_rank_start,
    .after_connect = shm_after_connect,
    .after_peer_gone = shm_after_peer_gone,
};
