/* bench/baseline_epoll_echo.c: a minimal echo server on raw epoll, no perch: the epoll baseline perch's echo is measured against.
 *
 * Shaped as nginx shapes its event loop, since that is the competent way:
 * non-blocking sockets registered once, edge-triggered, for in and out
 * (no epoll_ctl in the steady state); read until EAGAIN or a short read
 * (unless the peer's FIN is pending), write each chunk back at once
 * (speculatively) and keep only what the socket refused, then stop reading
 * that connection until EPOLLOUT drains it (backpressure). A turn reads at
 * most 64 KiB per connection; a connection with more left goes on a ready
 * list served after the batch, so one flooding peer cannot starve the rest.
 * Nagle's algorithm stays on, the kernel's default; --nodelay sets
 * TCP_NODELAY on the listener, which its accepted sockets inherit.
 *
 * Usage: baseline_epoll_echo [--host 127.0.0.1] [--port 7001] [--buf-size 16384] [--nodelay]
 *        [--unix PATH] (a Unix socket instead of TCP; --nodelay does not apply)
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

#define READ_BUDGET (64u << 10)
#define MAX_EVENTS  512

struct conn {
	int fd;
	bool readable, writable, eof_pending, on_ready, dead;
	char *out;            /* bytes the socket refused, sent first on EPOLLOUT */
	size_t out_len, out_cap;
	struct conn *next_ready;
};

static struct {
	int ep, listen_fd;
	char *buf;
	size_t buf_size;
	struct conn *ready, **ready_tail;
} S;

/* The listener's epoll tag: connections carry their struct, the listener this sentinel. */
static char listener_tag;

static void conn_close(struct conn *c)
{
	close(c->fd); /* also leaves the epoll set: the fd is not shared */
	c->dead = true;
	if (!c->on_ready) {
		free(c->out);
		free(c);
	}
}

/* Keeps bytes [p, p + n) that write refused. */
static bool stash(struct conn *c, const char *p, size_t n)
{
	if (c->out_len + n > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : 4096;
		while (cap < c->out_len + n)
			cap *= 2;
		char *o = realloc(c->out, cap);
		if (!o)
			return false;
		c->out = o;
		c->out_cap = cap;
	}
	memcpy(c->out + c->out_len, p, n);
	c->out_len += n;
	return true;
}

/* Writes p[0..n); returns bytes written (a shortfall means EAGAIN) or -1 on a dead peer. */
static ssize_t write_some(struct conn *c, const char *p, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t w = send(c->fd, p + done, n - done, MSG_NOSIGNAL);
		if (w > 0) {
			done += (size_t)w;
		} else if (w < 0 && errno == EINTR) {
			continue;
		} else if (w < 0 && errno == EAGAIN) {
			c->writable = false;
			break;
		} else {
			return -1;
		}
	}
	return (ssize_t)done;
}

/* Sends what was stashed. Returns false when the connection died. */
static bool flush_out(struct conn *c)
{
	ssize_t w = write_some(c, c->out, c->out_len);
	if (w < 0)
		return false;
	memmove(c->out, c->out + w, c->out_len - (size_t)w);
	c->out_len -= (size_t)w;
	return true;
}

static void push_ready(struct conn *c)
{
	c->on_ready = true;
	c->next_ready = NULL;
	*S.ready_tail = c;
	S.ready_tail = &c->next_ready;
}

/* Reads and echoes while the socket has bytes, nothing is stashed, and the budget lasts. */
static void service(struct conn *c)
{
	if (c->out_len && c->writable && !flush_out(c)) {
		conn_close(c);
		return;
	}
	size_t budget = READ_BUDGET;
	while (c->readable && !c->out_len) {
		if (budget == 0) {
			if (!c->on_ready)
				push_ready(c);
			return;
		}
		ssize_t n = recv(c->fd, S.buf, S.buf_size, 0);
		if (n > 0) {
			budget = (size_t)n < budget ? budget - (size_t)n : 0;
			/* A short read drained the socket; a later arrival raises a new edge. */
			if ((size_t)n < S.buf_size && !c->eof_pending)
				c->readable = false;
			ssize_t w = write_some(c, S.buf, (size_t)n);
			if (w < 0 || (w < n && !stash(c, S.buf + w, (size_t)(n - w)))) {
				conn_close(c);
				return;
			}
		} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
			conn_close(c); /* FIN (nothing is stashed here) or an error */
			return;
		} else if (errno == EAGAIN) {
			c->readable = false;
		}
	}
}

