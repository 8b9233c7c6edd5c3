/* The inbox (inbox.h): nonblocking accepts and header reads for a
 * listener that stays open while its communicator runs. */
#include "transport/base/inbox.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/log.h"

#define INBOX_MAX_PENDING 64
#define INBOX_ACCEPT_BURST 16
#define INBOX_EXPIRE_MS 5000
#define INBOX_HDR_MAX 256

typedef struct pending {
  int fd;
  size_t got;
  int64_t born_ms;
  hetccl_sockaddr_t from;
  unsigned char hdr[INBOX_HDR_MAX];
} pending_t;

struct hetccl_inbox {
  int lfd;
  size_t hdr_bytes;
  int npending;
  pending_t p[INBOX_MAX_PENDING];
};

hetccl_inbox_t *hetccl_inbox_create(int lfd, size_t hdr_bytes) {
  if (hdr_bytes == 0 || hdr_bytes > INBOX_HDR_MAX) {
    WARN("inbox: a header of %zu bytes (1 to %d)", hdr_bytes, INBOX_HDR_MAX);
    return NULL;
  }
  hetccl_inbox_t *in = calloc(1, sizeof(*in));
  if (in == NULL) {
    WARN("inbox: out of memory");
    return NULL;
  }
  in->lfd = lfd;
  in->hdr_bytes = hdr_bytes;
  return in;
}

static void drop(hetccl_inbox_t *in, int i) {
  close(in->p[i].fd);
  in->p[i] = in->p[--in->npending];
}

static ncclResult_t accept_some(hetccl_inbox_t *in) {
  for (int k = 0; k < INBOX_ACCEPT_BURST; k++) {
    hetccl_sockaddr_t from;
    socklen_t len = sizeof(from);
    memset(&from, 0, sizeof(from));
    int fd = accept4(in->lfd, &from.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclSuccess;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == EPERM) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (in->npending == 0) return ncclSuccess; /* wait it out: the next round retries */
        drop(in, 0);
        continue;
      }
      WARN("inbox: accept: %s", strerror(errno));
      return ncclSystemError;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (in->npending == INBOX_MAX_PENDING) { /* the oldest makes room */
      int oldest = 0;
      for (int i = 1; i < in->npending; i++)
        if (in->p[i].born_ms < in->p[oldest].born_ms) oldest = i;
      drop(in, oldest);
    }
    pending_t *p = &in->p[in->npending++];
    p->fd = fd;
    p->got = 0;
    p->born_ms = hetccl_net_now_ms();
    p->from = from;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_inbox_poll(hetccl_inbox_t *in, hetccl_inbox_take_fn take, void *ctx) {
  if (in == NULL) return ncclSuccess;
  ncclResult_t res = accept_some(in);
  if (res != ncclSuccess) return res;
  int64_t now = in->npending ? hetccl_net_now_ms() : 0;
  for (int i = 0; i < in->npending;) {
    pending_t *p = &in->p[i];
    ssize_t k = recv(p->fd, p->hdr + p->got, in->hdr_bytes - p->got, MSG_DONTWAIT);
    if (k > 0) p->got += (size_t)k;
    int gone = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (!gone && p->got == in->hdr_bytes) {
      pending_t done = *p;
      in->p[i] = in->p[--in->npending];
      if (!take(ctx, done.fd, done.hdr, &done.from)) close(done.fd);
      continue;
    }
    if (gone || now - p->born_ms > INBOX_EXPIRE_MS) {
      drop(in, i);
      continue;
    }
    i++;
  }
  return ncclSuccess;
}

void hetccl_inbox_destroy(hetccl_inbox_t *in) {
  if (in == NULL) return;
  while (in->npending) drop(in, 0);
  free(in);
}
