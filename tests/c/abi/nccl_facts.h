/* The NCCL 2.32.3 facts that hetccl's nccl.h must match, shared by the C
 * and C++ header tests. Values are written out here on purpose: the test
 * must not derive them from the header it checks. */
#ifndef HETCCL_TEST_NCCL_FACTS_H
#define HETCCL_TEST_NCCL_FACTS_H

#include <limits.h>
#include <stddef.h>

#ifdef __cplusplus
#define FACT(cond) static_assert(cond, #cond)
#else
#define FACT(cond) _Static_assert(cond, #cond)
#endif

FACT(NCCL_MAJOR == 2);
FACT(NCCL_MINOR == 32);
FACT(NCCL_PATCH == 3);
FACT(NCCL_VERSION_CODE == 23203);
FACT(NCCL_VERSION(2, 32, 3) == 23203);
FACT(NCCL_VERSION(2, 8, 4) == 2804);
FACT(NCCL_VERSION(2, 9, 0) == 20900);

FACT(sizeof(ncclUniqueId) == 128);
FACT(NCCL_UNIQUE_ID_BYTES == 128);

FACT(ncclSuccess == 0);
FACT(ncclUnhandledCudaError == 1);
FACT(ncclSystemError == 2);
FACT(ncclInternalError == 3);
FACT(ncclInvalidArgument == 4);
FACT(ncclInvalidUsage == 5);
FACT(ncclRemoteError == 6);
FACT(ncclInProgress == 7);
FACT(ncclTimeout == 8);
FACT(ncclNumResults == 9);

FACT(ncclInt8 == 0 && ncclChar == 0);
FACT(ncclUint8 == 1);
FACT(ncclInt32 == 2 && ncclInt == 2);
FACT(ncclUint32 == 3);
FACT(ncclInt64 == 4);
FACT(ncclUint64 == 5);
FACT(ncclFloat16 == 6 && ncclHalf == 6);
FACT(ncclFloat32 == 7 && ncclFloat == 7);
FACT(ncclFloat64 == 8 && ncclDouble == 8);
FACT(ncclBfloat16 == 9);
FACT(ncclFloat8e4m3 == 10);
FACT(ncclFloat8e5m2 == 11);
FACT(ncclNumTypes == 12);

FACT(ncclSum == 0);
FACT(ncclProd == 1);
FACT(ncclMax == 2);
FACT(ncclMin == 3);
FACT(ncclAvg == 4);
FACT(ncclNumOps == 5);
FACT(ncclMaxRedOp == 0x7fffffff);
FACT(sizeof(ncclRedOp_t) == 4);

FACT(ncclScalarDevice == 0);
FACT(ncclScalarHostImmediate == 1);

FACT(ncclStatGpuMemSuspend == 0);
FACT(ncclStatGpuMemSuspended == 1);
FACT(ncclStatGpuMemPersist == 2);
FACT(ncclStatGpuMemTotal == 3);

FACT(ncclHostCftDefault == INT_MIN && ncclHostCftEnable == 1 && ncclHostCftDisable == 2 &&
     ncclHostCftFallback == 3);
FACT(ncclNvlsHostModeDefault == INT_MIN && ncclNvlsHostModeEnable == 0 &&
     ncclNvlsHostModeDisableTransport == 1 && ncclNvlsHostModeDisableSymmetricMultimem == 2 &&
     ncclNvlsHostModeDisable == INT_MAX);
FACT(NCCL_ENCRYPTION_MODE_NONE == 0 && NCCL_ENCRYPTION_MODE_PSK == 1);

FACT(NCCL_CONFIG_UNDEF_INT == INT_MIN);
FACT(NCCL_SPLIT_NOCOLOR == -1);
FACT(NCCL_API_MAGIC == 0xcafebeef);
FACT(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 && NCCL_WIN_STRICT_ORDERING == 2 &&
     NCCL_WIN_GIN_ONLY == 4 && NCCL_WIN_CFT_COUNTED == 8);
FACT(NCCL_WIN_REQUIRED_ALIGNMENT == 4096);
FACT(NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 && NCCL_CTA_POLICY_ZERO == 2);
FACT(NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1);
FACT(NCCL_REVOKE_DEFAULT == 0);
FACT(NCCL_SUSPEND_MEM == 1);

#if defined(__x86_64__)
FACT(sizeof(ncclConfig_t) == 120);
FACT(offsetof(ncclConfig_t, size) == 0);
FACT(offsetof(ncclConfig_t, magic) == 8);
FACT(offsetof(ncclConfig_t, version) == 12);
FACT(offsetof(ncclConfig_t, blocking) == 16);
FACT(offsetof(ncclConfig_t, cgaClusterSize) == 20);
FACT(offsetof(ncclConfig_t, minCTAs) == 24);
FACT(offsetof(ncclConfig_t, maxCTAs) == 28);
FACT(offsetof(ncclConfig_t, netName) == 32);
FACT(offsetof(ncclConfig_t, splitShare) == 40);
FACT(offsetof(ncclConfig_t, trafficClass) == 44);
FACT(offsetof(ncclConfig_t, commName) == 48);
FACT(offsetof(ncclConfig_t, collnetEnable) == 56);
FACT(offsetof(ncclConfig_t, CTAPolicy) == 60);
FACT(offsetof(ncclConfig_t, shrinkShare) == 64);
FACT(offsetof(ncclConfig_t, nvlsCTAs) == 68);
FACT(offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72);
FACT(offsetof(ncclConfig_t, nvlinkCentricSched) == 76);
FACT(offsetof(ncclConfig_t, graphUsageMode) == 80);
FACT(offsetof(ncclConfig_t, numRmaCtx) == 84);
FACT(offsetof(ncclConfig_t, maxP2pPeers) == 88);
FACT(offsetof(ncclConfig_t, graphStreamOrdering) == 92);
FACT(offsetof(ncclConfig_t, launchOrderImplicit) == 96);
FACT(offsetof(ncclConfig_t, numRmaSig) == 100);
FACT(offsetof(ncclConfig_t, rmaEagerInit) == 104);
FACT(offsetof(ncclConfig_t, hostCftMode) == 108);
FACT(offsetof(ncclConfig_t, nvlsHostMode) == 112);

