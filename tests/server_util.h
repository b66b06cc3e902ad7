/* tests/server_util.h: plain blocking sockets with timeouts, for tests that drive an example server in-process. */
#ifndef PERCH_TESTS_SERVER_UTIL_H
#define PERCH_TESTS_SERVER_UTIL_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "loop_util.h"
#include "serve.h"

#define SU_TIMEOUT_S 10    /* every blocking read or write of a test gives up after this */
#define SU_IDLE_MS 300        /* the idle timeout of the setup_idle fixture: for tests that wait for it */
#define SU_IDLE_LONG_MS 1000  /* setup_idle_long's: for tests that must not be cut, with room for a stall */

/*
 * A client socket connected to 127.0.0.1:port, with read and write
 * timeouts and Nagle off, and SO_RCVBUF set to rcvbuf unless 0 (a small one
 * makes the server's sends wait soon). -1 on failure.
 */
static inline int su_connect_rcvbuf(int port, int rcvbuf)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (rcvbuf)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	struct timeval tv = { .tv_sec = SU_TIMEOUT_S };
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (lu_connect_fd(fd, port) != 0) {
		/* Said, so that a failed run shows why (a refusal, or no local port left). */
		fprintf(stderr, "su_connect to 127.0.0.1:%d: %s\n", port, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static inline int su_connect(int port)
{
	return su_connect_rcvbuf(port, 0);
}

/* A client socket connected to the Unix socket `name` (a path, or "@name"), with timeouts; -1 on failure. */
static inline int su_connect_unix(const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	size_t n = strlen(name);
	if (n >= sizeof(a.sun_path))
		return -1;
	memcpy(a.sun_path, name, n);
	if (name[0] == '@')
		a.sun_path[0] = 0; /* abstract: the name's bytes after a NUL */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = { .tv_sec = SU_TIMEOUT_S };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (name[0] != '@'));
	if (lu_connect_addr(fd, (struct sockaddr *)&a, len) != 0) {
		fprintf(stderr, "su_connect_unix to %s: %s\n", name, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

/* As lu_write_all, without SIGPIPE when the server has closed. */
static inline bool su_send(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		c += w;
		n -= (size_t)w;
	}
	return true;
}

static inline bool su_send_str(int fd, const char *s)
{
	return su_send(fd, s, strlen(s));
}

/* A send on its own thread, so the test thread can read the answers meanwhile. */
struct su_sender {
	int fd;
	const void *p;
	size_t n;
	bool ok;
	pthread_t th;
};

static inline void *su_sender_main(void *p)
{
	struct su_sender *s = p;
	s->ok = su_send(s->fd, s->p, s->n);
	return NULL;
}

static inline void su_send_async(struct su_sender *s, int fd, const void *p, size_t n)
{
	*s = (struct su_sender){ .fd = fd, .p = p, .n = n };
	assert_int_equal(pthread_create(&s->th, NULL, su_sender_main, s), 0);
}

/* Joins the sender; true when every byte went out. */
static inline bool su_send_join(struct su_sender *s)
{
	pthread_join(s->th, NULL);
	return s->ok;
}

/*
 * Sends n patterned bytes to an echoing port from another thread while
 * this one reads them back (so neither side's buffers need hold them all),
 * and checks every byte came back in order.
 */
static inline void su_echo_stream(int port, size_t n)
{
	uint8_t *out = malloc(n), *in = malloc(n);
	for (size_t i = 0; i < n; i++)
		out[i] = (uint8_t)((i * 2654435761u) >> 13);
	int fd = su_connect(port);
	assert_true(fd >= 0);
	struct su_sender sender;
	su_send_async(&sender, fd, out, n);
	bool got = lu_read_all(fd, in, n);
	assert_true(su_send_join(&sender));
	assert_true(got);
	assert_memory_equal(out, in, n);
	close(fd);
	free(out);
	free(in);
}

/* Reads exactly n bytes; false on EOF, error or timeout. */
static inline bool su_recv_all(int fd, void *p, size_t n)
{
	return lu_read_all(fd, p, n);
}

/* CLOCK_MONOTONIC in milliseconds. */
static inline double su_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* True when the peer closed: the next read returns EOF (or a reset) before the timeout. */
static inline bool su_peer_closed(int fd)
{
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	return r == 0 || (r < 0 && errno == ECONNRESET);
}

/*
 * Reads one HTTP response framed by Content-Length into buf (NUL-terminated).
 * Returns its total length (head + body) with *status and *body_off set, or 0.
 */
static inline size_t su_http_response(int fd, char *buf, size_t cap, int *status, size_t *body_off)
{
	size_t len = 0;
	char *end = NULL;
	while (!end) {
		if (len + 1 >= cap)
			return 0;
		ssize_t r = recv(fd, buf + len, 1, 0); /* byte by byte: never past this response */
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		len++;
		buf[len] = '\0';
		if (len >= 4 && memcmp(buf + len - 4, "\r\n\r\n", 4) == 0)
			end = buf + len;
	}
	const char *cl = strcasestr(buf, "\r\nContent-Length:");
	if (!cl || sscanf(buf, "HTTP/1.1 %d", status) != 1)
		return 0;
	size_t body = strtoul(cl + 17, NULL, 10);
	if (len + body + 1 > cap || !su_recv_all(fd, buf + len, body))
		return 0;
	*body_off = len;
	buf[len + body] = '\0';
	return len + body;
}

/*
 * The server closes fd one idle timeout (SU_IDLE_MS) after since_ms, a time
 * taken before whatever started its idle time: never earlier, and well
 * before the tests' own timeout.
 */
static inline void su_closed_after_idle(int fd, double since_ms)
{
	assert_true(su_peer_closed(fd));
	double idle = su_now_ms() - since_ms;
	assert_true(idle >= SU_IDLE_MS);
	assert_true(idle < 5000);
}

/* The port of fd's own address (peer false) or of its peer's, or -1. */
static inline int su_sock_port(int fd, bool peer)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if ((peer ? getpeername(fd, (struct sockaddr *)&ss, &len) : getsockname(fd, (struct sockaddr *)&ss, &len)) != 0)
		return -1;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return -1;
}

/*
 * Whether this process's TCP socket from local_port (-1: any) to
 * peer_port has TCP_NODELAY: 1 or 0, -1 when there is no such socket. An
 * in-process server's end of a test's connection is the one from the
 * server's port to the client's; a proxy's upstream, the one to the
 * upstream's port.
 */
static inline int su_nodelay_between(int local_port, int peer_port)
{
	if (peer_port <= 0)
		return -1; /* a listener has no peer: it must never match */
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int found = -1;
	for (struct dirent *e; found < 0 && (e = readdir(d));) {
		int fd = atoi(e->d_name), v = 0;
		socklen_t len = sizeof(v);
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d) ||
		    su_sock_port(fd, true) != peer_port ||
		    (local_port >= 0 && su_sock_port(fd, false) != local_port) ||
		    getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len) != 0)
			continue;
		found = v != 0;
	}
	closedir(d);
	return found;
}

