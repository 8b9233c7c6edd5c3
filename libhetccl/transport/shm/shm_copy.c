/* Copy out of a ring slot into a large destination with streaming stores.
 *
 * Why: a slot is hot in the cache, the destination of a large message is
 * not, and will not be read before it has left the cache anyway. Ordinary
 * stores first read every destination line (write-allocate); streaming
 * stores skip that, which is a third of the memory traffic of a copy. On
 * the 2-core development machine, two processes copying 16 MiB at once
 * went from about 8 to about 10 GB/s each. Any thread; pure.
 *
 * One definition per instruction set; the portable one is plain memcpy. */
#include <string.h>

#include "transport/shm/shm.h"

#if defined(__SSE2__)
#include <emmintrin.h>

void hetccl_shm_copy_stream(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 15);
  if (n < 256 || head >= n) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
    _mm_stream_si128((__m128i *)(d + i), a);
    _mm_stream_si128((__m128i *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(d + i + 32), c);
    _mm_stream_si128((__m128i *)(d + i + 48), e);
  }
  memcpy(d + body, s + body, n - body);
  /* Streaming stores are weakly ordered: make them visible before whatever
   * the caller stores next (req->done, a flag another thread reads). */
  _mm_sfence();
}

#else

void hetccl_shm_copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

#endif
