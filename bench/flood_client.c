/* bench/flood_client.c: the flood scenario: many connections each send a fixed number of small frames to an echo server and read every reply back.
 *
 * Defaults are issue #7's: 96 connections x 64,000 frames of 126 bytes.
 * Each connection writes its frames (--batch frames a write; 1 writes each
 * frame alone) and reads the echo, checked byte for byte (frame number and
 * connection are in every frame, so a lost, doubled or crossed frame shows).
 * The write deadline: a connection with frames still to send whose socket
 * took no byte for --deadline (2 s) has "hit the deadline": the server
 * stopped draining it. It is closed and counted, as a client with a write
 * deadline would give up. After the last write, replies that stop coming for
 * --read-timeout (5 s) mark the connection stalled. --timeout (60 s) bounds
 * the whole run.
 *
 * Reports frames sent, frames delivered (echoed back intact), clients past
 * the deadline, stalled and failed clients, and the wall time from the first
 * connect to the last reply.
 *
 * Usage: flood_client [--host 127.0.0.1] [--port 7000] [--conns 96] [--frames 64000]
 *                     [--frame-size 126] [--batch 64] [--deadline 2] [--read-timeout 5]
 *                     [--timeout 60] [--csv]
 * --csv prints one line: conns,frames,frame_size,sent,delivered,deadline_hit,stalled,failed,wall_s
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

#define CYCLE 256  /* frames repeat every CYCLE frame numbers: one block of them per connection */

enum state { SENDING, DRAINING, DONE, DEADLINE, STALLED, FAILED };

struct conn {
	int fd;
	enum state st;
	bool out_armed;
	uint64_t tx, rx;               /* bytes */
	uint64_t last_tx, last_rx;     /* when the socket last took or gave bytes */
	char *block;                   /* CYCLE frames of this connection, back to back */
};

static struct {
	const char *host;
	int port;
	uint64_t conns, frames, fsize, batch;
	double deadline, read_timeout, timeout;
	bool csv;
	int ep;
	struct conn *c;
	uint64_t live;
	char *rbuf;
	size_t rbuf_size;
} S;

static const char *prog = "flood_client";

/* Frame k of connection i: "<i:4><k:4>" then bytes that depend on both. */
static void fill_block(struct conn *c, uint32_t id)
{
	for (uint32_t k = 0; k < CYCLE; k++) {
		unsigned char *f = (unsigned char *)c->block + (size_t)k * S.fsize;
		for (uint64_t j = 0; j < S.fsize; j++)
			f[j] = (unsigned char)(id * 131 + k * 7 + j);
		if (S.fsize >= 8) {
			memcpy(f, &id, 4);
			memcpy(f + 4, &k, 4);
		}
	}
}

static uint64_t total_bytes(void)
{
	return S.frames * S.fsize;
}

/* The straight run of expected bytes at stream offset off (up to the end of the block). */
static const char *expected_at(const struct conn *c, uint64_t off, uint64_t *run)
{
	uint64_t block = CYCLE * S.fsize, in = off % block;
	*run = block - in;
	return c->block + in;
}

static void end_conn(struct conn *c, enum state st)
{
	c->st = st;
	S.live--;
	close(c->fd);
}

static void want_out(struct conn *c, bool on)
{
	bu_want_out(S.ep, c->fd, c, &c->out_armed, on);
}

static void write_some(struct conn *c, uint64_t now)
{
	uint64_t total = total_bytes();
	while (c->tx < total) {
		uint64_t run, n = S.batch * S.fsize;
		const char *p = expected_at(c, c->tx, &run);
		if (n > run)
			n = run;
		if (n > total - c->tx)
			n = total - c->tx;
		long w = bu_send(c->fd, p, n);
		if (w <= 0) {
			if (w == 0)
				want_out(c, true);
			else
				end_conn(c, FAILED);
			return;
		}
		c->tx += (uint64_t)w;
		c->last_tx = now;
	}
	want_out(c, false);
	c->st = DRAINING;
	c->last_rx = now; /* the read timeout counts from the last write */
}

static void read_some(struct conn *c, uint64_t now)
{
	for (;;) {
		ssize_t n = recv(c->fd, S.rbuf, S.rbuf_size, 0);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0) {
			end_conn(c, FAILED); /* the server closed before echoing everything */
			return;
		}
		for (uint64_t off = 0; off < (uint64_t)n;) {
			uint64_t run;
			const char *want = expected_at(c, c->rx + off, &run);
			uint64_t k = (uint64_t)n - off < run ? (uint64_t)n - off : run;
			if (c->rx + off + k > c->tx || memcmp(S.rbuf + off, want, k) != 0) {
				fprintf(stderr, "%s: connection %ld: echoed frames differ from those sent\n", prog,
					(long)(c - S.c));
				end_conn(c, FAILED);
				return;
			}
			off += k;
		}
		c->rx += (uint64_t)n;
		c->last_rx = now;
		if (c->rx == total_bytes()) {
			end_conn(c, DONE);
			return;
		}
	}
}

/* The deadlines: a write that took nothing for --deadline, replies that stopped for --read-timeout. */
static void check_deadlines(uint64_t now)
{
	uint64_t wd = (uint64_t)(S.deadline * 1e9), rd = (uint64_t)(S.read_timeout * 1e9);
	for (uint64_t i = 0; i < S.conns; i++) {
		struct conn *c = &S.c[i];
		if (c->st == SENDING && now - c->last_tx > wd)
			end_conn(c, DEADLINE);
		else if (c->st == DRAINING && now - c->last_rx > rd)
			end_conn(c, STALLED);
	}
}

