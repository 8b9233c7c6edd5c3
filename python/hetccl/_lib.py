"""The binding: cffi in ABI mode over libhetccl.so.

ABI mode means `ffi.dlopen` of the built library plus declarations written by
hand below (no C compiler at install or import time). The object loaded here
is the very same libhetccl.so that `LD_PRELOAD` (and `hetccl run`) puts in
front of libnccl.so.2, so the Python API and an unmodified NCCL program in
the same process talk to one library.

The declarations are the subset of include/nccl.h (NCCL 2.32.3 layout) and
include/hetccl.h that the package calls. Keep them in step with the headers:
tests/test_cli.py loads every one of them.

Where the library is: $HETCCL_LIBRARY, else libhetccl.so inside this package
directory (where the wheel installs it), else, for a source checkout that was
never installed, the newest build*/libhetccl/libhetccl.so of the repository.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional

import cffi

CDEF = """
typedef struct CUstream_st *cudaStream_t;
typedef struct ncclComm *ncclComm_t;

typedef struct { char internal[128]; } ncclUniqueId;

typedef enum {
  ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
  ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
  ncclRemoteError = 6, ncclInProgress = 7, ncclTimeout = 8, ncclNumResults = 9
} ncclResult_t;

typedef enum {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
  ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8,
  ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11, ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4,
  ncclNumOps = 5, ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                    int rank, ncclConfig_t *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                          ncclComm_t *newcomm, ncclConfig_t *config);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

const char *hetcclVersionString(void);
int hetcclKnobCount(void);
ncclResult_t hetcclKnobInfo(int index, const char **name, const char **type,
                            const char **defaultValue, const char **value,
                            const char **help);
ncclResult_t hetcclKnobsCheck(void);
const char *hetcclCommBackend(ncclComm_t comm);
ncclResult_t hetcclCommInitRankAs(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank,
                                  ncclConfig_t *config, int device);
int hetcclTransportCount(void);
ncclResult_t hetcclCommCopiedBytes(ncclComm_t comm, int index, const char **transport,
                                   unsigned long long *bytes);
int hetcclRuntimeCount(void);
ncclResult_t hetcclRuntimeInfo(int index, const char **name, int *available,
                               const char **detail);
int hetcclVendorCount(void);
ncclResult_t hetcclVendorInfo(int index, const char **name, int *version, const char **detail);
"""

CONFIG_MAGIC = 0xCAFEBEEF
CONFIG_VERSION = 23203  # NCCL_VERSION_CODE of the header this layout comes from
CONFIG_UNDEF_INT = -(2**31)
BUILD_VERSION = 23203   # the NCCL API version these declarations describe

ffi = cffi.FFI()
ffi.cdef(CDEF)

_PACKAGE_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_lib: Optional[Any] = None
_path: Optional[Path] = None


def _from_source_checkout() -> Optional[Path]:
    """python/hetccl of a repository whose library was built with meson."""
    repo = _PACKAGE_DIR.parent.parent
    if not (repo / "meson.build").is_file():
        return None
    found = [p for p in repo.glob("build*/libhetccl/libhetccl.so") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def library_path() -> Path:
    """Where libhetccl.so is (it need not be loaded yet)."""
    env = os.environ.get("HETCCL_LIBRARY")
    if env:
        return Path(env).resolve()
    inside = _PACKAGE_DIR / "libhetccl.so"
    if inside.is_file():
        return inside
    built = _from_source_checkout()
    if built is not None:
        return built.resolve()
    raise OSError(f"libhetccl.so not found: not in {_PACKAGE_DIR} and HETCCL_LIBRARY is unset")


def lib() -> Any:
    """The loaded library (loaded on first use, so that a process can set
    HETCCL_* variables before the library reads them)."""
    global _lib, _path
    if _lib is None:
        with _lock:
            if _lib is None:
                path = library_path()
                _lib = ffi.dlopen(str(path))
                _path = path
    return _lib


def loaded_path() -> Path:
    lib()
    assert _path is not None
    return _path


def new_config(blocking: Optional[bool] = None) -> Any:
    """An ncclConfig_t as NCCL_CONFIG_INITIALIZER makes it (every int field
    NCCL_CONFIG_UNDEF_INT, pointers NULL), optionally with `blocking` set."""
    cfg = ffi.new("ncclConfig_t *")
    cfg.size = ffi.sizeof("ncclConfig_t")
    cfg.magic = CONFIG_MAGIC
    cfg.version = CONFIG_VERSION
    for field, ctype in ffi.typeof("ncclConfig_t").fields:
        if ctype.type.cname == "int":
            setattr(cfg, field, CONFIG_UNDEF_INT)
    if blocking is not None:
        cfg.blocking = int(blocking)
    return cfg
