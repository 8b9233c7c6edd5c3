/* Processes and threads as the kernel shows them (proc.h). */
#include "util/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int hetccl_proc_stat(int pid, char *state, unsigned long long *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parens */
  if (!p || p[1] != ' ') return 0;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (!p) return 0;
    p++;
  }
  *start = strtoull(p, NULL, 10);
  return 1;
}

int hetccl_proc_alive(int pid, unsigned long long start) {
  if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
  char state;
  unsigned long long now_start;
  if (!hetccl_proc_stat(pid, &state, &now_start)) return 1;
  if (state == 'Z' || state == 'X') return 0;
  return start == 0 || now_start == start;
}

void hetccl_thread_name(const char *name) {
  char shown[16];
  snprintf(shown, sizeof(shown), "%s", name);
  (void)prctl(PR_SET_NAME, shown, 0, 0, 0);
}

int hetccl_host_cpus(void) {
  static int cpus;
  int c = __atomic_load_n(&cpus, __ATOMIC_RELAXED);
  if (!c) {
    long v = sysconf(_SC_NPROCESSORS_ONLN);
    c = v > 0 ? (int)v : 1;
    __atomic_store_n(&cpus, c, __ATOMIC_RELAXED);
  }
  return c;
}
