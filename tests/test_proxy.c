/* tests/test_proxy.c: examples/proxy in-process, in front of the echo example (plain or TLS) or of a socket the test accepts itself: bytes both ways, half-closes passed on each way, resets, a refused upstream, a client that does not read, and no fd left after stop. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cmocka_prelude.h"
#include "echo.h"
#include "proxy.h"
#include "server_util.h"
#if PERCH_HAVE_TLS
#include "tls_test_certs.h"
#endif

/* The proxy, and what it connects to: the echo example, or a listener the test accepts from. */
struct fx {
	struct su_server *echo;
	int up_listen;                 /* -1 unless the upstream is the test's */
	int queued;                    /* -1, or the connection that fills an unanswering upstream's queue */
	struct serve *proxy;
	int port;                      /* the proxy's */
	int fds_before;
};

/* A listening socket on 127.0.0.1, port 0, whose accept gives up after SU_TIMEOUT_S. */
static int listen_here(int *port, int backlog)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	struct timeval tv = { .tv_sec = SU_TIMEOUT_S };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, backlog) != 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
		close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

static int start_proxy_with(struct fx *f, int upstream_port, unsigned connect_timeout_ms,
			    unsigned idle_ms, bool nagle)
{
	struct serve_opts o;
	serve_opts_default(&o);
	if (idle_ms)
		o.idle_timeout_ms = idle_ms;
	o.nagle = nagle;
	struct proxy_target to = { .host = "127.0.0.1", .port = upstream_port,
				   .connect_timeout_ms = connect_timeout_ms };
	if (proxy_start(&o, &to, &f->proxy) != 0)
		return -1;
	f->port = serve_port(f->proxy);
	return 0;
}

static int start_proxy_idle(struct fx *f, int upstream_port, unsigned connect_timeout_ms,
			    unsigned idle_ms)
{
	return start_proxy_with(f, upstream_port, connect_timeout_ms, idle_ms, false);
}

static int start_proxy(struct fx *f, int upstream_port, unsigned connect_timeout_ms)
{
	return start_proxy_idle(f, upstream_port, connect_timeout_ms, 0);
}

static struct fx *fx_new(void)
{
	struct fx *f = calloc(1, sizeof(*f));
	f->up_listen = f->queued = -1;
	f->fds_before = lu_count_fds();
	return f;
}

static int setup_echo(void **state)
{
	struct fx *f = *state = fx_new();
	f->echo = su_start(echo_start, echo_stop, 1);
	return f->echo && start_proxy(f, f->echo->port, 0) == 0 ? 0 : -1;
}

/* The echo upstream behind a proxy whose idle timeout is idle_ms. */
static int echo_behind_idle_proxy(void **state, unsigned idle_ms)
{
	struct fx *f = *state = fx_new();
	f->echo = su_start(echo_start, echo_stop, 1);
	return f->echo && start_proxy_idle(f, f->echo->port, 0, idle_ms) == 0 ? 0 : -1;
}

static int setup_echo_idle(void **state)
{
	return echo_behind_idle_proxy(state, SU_IDLE_MS);
}

static int setup_echo_idle_long(void **state)
{
	return echo_behind_idle_proxy(state, SU_IDLE_LONG_MS);
}

static int setup_raw(void **state)
{
	struct fx *f = *state = fx_new();
	int port = 0;
	f->up_listen = listen_here(&port, 64);
	return f->up_listen >= 0 && start_proxy(f, port, 0) == 0 ? 0 : -1;
}

/*
 * An upstream that never answers: backlog 0 and one connection queued
 * that nobody accepts, so the kernel drops the proxy's SYNs. The proxy
 * waits 100 ms for a connect.
 */
static int unanswering(void **state, unsigned connect_timeout_ms)
{
	struct fx *f = *state = fx_new();
	int port = 0;
	f->up_listen = listen_here(&port, 0);
	f->queued = f->up_listen >= 0 ? su_connect(port) : -1;
	return f->queued >= 0 && start_proxy(f, port, connect_timeout_ms) == 0 ? 0 : -1;
}

static int setup_unanswering(void **state)
{
	return unanswering(state, 100);
}

/* The same upstream, with no connect timeout: a session stays connecting until the proxy stops. */
static int setup_unanswering_patient(void **state)
{
	return unanswering(state, 0);
}

