/* The knob check (knob_check.h). */
#include "util/knob_check.h"

#include "util/knobs.h"
#include "util/log.h"

ncclResult_t hetccl_knobs_check(void) {
  static int reported; /* set knobs are listed once per process */
  int bad = hetccl_knob_bad_default();
  if (bad >= 0) {
    const hetccl_knob_desc_t *d = hetccl_knob_desc((hetccl_knob_t)bad);
    if (d->type == HETCCL_KNOB_ENUM)
      WARN("knob table: default %s=%s is not one of %s", d->env, d->def, d->values);
    else
      WARN("knob table: default %s=%s is not an integer in %lld..%lld", d->env, d->def,
           (long long)d->min, (long long)d->max);
    return ncclInternalError;
  }
  for (int i = 0; i < HETCCL_KNOB_COUNT; i++) {
    const hetccl_knob_desc_t *d = hetccl_knob_desc((hetccl_knob_t)i);
    const char *given, *why;
    if (!hetccl_knob_refused((hetccl_knob_t)i, &given, &why)) continue;
    if (d->type == HETCCL_KNOB_ENUM)
      WARN("%s=%s: %s %s%s", d->env, given, why, d->values, d->nocase ? " (any case)" : "");
    else
      WARN("%s=%s: %s (expected %lld..%lld)", d->env, given, why, (long long)d->min,
           (long long)d->max);
    return ncclInvalidArgument;
  }
  if (!__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED)) {
    for (int i = 0; i < HETCCL_KNOB_COUNT; i++)
      if (hetccl_knob_is_set((hetccl_knob_t)i))
        INFO(HETCCL_ENV, "%s set by environment to %s", hetccl_knob_desc((hetccl_knob_t)i)->env,
             hetccl_knob_str((hetccl_knob_t)i));
  }
  return ncclSuccess;
}
