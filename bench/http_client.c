/* bench/http_client.c: a small HTTP/1.1 keep-alive load client (the one ./dev demo falls back on when wrk is missing).
 *
 * --conns connections on one epoll thread; each sends --depth GET requests
 * at once (1: plain keep-alive; 16: pipelined as wrk's pipeline.lua does),
 * reads that many responses framed by Content-Length, then sends the next
 * batch. A response's latency runs from its batch's send to its last byte.
 * A chunked or unframed response is an error (this client does not read
 * them); "Connection: close" makes it reconnect. Bounded by --duration.
 *
 * Usage: http_client [--host 127.0.0.1] [--port 8080] [--path /plaintext] [--conns 50]
 *                    [--depth 1] [--duration 3] [--csv]
 * --csv prints one line: conns,depth,seconds,requests,requests_per_s,p50_us,p99_us,max_us,non2xx,errors
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"

#define RBUF (64u << 10)  /* a response head or body larger than this is an error */

struct conn {
	int fd;
	bool out_armed, dead;
	size_t wpos;           /* bytes of the current batch written */
	uint32_t outstanding;  /* responses still due for the batch */
	uint64_t sent_at;
	size_t rlen;
	char rbuf[RBUF];
};

static struct {
	const char *host, *path;
	int port;
	uint64_t conns, depth;
	double duration;
	bool csv;
	int ep;
	char *batch;           /* depth copies of the request */
	size_t batch_len;
	struct conn *c;
	uint64_t requests, non2xx, errors, reconnects, live;
	struct bu_hist hist;
} S;

static const char *prog = "http_client";