/* Fails when a descriptor outlived the proxy and its upstream. */
static int teardown(void **state)
{
	struct fx *f = *state;
	proxy_stop(f->proxy);
	int rc = f->echo ? su_stop(f->echo) : 0;
	if (f->up_listen >= 0)
		close(f->up_listen);
	if (f->queued >= 0)
		close(f->queued);
	int after = lu_count_fds();
	if (after != f->fds_before) {
		fprintf(stderr, "descriptors: %d before start, %d after stop\n", f->fds_before, after);
		rc = -1;
	}
	free(f);
	return rc;
}

/* An echo upstream behind a proxy started with --nagle. */
static int setup_echo_nagle(void **state)
{
	struct fx *f = *state = fx_new();
	f->echo = su_start(echo_start, echo_stop, 1);
	return f->echo && start_proxy_with(f, f->echo->port, 0, 0, true) == 0 ? 0 : -1;
}

/*
 * Whether the proxy's two sockets of a session, the client's and the
 * upstream's, have TCP_NODELAY (after a round trip, so both exist).
 */
static void proxy_sockets_nodelay(struct fx *f, int *client_side, int *upstream_side)
{
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	char back[2];
	assert_true(su_send(fd, "hi", 2) && su_recv_all(fd, back, 2));
	*client_side = su_nodelay_between(f->port, su_sock_port(fd, false));
	*upstream_side = su_nodelay_between(-1, f->echo->port); /* the only socket whose peer is the echo's port */
	close(fd);
}

static void both_sides_of_a_session_have_tcp_nodelay_by_default(void **state)
{
	int client_side, upstream_side;
	proxy_sockets_nodelay(*state, &client_side, &upstream_side);
	assert_int_equal(client_side, 1);
	assert_int_equal(upstream_side, 1);
}

static void nagle_keeps_nagles_algorithm_on_both_sides_of_a_session(void **state)
{
	int client_side, upstream_side;
	proxy_sockets_nodelay(*state, &client_side, &upstream_side);
	assert_int_equal(client_side, 0);
	assert_int_equal(upstream_side, 0);
}

