/* Knobs: every environment variable hetccl reads is declared once, here.
 *
 * `hetccl info` prints this table; nothing else in the tree calls getenv for
 * a knob. Values are read and validated once per process (first use); a
 * malformed or out-of-range value makes hetccl_knobs_check() fail with
 * ncclInvalidArgument and a message naming the variable, which comm init
 * returns to the user. Validation lives here only: code that reads a knob
 * may assume its value is one the table allows.
 *
 * Columns: id, environment name, type, default (as text), min, max, help.
 * Types:
 *   INT                decimal with an optional K/M/G suffix (powers of
 *                      1024), bounded by min..max;
 *   STR                any text ("" = unset);
 *   ENUM(list)         one of the words of HETCCL_KNOB_WORDS_<list> (below),
 *                      matched exactly;
 *   ENUM_NOCASE(list)  one of them, case ignored (NCCL's rule for
 *                      NCCL_DEBUG). The effective value is the word as the
 *                      list spells it, whatever the case it was given in;
 *                      "" (unset) is allowed when the default is "".
 * min/max bound INT knobs only.
 *
 * Readers of an ENUM knob get a C value, not text: hetccl_knob_enum(id)
 * returns HETCCL_KNOB_<list>_<word>, generated from the list. A value the
 * table refuses is never what a reader sees: hetccl_knob_enum, _str and
 * _int give the default, while hetccl_knobs_check (util/knob_check.h) fails
 * comm init naming the variable, the value and the words. */
#ifndef HETCCL_UTIL_KNOBS_H
#define HETCCL_UTIL_KNOBS_H

#include <stdint.h>

#include "nccl.h"

/* The words of each ENUM knob: F(list, first word), then W(list, word) for
 * each other, in the order of the values a reader gets (HETCCL_KNOB_<list>_
 * <word>, 0 first; HETCCL_KNOB_<list>_COUNT of them). NCCL's twin of one of
 * our knobs names the same list, so the two give the same values. Every list
 * is named once in HETCCL_KNOB_WORD_LISTS too (a row naming one that is not
 * does not compile). */
#define HETCCL_KNOB_WORDS_DEBUG(F, W)                                          \
  F(DEBUG, VERSION) W(DEBUG, WARN) W(DEBUG, INFO) W(DEBUG, ABORT) W(DEBUG, TRACE)
#define HETCCL_KNOB_WORDS_SOCKET_FAMILY(F, W)                                  \
  F(SOCKET_FAMILY, AF_INET) W(SOCKET_FAMILY, AF_INET6) W(SOCKET_FAMILY, 4) W(SOCKET_FAMILY, 6)
#define HETCCL_KNOB_WORDS_TRANSPORT(F, W)                                      \
  F(TRANSPORT, auto) W(TRANSPORT, shm) W(TRANSPORT, socket) W(TRANSPORT, ib)
#define HETCCL_KNOB_WORDS_IB_GDR_FLUSH(F, W)                                   \
  F(IB_GDR_FLUSH, auto) W(IB_GDR_FLUSH, read) W(IB_GDR_FLUSH, off)
#define HETCCL_KNOB_WORDS_IB_GDR_LEVEL(F, W)                                   \
  F(IB_GDR_LEVEL, LOC) W(IB_GDR_LEVEL, PIX) W(IB_GDR_LEVEL, PXB) W(IB_GDR_LEVEL, PHB)          \
  W(IB_GDR_LEVEL, SYS)
#define HETCCL_KNOB_WORDS_ALGO(F, W)                                           \
  F(ALGO, auto) W(ALGO, ring) W(ALGO, rd) W(ALGO, direct) W(ALGO, pull) W(ALGO, rhd) W(ALGO, wavefront)
#define HETCCL_KNOB_WORDS_DEVICE(F, W)                                         \
  F(DEVICE, auto) W(DEVICE, host) W(DEVICE, cuda) W(DEVICE, hip)
#define HETCCL_KNOB_WORDS_PLANE(F, W) F(PLANE, auto) W(PLANE, on) W(PLANE, off)
#define HETCCL_KNOB_WORDS_PLANE_REDUCE_READ(F, W)                              \
  F(PLANE_REDUCE_READ, copy) W(PLANE_REDUCE_READ, mapped)
#define HETCCL_KNOB_WORDS_PLANE_PRIORITY(F, W)                                 \
  F(PLANE_PRIORITY, high) W(PLANE_PRIORITY, normal)
#define HETCCL_KNOB_WORDS_PLANE_HOSTS(F, W) F(PLANE_HOSTS, one) W(PLANE_HOSTS, all)

