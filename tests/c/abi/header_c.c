/* nccl.h against the NCCL 2.32.3 facts, in C11: every enum value, the
 * ncclConfig_t layout on x86-64, and what the initializers set. Compiling
 * this file is the test (static assertions); main checks the initializers'
 * run-time values. Needs no CUDA. */
#include <stddef.h>

#include "nccl.h"
#include "nccl_device_host.h"
#include "nccl_facts.h"

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclCollConfig_t coll = NCCL_COLLCONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  return check_initializers(&config, &coll, &sim, &enc);
}
