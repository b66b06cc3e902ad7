/* bench/bench_util.c: clocks, the latency histogram, socket set-up and option parsing for the bench programs. */
#include "config.h"

#include "bench_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

uint64_t bu_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- histogram ---- */

static unsigned bucket_of(uint64_t v)
{
	if (v < 128)
		return (unsigned)v;
	unsigned msb = 63u - (unsigned)__builtin_clzll(v);
	return 128 + (msb - 7) * 64 + (unsigned)((v >> (msb - 6)) & 63);
}

/* The middle of bucket i: what a quantile that lands in it reports. */
static uint64_t bucket_value(unsigned i)
{
	if (i < 128)
		return i;
	unsigned k = i - 128, msb = 7 + k / 64, shift = msb - 6;
	uint64_t low = (uint64_t)(64 + k % 64) << shift;
	return low + ((1ull << shift) >> 1);
}

void bu_hist_add(struct bu_hist *h, uint64_t ns)
{
	h->bucket[bucket_of(ns)]++;
	h->count++;
	if (ns > h->max)
		h->max = ns;
}

uint64_t bu_hist_quantile(const struct bu_hist *h, double q)
{
	if (h->count == 0)
		return 0;
	uint64_t rank = (uint64_t)(q * (double)h->count), seen = 0;
	if (rank >= h->count)
		rank = h->count - 1;
	for (unsigned i = 0; i < BU_HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen > rank) {
			uint64_t v = bucket_value(i);
			return v < h->max ? v : h->max;
		}
	}
	return h->max;
}

/* ---- sockets ---- */

/* Fills ss from a numeric v4 or v6 address; false for anything else. */
static bool make_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len)
{
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)port);
		*len = sizeof(*a4);
		return true;
	}
	if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*a6);
		return true;
	}
	return false;
}

int bu_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

int bu_connect(const char *host, int port)
{
	struct sockaddr_storage ss;
	socklen_t len;
	if (!make_addr(host, port, &ss, &len))
		return -EINVAL;
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&ss, len) < 0 || bu_set_nonblock(fd) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	bu_set_nodelay(fd);
	return fd;
}

int bu_set_nodelay(int fd)
{
	int one = 1;
	return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ? -errno : 0;
}

int bu_listen(const char *host, int port, int backlog, bool nodelay)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int one = 1;
	if (!make_addr(host, port, &ss, &len))
		return -EINVAL;
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
	if ((nodelay && bu_set_nodelay(fd) < 0) || bind(fd, (struct sockaddr *)&ss, len) < 0 ||
	    listen(fd, backlog) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

/* A path as a sockaddr_un; false when it does not fit with its NUL. */
static bool make_unix_addr(const char *path, struct sockaddr_un *a, socklen_t *len)
{
	size_t n = strlen(path);
	if (n >= sizeof(a->sun_path))
		return false;
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	memcpy(a->sun_path, path, n + 1);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	return true;
}

int bu_connect_unix(const char *path)
{
	struct sockaddr_un a;
	socklen_t len;
	if (!make_unix_addr(path, &a, &len))
		return -ENAMETOOLONG;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, len) < 0 || bu_set_nonblock(fd) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

int bu_listen_unix(const char *path, int backlog)
{
	struct sockaddr_un a;
	socklen_t len;
	if (!make_unix_addr(path, &a, &len))
		return -ENAMETOOLONG;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	unlink(path); /* a bench's own path: what a previous run left */
	if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, backlog) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

void bu_want_out(int ep, int fd, void *ptr, bool *armed, bool on)
{
	if (*armed == on)
		return;
	struct epoll_event ev = { .events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = ptr };
	epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
	*armed = on;
}

long bu_send(int fd, const void *p, size_t n)
{
	for (;;) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w >= 0)
			return w > 0 ? (long)w : -1;
		if (errno == EAGAIN)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

/* ---- options ---- */

bool bu_parse_u64(const char *prog, const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) {
		fprintf(stderr, "%s: --%s: '%s' is not a whole number in %llu..%llu\n", prog, name, s,
			(unsigned long long)lo, (unsigned long long)hi);
		return false;
	}
	*out = v;
	return true;
}

bool bu_parse_secs(const char *prog, const char *name, const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "%s: --%s: '%s' is not a number of seconds in %g..%g\n", prog, name, s, lo, hi);
		return false;
	}
	*out = v;
	return true;
}

void bu_ignore_sigpipe(void)
{
	signal(SIGPIPE, SIG_IGN);
}

bool bu_http_answer_whole(const char *buf, size_t len)
{
	const char *end = strstr(buf, "\r\n\r\n");
	const char *cl = strcasestr(buf, "\r\nContent-Length:");
	return end && cl && cl < end && len >= (size_t)(end + 4 - buf) + strtoul(cl + 17, NULL, 10);
}

int bu_room_for_fds(const char *prog, uint64_t n)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return -errno;
	if (rl.rlim_cur >= n)
		return 0;
	if (rl.rlim_max < n) {
		fprintf(stderr, "%s: needs %llu fds, the hard limit (RLIMIT_NOFILE) is %llu: "
				"raise it as root (ulimit -Hn, or LimitNOFILE= in a unit)\n",
			prog, (unsigned long long)n, (unsigned long long)rl.rlim_max);
		return -EMFILE;
	}
	rl.rlim_cur = n;
	return setrlimit(RLIMIT_NOFILE, &rl) == 0 ? 0 : -errno;
}

static void *wait_forever(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

int bu_second_thread(void)
{
	pthread_t th;
	int rc = pthread_create(&th, NULL, wait_forever, NULL);
	if (rc != 0)
		return -rc;
	pthread_detach(th);
	return 0;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double bu_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), by_value);
	return v[n / 2];
}

int bu_listen_loopback(const char *prog, int backlog, int *port)
{
	int fd = bu_listen("127.0.0.1", 0, backlog, false);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		fprintf(stderr, "%s: no loopback listener\n", prog);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	*port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

double bu_thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