#define HETCCL_KNOB_WORD_LISTS(L)                                              \
  L(DEBUG) L(SOCKET_FAMILY) L(TRANSPORT) L(IB_GDR_FLUSH) L(IB_GDR_LEVEL) L(ALGO) L(DEVICE)    \
  L(PLANE) L(PLANE_REDUCE_READ) L(PLANE_PRIORITY) L(PLANE_HOSTS)

#define HETCCL_KNOBS(X)                                                        \
  X(DEBUG, "HETCCL_DEBUG", ENUM_NOCASE(DEBUG), "", 0, 0,                       \
    "log level, any case; ABORT logs as WARN (default: NCCL_DEBUG, else silent)") \
  X(DEBUG_SUBSYS, "HETCCL_DEBUG_SUBSYS", STR, "", 0, 0,                        \
    "comma list of log subsystems (INIT,COLL,P2P,SHM,NET,BOOTSTRAP,PROXY,ENV,ALLOC,VENDOR,RUNTIME,GROUP,CALL, ALL, ^X to drop); default NCCL_DEBUG_SUBSYS, else INIT,ENV") \
  X(DEBUG_FILE, "HETCCL_DEBUG_FILE", STR, "", 0, 0,                            \
    "log file pattern (%h host, %p pid); default NCCL_DEBUG_FILE, else stderr") \
  X(NCCL_DEBUG, "NCCL_DEBUG", ENUM_NOCASE(DEBUG), "", 0, 0,                    \
    "NCCL's log level, honoured when HETCCL_DEBUG is unset")                   \
  X(NCCL_DEBUG_SUBSYS, "NCCL_DEBUG_SUBSYS", STR, "", 0, 0,                     \
    "NCCL's subsystem mask, honoured when HETCCL_DEBUG_SUBSYS is unset")       \
  X(NCCL_DEBUG_FILE, "NCCL_DEBUG_FILE", STR, "", 0, 0,                         \
    "NCCL's log file, honoured when HETCCL_DEBUG_FILE is unset")               \
  X(COMM_ID, "NCCL_COMM_ID", STR, "", 0, 0,                                    \
    "host:port of the bootstrap root; ncclGetUniqueId then encodes it and rank 0 serves it") \
  X(SOCKET_IFNAME, "NCCL_SOCKET_IFNAME", STR, "", 0, 0,                        \
    "interfaces for bootstrap and socket transport: prefix list, ^ to exclude, = for exact names") \
  X(SOCKET_FAMILY, "NCCL_SOCKET_FAMILY", ENUM(SOCKET_FAMILY), "", 0, 0,        \
    "restrict interface choice to IPv4 (AF_INET or 4) or IPv6 (AF_INET6 or 6)") \
  X(TIMEOUT, "HETCCL_TIMEOUT", INT, "300", 1, 86400,                           \
    "seconds a wait on a peer may last before the communicator fails with ncclTimeout") \
  X(CONNECT_TIMEOUT, "HETCCL_CONNECT_TIMEOUT", INT, "60", 1, 86400,            \
    "seconds for bootstrap and transport connection set-up")                   \
  X(RUNTIME_CONNECT, "HETCCL_RUNTIME_CONNECT", INT, "1", 0, 1,                \
    "1: connect a pair of ranks when an operation first needs it (ring neighbours for a ring, every peer only for all-to-all); 0: connect every pair at init (default: NCCL_RUNTIME_CONNECT, else 1)") \
  X(NCCL_RUNTIME_CONNECT, "NCCL_RUNTIME_CONNECT", INT, "1", 0, 1,              \
    "NCCL's, honoured when HETCCL_RUNTIME_CONNECT is unset")                  \
  X(TRANSPORT, "HETCCL_TRANSPORT", ENUM(TRANSPORT), "auto", 0, 0,              \
    "transport between two host-engine peers; auto: shm on one host, else ib where both ranks have an active verbs port, else socket (decided per pair); a name forces it for every pair") \
  X(SHM_CHUNK, "HETCCL_SHM_CHUNK", INT, "512K", 64, 1073741824,                \
    "bytes per shared-memory ring slot (multiple of 64)")                      \
  X(SHM_SLOTS, "HETCCL_SHM_SLOTS", INT, "8", 2, 1024,                          \
    "slots per shared-memory ring (chunks in flight per direction)")           \
  X(SHM_CMA, "HETCCL_SHM_CMA", INT, "0", 0, 1,                                 \
    "1: shm messages above HETCCL_SHM_CMA_MIN that the collective lets the receiver read (copying receives, and the pull algorithms') move in one copy, the receiver reading the sender's buffer with process_vm_readv, where the kernel allows; 0: always through the ring. Unset: on where this host runs more ranks of the communicator than it has CPUs, or has 8 CPUs or more and a process_vm_readv not far slower than a copy (measured once per boot; docs/host-engine.md)") \
  X(SHM_CMA_MIN, "HETCCL_SHM_CMA_MIN", INT, "256K", 0, 1099511627776,         \
    "with single copy on (HETCCL_SHM_CMA), shm messages larger than this go by process_vm_readv, smaller ones through the ring (unset: half a slot, HETCCL_SHM_CHUNK / 2)") \
  X(SHM_HELPER, "HETCCL_SHM_HELPER", INT, "0", 0, 1,                          \
    "1: a large single-copy receive is read from both ends, by the driving thread from the front and by this process's receive helper thread from the back (two cores on one message); 0: by the driving thread alone. Unset: on where this host has 2 CPUs or more per rank of the communicator on it and the process may run on 2 CPUs or more") \
  X(SHM_CMA_STREAM, "HETCCL_SHM_CMA_STREAM", INT, "0", 0, 1,                  \
    "1: a message of 1 MiB or more that single copy pulls is read into a cache-sized buffer and stored with streaming stores (no read of the destination for ownership; two copies by the receiver, one of them in cache); 0: process_vm_readv writes the destination itself") \
  X(SOCKET_NSTREAMS, "HETCCL_SOCKET_NSTREAMS", INT, "2", 1, 64,                \
    "TCP connections per peer pair; large messages are striped over them")     \
  X(SOCKET_CHUNK, "HETCCL_SOCKET_CHUNK", INT, "256K", 512, 1073741824,         \
    "bytes per stripe unit on the socket transport")                           \
  X(IB_DISABLE, "NCCL_IB_DISABLE", INT, "0", 0, 1,                           \
    "1: under HETCCL_TRANSPORT=auto, ranks on different hosts use socket, never ib") \
  X(IB_HCA, "HETCCL_IB_HCA", STR, "", 0, 0,                                    \
    "verbs devices the ib transport may use, in NCCL_IB_HCA's syntax: a comma list of name prefixes, each optionally :port; a leading = matches whole names, a leading ^ excludes; each allowed device with an allowed active port becomes a rail, HETCCL_IB_RAILS of them at most (default: NCCL_IB_HCA, else every device)") \
  X(NCCL_IB_HCA, "NCCL_IB_HCA", STR, "", 0, 0,                                 \
    "NCCL's, honoured when HETCCL_IB_HCA is unset")                            \
  X(IB_RAILS, "HETCCL_IB_RAILS", INT, "4", 1, 4,                             \
    "most verbs devices (rails) one ib context uses, in the verbs list's order among those HETCCL_IB_HCA / NCCL_IB_HCA allows; a pair of ranks uses the smaller count, and stripes its RDMA WRITEs over HETCCL_IB_QPS queue pairs on each rail (eager pieces and control messages stay on the first)") \
  X(IB_NEAR, "HETCCL_IB_NEAR", INT, "1", 0, 1,                                 \
    "1: a GPU rank takes the allowed verbs devices nearest its GPU on the PCI tree (sysfs), only those at the least distance, HETCCL_IB_RAILS at most, so that each GPU uses the NIC beside it; 0: the verbs list's order, as host ranks and ranks whose NICs sysfs does not place (docs/transports.md)") \
  X(SYSFS, "HETCCL_SYSFS", STR, "/sys", 0, 0,                                  \
    "where sysfs is read from for the PCI tree (HETCCL_IB_NEAR); tests point it at a tree of their own") \
  X(IB_GID_INDEX, "HETCCL_IB_GID_INDEX", INT, "-1", -1, 255,                   \
    "GID index for the ib transport; -1: a RoCE v2 IPv4-mapped GID if the port has one, else 0") \
  X(IB_CHUNK, "HETCCL_IB_CHUNK", INT, "128K", 64, 1073741824,                  \
    "bytes per ib piece (staging slot payload, multiple of 64)")               \
  X(IB_SLOTS, "HETCCL_IB_SLOTS", INT, "8", 2, 1024,                            \
    "ib staging slots per direction per peer (pieces in flight)")              \
  X(IB_TIMEOUT, "NCCL_IB_TIMEOUT", INT, "20", 1, 31,                         \
    "ib queue pairs' ack timeout, as the verbs exponent: 4.096 us x 2^N before a write or send unacknowledged is sent again (default 20, as NCCL: 4.3 s; 14: 67 ms)") \
  X(IB_RETRY_CNT, "NCCL_IB_RETRY_CNT", INT, "7", 0, 7,                        \
    "ib queue pairs' retransmissions of an unacknowledged packet before the connection fails") \
  X(IB_QPS, "HETCCL_IB_QPS", INT, "2", 1, 16,                                \
    "RC queue pairs per ib connection and rail; with more than one in all, the RDMA WRITEs of a rendezvous message are striped over them by chunk (eager pieces and control messages stay on the first); must be the same on every rank (default: NCCL_IB_QPS_PER_CONNECTION when set, else 2, the two channels NCCL gives a network peer's p2p traffic)") \
  X(NCCL_IB_QPS_PER_CONNECTION, "NCCL_IB_QPS_PER_CONNECTION", INT, "1", 1, 16, \
    "NCCL's, honoured when HETCCL_IB_QPS is unset")                            \
  X(IB_ZCOPY_THRESHOLD, "HETCCL_IB_ZCOPY_THRESHOLD", INT, "1M", 1, 4611686018427387904, \
    "ib messages of at least this many bytes whose source is registered (ncclMemAlloc, ncclCommRegister) go by RDMA WRITE into the receiver's buffer when it is registered too, without CPU copies; smaller ones, and others, through the staging slots") \
  X(IB_OFFER, "HETCCL_IB_OFFER", INT, "4", 0, 4,                              \
    "how many receives, from the head of a direction on, an ib receiver clears to send before the sender asks, where it can take them by RDMA WRITE (the head into its buffer or its bounce buffer, those behind it into their own registered buffers), so that consecutive rendezvous messages stream without a round trip each; 0: only when asked; 1: the head alone") \
  X(IB_STAGED_WRITE, "HETCCL_IB_STAGED_WRITE", INT, "1", 0, 1,                \
    "1: an ib message of at least HETCCL_IB_ZCOPY_THRESHOLD bytes from memory that is not registered, whose receiver has already offered its registered buffer, is copied into a registered staging ring and RDMA-written from there into that buffer (one CPU copy, the sender's, where eager pieces cost one on each side); 0: such messages go eager") \
  X(IB_BOUNCE, "HETCCL_IB_BOUNCE", INT, "4M", 0, 1073741824,                 \
    "largest rendezvous message an ib receiver that reduces it, or whose buffer is not registered, takes by RDMA WRITE into a registered bounce buffer of its own (made on first need, one per peer) instead of declining; 0: decline them") \
  X(IB_REG_CACHE, "HETCCL_IB_REG_CACHE", INT, "64G", 0, 4611686018427387904,   \
    "most bytes of registered user memory (ncclMemAlloc, ncclCommRegister) each ib context keeps registered with its device; ranges beyond it take the copy path") \
  X(IB_GDR, "HETCCL_IB_GDR", INT, "1", 0, 1,                                  \
    "1: a device rank's ib context tries GPUDirect RDMA at init (dma-buf, else ibv_reg_mr of device memory through a peer-memory client) and, where it works, sends from registered device memory (ncclCommRegister) unstaged; 0: every device buffer is staged through pinned host memory") \
  X(IB_GDR_RECV, "HETCCL_IB_GDR_RECV", INT, "1", 0, 1,                        \
    "1: where GPUDirect RDMA works (HETCCL_IB_GDR), a device rank's receives of at least HETCCL_IB_ZCOPY_THRESHOLD bytes into registered device memory (ncclCommRegister) are written there by the NIC, unstaged, and its peers ask before sending it such messages (from unregistered memory they write from a registered staging ring); 0: such receives are staged through pinned host memory") \
  X(IB_GDR_STAGING, "HETCCL_IB_GDR_STAGING", INT, "1", 0, 1,                  \
    "1: where GPUDirect RDMA works (HETCCL_IB_GDR), a device rank's sends of at least HETCCL_IB_ZCOPY_THRESHOLD bytes from unregistered device memory, and its receives of that size into it (with HETCCL_IB_GDR_RECV), are staged in device memory registered with the NIC (a copy on the GPU, then RDMA), as NCCL stages in its own device buffers; 0: through pinned host memory") \
  X(IB_GDR_STAGING_MAX, "HETCCL_IB_GDR_STAGING_MAX", INT, "64M", 0, 1099511627776, \
    "largest device-memory staging block of one batch (HETCCL_IB_GDR_STAGING): a batch of sends and receives that needs more is staged through pinned host memory; with at most three blocks, device memory held for staging stays under three times this") \
  X(IB_GDR_FLUSH, "HETCCL_IB_GDR_FLUSH", ENUM(IB_GDR_FLUSH), "auto", 0, 0,     \
    "how a NIC's writes into device memory (HETCCL_IB_GDR_RECV) are made visible before the receive is done: auto: the device runtime's flush call where it has one (CUDA's cuFlushGPUDirectRDMAWrites), else an RDMA READ of the receive back through the NIC (HIP); read: the read back as well; off: no read back (for a platform that orders them; the runtime's call still runs)") \
  X(IB_GDR_LEVEL, "HETCCL_IB_GDR_LEVEL", ENUM_NOCASE(IB_GDR_LEVEL), "PXB", 0, 0, \
    "the farthest path on the PCI tree between a device rank's GPU and its NICs over which GPUDirect RDMA is used (NCCL's words: PIX one switch between them, PXB several, PHB through the CPU's host bridge, SYS across sockets; LOC never): with a NIC farther away every device buffer is staged in pinned host memory; where sysfs places not both (a VM), the trial registration decides alone (default: NCCL_NET_GDR_LEVEL, else PXB)") \
  X(NCCL_NET_GDR_LEVEL, "NCCL_NET_GDR_LEVEL", ENUM_NOCASE(IB_GDR_LEVEL), "PXB", 0, 0, \
    "NCCL's, honoured when HETCCL_IB_GDR_LEVEL is unset")                       \
  X(IB_DMABUF, "HETCCL_IB_DMABUF", INT, "1", 0, 1,                            \
    "1: at init, try GPUDirect RDMA through dma-buf for a device rank's ib context and log whether it works; 0: do not try (default: NCCL_DMABUF_ENABLE, else 1)") \
  X(NCCL_DMABUF_ENABLE, "NCCL_DMABUF_ENABLE", INT, "1", 0, 1,                  \
    "NCCL's, honoured when HETCCL_IB_DMABUF is unset")                         \
  X(ALGO, "HETCCL_ALGO", ENUM(ALGO), "auto", 0, 0,                             \
    "host-engine algorithm, as algo/select.c's table names them (rd: recursive doubling; rhd: recursive halving then doubling, on the data plane too; pull: every rank reads its share straight from its peers' buffers, docs/host-engine.md; wavefront: the data plane's own forms, run by the host executor); auto picks by size, rank count and whether the ranks can read each other's memory") \
  X(SMALL_BYTES, "HETCCL_SMALL_BYTES", INT, "64K", 0, 1073741824,            \
    "messages up to this many bytes use latency-bound algorithms under HETCCL_ALGO=auto") \
  X(PIPELINE_CHUNK, "HETCCL_PIPELINE_CHUNK", INT, "1M", 64, 1073741824,        \
    "bytes per pipeline step in ring/chain algorithms (small values reach multi-chunk paths)") \
  X(STAGE_PIECE, "HETCCL_STAGE_PIECE", INT, "4M", 0, 1073741824,               \
    "on a communicator where some rank passes device buffers, AllReduce/Broadcast/Reduce larger than this run as pieces of this many bytes, so that staging overlaps the engine; 0: whole") \
  X(STAGE_PIECE_HOST, "HETCCL_STAGE_PIECE_HOST", INT, "0", 0, 1,               \
    "1: cut into HETCCL_STAGE_PIECE pieces on host-only communicators too (tests)") \
  X(SPIN, "HETCCL_SPIN", INT, "2000", 0, 100000000,                            \
    "polls of an idle wait before it starts yielding the CPU")                 \
  X(IDLE_YIELD, "HETCCL_IDLE_YIELD", INT, "1000", 0, 10000000,                \
    "microseconds an idle wait yields the CPU, after HETCCL_SPIN polls, before it sleeps (unset: 200 on a host rank with a CPU for each local rank, else 1000)") \
  X(IDLE_NAP, "HETCCL_IDLE_NAP", INT, "64", 0, 100000,                         \
    "microseconds: an idle wait still idle after HETCCL_SPIN polls and HETCCL_IDLE_YIELD of yielding sleeps 8 us, doubling up to this; 0: it yields for ever") \
  X(CHECK_MISMATCH, "HETCCL_CHECK_MISMATCH", INT, "1", 0, 1,                   \
    "1: every message carries the operation signature and a mismatch between ranks is an error") \
  X(ISLANDS, "HETCCL_ISLANDS", STR, "", 0, 0,                                  \
    "force islands: comma list giving each rank's island id (e.g. 0,0,1,1), or 'rank' for one island per rank") \
  X(NCCL_LIBRARY, "HETCCL_NCCL_LIBRARY", STR, "", 0, 0,                        \
    "path or name of the real NCCL library to forward to (default: the loaded libnccl.so.2, then the usual names)") \
  X(RCCL_LIBRARY, "HETCCL_RCCL_LIBRARY", STR, "", 0, 0,                        \
    "path or name of the real RCCL library to forward to (default: the loaded librccl.so.1, then the usual names)") \
  X(DEVICE, "HETCCL_DEVICE", ENUM_NOCASE(DEVICE), "auto", 0, 0,                \
    "device kind this process presents, any case; auto: cuda or hip when the process already uses that runtime, or links NCCL or RCCL, and a device is usable, else host") \
  X(VENDOR, "HETCCL_VENDOR", INT, "1", 0, 1,                                   \
    "0: never forward to a vendor library, run every collective on hetccl's engine") \
  X(HIER, "HETCCL_HIER", INT, "1", 0, 1,                                       \
    "1: where a communicator spans several islands and one holds several ranks, AllReduce, Broadcast, Reduce, AllGather and ReduceScatter run inside each island (its vendor library where it has one), across the islands' first ranks, and inside again (docs/islands.md); 0: over every rank on the engine") \
  X(HIER_RAILS, "HETCCL_HIER_RAILS", INT, "1", 0, 1,                           \
    "1: where every island holds as many ranks, AllReduce reduce-scatters inside each island, all-reduces each slice across the islands on the ranks of its index in every island at once (the rails), and all-gathers inside again; 0: the island's first rank carries the whole message across (docs/islands.md)") \
  X(HIER_RAILS_MIN, "HETCCL_HIER_RAILS_MIN", INT, "4M", 0, INT64_MAX,           \
    "bytes from which an AllReduce or a Broadcast takes the rails (HETCCL_HIER_RAILS); smaller ones go through the leaders, which cost fewer launches") \
  X(HIER_RAILS_MIN_GATHER, "HETCCL_HIER_RAILS_MIN_GATHER", INT, "16M", 0, INT64_MAX, \
    "bytes of the whole buffer (count x ranks) from which AllGather and ReduceScatter take the rails (HETCCL_HIER_RAILS); smaller ones go through the leaders (where the islands are contiguous) or over every rank") \
  X(PLANE, "HETCCL_PLANE", ENUM(PLANE), "auto", 0, 0,                          \
    "cross-island data plane: auto (ranks of one host, or of several unless HETCCL_PLANE_HOSTS=one, some with device buffers, move data through shared pinned segments with the devices' copy engines and reduce on the devices), on (also when no rank has device buffers: host ranks through the same segments, for tests), off (the engine, device buffers staged through host memory)") \
  X(PLANE_PIECE, "HETCCL_PLANE_PIECE", INT, "4M", 4096, 1073741824,            \
    "bytes per data-plane slot (a multiple of 4096): the unit a copy engine or reduction moves at once") \
  X(PLANE_SLOTS, "HETCCL_PLANE_SLOTS", INT, "4", 2, 64,                        \
    "data-plane slots per channel (pieces in flight per direction and pair)") \
  X(PLANE_WIDE_MIN, "HETCCL_PLANE_WIDE_MIN", INT, "256M", 0, INT64_MAX,          \
    "bytes per channel from which a data-plane message moves in wide pieces of two slots each (half as many pieces, the same bytes in flight; needs 4 slots or more, and one host); 0: never") \
  X(PLANE_REDUCE_READ, "HETCCL_PLANE_REDUCE_READ", ENUM(PLANE_REDUCE_READ), "copy", 0, 0, \
    "how a device reduction reads the peer's piece: copy (the copy engine moves it from the shared slot into device memory, then the kernel reduces in device memory) or mapped (the kernel reads the slot through its device mapping, over the bus)") \
  X(PLANE_STAGE, "HETCCL_PLANE_STAGE", INT, "64M", 0, 17179869184,            \
    "device memory per receiving channel of a GPU rank (made at its first reduction) where arriving pieces wait for their reduction, so that a reduction kernel held back by the application's compute holds back neither the copy engines nor the sender; 0: reductions hold their slot until their kernel has run, the default for a rank whose GPU another process of the communicator drives too (docs/dataplane.md)") \
  X(PLANE_RESIDENT, "HETCCL_PLANE_RESIDENT", INT, "16", 0, 1024,                \
    "blocks of a resident reduction kernel that a GPU rank launches with each run of reductions on the split path (HETCCL_PLANE_STAGE): it stays on the device for the operation and reduces each piece as its copy lands, instead of a kernel per piece started behind a stream wait; 0: a kernel per piece (docs/dataplane.md)") \
  X(PLANE_INFLIGHT, "HETCCL_PLANE_INFLIGHT", INT, "0", 0, 1024,               \
    "programs of a GPU rank that may wait on its streams at once: a launch beyond them first waits, at most 20 ms, for the oldest to end; 0: no limit. Unset: 1 where another process of the communicator drives the same GPU (programs waiting behind others kept that process's turn on the GPU), else no limit (docs/dataplane.md)") \
  X(PLANE_LANE_STREAMS, "HETCCL_PLANE_LANE_STREAMS", INT, "1", 1, 8,         \
    "streams a GPU rank spreads its pieces to or from one peer over (piece q on stream q mod N), so that one stream's copy fills the gap while another waits and signals; lowered to divide HETCCL_PLANE_SLOTS. 2 moves a long sendrecv faster but slowed DDP training (docs/dataplane.md)") \
  X(PLANE_PRIORITY, "HETCCL_PLANE_PRIORITY", ENUM(PLANE_PRIORITY), "normal", 0, 0, \
    "priority of the data plane's own streams on a GPU: high (the device's greatest, so its reductions take SMs ahead of the application's compute) or normal") \
  X(PLANE_HOSTS, "HETCCL_PLANE_HOSTS", ENUM(PLANE_HOSTS), "all", 0, 0,         \
    "all: the data plane spans hosts, each channel to a rank of another host a segment on each side whose pieces cross by the pair's transport (ib: RDMA WRITE from segment to segment; docs/dataplane.md); one: it joins ranks of one host only, and a communicator over several hosts stages device buffers through host memory for its transports") \
  X(PLANE_MAX_RANKS, "HETCCL_PLANE_MAX_RANKS", INT, "8", 2, 64,                \
    "largest communicator given a data plane (every pair of its ranks holds a channel of HETCCL_PLANE_SLOTS x HETCCL_PLANE_PIECE bytes, one piece more with wide pieces)") \
  X(NVRTC_LIBRARY, "HETCCL_NVRTC_LIBRARY", STR, "", 0, 0,                       \
    "path or name of NVRTC for reductions on CUDA devices, or none to reduce on the host (default: a loaded libnvrtc, libnvrtc.so.13/.12/.11.2/.so, beside libcudart, its pip wheel's sibling, /usr/local/cuda/lib64)") \
  X(HIPRTC_LIBRARY, "HETCCL_HIPRTC_LIBRARY", STR, "", 0, 0,                     \
    "path or name of hipRTC for reductions on HIP devices, or none to reduce on the host (default: a loaded libhiprtc, libhiprtc.so.7/.6/.5/.so, beside libamdhip64, /opt/rocm/lib)") \
  X(RTC_CACHE, "HETCCL_RTC_CACHE", STR, "", 0, 0,                             \
    "directory keeping compiled device-reduction kernels between processes (default $XDG_CACHE_HOME/hetccl, else ~/.cache/hetccl), or none") \
  X(TRACE, "HETCCL_TRACE", STR, "", 0, 0,                                      \
    "per-operation trace as Chrome trace-event JSON, one file per rank (docs/trace.md): a file pattern, %r rank, %p pid, %h host; without %r, .RANK goes before .json (run.json: run.0.json, ...). Written at ncclCommDestroy/Abort and at exit; merge with `hetccl trace`. Unset: off (one branch per trace point)") \
  X(TRACE_EVENTS, "HETCCL_TRACE_EVENTS", INT, "256K", 16, 268435456,         \
    "events each thread may buffer under HETCCL_TRACE; later ones are dropped and counted in the file (otherData.dropped_events)")

