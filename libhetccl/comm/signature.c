/* Reading an operation signature back (comm.h: hetccl_comm_tag_describe),
 * for the message that tells two ranks they called different operations.
 * The layout is hetccl_comm_coll_tag's / hetccl_comm_p2p_tag's (comm.c).
 * Any thread; pure. */
#include <stdio.h>

#include "comm/comm.h"

/* The signature keeps the pairwise kind (ncclSum..ncclMin order) and +8
 * when the sum is scaled (PreMulSum or Avg). */
static const char *op_name(unsigned op) {
  return (op & 8) ? "premulsum/avg" : hetccl_redop_name((ncclRedOp_t)(op & 3));
}

void hetccl_comm_tag_describe(uint64_t tag, char *buf, size_t len) {
  int func = (int)(tag >> 60) - 1;
  if (func == HETCCL_FUNC_SEND) {
    snprintf(buf, len, "Send/Recv of %llu bytes", (unsigned long long)(tag & 0xffffffffffull));
    return;
  }
  if (func < 0 || func >= HETCCL_FUNC_COUNT) {
    snprintf(buf, len, "an unknown operation (signature 0x%016llx)", (unsigned long long)tag);
    return;
  }
  ncclDataType_t dtype = (ncclDataType_t)((tag >> 56) & 0xf);
  unsigned op = (unsigned)(tag >> 52) & 0xf;
  int root = (int)((tag >> 40) & 0xfff);
  unsigned long long count = (tag >> 16) & 0xffffff, seq = tag & 0xffff;
  char what[48] = "", where[24] = "";
  if (hetccl_func_reduces((hetccl_func_t)func)) snprintf(what, sizeof(what), ", %s", op_name(op));
  if (hetccl_func_rooted((hetccl_func_t)func)) snprintf(where, sizeof(where), ", root %d", root);
  snprintf(buf, len, "%s(%s%s%s, count %llu, operation #%llu)",
           hetccl_func_name((hetccl_func_t)func), hetccl_dtype_name(dtype), what, where, count,
           seq);
}