/* The upstream side of the next client's session, as the proxy connects it. */
static int upstream_accept(struct fx *f)
{
	int fd;
	while ((fd = accept4(f->up_listen, NULL, NULL, SOCK_CLOEXEC)) < 0 && errno == EINTR)
		; /* seen under ASan */
	if (fd < 0)
		fprintf(stderr, "upstream accept: %s\n", strerror(errno));
	assert_true(fd >= 0);
	struct timeval tv = { .tv_sec = SU_TIMEOUT_S };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

/* True when the next read says the peer ended its sending (EOF) and nothing came before. */
static bool reads_eof(int fd)
{
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	return r == 0;
}

/* True when reading on ends in a reset (ECONNRESET), not the end of the stream; bytes before it are skipped. */
static bool reads_reset(int fd)
{
	char buf[256];
	ssize_t r;
	while ((r = recv(fd, buf, sizeof(buf), 0)) > 0 || (r < 0 && errno == EINTR))
		;
	return r < 0 && errno == ECONNRESET;
}

/* Closes with a reset (SO_LINGER 0): the peer's next read fails with ECONNRESET. */
static void close_with_reset(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

static void round_trips_through_an_echo_upstream_come_back_in_order(void **state)
{
	struct fx *f = *state;
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	char buf[64], back[64];
	for (int i = 0; i < 200; i++) {
		int n = snprintf(buf, sizeof(buf), "message %d", i);
		assert_true(su_send(fd, buf, (size_t)n));
		assert_true(su_recv_all(fd, back, (size_t)n));
		assert_memory_equal(buf, back, (size_t)n);
	}
	close(fd);
}

/* 8 MiB out while this thread reads it back: it crosses the proxy twice, to the echo and back, forwarded. */
static void a_stream_larger_than_the_socket_buffers_passes_both_ways_whole(void **state)
{
	su_echo_stream(((struct fx *)*state)->port, 8u << 20);
}

/* Many clients at once, each with its own upstream: no bytes cross sessions. */
static void clients_at_once_each_get_their_own_bytes_back(void **state)
{
	struct fx *f = *state;
	enum { N = 32 };
	int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = su_connect(f->port);
		assert_true(fds[i] >= 0);
	}
	for (int round = 0; round < 20; round++) {
		char buf[32], back[32];
		for (int i = 0; i < N; i++) {
			int n = snprintf(buf, sizeof(buf), "client %d round %d", i, round);
			assert_true(su_send(fds[i], buf, (size_t)n));
		}
		for (int i = 0; i < N; i++) {
			int n = snprintf(buf, sizeof(buf), "client %d round %d", i, round);
			assert_true(su_recv_all(fds[i], back, (size_t)n));
			assert_memory_equal(buf, back, (size_t)n);
		}
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
}

/*
 * The client sends a request and ends its sending: upstream reads the
 * request, then the end, and its answer still comes back to the client,
 * then upstream's own end.
 */
static void a_clients_half_close_reaches_upstream_after_its_bytes_and_the_answer_still_comes_back(void **state)
{
	struct fx *f = *state;
	int cl = su_connect(f->port);
	assert_true(cl >= 0);
	int up = upstream_accept(f);
	char got[16];
	assert_true(su_send_str(cl, "request"));
	assert_int_equal(shutdown(cl, SHUT_WR), 0);
	assert_true(su_recv_all(up, got, 7));
	assert_memory_equal(got, "request", 7);
	assert_true(reads_eof(up));
	assert_true(su_send_str(up, "answer"));
	close(up);
	assert_true(su_recv_all(cl, got, 6));
	assert_memory_equal(got, "answer", 6);
	assert_true(reads_eof(cl));
	close(cl);
}

/* The mirror: upstream ends first; the client reads its bytes and the end, and can still send. */
static void upstreams_half_close_reaches_the_client_and_the_client_can_still_send(void **state)
{
	struct fx *f = *state;
	int cl = su_connect(f->port);
	assert_true(cl >= 0);
	int up = upstream_accept(f);
	char got[16];
	assert_true(su_send_str(up, "hello"));
	assert_int_equal(shutdown(up, SHUT_WR), 0);
	assert_true(su_recv_all(cl, got, 5));
	assert_memory_equal(got, "hello", 5);
	assert_true(reads_eof(cl));
	assert_true(su_send_str(cl, "more"));
	assert_true(su_recv_all(up, got, 4));
	assert_memory_equal(got, "more", 4);
	close(cl);
	assert_true(reads_eof(up));
	close(up);
}

/* One side sends a few bytes through, then resets: the other side is reset too, never told the stream ended. */
static void reset_on_one_side_ends_the_other(struct fx *f, bool client_resets)
{
	int fds[2];
	fds[0] = su_connect(f->port);
	assert_true(fds[0] >= 0);
	fds[1] = upstream_accept(f);
	int resets = fds[!client_resets], other = fds[client_resets];
	char got[4];
	assert_true(su_send_str(resets, "abc"));
	assert_true(su_recv_all(other, got, 3));
	close_with_reset(resets);
	assert_true(reads_reset(other));
	close(other);
}

static void a_client_reset_closes_its_upstream(void **state)
{
	reset_on_one_side_ends_the_other(*state, true);
}

static void an_upstream_reset_closes_its_client(void **state)
{
	reset_on_one_side_ends_the_other(*state, false);
}

/* Nothing listens upstream: the client is reset, and the proxy serves the next one. */
static void a_refused_upstream_ends_the_client_and_the_proxy_goes_on(void **state)
{
	struct fx *f = *state;
	close(f->up_listen); /* its port is now refused */
	f->up_listen = -1;
	for (int i = 0; i < 3; i++) {
		int cl = su_connect(f->port);
		assert_true(cl >= 0);
		assert_true(reads_reset(cl));
		close(cl);
	}
}

/* The upstream's kernel drops every SYN: the client is closed once the connect timeout passes, not minutes later. */
static void an_upstream_that_never_answers_ends_the_client_after_the_connect_timeout(void **state)
{
	struct fx *f = *state;
	int cl = su_connect(f->port);
	assert_true(cl >= 0);
	assert_true(reads_reset(cl)); /* within SU_TIMEOUT_S; the kernel would retry for minutes */
	close(cl);
}

/* What the kernel may buffer on one socket at most, both ways, read from /proc (4 MiB each if unreadable). */
static size_t socket_buffers_max(void)
{
	size_t total = 0;
	const char *files[] = { "/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem" };
	for (int i = 0; i < 2; i++) {
		unsigned long lo, def, max = 4u << 20;
		FILE *fp = fopen(files[i], "r");
		if (fp && fscanf(fp, "%lu %lu %lu", &lo, &def, &max) != 3)
			max = 4u << 20;
		if (fp)
			fclose(fp);
		total += max;
	}
	return total;
}

/*
 * Upstream sends more than every buffer on the way can hold (two sockets'
 * worth each way, plus 8 MiB) to a client that reads nothing for 300 ms:
 * upstream's send must still be blocked then (the proxy stopped reading it,
 * it did not queue the bytes itself), and every byte arrives in order once
 * the client reads.
 */
static void a_client_that_does_not_read_holds_upstream_back_and_loses_nothing(void **state)
{
	struct fx *f = *state;
	size_t n = 2 * socket_buffers_max() + (8u << 20);
	uint8_t *out = malloc(n), *in = malloc(n);
	lu_fill(out, n);
	int cl = su_connect_rcvbuf(f->port, 64 << 10);
	assert_true(cl >= 0);
	int up = upstream_accept(f);
	struct su_sender sender;
	su_send_async(&sender, up, out, n);
	usleep(300 * 1000);
	assert_int_equal(pthread_tryjoin_np(sender.th, NULL), EBUSY); /* still sending */
	assert_true(su_recv_all(cl, in, n));
	assert_true(su_send_join(&sender));
	assert_memory_equal(out, in, n);
	close(cl);
	close(up);
	free(out);
	free(in);
}

/*
 * An upstream whose accepted sockets have 4 KiB receive buffers (they
 * inherit the listener's): a far side that takes little. The proxy's
 * loop has 2,048 receive buffers (a quarter of its default), its pause
 * the proxy's own.
 */
static int setup_raw_small_window(void **state)
{
	struct fx *f = *state = fx_new();
	int port = 0, small = 4096;
	f->up_listen = listen_here(&port, 256);
	if (f->up_listen < 0 || setsockopt(f->up_listen, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) != 0)
		return -1;
	struct serve_opts o;
	serve_opts_default(&o);
	o.recv_buffers = 2048;
	struct proxy_target to = { .host = "127.0.0.1", .port = port };
	if (proxy_start(&o, &to, &f->proxy) != 0)
		return -1;
	f->port = serve_port(f->proxy);
	return 0;
}

/* Sends from every client, non-blocking, until each one's socket took nothing for 300 ms (bounded): bytes sent. */
static size_t send_until_all_stall(const int *fds, int n)
{
	static uint8_t chunk[64 * 1024];
	size_t total = 0;
	double end = su_now_ms() + SU_TIMEOUT_S * 1000.0, *moved = malloc(n * sizeof(*moved));
	for (int i = 0; i < n; i++)
		moved[i] = su_now_ms();
	int still = 0;
	while (still < n && su_now_ms() < end) {
		still = 0;
		for (int i = 0; i < n; i++) {
			ssize_t w;
			while ((w = send(fds[i], chunk, sizeof(chunk), MSG_DONTWAIT | MSG_NOSIGNAL)) > 0) {
				total += (size_t)w;
				moved[i] = su_now_ms();
			}
			assert_true(w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)); /* the proxy keeps it */
			still += su_now_ms() - moved[i] >= 300;
		}
		usleep(10 * 1000);
	}
	assert_int_equal(still, n);
	free(moved);
	return total;
}

/*
 * 200 sessions whose upstream takes nothing (4 KiB windows, never read),
 * each client sending until its socket stays full: with the proxy's
 * pause each pins at most a few of its loop's 2,048 receive buffers (2
 * full ones, 6 thin ones), so a normal session opened then still carries
 * 4 MiB, whole and in order, and its answer back. With the library's
 * 256 KiB pause (17 buffers each), or a multishot receive running past
 * the pause, they take the whole pool and the normal session's bytes
 * never leave the proxy.
 */
static void hundreds_of_sessions_whose_upstream_never_reads_leave_room_for_a_normal_one(void **state)
{
	enum { STALLED = 200, N = 4 << 20 };
	struct fx *f = *state;
	struct rlimit rl;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 4 * STALLED + 64)
		skip(); /* two sockets a session here, two in the proxy */
	rl.rlim_cur = rl.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	int cl[STALLED], up[STALLED];
	for (int i = 0; i < STALLED; i++) {
		cl[i] = su_connect(f->port);
		assert_true(cl[i] >= 0);
		int sndbuf = 64 * 1024; /* the kernel's memory is for the proxy's sockets */
		assert_int_equal(setsockopt(cl[i], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
		up[i] = upstream_accept(f);
	}
	size_t stalled = send_until_all_stall(cl, STALLED);
	print_message("%d stalled sessions took %zu bytes\n", STALLED, stalled);

	uint8_t *out = malloc(N), *in = malloc(N);
	lu_fill(out, N);
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	int far = upstream_accept(f);
	struct su_sender sender;
	su_send_async(&sender, fd, out, N);
	assert_true(su_recv_all(far, in, N));
	assert_true(su_send_join(&sender));
	assert_memory_equal(in, out, N);
	assert_true(su_send(far, "back", 4));
	char back[4];
	assert_true(su_recv_all(fd, back, 4));
	assert_memory_equal(back, "back", 4);
	close(fd);
	close(far);
	for (int i = 0; i < STALLED; i++) {
		close(cl[i]);
		close(up[i]);
	}
	free(out);
	free(in);
}

/*
 * Clients that send a byte and reset at once, 300 times: a session may end
 * while it starts its pumps (on epoll it mostly does), and every one ends
 * with nothing left (ASan runs this on both backends).
 */
static void clients_that_reset_at_once_leave_nothing_behind(void **state)
{
	struct fx *f = *state;
	for (int i = 0; i < 300; i++) {
		int cl = su_connect(f->port);
		assert_true(cl >= 0);
		assert_true(su_send_str(cl, "x"));
		close_with_reset(cl);
		close(upstream_accept(f));
	}
}

/* Stopped with sessions open both ways and one half-closed: every fd goes (teardown counts them). */
static void stop_with_sessions_open_leaves_no_descriptor(void **state)
{
	struct fx *f = *state;
	int cl[3], up[3];
	char got[2];
	for (int i = 0; i < 3; i++) {
		cl[i] = su_connect(f->port);
		assert_true(cl[i] >= 0);
		up[i] = upstream_accept(f);
		assert_true(su_send_str(cl[i], "x"));
		assert_true(su_recv_all(up[i], got, 1));
	}
	assert_int_equal(shutdown(cl[0], SHUT_WR), 0);
	assert_true(reads_eof(up[0]));
	proxy_stop(f->proxy);
	f->proxy = NULL;
	for (int i = 0; i < 3; i++) {
		assert_true(su_peer_closed(cl[i]));
		assert_true(su_peer_closed(up[i]));
		close(cl[i]);
		close(up[i]);
	}
}

/* Stopped while a client's upstream is still connecting: the client is closed, nothing is left. */
static void stop_with_a_session_still_connecting_leaves_no_descriptor(void **state)
{
	struct fx *f = *state;
	int fds = lu_count_fds();
	int cl = su_connect(f->port);
	assert_true(cl >= 0);
	/* The client's socket, the proxy's accepted one and its upstream socket: it is connecting. */
	for (int i = 0; i < 10000 && lu_count_fds() < fds + 3; i++)
		usleep(1000);
	assert_int_equal(lu_count_fds(), fds + 3);
	proxy_stop(f->proxy);
	f->proxy = NULL;
	assert_true(su_peer_closed(cl));
	close(cl);
}

static void targets_parse_or_are_refused(void **state)
{
	struct proxy_target t = { .host = "unchanged", .port = 7 };
	assert_int_equal(proxy_parse_target("127.0.0.1:6379", &t), 0);
	assert_string_equal(t.host, "127.0.0.1");
	assert_int_equal(t.port, 6379);
	assert_int_equal(proxy_parse_target("[::1]:80", &t), 0);
	assert_string_equal(t.host, "::1");
	assert_int_equal(t.port, 80);
	const char *bad[] = { "127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:0", "127.0.0.1:65536",
			      "127.0.0.1:80x", "localhost:80", "[::1:80", "::1:80", "[127.0.0.1]:80", "",
			      NULL };
	for (int i = 0; i < 12; i++)
		assert_int_equal(proxy_parse_target(bad[i], &t), -EINVAL);
	assert_string_equal(t.host, "::1"); /* untouched by every refusal */
	assert_int_equal(proxy_parse_target("127.0.0.1:80", NULL), -EINVAL);
	struct serve_opts o;
	serve_opts_default(&o);
	struct serve *s = NULL;
	struct proxy_target none = { .host = "nowhere", .port = 80 };
	assert_int_equal(proxy_start(&o, &none, &s), -EINVAL);
	struct proxy_target too_patient = { .host = "127.0.0.1", .port = 80,
					    .connect_timeout_ms = PERCH_CONNECT_TIMEOUT_MAX_MS + 1 };
	assert_int_equal(proxy_start(&o, &too_patient, &s), -EINVAL);
	assert_int_equal(proxy_start(&o, NULL, &s), -EINVAL);
	assert_null(s);
}

/* --to unix:NAME and tcp:HOST:PORT parse; a Unix name empty or too long is refused. */
static void unix_and_tcp_prefixed_targets_parse(void **state)
{
	struct proxy_target t = { .port = 7 };
	assert_int_equal(proxy_parse_target("unix:/run/app.sock", &t), 0);
	assert_string_equal(t.unix_name, "/run/app.sock");
	char text[160];
	assert_string_equal(proxy_target_text(&t, text, sizeof(text)), "unix:/run/app.sock");
	assert_int_equal(proxy_parse_target("tcp:127.0.0.1:6379", &t), 0);
	assert_string_equal(t.unix_name, "");
	assert_string_equal(t.host, "127.0.0.1");
	assert_int_equal(t.port, 6379);
	char long_name[140] = "unix:/";
	memset(long_name + 6, 'a', 107);
	long_name[6 + 107] = 0;
	const char *bad[] = { "unix:", "unix:@", long_name, "tcp:", "tcp:unix:/x" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(proxy_parse_target(bad[i], &t), -EINVAL);
	assert_string_equal(t.host, "127.0.0.1"); /* untouched by every refusal */
}

/*
 * The proxy's upstream on a Unix socket (the echo example on an abstract
 * name): round trips and a stream pass both ways; stopped, nothing left.
 */
static void a_proxy_to_a_unix_socket_upstream_passes_bytes_both_ways(void **state)
{
	char name[64], to[80];
	snprintf(name, sizeof(name), "@perch-proxy-up-%d", (int)getpid());
	snprintf(to, sizeof(to), "unix:%s", name);
	struct serve_opts eo;
	serve_opts_default(&eo);
	eo.unix_name = name;
	struct su_server *echo = su_start_opts(echo_start, echo_stop, &eo);
	assert_non_null(echo);
	struct proxy_target t = { .connect_timeout_ms = 5000 };
	assert_int_equal(proxy_parse_target(to, &t), 0);
	struct serve_opts po;
	serve_opts_default(&po);
	struct serve *proxy;
	int fds = lu_count_fds();
	assert_int_equal(proxy_start(&po, &t, &proxy), 0);
	int port = serve_port(proxy);
	int fd = su_connect(port);
	assert_true(fd >= 0);
	char back[8];
	for (int i = 0; i < 10; i++) {
		assert_true(su_send(fd, "via unix", 8));
		assert_true(su_recv_all(fd, back, 8));
		assert_memory_equal(back, "via unix", 8);
	}
	close(fd);
	su_echo_stream(port, 1u << 20);
	proxy_stop(proxy);
	assert_int_equal(lu_count_fds(), fds);
	assert_int_equal(su_stop(echo), 0);
}

/*
 * One round trip, then nothing either way: the proxy cuts the session (a
 * reset) after its idle timeout; so it does a client that never sent a byte.
 */
static void an_idle_session_is_cut_after_the_idle_timeout(void **state)
{
	struct fx *f = *state;
	double start = su_now_ms();
	int silent = su_connect(f->port);
	int fd = su_connect(f->port);
	assert_true(silent >= 0 && fd >= 0);
	char back[2];
	usleep(SU_IDLE_MS / 2 * 1000); /* then the time runs from the bytes, not from the connect */
	double asked = su_now_ms(); /* no flush of the proxy's can complete before this */
	assert_true(su_send(fd, "hi", 2));
	assert_true(su_recv_all(fd, back, 2));
	assert_true(reads_reset(fd));
	double quiet = su_now_ms() - asked;
	assert_true(quiet >= SU_IDLE_MS);
	assert_true(quiet < 5000);
	assert_true(reads_reset(silent));
	double silent_for = su_now_ms() - start;
	assert_true(silent_for >= SU_IDLE_MS);
	assert_true(silent_for < 5000);
	close(fd);
	close(silent);
}

/* Round trips every 50 ms for one and a half idle timeouts: bytes moving keep the session. */
static void a_session_moving_bytes_outlives_the_idle_timeout(void **state)
{
	struct fx *f = *state;
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	double end = su_now_ms() + 1.5 * SU_IDLE_LONG_MS;
	char back[2];
	while (su_now_ms() < end) {
		assert_true(su_send(fd, "hi", 2));
		assert_true(su_recv_all(fd, back, 2));
		usleep(50 * 1000);
	}
	close(fd);
}

#if PERCH_HAVE_TLS
/*
 * The echo example speaking TLS (tests/tls_certs.sh's server certificate)
 * behind a proxy --to-tls whose CAs are `ca` and whose name for the
 * upstream is `name` ("": the address, 127.0.0.1, among its IP names).
 */
static int tls_upstream(void **state, const char *ca, const char *name)
{
	struct fx *f = *state = fx_new();
	struct serve_opts o;
	serve_opts_default(&o);
	o.tls_cert = cert("server.pem");
	o.tls_key = cert("server.key");
	f->echo = su_start_opts(echo_start, echo_stop, &o);
	if (!f->echo)
		return -1;
	serve_opts_default(&o);
	struct proxy_target to = { .host = "127.0.0.1", .port = f->echo->port, .tls = true, .ca_file = cert(ca) };
	snprintf(to.name, sizeof(to.name), "%s", name);
	if (proxy_start(&o, &to, &f->proxy) != 0)
		return -1;
	f->port = serve_port(f->proxy);
	return 0;
}

static int setup_tls_echo(void **state)
{
	return tls_upstream(state, "ca.pem", "");
}

static int setup_tls_echo_named(void **state)
{
	return tls_upstream(state, "ca.pem", "localhost");
}

static int setup_tls_other_ca(void **state)
{
	return tls_upstream(state, "other-ca.pem", "");
}

static int setup_tls_other_name(void **state)
{
	return tls_upstream(state, "ca.pem", "other.test");
}

/*
 * A plain client through proxy --to-tls to a TLS echo: its bytes come
 * back, and its half-close goes up as close_notify (a FIN under the TLS
 * stream would be a truncation, and the echo would reset), the echo's
 * close_notify comes back as a clean end.
 */
static void a_tls_upstream_gets_bytes_and_each_end_as_close_notify(void **state)
{
	struct fx *f = *state;
	int cl = su_connect(f->port);
	assert_true(cl >= 0);
	char got[64];
	assert_true(su_send_str(cl, "through tls"));
	assert_true(su_recv_all(cl, got, 11));
	assert_memory_equal(got, "through tls", 11);
	assert_true(su_send_str(cl, "and the end"));
	assert_int_equal(shutdown(cl, SHUT_WR), 0);
	assert_true(su_recv_all(cl, got, 11));
	assert_memory_equal(got, "and the end", 11);
	assert_true(reads_eof(cl));
	close(cl);
}

/* The same with the upstream's name given (--to-name localhost): checked, and sent as SNI. */
static void a_tls_upstream_checked_by_name_gets_each_end_as_close_notify(void **state)
{
	a_tls_upstream_gets_bytes_and_each_end_as_close_notify(state);
}

/* 8 MiB out while this thread reads it back, encrypted to the echo and decrypted back. */
static void a_stream_passes_a_tls_upstream_both_ways_whole(void **state)
{
	su_echo_stream(((struct fx *)*state)->port, 8u << 20);
}

/* The upstream's certificate is not one the proxy's CAs vouch for, or not for its name: the client is reset. */
static void upstream_certificate_refused(void **state)
{
	struct fx *f = *state;
	for (int i = 0; i < 2; i++) {
		int cl = su_connect(f->port);
		assert_true(cl >= 0);
		/* The refusal may reset the client before its send: then the send meets the reset. */
		bool sent = su_send_str(cl, "secret");
		int send_errno = errno;
		bool reset = sent ? reads_reset(cl) : send_errno == ECONNRESET || send_errno == EPIPE;
		close(cl);
		assert_true(reset);
	}
}

static void an_upstream_certificate_from_another_ca_resets_the_client(void **state)
{
	upstream_certificate_refused(state);
}

static void an_upstream_certificate_for_another_name_resets_the_client(void **state)
{
	upstream_certificate_refused(state);
}

/* --to-tls to a Unix socket needs a name to check; a CA file that is not there fails the start. */
static void tls_targets_are_refused_without_a_name_or_with_a_missing_ca(void **state)
{
	struct serve_opts o;
	serve_opts_default(&o);
	struct proxy_target to = { .unix_name = "@perch-test-proxy", .tls = true };
	struct serve *s = NULL;
	assert_int_equal(proxy_start(&o, &to, &s), -EINVAL);
	struct proxy_target tcp = { .host = "127.0.0.1", .port = 9, .tls = true, .ca_file = "/nonexistent/ca.pem" };
	assert_int_equal(proxy_start(&o, &tcp, &s), -ENOENT);
	assert_null(s);
}
#endif

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(round_trips_through_an_echo_upstream_come_back_in_order,
						setup_echo, teardown),
		cmocka_unit_test_setup_teardown(a_stream_larger_than_the_socket_buffers_passes_both_ways_whole,
						setup_echo, teardown),
		cmocka_unit_test_setup_teardown(clients_at_once_each_get_their_own_bytes_back, setup_echo,
						teardown),
		cmocka_unit_test_setup_teardown(
			a_clients_half_close_reaches_upstream_after_its_bytes_and_the_answer_still_comes_back,
			setup_raw, teardown),
		cmocka_unit_test_setup_teardown(
			upstreams_half_close_reaches_the_client_and_the_client_can_still_send, setup_raw,
			teardown),
		cmocka_unit_test_setup_teardown(a_client_reset_closes_its_upstream, setup_raw, teardown),
		cmocka_unit_test_setup_teardown(an_upstream_reset_closes_its_client, setup_raw, teardown),
		cmocka_unit_test_setup_teardown(a_refused_upstream_ends_the_client_and_the_proxy_goes_on,
						setup_raw, teardown),
		cmocka_unit_test_setup_teardown(
			an_upstream_that_never_answers_ends_the_client_after_the_connect_timeout,
			setup_unanswering, teardown),
		cmocka_unit_test_setup_teardown(
			a_client_that_does_not_read_holds_upstream_back_and_loses_nothing, setup_raw,
			teardown),
		cmocka_unit_test_setup_teardown(clients_that_reset_at_once_leave_nothing_behind, setup_raw,
						teardown),
		cmocka_unit_test_setup_teardown(
			hundreds_of_sessions_whose_upstream_never_reads_leave_room_for_a_normal_one,
			setup_raw_small_window, teardown),
		cmocka_unit_test_setup_teardown(stop_with_sessions_open_leaves_no_descriptor, setup_raw,
						teardown),
		cmocka_unit_test_setup_teardown(stop_with_a_session_still_connecting_leaves_no_descriptor,
						setup_unanswering_patient, teardown),
		cmocka_unit_test(targets_parse_or_are_refused),
		cmocka_unit_test_setup_teardown(both_sides_of_a_session_have_tcp_nodelay_by_default, setup_echo,
						teardown),
		cmocka_unit_test_setup_teardown(nagle_keeps_nagles_algorithm_on_both_sides_of_a_session,
						setup_echo_nagle, teardown),
		cmocka_unit_test_setup_teardown(an_idle_session_is_cut_after_the_idle_timeout, setup_echo_idle,
						teardown),
		cmocka_unit_test_setup_teardown(a_session_moving_bytes_outlives_the_idle_timeout,
						setup_echo_idle_long, teardown),
		cmocka_unit_test(unix_and_tcp_prefixed_targets_parse),
		cmocka_unit_test(a_proxy_to_a_unix_socket_upstream_passes_bytes_both_ways),
#if PERCH_HAVE_TLS
		cmocka_unit_test_setup_teardown(a_tls_upstream_gets_bytes_and_each_end_as_close_notify,
						setup_tls_echo, teardown),
		cmocka_unit_test_setup_teardown(a_tls_upstream_checked_by_name_gets_each_end_as_close_notify,
						setup_tls_echo_named, teardown),
		cmocka_unit_test_setup_teardown(a_stream_passes_a_tls_upstream_both_ways_whole, setup_tls_echo,
						teardown),
		cmocka_unit_test_setup_teardown(an_upstream_certificate_from_another_ca_resets_the_client,
						setup_tls_other_ca, teardown),
		cmocka_unit_test_setup_teardown(an_upstream_certificate_for_another_name_resets_the_client,
						setup_tls_other_name, teardown),
		cmocka_unit_test(tls_targets_are_refused_without_a_name_or_with_a_missing_ca),
#endif
	};
#if PERCH_HAVE_TLS
	make_certs();
#endif
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
#if PERCH_HAVE_TLS
	remove_certs();
#endif
	return failed;
}