/* A list's words as one string, '|'-separated: "auto|shm|socket|ib" (the
 * list's name is only ever pasted, never expanded: a word such as AF_INET
 * or INFO stays a word). */
#define HETCCL_KNOB_WORD_FIRST(list, w) #w
#define HETCCL_KNOB_WORD_NEXT(list, w) "|" #w

/* The values readers compare with: HETCCL_KNOB_<list>_<word>. */
#define HETCCL_KNOB_WORD_VALUE(list, w) HETCCL_KNOB_##list##_##w,
#define HETCCL_KNOB_WORD_ENUM(list)                                            \
  enum {                                                                       \
    HETCCL_KNOB_WORDS_##list(HETCCL_KNOB_WORD_VALUE, HETCCL_KNOB_WORD_VALUE)   \
    HETCCL_KNOB_##list##_COUNT                                                 \
  };
HETCCL_KNOB_WORD_LISTS(HETCCL_KNOB_WORD_ENUM)
#undef HETCCL_KNOB_WORD_ENUM

/* What hetccl_knob_enum returns for an ENUM knob left unset whose default
 * is "" (no word: NCCL_DEBUG unset), and for a knob that is no ENUM. */
#define HETCCL_KNOB_NO_WORD (-1)

/* The type column, expanded by HETCCL_KNOB_KIND_##type into
 * (type, allowed words, their number, case ignored, type name for
 * hetcclKnobInfo). */
