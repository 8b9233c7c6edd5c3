/* hetccl's own entry points, beside the NCCL API (nccl.h).
 *
 * Everything here is exported as hetccl* and never clashes with a vendor
 * library. The Python package and `hetccl info` use it. */
#ifndef HETCCL_H_
#define HETCCL_H_

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HETCCL_VERSION_STRING "0.1.0"

/* hetccl's own version string (not the NCCL API version). */
const char *hetcclVersionString(void);

/* The knob table (environment variables hetccl reads), for `hetccl info`.
 * index in [0, hetcclKnobCount()); every out pointer may be NULL; the
 * strings are static. `value` is the effective value ("" when unset); for
 * a value the table refuses (hetcclKnobsCheck fails naming it), the text as
 * given, which no reader in the library sees (they take the default).
 * `type` is "int", "str", or "enum:" followed by the allowed words
 * separated by '|' ("enum:auto|shm|socket|ib"). */
int hetcclKnobCount(void);
ncclResult_t hetcclKnobInfo(int index, const char **name, const char **type,
                            const char **defaultValue, const char **value,
                            const char **help);

/* Validate every knob now (as comm init does): ncclInvalidArgument and a
 * message for ncclGetLastError(NULL) if one is malformed or out of range. */
ncclResult_t hetcclKnobsCheck(void);

/* The device runtimes (host, cuda, hip) and vendor libraries (nccl, rccl)
 * this build knows, for `hetccl info`. Asking loads each as a communicator
 * of that kind would (a tool's question, not a rank's). index in [0,
 * count); every out pointer may be NULL; strings are static. detail: the
 * files used and the devices seen (runtime), the file loaded (vendor), or
 * why none could be loaded. version: the vendor's ncclGetVersion, 0 when
 * it could not be loaded. */
int hetcclRuntimeCount(void);
ncclResult_t hetcclRuntimeInfo(int index, const char **name, int *available,
                               const char **detail);
int hetcclVendorCount(void);
ncclResult_t hetcclVendorInfo(int index, const char **name, int *version,
                              const char **detail);

/* What kind of rank the caller of hetcclCommInitRankAs is. */
typedef enum {
  hetcclDeviceAuto = 0, /* as ncclCommInitRank: HETCCL_DEVICE, else the GPU runtime the
                           process already uses (docs/islands.md) */
  hetcclDeviceHost = 1, /* a host rank: its buffers are host memory (device buffers are
                           staged through host memory where the process uses a GPU) */
  hetcclDeviceCuda = 2, /* a CUDA rank on the calling thread's current CUDA device */
  hetcclDeviceHip = 3   /* a HIP rank on the calling thread's current HIP device */
} hetcclDevice_t;

/* ncclCommInitRankConfig (config may be NULL) for a rank whose kind the
 * caller knows: a framework that serves CPU tensors on a machine where its
 * process also loaded CUDA makes that rank a host rank, whatever the
 * process has loaded. hetcclDeviceAuto behaves as ncclCommInitRankConfig;
 * any other value wins over HETCCL_DEVICE. A GPU kind with no usable
 * runtime fails naming what is missing. Splits of the communicator keep
 * its kind. */
ncclResult_t hetcclCommInitRankAs(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank,
                                  ncclConfig_t *config, hetcclDevice_t device);

/* How a communicator is served: "vendor:nccl", "vendor:rccl", "engine", ... (static string;
 * NULL comm gives "invalid"). */
const char *hetcclCommBackend(ncclComm_t comm);

/* Payload bytes this rank's CPU has copied on comm's behalf through one
 * transport (index in [0, hetcclTransportCount()): shm, socket, ib), or,
 * at index hetcclTransportCount() itself ("plane"), by the data plane's
 * host executor into and out of its slots, since init, counting an
 * internal communicator's (a hierarchical one's island and leaders) too:
 * memcpy into or out of a transport's staging, the kernel's copy in a
 * socket send or receive, process_vm_readv. A receive-and-reduce straight
 * out of staging is not counted (the reduction reads the bytes in any
 * case), nor is device staging or a GPU's copy engines. 0 for a
 * communicator forwarded to a vendor library. For tests that assert "zero
 * copy"; every out pointer may be NULL; the name is static. */
int hetcclTransportCount(void);
ncclResult_t hetcclCommCopiedBytes(ncclComm_t comm, int index, const char **transport,
                                   unsigned long long *bytes);

/* What transport `index` (in [0, hetcclTransportCount())) would choose on
 * this host for a communicator with localRanks ranks here, its knobs
 * included, in one line of text ("" where it has nothing to say): shm's
 * single copy and receive helper, each with why. shm measures this host's
 * copy rates here where no rank has since boot (about 10 ms), as a
 * communicator's init would. The strings are static, the text per thread
 * until the next call; out pointers may be NULL. */
ncclResult_t hetcclTransportHostInfo(int index, int localRanks, const char **name,
                                     const char **text);

#ifdef __cplusplus
}
#endif

#endif
