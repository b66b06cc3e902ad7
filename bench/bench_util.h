/* bench/bench_util.h: what the bench programs share: clocks, a latency histogram, sockets, option parsing. */
#ifndef PERCH_BENCH_UTIL_H
#define PERCH_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Monotonic clock. */
uint64_t bu_now_ns(void);

/*
 * Log-linear latency histogram (nanoseconds): exact below 128 ns, then 64
 * sub-buckets per power of two, so a percentile is within 1.6% of the truth
 * in 30 KiB whatever the sample count.
 */
#define BU_HIST_BUCKETS (128 + 57 * 64)
struct bu_hist {
	uint64_t count, max;
	uint64_t bucket[BU_HIST_BUCKETS];
};
void bu_hist_add(struct bu_hist *h, uint64_t ns);
/* The value at quantile q (0..1), in ns; 0 for an empty histogram. */
uint64_t bu_hist_quantile(const struct bu_hist *h, double q);

/* Blocking TCP connect to host:port (numeric v4/v6), then non-blocking with TCP_NODELAY. -errno on failure. */
int bu_connect(const char *host, int port);
/*
 * A non-blocking listening socket on host:port with SO_REUSEADDR and
 * SO_REUSEPORT, and TCP_NODELAY when `nodelay` (set before listen, so every
 * accepted socket inherits it). -errno on failure.
 */
int bu_listen(const char *host, int port, int backlog, bool nodelay);
/* Blocking connect to the Unix socket at path, then non-blocking. -errno on failure (-ENAMETOOLONG). */
int bu_connect_unix(const char *path);
/* A non-blocking listening Unix socket at path, a file left there first removed. -errno on failure. */
int bu_listen_unix(const char *path, int backlog);
int bu_set_nonblock(int fd);
/* TCP_NODELAY on fd; a listener's accepted sockets inherit it. -errno on failure. */
int bu_set_nodelay(int fd);

/*
 * Reads a decimal option value into *out within [lo, hi]; on bad input
 * prints "PROG: --NAME: ..." to stderr and returns false (never aborts).
 */
bool bu_parse_u64(const char *prog, const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
bool bu_parse_secs(const char *prog, const char *name, const char *s, double lo, double hi, double *out);

/* Interest EPOLLIN, plus EPOLLOUT when `on`, for fd tagged ptr; *armed remembers the last, so a no-change costs nothing. */
void bu_want_out(int ep, int fd, void *ptr, bool *armed, bool on);

/* send() without SIGPIPE that retries EINTR: bytes sent (> 0), 0 when the socket is full, -1 when the peer is gone. */
long bu_send(int fd, const void *p, size_t n);

/* Ignore SIGPIPE, so a peer that vanished is an EPIPE to count, not a dead process. */
void bu_ignore_sigpipe(void);

/*
 * Whether buf (NUL-terminated, len bytes) holds one whole HTTP answer:
 * its head and the Content-Length bytes of body after it.
 */
bool bu_http_answer_whole(const char *buf, size_t len);

/*
 * Raises the soft RLIMIT_NOFILE to n if it is lower: 0, or -errno; when
 * the hard limit is below n, -EMFILE after saying on stderr (as `prog`)
 * what is needed and how to get it.
 */
int bu_room_for_fds(const char *prog, uint64_t n);

/*
 * Starts a thread that only waits (detached, until the process exits), so
 * the process's file table is shared, as a server's with a loop thread is:
 * the kernel then takes a reference at each fd lookup. 0 or -errno.
 */
int bu_second_thread(void);

/* The median of v[0..n) (n > 0), which it sorts in place. */
double bu_median(double *v, int n);

/* A listener on 127.0.0.1 at a port the kernel picks: its fd (non-blocking) and *port, or -1 after saying why on stderr, `prog` first. */
int bu_listen_loopback(const char *prog, int backlog, int *port);

/* The calling thread's CPU time, user and system, in nanoseconds. */
double bu_thread_cpu_ns(void);

#endif /* PERCH_BENCH_UTIL_H */