#define HETCCL_KNOB_KIND_INT HETCCL_KNOB_INT, NULL, 0, 0, "int"
#define HETCCL_KNOB_KIND_STR HETCCL_KNOB_STR, NULL, 0, 0, "str"
#define HETCCL_KNOB_KIND_ENUM(list)                                            \
  HETCCL_KNOB_ENUM, HETCCL_KNOB_WORDS_##list(HETCCL_KNOB_WORD_FIRST, HETCCL_KNOB_WORD_NEXT), \
      HETCCL_KNOB_##list##_COUNT, 0,                                           \
      "enum:" HETCCL_KNOB_WORDS_##list(HETCCL_KNOB_WORD_FIRST, HETCCL_KNOB_WORD_NEXT)
#define HETCCL_KNOB_KIND_ENUM_NOCASE(list)                                     \
  HETCCL_KNOB_ENUM, HETCCL_KNOB_WORDS_##list(HETCCL_KNOB_WORD_FIRST, HETCCL_KNOB_WORD_NEXT), \
      HETCCL_KNOB_##list##_COUNT, 1,                                           \
      "enum:" HETCCL_KNOB_WORDS_##list(HETCCL_KNOB_WORD_FIRST, HETCCL_KNOB_WORD_NEXT)

typedef enum {
#define HETCCL_KNOB_ID(id, env, type, def, lo, hi, help) HETCCL_KNOB_##id,
  HETCCL_KNOBS(HETCCL_KNOB_ID)
#undef HETCCL_KNOB_ID
  HETCCL_KNOB_COUNT
} hetccl_knob_t;

