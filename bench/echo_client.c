/* bench/echo_client.c: load client for echo servers: ping-pong (latency) or streaming (throughput), N connections on one epoll thread.
 *
 * pingpong: each connection sends one message of --size bytes, waits for all
 *   of it to come back (checked byte for byte), records the round trip, sends
 *   the next. Reports messages/s, MiB/s and round-trip p50/p99/max.
 * stream: each connection keeps up to --window bytes in flight and reads
 *   everything back (checked against the pattern it sent). Reports
 *   messages/s (bytes echoed / --size) and MiB/s.
 * Always bounded: --duration (default 3 s) and/or --count messages per
 *   connection, and never more than --timeout (default 60 s) in all.
 *
 * Usage: echo_client [--host 127.0.0.1] [--port 7000] [--mode pingpong|stream] [--conns 50]
 *                    [--size 64] [--duration S] [--count N] [--window B] [--timeout S] [--csv]
 *                    [--unix PATH] (a Unix socket instead of host and port)
 * --csv prints one line: mode,conns,size,seconds,msgs,msgs_per_s,mib_per_s,p50_us,p99_us,max_us,errors
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"

#define PERIOD 65521u  /* the stream pattern repeats every PERIOD bytes: prime, so it never lines up with a message */

struct conn {
	int fd;
	bool done, out_armed;
	uint64_t tx, rx;       /* bytes sent and received over the connection's life */
	uint64_t msgs;         /* messages completed */
	uint64_t sent_at;      /* pingpong: when the current message went out */
};

static struct {
	const char *host;
	int port;
	const char *unix_path;     /* --unix: a Unix socket instead of host and port */
	bool stream, csv;
	uint64_t conns, size, count, window;
	double duration, timeout;
	int ep;
	char *pat;             /* PERIOD + max chunk bytes of pattern, so any offset has a straight run */
	char *rbuf;
	size_t rbuf_size;
	struct conn *c;
	uint64_t live, errors, msgs;
	struct bu_hist hist;
} S;

static const char *prog = "echo_client";

/* Pattern bytes for stream offset `off`, as one straight run of up to PERIOD bytes. */
static const char *pat_at(uint64_t off)
{
	return S.pat + off % PERIOD;
}

static void finish(struct conn *c, bool error)
{
	if (c->done)
		return;
	c->done = true;
	S.live--;
	S.errors += error;
	close(c->fd);
}

static void want_out(struct conn *c, bool on)
{
	bu_want_out(S.ep, c->fd, c, &c->out_armed, on);
}

/* Sends pattern bytes up to `goal` (total tx); waits for EPOLLOUT when the socket is full. */
static void send_to(struct conn *c, uint64_t goal)
{
	while (c->tx < goal) {
		uint64_t n = goal - c->tx;
		if (n > PERIOD)
			n = PERIOD;
		long w = bu_send(c->fd, pat_at(c->tx), n);
		if (w <= 0) {
			if (w == 0)
				want_out(c, true);
			else
				finish(c, true);
			return;
		}
		c->tx += (uint64_t)w;
	}
	want_out(c, false);
}

/* What the connection should have sent by now: one message ahead (pingpong) or a window ahead (stream). */
static uint64_t send_goal(const struct conn *c, bool stopping)
{
	uint64_t cap = S.count ? S.count * S.size : UINT64_MAX;
	uint64_t goal = S.stream ? c->rx + S.window : (c->msgs + 1) * S.size;
	if (stopping)
		return c->tx;
	return goal < cap ? goal : cap;
}

static void on_readable(struct conn *c, uint64_t now, bool stopping)
{
	for (;;) {
		ssize_t n = recv(c->fd, S.rbuf, S.rbuf_size, 0);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			finish(c, true); /* the server closed on us */
			return;
		}
		if (n < 0)
			break;
		if ((uint64_t)n > c->tx - c->rx || memcmp(S.rbuf, pat_at(c->rx), (size_t)n) != 0) {
			fprintf(stderr, "%s: connection %ld: echoed bytes differ from those sent\n", prog,
				(long)(c - S.c));
			finish(c, true);
			return;
		}
		c->rx += (uint64_t)n;
	}
	uint64_t msgs = c->rx / S.size;
	if (msgs > c->msgs) {
		if (!S.stream)
			bu_hist_add(&S.hist, now - c->sent_at);
		S.msgs += msgs - c->msgs;
		c->msgs = msgs;
		c->sent_at = now;
	}
	if (S.count && c->msgs >= S.count) {
		finish(c, false);
		return;
	}
	if (!stopping)
		send_to(c, send_goal(c, stopping));
}

static int connect_all(void)
{
	for (uint64_t i = 0; i < S.conns; i++) {
		struct conn *c = &S.c[i];
		c->fd = S.unix_path ? bu_connect_unix(S.unix_path) : bu_connect(S.host, S.port);
		if (c->fd < 0) {
			fprintf(stderr, "%s: connect %s:%d%s%s: %s\n", prog, S.host, S.port, S.unix_path ? ", unix:" : "",
				S.unix_path ? S.unix_path : "", strerror(-c->fd));
			return -1;
		}
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
		epoll_ctl(S.ep, EPOLL_CTL_ADD, c->fd, &ev);
		S.live++;
	}
	return 0;
}

