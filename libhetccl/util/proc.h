/* Processes and threads as the kernel shows them: whether a peer process
 * of this host still lives (liveness checks of the shm transport and of
 * connections on first use), the names of hetccl's own threads (what
 * top -H, /proc/PID/task/TID/comm and profilers show), and the host's CPUs.
 *
 * Pids mean something only within one pid namespace; callers compare them
 * only for ranks of this host. */
#ifndef HETCCL_UTIL_PROC_H
#define HETCCL_UTIL_PROC_H

/* State letter (field 3) and start time (field 22, clock ticks since boot)
 * of /proc/pid/stat; 0 when it cannot be read or parsed. */
int hetccl_proc_stat(int pid, char *state, unsigned long long *start);

/* 0 if the process is certainly gone: it does not exist, is a zombie, or
 * (start != 0) its pid now names a process started at another time; 1
 * otherwise, including when nothing can be told. */
int hetccl_proc_alive(int pid, unsigned long long start);

/* This host's online CPUs (sysconf's count, at least 1; read once): what
 * the defaults that weigh ranks against CPUs compare with. */
int hetccl_host_cpus(void);

/* Name the calling thread (at most 15 characters are kept): every thread
 * hetccl starts says so, "hetccl-proxy" and the like. Best effort. */
void hetccl_thread_name(const char *name);

#endif