/* Parses one response at the start of p[0..len): 1 with *consumed, 0 for more, -1 for what this client cannot frame. */
static int parse_response(const char *p, size_t len, size_t *consumed, int *status, bool *close_after)
{
	const char *end = memmem(p, len, "\r\n\r\n", 4);
	if (!end)
		return len >= RBUF ? -1 : 0;
	size_t head = (size_t)(end - p) + 4, clen = 0;
	bool have_len = false;
	if (len < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
		return -1;
	*status = atoi(p + 9);
	*close_after = false;
	for (const char *line = memchr(p, '\n', head) + 1; line < end; line = memchr(line, '\n', (size_t)(end - line) + 2) + 1) {
		if (strncasecmp(line, "content-length:", 15) == 0) {
			clen = strtoul(line + 15, NULL, 10);
			have_len = true;
		} else if (strncasecmp(line, "transfer-encoding:", 18) == 0) {
			return -1;
		} else if (strncasecmp(line, "connection:", 11) == 0) {
			const char *v = line + 11;
			while (*v == ' ')
				v++;
			*close_after = strncasecmp(v, "close", 5) == 0;
		}
	}
	bool no_body = *status / 100 == 1 || *status == 204 || *status == 304;
	if (!have_len && !no_body)
		return -1;
	if (head + clen > RBUF)
		return -1;
	if (len < head + clen)
		return 0;
	*consumed = head + clen;
	return 1;
}

static void want_out(struct conn *c, bool on)
{
	bu_want_out(S.ep, c->fd, c, &c->out_armed, on);
}

static bool open_conn(struct conn *c)
{
	c->fd = bu_connect(S.host, S.port);
	if (c->fd < 0) {
		fprintf(stderr, "%s: connect %s:%d: %s\n", prog, S.host, S.port, strerror(-c->fd));
		return false;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
	epoll_ctl(S.ep, EPOLL_CTL_ADD, c->fd, &ev);
	c->out_armed = false;
	c->rlen = 0;
	c->outstanding = 0;
	c->wpos = S.batch_len; /* nothing of a batch pending */
	return true;
}

static void drop(struct conn *c, bool error)
{
	S.errors += error;
	close(c->fd);
	c->dead = true;
	S.live--;
}

/* Writes the rest of the current batch. */
static void write_batch(struct conn *c)
{
	while (c->wpos < S.batch_len) {
		long w = bu_send(c->fd, S.batch + c->wpos, S.batch_len - c->wpos);
		if (w <= 0) {
			if (w == 0)
				want_out(c, true);
			else
				drop(c, true);
			return;
		}
		c->wpos += (size_t)w;
	}
	want_out(c, false);
}

static void start_batch(struct conn *c, uint64_t now)
{
	c->wpos = 0;
	c->outstanding = (uint32_t)S.depth;
	c->sent_at = now;
	write_batch(c);
}

/* Takes every whole response out of rbuf; returns false when the connection went away. */
static bool take_responses(struct conn *c, uint64_t now)
{
	size_t off = 0, used;
	int status, r = 1;
	bool close_after = false;
	while (c->outstanding && (r = parse_response(c->rbuf + off, c->rlen - off, &used, &status, &close_after)) == 1) {
		off += used;
		c->outstanding--;
		S.requests++;
		S.non2xx += status / 100 != 2;
		bu_hist_add(&S.hist, now - c->sent_at);
		if (close_after)
			break;
	}
	if (r < 0 || (!c->outstanding && off < c->rlen && !close_after)) {
		fprintf(stderr, "%s: a response this client cannot frame (or bytes nobody asked for)\n", prog);
		drop(c, true);
		return false;
	}
	memmove(c->rbuf, c->rbuf + off, c->rlen - off);
	c->rlen -= off;
	if (close_after) {
		/* The server ends the connection: what the batch still owed is lost; open a new one. */
		close(c->fd);
		S.reconnects++;
		if (!open_conn(c)) {
			c->dead = true;
			S.live--;
			return false;
		}
	}
	return true;
}

static void on_readable(struct conn *c, uint64_t now, bool stopping)
{
	for (;;) {
		ssize_t n = recv(c->fd, c->rbuf + c->rlen, RBUF - c->rlen, 0);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0) {
			drop(c, true);
			return;
		}
		c->rlen += (size_t)n;
		if (!take_responses(c, now))
			return;
	}
	if (!c->outstanding && !stopping)
		start_batch(c, now);
}

static void report(double secs)
{
	double rps = secs > 0 ? (double)S.requests / secs : 0;
	double p50 = bu_hist_quantile(&S.hist, 0.50) / 1e3, p99 = bu_hist_quantile(&S.hist, 0.99) / 1e3;
	if (S.csv)
		printf("%lu,%lu,%.3f,%lu,%.1f,%.1f,%.1f,%.1f,%lu,%lu\n", S.conns, S.depth, secs, S.requests, rps,
		       p50, p99, S.hist.max / 1e3, S.non2xx, S.errors);
	else
		printf("http_client: conns=%lu depth=%lu secs=%.2f requests=%lu req/s=%.0f p50=%.1fus p99=%.1fus "
		       "max=%.1fus non2xx=%lu errors=%lu reconnects=%lu\n", S.conns, S.depth, secs, S.requests,
		       rps, p50, p99, S.hist.max / 1e3, S.non2xx, S.errors, S.reconnects);
}

static int run(void)
{
	struct epoll_event evs[256];
	uint64_t t0 = bu_now_ns(), now = t0, end = t0 + (uint64_t)(S.duration * 1e9);
	for (uint64_t i = 0; i < S.conns; i++) {
		if (!open_conn(&S.c[i]))
			return 1;
		S.live++;
	}
	for (uint64_t i = 0; i < S.conns; i++)
		start_batch(&S.c[i], t0);
	while (S.live && now < end) {
		int n = epoll_wait(S.ep, evs, 256, 100);
		now = bu_now_ns();
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (!c->dead && (evs[i].events & EPOLLOUT))
				write_batch(c);
			if (!c->dead && (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
				on_readable(c, now, now >= end);
		}
	}
	report((double)((now < end ? now : end) - t0) / 1e9);
	return S.errors ? 1 : 0;
}

static bool parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "host", required_argument, 0, 'h' }, { "port", required_argument, 0, 'p' },
		{ "path", required_argument, 0, 'a' }, { "conns", required_argument, 0, 'c' },
		{ "depth", required_argument, 0, 'd' }, { "duration", required_argument, 0, 't' },
		{ "csv", no_argument, 0, 'v' }, { 0, 0, 0, 0 },
	};
	uint64_t port = 8080;
	S.host = "127.0.0.1";
	S.path = "/plaintext";
	S.conns = 50;
	S.depth = 1;
	S.duration = 3;
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		bool ok = true;
		switch (o) {
		case 'h': S.host = optarg; break;
		case 'a': S.path = optarg; ok = optarg[0] == '/' && !strpbrk(optarg, " \r\n"); break;
		case 'p': ok = bu_parse_u64(prog, "port", optarg, 1, 65535, &port); break;
		case 'c': ok = bu_parse_u64(prog, "conns", optarg, 1, 10000, &S.conns); break;
		case 'd': ok = bu_parse_u64(prog, "depth", optarg, 1, 256, &S.depth); break;
		case 't': ok = bu_parse_secs(prog, "duration", optarg, 0.1, 3600, &S.duration); break;
		case 'v': S.csv = true; break;
		default: ok = false;
		}
		if (!ok) {
			if (o == 'a')
				fprintf(stderr, "%s: --path: '%s' must start with / and hold no space\n", prog, optarg);
			return false;
		}
	}
	S.port = (int)port;
	return optind == argc;
}

int main(int argc, char **argv)
{
	if (!parse_args(argc, argv)) {
		fprintf(stderr, "usage: %s [--host ADDR] [--port P] [--path /plaintext] [--conns N] [--depth D]\n"
				"       [--duration S] [--csv]\n", prog);
		return 2;
	}
	bu_ignore_sigpipe();
	char req[512];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n", S.path, S.host, S.port);
	S.batch_len = (size_t)n * S.depth;
	S.batch = malloc(S.batch_len);
	S.c = calloc(S.conns, sizeof(*S.c));
	S.ep = epoll_create1(EPOLL_CLOEXEC);
	if (n <= 0 || (size_t)n >= sizeof(req) || !S.batch || !S.c || S.ep < 0) {
		fprintf(stderr, "%s: path too long, out of memory, or epoll_create1 failed\n", prog);
		return 1;
	}
	for (uint64_t i = 0; i < S.depth; i++)
		memcpy(S.batch + i * (size_t)n, req, (size_t)n);
	return run();
}