FACT(sizeof(ncclCollConfig_t) == 72);
FACT(offsetof(ncclCollConfig_t, ext) == 16);
FACT(offsetof(ncclCollConfig_t, minCTAs) == 24);
FACT(offsetof(ncclCollConfig_t, algSelection) == 40);
FACT(offsetof(ncclCollConfig_t, forceAlgSelection) == 48);
FACT(offsetof(ncclCollConfig_t, CTAPolicy) == 52);
FACT(offsetof(ncclCollConfig_t, userProfilerTag) == 56);
FACT(offsetof(ncclCollConfig_t, launchCompletionEvent) == 64);

FACT(sizeof(ncclSimInfo_t) == 24);
FACT(offsetof(ncclSimInfo_t, estimatedTime) == 16);
FACT(sizeof(ncclEncryptionConfig_t) == 32);
FACT(sizeof(ncclConfigExt_t) == 24);
FACT(sizeof(ncclWaitSignalDesc_t) == 16);
#endif

#ifdef NCCL_DEVICE_HOST_H_
FACT(NCCL_GIN_TYPE_NONE == 0 && NCCL_GIN_TYPE_PROXY == 2 && NCCL_GIN_TYPE_GDAKI == 3 &&
     NCCL_GIN_TYPE_GPI == 4 && NCCL_GIN_TYPE_EFA_GDA == 5 && NCCL_GIN_MAX_TYPES == 6);
FACT(NCCL_GIN_CONNECTION_NONE == 0 && NCCL_GIN_CONNECTION_CUSTOM_STRIDE == 3);
FACT(NCCL_CFT_TEAM_FLAT == 0 && NCCL_CFT_TEAM_HIER_LSA == 2);
FACT(sizeof(ncclTeam_t) == 12);
FACT(offsetof(ncclTeam_t, nRanks) == 0 && offsetof(ncclTeam_t, rank) == 4 &&
     offsetof(ncclTeam_t, stride) == 8);
#if defined(__x86_64__)
FACT(sizeof(ncclMultimemHandle_t) == 8);
FACT(sizeof(ncclCommProperties_t) == 152);
FACT(offsetof(ncclCommProperties_t, rank) == 16);
FACT(offsetof(ncclCommProperties_t, deviceApiSupport) == 32);
FACT(offsetof(ncclCommProperties_t, ginType) == 36);
FACT(offsetof(ncclCommProperties_t, commHash) == 56);
FACT(offsetof(ncclCommProperties_t, ginSupport) == 72);
FACT(offsetof(ncclCommProperties_t, devCommRuntimeVersionSize) == 136);
FACT(offsetof(ncclCommProperties_t, cftCountedSupport) == 146);
#endif
#endif

/* Non-zero for every initializer field that differs from NCCL's. */
static inline int check_initializers(const ncclConfig_t *c, const ncclCollConfig_t *k,
                                     const ncclSimInfo_t *s, const ncclEncryptionConfig_t *e) {
  int bad = 0;
  bad += c->size != sizeof(ncclConfig_t) || c->magic != 0xcafebeef || c->version != 23203;
  const int undef[] = {c->blocking, c->cgaClusterSize, c->minCTAs, c->maxCTAs, c->splitShare,
                       c->trafficClass, c->collnetEnable, c->CTAPolicy, c->shrinkShare,
                       c->nvlsCTAs, c->nChannelsPerNetPeer, c->nvlinkCentricSched,
                       c->graphUsageMode, c->numRmaCtx, c->maxP2pPeers, c->graphStreamOrdering,
                       c->launchOrderImplicit, c->numRmaSig, c->rmaEagerInit, c->hostCftMode,
                       c->nvlsHostMode};
  for (size_t i = 0; i < sizeof(undef) / sizeof(undef[0]); i++) bad += undef[i] != INT_MIN;
  bad += c->netName != NULL || c->commName != NULL;

  bad += k->size != sizeof(ncclCollConfig_t) || k->magic != 0xcafebeef || k->version != 23203;
  bad += k->ext != NULL || k->algSelection != NULL || k->launchCompletionEvent != NULL;
  bad += k->minCTAs != INT_MIN || k->maxCTAs != INT_MIN || k->nvlsCTAs != INT_MIN ||
         k->cgaClusterSize != INT_MIN || k->CTAPolicy != INT_MIN;
  bad += k->forceAlgSelection != 1 || k->userProfilerTag != 0;

  bad += s->size != sizeof(ncclSimInfo_t) || s->magic != 0x74685283 || s->version != 23203 ||
         s->estimatedTime != -1.0f;

  bad += e->size != sizeof(ncclEncryptionConfig_t) || e->magic != 0xcafebeef ||
         e->version != 23203 || e->mode != 0 || e->psk != NULL;
  return bad;
}

#endif
