/* Helpers of the transport conformance test (tests/c/transport):
 * message contents that differ by sender, size and offset, and a summing
 * consume hook that also checks the transport's piece contract. */
#ifndef HETCCL_TESTS_TRANSPORT_CHECK_H
#define HETCCL_TESTS_TRANSPORT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

static inline uint8_t content(int src, size_t size, size_t i) {
  return (uint8_t)(src * 131 + size * 7 + i * 13 + (i >> 9));
}
static inline uint8_t prefill(size_t i) { return (uint8_t)(i * 3 + 1); }

/* Set when a consume call breaks the contract: a piece outside the request's
 * buffer, or a piece that is not a multiple of 8 bytes but the last. */
static int consume_bad;

static inline void sum_consume(void *ctx, void *dst, const void *src, size_t n) {
  hetccl_req_t *r = ctx;
  char *end = (char *)r->buf + r->bytes;
  if ((char *)dst < (char *)r->buf || (char *)dst + n > end ||
      (n % 8 != 0 && (char *)dst + n != end))
    consume_bad = 1;
  uint8_t *d = dst;
  const uint8_t *s = src;
  for (size_t i = 0; i < n; i++) d[i] += s[i];
}

#endif
