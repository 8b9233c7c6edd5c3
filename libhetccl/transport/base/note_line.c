/* The note line: a TCP connection per pair that carries nothing while all
 * is well and, when a rank gives up, its failure note (socket and ib
 * transports; they cannot put the note on their data path, which the
 * failing rank may have left in the middle of a piece). Runs on the
 * thread that drives the endpoint; waits only as long as it is told. */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "transport/transport.h"
#include "util/log.h"

#define NOTE_LINE_MAGIC 0x484e4f54454c4e31ull /* "HNOTELN1" */

typedef struct note_wire {
  uint64_t magic;
  hetccl_fail_note_t note;
} note_wire_t;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void hetccl_note_line_send(int fd, const hetccl_fail_note_t *why, const char *transport,
                           int peer) {
  if (fd < 0 || why == NULL) return;
  note_wire_t w;
  memset(&w, 0, sizeof(w));
  w.magic = NOTE_LINE_MAGIC;
  w.note = *why;
  w.note.text[HETCCL_FAIL_TEXT - 1] = '\0';
  ssize_t k = send(fd, &w, sizeof(w), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (k != (ssize_t)sizeof(w))
    INFO(HETCCL_NET, "%s: no room to leave rank %d a note (%zd of %zu bytes)", transport, peer, k,
         sizeof(w));
  shutdown(fd, SHUT_WR);
  /* The peer's own note, if both gave up at once: read it, so that our
   * close does not reset the line and take our note with it. */
  char drain[sizeof(w)];
  while (recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0) {}
}

int hetccl_note_line_read(int fd, int wait_ms, hetccl_fail_note_t *out) {
  note_wire_t w;
  size_t got = 0;
  int64_t deadline = now_ms() + wait_ms;
  while (fd >= 0 && got < sizeof(w)) {
    ssize_t k = recv(fd, (char *)&w + got, sizeof(w) - got, MSG_DONTWAIT);
    if (k > 0) {
      got += (size_t)k;
      continue;
    }
    if (k == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) break;
    int64_t left = deadline - now_ms();
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    if (left <= 0 || (poll(&p, 1, (int)left) < 0 && errno != EINTR)) break;
  }
  if (got < sizeof(w) || w.magic != NOTE_LINE_MAGIC || w.note.code == 0) return 0;
  *out = w.note;
  return 1;
}