static void report(double wall)
{
	uint64_t sent = 0, delivered = 0, count[FAILED + 1] = { 0 };
	for (uint64_t i = 0; i < S.conns; i++) {
		sent += S.c[i].tx / S.fsize;
		delivered += S.c[i].rx / S.fsize;
		count[S.c[i].st]++;
	}
	uint64_t offered = S.conns * S.frames;
	if (S.csv)
		printf("%lu,%lu,%lu,%lu,%lu,%lu,%lu,%lu,%.3f\n", S.conns, S.frames, S.fsize, sent, delivered,
		       count[DEADLINE], count[STALLED], count[FAILED] + count[SENDING] + count[DRAINING], wall);
	else
		printf("flood_client: conns=%lu frames=%lu frame_size=%lu sent=%lu/%lu delivered=%lu (%.2f%%) "
		       "deadline_hit=%lu stalled=%lu failed=%lu completed=%lu wall=%.2fs\n",
		       S.conns, S.frames, S.fsize, sent, offered, delivered, 100.0 * (double)delivered / (double)offered,
		       count[DEADLINE], count[STALLED], count[FAILED] + count[SENDING] + count[DRAINING],
		       count[DONE], wall);
}

static int run(void)
{
	struct epoll_event evs[256];
	uint64_t t0 = bu_now_ns(), now = t0, last_check = t0;
	uint64_t hard = t0 + (uint64_t)(S.timeout * 1e9);
	for (uint64_t i = 0; i < S.conns; i++) {
		struct conn *c = &S.c[i];
		c->fd = bu_connect(S.host, S.port);
		if (c->fd < 0) {
			fprintf(stderr, "%s: connect %s:%d: %s\n", prog, S.host, S.port, strerror(-c->fd));
			return 1;
		}
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
		epoll_ctl(S.ep, EPOLL_CTL_ADD, c->fd, &ev);
		c->last_tx = c->last_rx = t0;
		S.live++;
	}
	for (uint64_t i = 0; i < S.conns; i++)
		write_some(&S.c[i], t0);
	while (S.live && now < hard) {
		int n = epoll_wait(S.ep, evs, 256, 50);
		now = bu_now_ns();
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (c->st == SENDING && (evs[i].events & EPOLLOUT))
				write_some(c, now);
			if ((c->st == SENDING || c->st == DRAINING) && (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
				read_some(c, now);
		}
		if (now - last_check > 50000000u) {
			check_deadlines(now);
			last_check = now;
		}
	}
	if (S.live)
		fprintf(stderr, "%s: --timeout reached with %lu connections unfinished\n", prog, S.live);
	report((double)(now - t0) / 1e9);
	return 0;
}

static bool parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "host", required_argument, 0, 'h' }, { "port", required_argument, 0, 'p' },
		{ "conns", required_argument, 0, 'c' }, { "frames", required_argument, 0, 'f' },
		{ "frame-size", required_argument, 0, 's' }, { "batch", required_argument, 0, 'b' },
		{ "deadline", required_argument, 0, 'd' }, { "read-timeout", required_argument, 0, 'r' },
		{ "timeout", required_argument, 0, 't' }, { "csv", no_argument, 0, 'v' }, { 0, 0, 0, 0 },
	};
	uint64_t port = 7000;
	S.host = "127.0.0.1";
	S.conns = 96;
	S.frames = 64000;
	S.fsize = 126;
	S.batch = 64;
	S.deadline = 2;
	S.read_timeout = 5;
	S.timeout = 60;
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		bool ok;
		switch (o) {
		case 'h': S.host = optarg; ok = true; break;
		case 'p': ok = bu_parse_u64(prog, "port", optarg, 1, 65535, &port); break;
		case 'c': ok = bu_parse_u64(prog, "conns", optarg, 1, 10000, &S.conns); break;
		case 'f': ok = bu_parse_u64(prog, "frames", optarg, 1, 100000000, &S.frames); break;
		case 's': ok = bu_parse_u64(prog, "frame-size", optarg, 1, 65536, &S.fsize); break;
		case 'b': ok = bu_parse_u64(prog, "batch", optarg, 1, 4096, &S.batch); break;
		case 'd': ok = bu_parse_secs(prog, "deadline", optarg, 0.01, 600, &S.deadline); break;
		case 'r': ok = bu_parse_secs(prog, "read-timeout", optarg, 0.01, 600, &S.read_timeout); break;
		case 't': ok = bu_parse_secs(prog, "timeout", optarg, 0.1, 3600, &S.timeout); break;
		case 'v': S.csv = true; ok = true; break;
		default: ok = false;
		}
		if (!ok)
			return false;
	}
	S.port = (int)port;
	return optind == argc;
}

int main(int argc, char **argv)
{
	if (!parse_args(argc, argv)) {
		fprintf(stderr, "usage: %s [--host ADDR] [--port P] [--conns 96] [--frames 64000] [--frame-size 126]\n"
				"       [--batch 64] [--deadline 2] [--read-timeout 5] [--timeout 60] [--csv]\n", prog);
		return 2;
	}
	bu_ignore_sigpipe();
	S.rbuf_size = 1 << 16;
	S.rbuf = malloc(S.rbuf_size);
	S.c = calloc(S.conns, sizeof(*S.c));
	S.ep = epoll_create1(EPOLL_CLOEXEC);
	if (!S.rbuf || !S.c || S.ep < 0) {
		fprintf(stderr, "%s: out of memory or epoll_create1 failed\n", prog);
		return 1;
	}
	for (uint64_t i = 0; i < S.conns; i++) {
		S.c[i].block = malloc(CYCLE * S.fsize);
		if (!S.c[i].block) {
			fprintf(stderr, "%s: out of memory\n", prog);
			return 1;
		}
		fill_block(&S.c[i], (uint32_t)i);
	}
	return run();
}