typedef enum { HETCCL_KNOB_INT, HETCCL_KNOB_STR, HETCCL_KNOB_ENUM } hetccl_knob_type_t;

typedef struct hetccl_knob_desc {
  const char *env;
  hetccl_knob_type_t type;
  const char *def;
  int64_t min, max;
  const char *help;
  const char *values;    /* ENUM: the allowed words, '|'-separated; NULL otherwise */
  int nwords;            /* ENUM: how many (HETCCL_KNOB_<list>_COUNT); 0 otherwise */
  int nocase;            /* ENUM: words match whatever their case */
  const char *type_name; /* "int", "str", or "enum:" and the words */
} hetccl_knob_desc_t;

/* The declaration of knob `id`. */
const hetccl_knob_desc_t *hetccl_knob_desc(hetccl_knob_t id);

/* Value of an INT knob (the default when unset or refused). */
int64_t hetccl_knob_int(hetccl_knob_t id);
/* Value of an ENUM knob: the word's place in its list, to compare with the
 * generated HETCCL_KNOB_<list>_<word> (the default's when unset or
 * refused; HETCCL_KNOB_NO_WORD when unset with an empty default). */
int hetccl_knob_enum(hetccl_knob_t id);
/* Value of a STR knob, for the free-form ones (paths, interface names,
 * lists); never NULL ("" when unset). Of an ENUM knob, the word as the
 * list spells it, for messages and hetcclKnobInfo: readers that choose by
 * it take hetccl_knob_enum. */
const char *hetccl_knob_str(hetccl_knob_t id);
/* Was the variable set in the environment, to a value the table allows? */
int hetccl_knob_is_set(hetccl_knob_t id);
/* The knob to read where ours has an NCCL twin of the same meaning:
 * `nccls` when it is set and `ours` is not, else `ours` (set or at its
 * default, which may differ from NCCL's). */
hetccl_knob_t hetccl_knob_or_nccl(hetccl_knob_t ours, hetccl_knob_t nccls);

/* For hetccl_knobs_check (util/knob_check.h), which logs what these say
 * (this file never logs: logging reads its own settings here). A refused
 * value: 1, the text as given and why (a static phrase); else 0. */
int hetccl_knob_refused(hetccl_knob_t id, const char **given, const char **why);
/* The first knob whose table default fails its own check, or -1. */
int hetccl_knob_bad_default(void);

/* Read the environment again (ncclResetDebugInit). Strings returned
 * earlier stay valid. */
void hetccl_knobs_reload(void);

#endif