static void accept_some(void)
{
	/* Bounded: the listener is level-triggered, what is left comes back next turn. */
	for (int i = 0; i < 64; i++) {
		int fd = accept4(S.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				fprintf(stderr, "baseline_epoll_echo: accept: %s\n", strerror(errno));
			return;
		}
		struct conn *c = calloc(1, sizeof(*c));
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c };
		if (!c || epoll_ctl(S.ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
			free(c);
			close(fd);
			continue;
		}
		c->fd = fd;
		c->writable = true;
	}
}

static void on_event(struct conn *c, uint32_t ev)
{
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		c->readable = true;
	if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		c->eof_pending = true;
	if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
		c->writable = true;
	service(c);
}

/* The connections that used up their budget get one more turn each, in order. */
static void serve_ready(void)
{
	struct conn *c = S.ready;
	S.ready = NULL;
	S.ready_tail = &S.ready;
	for (struct conn *next; c; c = next) {
		next = c->next_ready;
		c->on_ready = false;
		if (c->dead) {
			free(c->out);
			free(c);
		} else {
			service(c);
		}
	}
}

static int run(void)
{
	struct epoll_event evs[MAX_EVENTS];
	for (;;) {
		int n = epoll_wait(S.ep, evs, MAX_EVENTS, S.ready ? 0 : -1);
		if (n < 0 && errno != EINTR) {
			fprintf(stderr, "baseline_epoll_echo: epoll_wait: %s\n", strerror(errno));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr == &listener_tag)
				accept_some();
			else
				on_event(evs[i].data.ptr, evs[i].events);
		}
		serve_ready();
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "host", required_argument, 0, 'h' }, { "port", required_argument, 0, 'p' },
		{ "buf-size", required_argument, 0, 's' }, { "nodelay", no_argument, 0, 'n' },
		{ "unix", required_argument, 0, 'u' }, { 0, 0, 0, 0 },
	};
	const char *host = "127.0.0.1", *prog = "baseline_epoll_echo", *unix_path = NULL;
	uint64_t port = 7001, bsize = 16384;
	bool nodelay = false;
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		bool ok = o == 'h' ? (host = optarg, true)
			: o == 'p' ? bu_parse_u64(prog, "port", optarg, 1, 65535, &port)
			: o == 's' ? bu_parse_u64(prog, "buf-size", optarg, 64, 1 << 20, &bsize)
			: o == 'n' ? (nodelay = true, true)
			: o == 'u' ? (unix_path = optarg, true)
			: false;
		if (!ok) {
			fprintf(stderr, "usage: %s [--host ADDR] [--port P] [--buf-size B] [--nodelay] [--unix PATH]\n", prog);
			return 2;
		}
	}
	bu_ignore_sigpipe();
	S.buf_size = bsize;
	S.buf = malloc(bsize);
	S.ready_tail = &S.ready;
	S.ep = epoll_create1(EPOLL_CLOEXEC);
	S.listen_fd = unix_path ? bu_listen_unix(unix_path, 4096) : bu_listen(host, (int)port, 4096, nodelay);
	if (S.listen_fd < 0) {
		fprintf(stderr, "%s: listen on %s: %s\n", prog, unix_path ? unix_path : host, strerror(-S.listen_fd));
		return 1;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &listener_tag };
	if (!S.buf || S.ep < 0 || epoll_ctl(S.ep, EPOLL_CTL_ADD, S.listen_fd, &ev) < 0) {
		fprintf(stderr, "%s: epoll set-up: %s\n", prog, strerror(errno));
		return 1;
	}
	if (unix_path)
		fprintf(stderr, "%s: listening on unix:%s\n", prog, unix_path);
	else
		fprintf(stderr, "%s: listening on %s:%d\n", prog, host, (int)port);
	return run();
}
