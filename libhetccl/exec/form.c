/* Forms (exec/form.h): the lines that say them.
 *
 * Thread: any (a relaxed flag per operation and form). */
#include "exec/form.h"

static const char *const form_names[HETCCL_FORM_COUNT] = {
    [HETCCL_FORM_FORWARDED] = "goes to the vendor library",
    [HETCCL_FORM_HIERARCHICAL] = "takes its hierarchical form",
    [HETCCL_FORM_PLANE] = "goes through the data plane",
    [HETCCL_FORM_STAGED] = "runs on the host engine, its device buffers staged through host "
                           "memory",
    [HETCCL_FORM_HOST] = "runs on the host engine",
};

void hetccl_form_say(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_t form,
                     const char *how, const char *why) {
  static unsigned char said[HETCCL_OP_KIND_COUNT][HETCCL_FORM_COUNT];
  if ((unsigned)op->kind >= HETCCL_OP_KIND_COUNT || (unsigned)form >= HETCCL_FORM_COUNT) return;
  const char *sep = how ? ", " : "", *open = why ? " (" : "", *close = why ? ")" : "";
  TRACE(HETCCL_COLL, "%s on comm %016llx (rank %d of %d) %s%s%s%s%s%s", op->fn,
        (unsigned long long)comm->comm_id, comm->rank, comm->nranks, form_names[form], sep,
        how ? how : "", open, why ? why : "", close);
  if (__atomic_exchange_n(&said[op->kind][form], 1, __ATOMIC_RELAXED)) return;
  INFO(HETCCL_COLL, "%s on comm %016llx (%d ranks) %s%s%s%s%s%s; the first such call, later "
       "ones are not logged", op->fn, (unsigned long long)comm->comm_id, comm->nranks,
       form_names[form], sep, how ? how : "", open, why ? why : "", close);
}