/* A server started in-process on 127.0.0.1, port 0; the fds open before it, to find leaks after. */
struct su_server {
	struct serve *srv;
	serve_stop_fn stop;
	int port;
	int fds_before;
};


/* Returns a server started with *o (its port and host ignored: 127.0.0.1, port 0), or NULL. */
static inline struct su_server *su_start_opts(serve_start_fn start, serve_stop_fn stop,
					      const struct serve_opts *o)
{
	struct su_server *s = calloc(1, sizeof(*s));
	struct serve_opts local = *o;
	local.host = "127.0.0.1";
	local.port = 0;
	s->stop = stop;
	s->fds_before = lu_count_fds();
	if (start(&local, &s->srv) != 0) {
		free(s);
		return NULL;
	}
	s->port = serve_port(s->srv);
	return s;
}

/* Returns a started server (idle_ms: its idle timeout, 0 for the default), or NULL. */
static inline struct su_server *su_start_idle(serve_start_fn start, serve_stop_fn stop, int threads,
					      unsigned idle_ms)
{
	struct serve_opts o;
	serve_opts_default(&o);
	o.threads = threads;
	if (idle_ms)
		o.idle_timeout_ms = idle_ms;
	return su_start_opts(start, stop, &o);
}

static inline struct su_server *su_start(serve_start_fn start, serve_stop_fn stop, int threads)
{
	return su_start_idle(start, stop, threads, 0);
}

/* Stops the server (if a test has not) and returns -1 when a descriptor outlived it. */
static inline int su_stop(struct su_server *s)
{
	int before = s->fds_before;
	s->stop(s->srv);
	free(s);
	int after = lu_count_fds();
	if (after != before) {
		fprintf(stderr, "descriptors: %d before start, %d after stop\n", before, after);
		return -1;
	}
	return 0;
}

/* A client connected to the fixture's server (cmocka's `state`), or the test fails. */
static inline int su_connect_to(void **state)
{
	int fd = su_connect(((struct su_server *)*state)->port);
	assert_true(fd >= 0);
	return fd;
}

/*
 * The fixtures of a server test: setup (one loop), setup_two_loops,
 * setup_idle and setup_idle_long (one loop, SU_IDLE_MS or SU_IDLE_LONG_MS
 * idle timeout), teardown (fails on a leaked fd).
 */
#define SU_FIXTURES(start, stop)                                                   \
	static int setup(void **state)                                             \
	{                                                                          \
		return (*state = su_start(start, stop, 1)) ? 0 : -1;               \
	}                                                                          \
	static int setup_two_loops(void **state)                                   \
	{                                                                          \
		return (*state = su_start(start, stop, 2)) ? 0 : -1;               \
	}                                                                          \
	static __attribute__((unused)) int setup_idle(void **state)                \
	{                                                                          \
		return (*state = su_start_idle(start, stop, 1, SU_IDLE_MS)) ? 0 : -1; \
	}                                                                          \
	static __attribute__((unused)) int setup_idle_long(void **state)           \
	{                                                                          \
		return (*state = su_start_idle(start, stop, 1, SU_IDLE_LONG_MS)) ? 0 : -1; \
	}                                                                          \
	static int teardown(void **state)                                          \
	{                                                                          \
		return su_stop(*state);                                            \
	}

#endif /* PERCH_TESTS_SERVER_UTIL_H */
