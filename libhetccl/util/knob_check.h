/* The knob check: whether every HETCCL_* / NCCL_* variable set holds a
 * value the knob table allows (util/knobs.h), reported in a WARN naming
 * the first bad one. Apart from knobs.c, which never logs (logging reads
 * its settings there). Any thread. */
#ifndef HETCCL_UTIL_KNOB_CHECK_H
#define HETCCL_UTIL_KNOB_CHECK_H

#include "nccl.h"

/* ncclInvalidArgument with a WARN naming the first bad variable, its value
 * and what it may be; ncclInternalError if the table's own default fails
 * its check. On the first success, one INFO line per variable set. */
ncclResult_t hetccl_knobs_check(void);

#endif
