/* The frame header every transport puts in front of a message, and the one
 * judgement of it on the receive side; the hello that opens a connection,
 * and the one judgement of it on the listening side (transport.h). Any
 * thread; pure. */
#include <inttypes.h>
#include <string.h>

#include "transport/transport.h"
#include "util/log.h"

void hetccl_frame_fill(hetccl_frame_hdr_t *h, uint64_t comm_id, int src_rank, uint64_t seq,
                       uint64_t tag, uint64_t bytes) {
  memset(h, 0, sizeof(*h));
  h->magic = HETCCL_FRAME_MAGIC;
  h->comm_id = comm_id;
  h->tag = tag;
  h->seq = seq;
  h->bytes = bytes;
  h->src_rank = src_rank;
  h->flags = 0;
}

hetccl_hello_t hetccl_hello_make(uint64_t magic, const hetccl_transport_args_t *args) {
  return (hetccl_hello_t){.magic = magic, .comm_id = args->comm_id, .secret = args->secret,
                          .rank = args->rank, .nranks = args->nranks};
}

const char *hetccl_hello_refusal(const hetccl_hello_t *h, uint64_t magic,
                                 const hetccl_transport_args_t *args, const uint8_t *use) {
  if (h->magic != magic) return "not a hetccl handshake of this transport";
  if (h->comm_id != args->comm_id || h->secret != args->secret) return "another communicator";
  if (h->nranks != args->nranks || h->rank < 0 || h->rank >= args->rank ||
      (use && !use[h->rank]))
    return "a rank that should not connect here";
  return NULL;
}

/* A rank number a peer sent (a header's, a note's), for a message: as the
 * user numbers it if it is a rank of the communicator, else as it came (a
 * corrupt header names no rank, and must not index user_ranks). */
static int wire_rank(const hetccl_transport_args_t *args, int32_t r) {
  return r >= 0 && r < args->nranks ? hetccl_user_rank(args->user_ranks, r) : (int)r;
}

ncclResult_t hetccl_frame_check(const hetccl_frame_hdr_t *h, const char *transport,
                                const hetccl_transport_args_t *args, int expect_src,
                                uint64_t expect_seq, uint64_t expect_tag, uint64_t expect_bytes) {
  uint64_t comm_id = args->comm_id;
  hetccl_tag_mismatch_t *mismatch = args->mismatch;
  int from = hetccl_user_rank(args->user_ranks, expect_src);
  /* Framing first: if these are wrong the rest of the header means nothing. */
  if (h->magic != HETCCL_FRAME_MAGIC) {
    WARN("%s: corrupt frame from rank %d: magic 0x%016" PRIx64 ", expected 0x%016" PRIx64,
         transport, from, h->magic, (uint64_t)HETCCL_FRAME_MAGIC);
    return ncclSystemError;
  }
  if (h->comm_id != comm_id) {
    WARN("%s: frame from rank %d belongs to communicator 0x%016" PRIx64
         ", expected 0x%016" PRIx64, transport, from, h->comm_id, comm_id);
    return ncclSystemError;
  }
  if (h->src_rank != expect_src) {
    WARN("%s: frame on the connection from rank %d says it comes from rank %d", transport,
         from, wire_rank(args, h->src_rank));
    return ncclSystemError;
  }
  if (h->seq != expect_seq) {
    WARN("%s: frame from rank %d has sequence number %" PRIu64 ", expected %" PRIu64
         " (lost or reordered message)", transport, from, h->seq, expect_seq);
    return ncclSystemError;
  }
  if (h->flags != 0) {
    WARN("%s: frame from rank %d has unknown flags 0x%x", transport, from, h->flags);
    return ncclSystemError;
  }
  /* The peer posted a different operation than we did: a usage error. */
  if (expect_tag != 0 && h->tag != expect_tag) {
    if (mismatch && !mismatch->seen)
      *mismatch = (hetccl_tag_mismatch_t){1, expect_src, h->tag, expect_tag};
    WARN("%s: message %" PRIu64 " from rank %d has operation signature 0x%016" PRIx64
         ", the posted receive expects 0x%016" PRIx64 " (ranks called different operations)",
         transport, expect_seq, from, h->tag, expect_tag);
    return ncclInvalidUsage;
  }
  if (h->bytes != expect_bytes) {
    WARN("%s: message %" PRIu64 " from rank %d carries %" PRIu64
         " bytes, the posted receive expects %" PRIu64, transport, expect_seq, from,
         h->bytes, expect_bytes);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_fail_note_received(const hetccl_fail_note_t *note, const char *transport,
                                       int peer, const hetccl_transport_args_t *args) {
  hetccl_fail_note_t n = *note; /* it may sit in memory the peer still writes */
  n.text[HETCCL_FAIL_TEXT - 1] = '\0';
  /* origin stays in the communicator's numbering (the engine relays the
   * note as is); only the message names the user's. */
  int who = hetccl_user_rank(args->user_ranks, peer);
  if (n.origin == peer)
    WARN("%s: rank %d gave up: %s", transport, who, n.text);
  else
    WARN("%s: rank %d gave up because rank %d did: %s", transport, who, wire_rank(args, n.origin),
         n.text);
  hetccl_fail_note_t *keep = args->peer_note;
  if (keep && keep->code == 0) *keep = n;
  return n.code == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError;
}