static void report(double secs)
{
	double mps = secs > 0 ? (double)S.msgs / secs : 0;
	double mib = mps * (double)S.size / (1 << 20);
	double p50 = bu_hist_quantile(&S.hist, 0.50) / 1e3, p99 = bu_hist_quantile(&S.hist, 0.99) / 1e3;
	double max = S.hist.max / 1e3;
	const char *mode = S.stream ? "stream" : "pingpong";
	if (S.csv)
		printf("%s,%lu,%lu,%.3f,%lu,%.1f,%.2f,%.1f,%.1f,%.1f,%lu\n", mode, S.conns, S.size, secs, S.msgs,
		       mps, mib, p50, p99, max, S.errors);
	else if (S.stream)
		printf("echo_client: %s conns=%lu size=%lu secs=%.2f msgs=%lu msgs/s=%.0f MiB/s=%.1f errors=%lu\n",
		       mode, S.conns, S.size, secs, S.msgs, mps, mib, S.errors);
	else
		printf("echo_client: %s conns=%lu size=%lu secs=%.2f msgs=%lu msgs/s=%.0f MiB/s=%.1f "
		       "p50=%.1fus p99=%.1fus max=%.1fus errors=%lu\n",
		       mode, S.conns, S.size, secs, S.msgs, mps, mib, p50, p99, max, S.errors);
}

static int run(void)
{
	struct epoll_event evs[256];
	uint64_t t0 = bu_now_ns(), now = t0;
	uint64_t end = S.duration > 0 ? t0 + (uint64_t)(S.duration * 1e9) : UINT64_MAX;
	uint64_t hard = t0 + (uint64_t)(S.timeout * 1e9);
	for (uint64_t i = 0; i < S.conns; i++) {
		S.c[i].sent_at = t0;
		send_to(&S.c[i], send_goal(&S.c[i], false));
	}
	while (S.live && now < end && now < hard) {
		int n = epoll_wait(S.ep, evs, 256, 100);
		now = bu_now_ns();
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (c->done)
				continue;
			if (evs[i].events & EPOLLOUT)
				send_to(c, send_goal(c, false));
			if (!c->done && (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
				on_readable(c, now, false);
		}
	}
	double secs = (double)((now < end ? now : end) - t0) / 1e9;
	if (now >= hard && S.live)
		fprintf(stderr, "%s: --timeout reached with %lu connections unfinished\n", prog, S.live);
	report(secs);
	return S.errors ? 1 : 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: %s [--host ADDR] [--port P | --unix PATH] [--mode pingpong|stream] [--conns N] [--size B]\n"
			"       [--duration S] [--count N] [--window B] [--timeout S] [--csv]\n", prog);
}

static bool parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "host", required_argument, 0, 'h' }, { "port", required_argument, 0, 'p' },
		{ "mode", required_argument, 0, 'm' }, { "conns", required_argument, 0, 'c' },
		{ "size", required_argument, 0, 's' }, { "duration", required_argument, 0, 'd' },
		{ "count", required_argument, 0, 'n' }, { "window", required_argument, 0, 'w' },
		{ "timeout", required_argument, 0, 't' }, { "csv", no_argument, 0, 'v' },
		{ "unix", required_argument, 0, 'u' }, { 0, 0, 0, 0 },
	};
	uint64_t port = 7000;
	bool have_duration = false;
	S.host = "127.0.0.1";
	S.conns = 50;
	S.size = 64;
	S.timeout = 60;
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		bool ok = true;
		switch (o) {
		case 'h': S.host = optarg; break;
		case 'p': ok = bu_parse_u64(prog, "port", optarg, 1, 65535, &port); break;
		case 'c': ok = bu_parse_u64(prog, "conns", optarg, 1, 100000, &S.conns); break;
		case 's': ok = bu_parse_u64(prog, "size", optarg, 1, 1 << 20, &S.size); break;
		case 'n': ok = bu_parse_u64(prog, "count", optarg, 1, UINT32_MAX, &S.count); break;
		case 'w': ok = bu_parse_u64(prog, "window", optarg, 1, 64 << 20, &S.window); break;
		case 'd': ok = bu_parse_secs(prog, "duration", optarg, 0.1, 3600, &S.duration); have_duration = ok; break;
		case 't': ok = bu_parse_secs(prog, "timeout", optarg, 0.1, 3600, &S.timeout); break;
		case 'v': S.csv = true; break;
		case 'u': S.unix_path = optarg; break;
		case 'm':
			S.stream = strcmp(optarg, "stream") == 0;
			ok = S.stream || strcmp(optarg, "pingpong") == 0;
			if (!ok)
				fprintf(stderr, "%s: --mode: '%s' is neither pingpong nor stream\n", prog, optarg);
			break;
		default: ok = false;
		}
		if (!ok)
			return false;
	}
	if (optind < argc)
		return false;
	if (!have_duration && !S.count)
		S.duration = 3;
	if (!S.window)
		S.window = S.size * 4 > 65536 ? S.size * 4 : 65536;
	S.port = (int)port;
	return true;
}

int main(int argc, char **argv)
{
	if (!parse_args(argc, argv)) {
		usage();
		return 2;
	}
	bu_ignore_sigpipe();
	S.rbuf_size = 1 << 15; /* with PERIOD, what keeps pat_at(off) + a read inside S.pat */
	S.rbuf = malloc(S.rbuf_size);
	S.pat = malloc(2 * PERIOD);
	S.c = calloc(S.conns, sizeof(*S.c));
	S.ep = epoll_create1(EPOLL_CLOEXEC);
	if (!S.rbuf || !S.pat || !S.c || S.ep < 0) {
		fprintf(stderr, "%s: out of memory or epoll_create1 failed\n", prog);
		return 1;
	}
	for (uint64_t i = 0; i < 2 * PERIOD; i++)
		S.pat[i] = (char)((i % PERIOD) * 7 + (i % PERIOD) / 251);
	if (connect_all() < 0)
		return 1;
	return run();
}
