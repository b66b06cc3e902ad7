/* bench/stall_client.c: a proxy's far side that never reads: many sessions stalled behind it, and a normal session's throughput meanwhile. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"

#define CHUNK (64 * 1024)
#define STILL_MS 300 /* a stalled client that sent nothing for this long is full */
#define STALLED_SNDBUF (64 * 1024) /* what it queues itself: the kernel's TCP memory is for the proxy's sockets */

struct opts {
	const char *host;
	uint64_t port, upstream_port, stalled, stall_bytes;
	double secs, timeout_s;
	bool csv;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: stall_client --port N --upstream-port N [--host ADDR] [--stalled N] [--stall-bytes N]\n"
		   "                    [--secs S] [--timeout SECS] [--csv]\n"
		   "  Listens on --upstream-port as the proxy's upstream, with 4 KiB receive buffers, and\n"
		   "  never reads what the proxy forwards to it, but for the last session. Through the\n"
		   "  proxy on --port it opens --stalled sessions (1000), each sending (with a 64 KiB send\n"
		   "  buffer of its own) until its socket stays full for 300 ms or it sent --stall-bytes\n"
		   "  (16 MiB); then one normal session sends for --secs seconds (3) to an upstream\n"
		   "  side that reads everything.\n"
		   "  Prints: stalled sessions, bytes they sent, the normal session's MB/s (upstream's\n"
		   "  count over the sending time) and ms to its first byte; --csv: one comma-separated\n"
		   "  line (first byte -1: none came). --timeout (30 s) bounds each phase. Start the proxy\n"
		   "  first, pointed at the upstream port: proxy --port P --to 127.0.0.1:U, then\n"
		   "  stall_client --port P --upstream-port U. Exits 3 when no byte got through.\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{ "host", required_argument, 0, 'H' }, { "port", required_argument, 0, 'p' },
		{ "upstream-port", required_argument, 0, 'u' }, { "stalled", required_argument, 0, 'n' },
		{ "stall-bytes", required_argument, 0, 'b' }, { "secs", required_argument, 0, 's' },
		{ "timeout", required_argument, 0, 't' }, { "csv", no_argument, 0, 'v' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	*o = (struct opts){ .host = "127.0.0.1", .stalled = 1000, .stall_bytes = 16u << 20, .secs = 3,
			    .timeout_s = 30 };
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case 'H': o->host = optarg; break;
		case 'p': ok = bu_parse_u64(argv[0], "port", optarg, 1, 65535, &o->port); break;
		case 'u': ok = bu_parse_u64(argv[0], "upstream-port", optarg, 1, 65535, &o->upstream_port); break;
		case 'n': ok = bu_parse_u64(argv[0], "stalled", optarg, 0, 100000, &o->stalled); break;
		case 'b': ok = bu_parse_u64(argv[0], "stall-bytes", optarg, 1, 1ull << 34, &o->stall_bytes); break;
		case 's': ok = bu_parse_secs(argv[0], "secs", optarg, 0.1, 600, &o->secs); break;
		case 't': ok = bu_parse_secs(argv[0], "timeout", optarg, 0.1, 600, &o->timeout_s); break;
		case 'v': o->csv = true; break;
		case 'h': usage(stdout); exit(0);
		default: ok = false;
		}
		if (!ok)
			return -1;
	}
	if (o->port == 0 || o->upstream_port == 0 || optind != argc) {
		usage(stderr);
		return -1;
	}
	return 0;
}

static double ms_since(uint64_t t0)
{
	return (double)(bu_now_ns() - t0) / 1e6;
}

/* The upstream's side: every connection the proxy made, in the order it made them. */
struct upstream {
	int lfd;
	int *fds;
	size_t n, cap;
};

/* Accepts what is waiting (non-blocking); false when the fd table is full. */
static bool accept_waiting(struct upstream *u)
{
	for (;;) {
		int fd = accept4(u->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED;
		if (u->n == u->cap) {
			size_t cap = u->cap ? 2 * u->cap : 1024;
			int *fds = realloc(u->fds, cap * sizeof(*fds));
			if (!fds) {
				close(fd);
				return false;
			}
			u->fds = fds;
			u->cap = cap;
		}
		u->fds[u->n++] = fd;
	}
}

/* Accepts until `want` connections came, or the timeout. */
static bool accept_until(struct upstream *u, size_t want, double timeout_s)
{
	uint64_t t0 = bu_now_ns();
	while (u->n < want && ms_since(t0) < timeout_s * 1e3) {
		if (!accept_waiting(u))
			return false;
		struct pollfd p = { .fd = u->lfd, .events = POLLIN };
		if (u->n < want)
			poll(&p, 1, 10);
	}
	return u->n >= want;
}

/* Sends from every stalled client until each stayed full for STILL_MS or sent its cap. Bytes sent. */
static uint64_t fill(int *fds, size_t n, const struct opts *o)
{
	static char buf[CHUNK];
	uint64_t *sent = calloc(n, sizeof(*sent)), *last = calloc(n, sizeof(*last)), total = 0, t0 = bu_now_ns();
	size_t done = 0;
	for (size_t i = 0; i < n; i++)
		last[i] = t0;
	while (done < n && ms_since(t0) < o->timeout_s * 1e3) {
		done = 0;
		for (size_t i = 0; i < n; i++) {
			bool moved = false;
			while (fds[i] >= 0 && sent[i] < o->stall_bytes) {
				size_t want = o->stall_bytes - sent[i] < CHUNK ? o->stall_bytes - sent[i] : CHUNK;
				long k = bu_send(fds[i], buf, want);
				if (k <= 0) {
					if (k < 0) { /* the proxy closed it: not a stalled session any more */
						close(fds[i]);
						fds[i] = -1;
					}
					break;
				}
				sent[i] += (uint64_t)k;
				total += (uint64_t)k;
				moved = true;
			}
			if (moved)
				last[i] = bu_now_ns();
			done += fds[i] < 0 || sent[i] >= o->stall_bytes || ms_since(last[i]) >= STILL_MS;
		}
		usleep(10 * 1000);
	}
	free(sent);
	free(last);
	return total;
}

/* The normal session's far side: reads everything, counting, until told to stop. */
struct reader {
	int fd;
	uint64_t got, first_ns;
	bool stop;
};

static void *read_all(void *arg)
{
	struct reader *r = arg;
	static char buf[1 << 20];
	while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
		ssize_t k = recv(r->fd, buf, sizeof(buf), 0);
		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			break;
		if (k > 0) {
			if (r->got == 0)
				__atomic_store_n(&r->first_ns, bu_now_ns(), __ATOMIC_RELEASE);
			__atomic_store_n(&r->got, r->got + (uint64_t)k, __ATOMIC_RELEASE);
		}
	}
	return NULL;
}

/* One normal session for o->secs: bytes its upstream got in that time (*first_ms: to the first, -1 if none). */
static uint64_t normal_session(const struct opts *o, struct upstream *u, double *first_ms)
{
	static char buf[CHUNK];
	*first_ms = -1;
	size_t before = u->n;
	int fd = bu_connect(o->host, (int)o->port);
	if (fd < 0 || !accept_until(u, before + 1, o->timeout_s)) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	struct reader r = { .fd = u->fds[before] };
	struct timeval tv = { .tv_usec = 100 * 1000 }; /* so the reader sees its stop */
	pthread_t th;
	if (setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    pthread_create(&th, NULL, read_all, &r) != 0) {
		perror("stall_client: the normal session's reader");
		close(fd);
		return 0;
	}
	uint64_t t0 = bu_now_ns();
	while (ms_since(t0) < o->secs * 1e3) {
		if (bu_send(fd, buf, sizeof(buf)) < 0)
			break;
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		poll(&p, 1, 10);
	}
	uint64_t got = __atomic_load_n(&r.got, __ATOMIC_ACQUIRE);
	__atomic_store_n(&r.stop, true, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	if (r.first_ns)
		*first_ms = (double)(r.first_ns - t0) / 1e6;
	close(fd);
	return got;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse(argc, argv, &o) != 0)
		return 2;
	bu_ignore_sigpipe();
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			perror("stall_client: raising the fd limit (going on with the soft one)");
	}
	struct upstream u = { .lfd = bu_listen(o.host, (int)o.upstream_port, 4096, false) };
	if (u.lfd < 0) {
		fprintf(stderr, "stall_client: listen on %s:%d: %s\n", o.host, (int)o.upstream_port, strerror(-u.lfd));
		return 1;
	}
	int small = 4096; /* the accepted sockets inherit it */
	int *fds = calloc(o.stalled ? o.stalled : 1, sizeof(*fds));
	if (setsockopt(u.lfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) != 0 || !fds) {
		perror("stall_client: the upstream's receive buffer, or memory");
		return 1;
	}
	size_t opened = 0;
	for (; opened < o.stalled; opened++) {
		if ((fds[opened] = bu_connect(o.host, (int)o.port)) < 0) {
			fprintf(stderr, "stall_client: connect %zu: %s\n", opened, strerror(-fds[opened]));
			break;
		}
		int sndbuf = STALLED_SNDBUF;
		if (setsockopt(fds[opened], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)) != 0) {
			perror("stall_client: a stalled client's send buffer");
			close(fds[opened]);
			break;
		}
	}
	uint64_t stalled_bytes = accept_until(&u, opened, o.timeout_s) ? fill(fds, opened, &o) : 0;
	/* The normal session's upstream is the next one accepted: every stalled one must be in first. */
	if (u.n != opened) {
		fprintf(stderr, "stall_client: the upstream accepted %zu connections for %zu sessions\n", u.n, opened);
		return 1;
	}
	double first_ms;
	uint64_t got = normal_session(&o, &u, &first_ms);
	double mbps = (double)got / 1e6 / o.secs;
	if (o.csv)
		printf("%zu,%llu,%.1f,%.1f\n", opened, (unsigned long long)stalled_bytes, mbps, first_ms);
	else if (first_ms < 0)
		printf("stalled sessions %zu (upstream accepted %zu), they sent %.1f MB; normal session: no byte "
		       "reached its upstream in %.1f s\n",
		       opened, u.n > opened ? opened : u.n, (double)stalled_bytes / 1e6, o.secs);
	else
		printf("stalled sessions %zu (upstream accepted %zu), they sent %.1f MB; normal session %.1f MB/s, "
		       "first byte after %.1f ms\n",
		       opened, u.n > opened ? opened : u.n, (double)stalled_bytes / 1e6, mbps, first_ms);
	for (size_t i = 0; i < opened; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	for (size_t i = 0; i < u.n; i++)
		close(u.fds[i]);
	close(u.lfd);
	free(fds);
	free(u.fds);
	return got > 0 ? 0 : 3;
}
