/* tests/test_tls.c: the TLS layer between two sessions over in-memory pipes: handshake, bytes, ends, failures, backpressure. */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <perch.h>
#include <perch/tls.h>

#include "both_backends.h"
#include "loop_internal.h"
#include "tls_internal.h"
#include "tls_test_certs.h"

static int backend;

/* A client and a server session over two in-memory pipes, on one loop the test thread turns. */
struct pair {
	struct perch_loop *loop;
	struct perch_tls_ctx *cctx, *sctx;
	struct perch_tls *client, *server;
	struct perch_pipe_writer *to_server;   /* the client's ciphertext writer, when the test holds it */
};

static struct perch_tls_ctx *server_ctx(const char *leaf, const char *alpn)
{
	char crt[32], key[32], why[256];
	snprintf(crt, sizeof(crt), "%s.pem", leaf);
	snprintf(key, sizeof(key), "%s.key", leaf);
	struct perch_tls_ctx_opts o = {.role = PERCH_TLS_SERVER, .cert_file = cert(crt),
				       .key_file = cert(key), .alpn = alpn};
	struct perch_tls_ctx *ctx = NULL;
	int rc = perch_tls_ctx_new(&o, &ctx, why, sizeof(why));
	if (rc)
		fail_msg("server ctx: %d %s", rc, why);
	return ctx;
}

static struct perch_tls_ctx *client_ctx(const char *ca, const char *alpn)
{
	char why[256];
	struct perch_tls_ctx_opts o = {.role = PERCH_TLS_CLIENT, .ca_file = cert(ca), .alpn = alpn};
	struct perch_tls_ctx *ctx = NULL;
	int rc = perch_tls_ctx_new(&o, &ctx, why, sizeof(why));
	if (rc)
		fail_msg("client ctx: %d %s", rc, why);
	return ctx;
}

static void pair_loop(struct pair *p)
{
	struct perch_loop_opts lo = {.backend = backend};
	assert_int_equal(perch_loop_new(&lo, &p->loop), 0);
}

/* A pair with its loop and contexts (no ALPN), its sessions not made yet. */
static struct pair *pair_bare(void)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->sctx = server_ctx("server", NULL);
	p->cctx = client_ctx("ca.pem", NULL);
	return p;
}

/* Two pipes crossing: what one session's ciphertext writer flushes, the other's reader reads. */
static void cross(struct perch_pipe_reader **c_r, struct perch_pipe_writer **c_w,
		  struct perch_pipe_reader **s_r, struct perch_pipe_writer **s_w)
{
	assert_int_equal(perch_pipe_new(NULL, s_r, c_w), 0);
	assert_int_equal(perch_pipe_new(NULL, c_r, s_w), 0);
}

static void pair_start(struct pair *p, const char *name, unsigned server_ms)
{
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	cross(&cr, &cw, &sr, &sw);
	struct perch_tls_opts so = {.handshake_ms = server_ms};
	struct perch_tls_opts co = {.server_name = name};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, &so, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
}

static struct pair *pair_new(const char *leaf, const char *ca, const char *name)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->sctx = server_ctx(leaf, "http/1.1");
	p->cctx = client_ctx(ca, "h2,http/1.1");
	pair_start(p, name, 0);
	return p;
}

static void pair_free(struct pair *p)
{
	perch_tls_free(p->client);
	perch_tls_free(p->server);
	perch_tls_ctx_free(p->cctx);
	perch_tls_ctx_free(p->sctx);
	for (int i = 0; i < 4; i++)
		perch_loop_run_once(p->loop, 0);
	perch_loop_free(p->loop);
	free(p);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Turns the loop until `done(arg)` or 5 s. */
static bool turn_until(struct perch_loop *loop, bool (*done)(void *), void *arg)
{
	double end = now_ms() + 5000;
	while (!done(arg)) {
		if (now_ms() > end)
			return false;
		perch_loop_run_once(loop, 5);
	}
	return true;
}

static bool both_established(void *arg)
{
	struct pair *p = arg;
	char cwhy[200], swhy[200];
	int ce = perch_tls_error(p->client, cwhy, sizeof(cwhy));
	int se = perch_tls_error(p->server, swhy, sizeof(swhy));
	if (ce || se)
		fail_msg("handshake failed: client %d %s, server %d %s", ce, cwhy, se, swhy);
	return perch_tls_established(p->client) && perch_tls_established(p->server);
}

/* Reads what is there (up to cap bytes into buf), turning the loop: the bytes, or a final state. */
struct got {
	size_t len;
	int error;
	bool completed;
};

static struct got read_some(struct pair *p, struct perch_tls *t, uint8_t *buf, size_t cap)
{
	struct got g = {0};
	double end = now_ms() + 5000;
	for (;;) {
		struct perch_read_result r;
		int rc = perch_pipe_try_read(perch_tls_reader(t), &r);
		if (rc == 0) {
			size_t n = r.len < cap ? r.len : cap;
			perch_segs_copy(&r, 0, buf, n);
			assert_int_equal(perch_pipe_advance_to(perch_tls_reader(t), n, n), 0);
			g.len = n;
			g.error = n == r.len ? r.error : 0;
			g.completed = n == r.len && r.completed;
			if (n || g.error || g.completed)
				return g;
		} else {
			assert_int_equal(rc, -EAGAIN);
		}
		if (now_ms() > end)
			fail_msg("nothing to read in 5 s");
		perch_loop_run_once(p->loop, 5);
	}
}

/* Writes and flushes, turning the loop until the flush completed; returns its result. */
static int write_flush(struct pair *p, struct perch_tls *t, const void *data, size_t len)
{
	struct perch_pipe_writer *w = perch_tls_writer(t);
	int rc = perch_pipe_write(w, data, len);
	if (rc)
		return rc;
	struct perch_vtask_handle h;
	rc = perch_pipe_flush(w, &h);
	double end = now_ms() + 5000;
	while (rc == PERCH_PENDING && perch_vtask_status(h) == PERCH_PENDING && now_ms() < end)
		perch_loop_run_once(p->loop, 5);
	if (rc != PERCH_PENDING)
		return rc;
	int64_t result = -ETIMEDOUT;
	perch_vtask_result(h, &result);
	return (int)result;
}

static void assert_reads(struct pair *p, struct perch_tls *t, const char *want)
{
	uint8_t buf[256] = {0};
	size_t have = 0, n = strlen(want);
	while (have < n) {
		struct got g = read_some(p, t, buf + have, n - have);
		assert_int_equal(g.error, 0);
		assert_false(g.completed && have + g.len < n);
		have += g.len;
	}
	assert_memory_equal(buf, want, n);
}

/* ---- the tests ---- */

static void a_handshake_agrees_alpn_and_carries_bytes_both_ways(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	assert_string_equal(perch_tls_alpn(p->client), "http/1.1");
	assert_string_equal(perch_tls_alpn(p->server), "http/1.1");
	assert_string_equal(perch_tls_version(p->client), "TLSv1.3");
	assert_non_null(perch_tls_cipher(p->server));
	assert_int_equal(perch_tls_path(p->server), PERCH_TLS_PATH_USERSPACE);
	assert_non_null(strstr(perch_tls_path_reason(p->server), "not a socket"));
	assert_int_equal(write_flush(p, p->client, "ping", 4), 0);
	assert_reads(p, p->server, "ping");
	assert_int_equal(write_flush(p, p->server, "pong!", 5), 0);
	assert_reads(p, p->client, "pong!");
	char why[64];
	assert_int_equal(perch_tls_error(p->client, why, sizeof(why)), 0);
	pair_free(p);
}

/* The loop thread's OpenSSL error queue is shared with whatever else runs there. */
static bool established_over_stale_errors(void *arg)
{
	ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);   /* as a caller's own failed OpenSSL call leaves it */
	return both_established(arg);
}

/* The client's ciphertext, passed on to the server by the test, cut where it likes. */
struct relay {
	struct perch_pipe_reader *from_client;
	struct perch_pipe_writer *to_server;
};

/* Passes on up to `max` bytes of what the client flushed; returns how many. */
static size_t relay_some(struct relay *rl, size_t max)
{
	struct perch_read_result r;
	if (perch_pipe_try_read(rl->from_client, &r) != 0 || r.len == 0)
		return 0;
	size_t n = r.len < max ? r.len : max;
	uint8_t *b = malloc(n);
	assert_int_equal(perch_segs_copy(&r, 0, b, n), n);
	assert_int_equal(perch_pipe_advance_to(rl->from_client, n, n), 0);
	assert_int_equal(perch_pipe_write(rl->to_server, b, n), 0);
	struct perch_vtask_handle h;
	int rc = perch_pipe_flush(rl->to_server, &h);
	assert_true(rc == 0 || rc == PERCH_PENDING);
	free(b);
	return n;
}

struct relayed_pair {
	struct pair *p;
	struct relay rl;
};

static bool relayed_established(void *arg)
{
	struct relayed_pair *rp = arg;
	relay_some(&rp->rl, SIZE_MAX);
	return established_over_stale_errors(rp->p);
}

/* A loop and both contexts (ALPN http/1.1), no session yet. */
static struct pair *pair_of_contexts(void)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->sctx = server_ctx("server", "http/1.1");
	p->cctx = client_ctx("ca.pem", "http/1.1");
	return p;
}

/* A client and a server over in-memory pipes, the client's side through the test. */
static void relayed_pair_new(struct relayed_pair *rp)
{
	struct pair *p = rp->p = pair_of_contexts();
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	assert_int_equal(perch_pipe_new(NULL, &rp->rl.from_client, &cw), 0);
	assert_int_equal(perch_pipe_new(NULL, &sr, &rp->rl.to_server), 0);
	assert_int_equal(perch_pipe_new(NULL, &cr, &sw), 0);
	struct perch_tls_opts co = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, NULL, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
}

/* Both directions through the test, as through a proxy, the server's ciphertext pipe small. */
struct proxied_pair {
	struct pair *p;
	struct relay c2s, s2c;   /* the client's ciphertext to the server; the server's to the client */
	const uint8_t *next;     /* what the proxy passes on to the server when its flush completes */
	size_t next_len;
	void (*inside)(struct proxied_pair *x);   /* what the pump does, if not pass the server's answer on */
	bool ran, server_running, in_openssl_read, client_read;
	uint8_t *held;           /* the client's ciphertext the proxy took */
};

static bool proxied_established(void *arg)
{
	struct proxied_pair *x = arg;
	relay_some(&x->c2s, SIZE_MAX);
	relay_some(&x->s2c, SIZE_MAX);
	return both_established(x->p);
}

static void proxied_pair_new(struct proxied_pair *x)
{
	struct pair *p = x->p = pair_of_contexts();
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	struct perch_pipe_opts small = {.pause_bytes = 1024};
	assert_int_equal(perch_pipe_new(NULL, &x->c2s.from_client, &cw), 0);
	assert_int_equal(perch_pipe_new(&small, &sr, &x->c2s.to_server), 0);
	assert_int_equal(perch_pipe_new(NULL, &x->s2c.from_client, &sw), 0);   /* from the server, here */
	assert_int_equal(perch_pipe_new(NULL, &cr, &x->s2c.to_server), 0);    /* to the client, here */
	struct perch_tls_opts co = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, NULL, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	assert_true(turn_until(p->loop, proxied_established, x));
	for (int i = 0; i < 20; i++) {
		proxied_established(x);
		perch_loop_run_once(p->loop, 1);
	}
}

static void proxied_pair_free(struct proxied_pair *x)
{
	free(x->held);
	pair_free(x->p);
	perch_pipe_reader_free(x->c2s.from_client);
	perch_pipe_writer_free(x->c2s.to_server);
	perch_pipe_reader_free(x->s2c.from_client);
	perch_pipe_writer_free(x->s2c.to_server);
}

static void pass_on_the_rest(struct proxied_pair *x)
{
	assert_int_equal(perch_pipe_write(x->c2s.to_server, x->next, x->next_len), 0);
	struct perch_vtask_handle h;
	int rc = perch_pipe_flush(x->c2s.to_server, &h);
	assert_true(rc == 0 || rc == PERCH_PENDING);
}

/* The proxy's pump, run when its flush to the server completes: inside the server's read of it. */
static void pump_on(void *arg, int64_t result)
{
	(void)result;
	struct proxied_pair *x = arg;
	x->ran = true;
	x->server_running = x->p->server->running;
	x->in_openssl_read = x->p->server->in_openssl_read;
	if (x->inside) {
		x->inside(x);   /* the rest comes later: the server's read returns waiting for it */
		return;
	}
	relay_some(&x->s2c, SIZE_MAX);   /* the client decrypts it here */
	struct perch_read_result r;
	x->client_read = perch_pipe_try_read(perch_tls_reader(x->p->client), &r) == 0 && r.len > 0;
	pass_on_the_rest(x);
}

/*
 * The client writes 3,000 'a' then `second` 'b' bytes, two records; the
 * proxy passes on the first and 3 bytes of the second in a flush that
 * waits for room, and the rest once it completed (pump_on): the server's OpenSSL
 * reads the first record, then consumes the ciphertext to read on, which
 * completes that flush inside its read. Returns once the pump ran.
 */
static void cut_the_clients_second_record(struct proxied_pair *x, size_t second)
{
	struct pair *p = x->p;
	static uint8_t a[3000], b[8000];
	memset(a, 'a', sizeof(a));
	memset(b, 'b', sizeof(b));
	assert_true(second <= sizeof(b));
	assert_int_equal(write_flush(p, p->client, a, sizeof(a)), 0);
	assert_int_equal(write_flush(p, p->client, b, second), 0);
	struct perch_read_result r;
	assert_int_equal(perch_pipe_try_read(x->c2s.from_client, &r), 0);
	size_t all = r.len, first = all - (second + 22) + 3;   /* TLS 1.3: 5 header + 1 type + 16 tag */
	uint8_t *buf = x->held = malloc(all);
	perch_segs_copy(&r, 0, buf, all);
	assert_int_equal(perch_pipe_advance_to(x->c2s.from_client, all, all), 0);
	x->next = buf + first;
	x->next_len = all - first;
	assert_int_equal(perch_pipe_write(x->c2s.to_server, buf, first), 0);
	assert_int_equal(perch_pipe_flush_or_wait(x->c2s.to_server, pump_on, x), PERCH_PENDING);
	for (int i = 0; i < 100 && !x->ran; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(x->ran);
}

/* A proxied pair whose pump does x->inside inside the server's OpenSSL read, which it asserts. */
static struct pair *pump_inside_the_servers_read(struct proxied_pair *x)
{
	proxied_pair_new(x);
	cut_the_clients_second_record(x, 3000);
	assert_true(x->in_openssl_read);   /* the nesting these tests are about */
	return x->p;
}

/* Reads len bytes of t's plaintext, which must all be `byte`. */
static void reads_only(struct pair *p, struct perch_tls *t, size_t len, uint8_t byte)
{
	static uint8_t buf[16384];
	size_t have = 0;
	while (have < len) {
		size_t want = len - have < sizeof(buf) ? len - have : sizeof(buf);
		struct got g = read_some(p, t, buf, want);
		assert_int_equal(g.error, 0);
		for (size_t i = 0; i < g.len; i++)
			if (buf[i] != byte)
				fail_msg("byte %zu is '%c', not '%c'", have + i, buf[i], byte);
		have += g.len;
	}
}

/*
 * The proxy's pump, run inside the server's OpenSSL read (see
 * cut_the_clients_second_record), passes the server's 5,000-byte answer
 * on to the client, whose engine decrypts it there. Each read must keep
 * its own room: the client reads its 'c's, and the server the client's
 * 'a's then 'b's.
 */
static void a_decryption_inside_another_sessions_read(size_t second)
{
	struct proxied_pair x = {0};
	proxied_pair_new(&x);
	struct pair *p = x.p;
	static uint8_t c[5000];
	memset(c, 'c', sizeof(c));
	assert_int_equal(write_flush(p, p->server, c, sizeof(c)), 0);   /* held by the proxy */
	cut_the_clients_second_record(&x, second);
	assert_true(x.server_running && x.in_openssl_read && x.client_read);   /* the nesting this test is about */
	reads_only(p, p->client, sizeof(c), 'c');
	reads_only(p, p->server, 3000, 'a');
	reads_only(p, p->server, second, 'b');
	proxied_pair_free(&x);
}

static void a_short_record_decrypted_inside_another_sessions_read_keeps_its_room(void **state)
{
	(void)state;
	a_decryption_inside_another_sessions_read(3000);
}

static void a_long_record_decrypted_inside_another_sessions_read_keeps_its_room(void **state)
{
	(void)state;
	a_decryption_inside_another_sessions_read(8000);
}

/* t's plaintext read to its end or `upto` bytes, passing on the other side's ciphertext (and end) meanwhile: the bytes, *end how. */
static size_t reads_through(struct pair *p, struct perch_tls *t, struct relay *rl, size_t upto, struct got *end)
{
	*end = (struct got){0};
	size_t total = 0;
	double stop = now_ms() + 5000;
	for (;;) {
		struct perch_read_result r;
		if (perch_pipe_try_read(perch_tls_reader(t), &r) == 0) {
			assert_int_equal(perch_pipe_advance_to(perch_tls_reader(t), r.len, r.len), 0);
			total += r.len;
			if (r.error || r.completed || total >= upto) {
				*end = (struct got){.error = r.error, .completed = r.completed};
				return total;
			}
		}
		relay_some(rl, SIZE_MAX);
		struct perch_read_result e;
		if (perch_pipe_try_read(rl->from_client, &e) == 0 && e.len == 0 && (e.completed || e.error))
			perch_pipe_writer_complete(rl->to_server);   /* the other side's end, passed on */
		if (now_ms() > stop)
			fail_msg("no end in 5 s (read %zu)", total);
		perch_loop_run_once(p->loop, 1);
	}
}

/*
 * The server's writer is completed by the proxy's pump, inside the
 * server's OpenSSL read: its close_notify waits for that read to return
 * (an SSL_shutdown inside SSL_read failed the read). The client reads
 * close_notify, and the server both of the client's records, unfailed.
 */
static void complete_the_servers_writer(struct proxied_pair *x)
{
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(x->p->server)), 0);
}

static void a_writer_completed_inside_openssls_read_sends_close_notify_after_it(void **state)
{
	(void)state;
	struct proxied_pair x = {.inside = complete_the_servers_writer};
	struct pair *p = pump_inside_the_servers_read(&x);
	pass_on_the_rest(&x);
	struct got g;
	assert_int_equal(reads_through(p, p->client, &x.s2c, SIZE_MAX, &g), 0);
	assert_int_equal(g.error, 0);
	assert_true(g.completed);
	reads_only(p, p->server, 3000, 'a');
	reads_only(p, p->server, 3000, 'b');
	assert_int_equal(perch_tls_error(p->server, NULL, 0), 0);
	proxied_pair_free(&x);
}

static void complete_and_free_the_server(struct proxied_pair *x)
{
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(x->p->server)), 0);
	perch_tls_free(x->p->server);
	x->p->server = NULL;
}

/*
 * The same, then the pump frees the server: the close_notify the writer
 * asked for inside the read is sent by the rest of the free, once the
 * read returned, as it is outside a read. The client reads close_notify.
 */
static void a_writer_completed_then_freed_inside_openssls_read_sends_close_notify(void **state)
{
	(void)state;
	struct proxied_pair x = {.inside = complete_and_free_the_server};
	struct pair *p = pump_inside_the_servers_read(&x);
	struct got g;
	assert_int_equal(reads_through(p, p->client, &x.s2c, SIZE_MAX, &g), 0);
	assert_int_equal(g.error, 0);
	assert_true(g.completed);
	proxied_pair_free(&x);
}

static void flush_complete_and_free_the_server(struct proxied_pair *x)
{
	struct perch_pipe_writer *w = perch_tls_writer(x->p->server);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(w, "bytes the peer must get", 23), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	complete_and_free_the_server(x);
}

/*
 * The same with a flush waiting before the completion: the free drops
 * that flush, so the close_notify asked for after it is not sent either
 * (it would say nothing was cut short). The client reads a truncation.
 */
static void a_flush_completed_and_freed_inside_openssls_read_ends_with_no_close_notify(void **state)
{
	(void)state;
	struct proxied_pair x = {.inside = flush_complete_and_free_the_server};
	struct pair *p = pump_inside_the_servers_read(&x);
	struct got g;
	assert_int_equal(reads_through(p, p->client, &x.s2c, SIZE_MAX, &g), 0);
	assert_int_equal(g.error, PERCH_TLS_TRUNCATED);
	proxied_pair_free(&x);
}

/* Another library's OpenSSL call, in the pump, fails and leaves its error queued. */
static void leave_an_error_queued(struct proxied_pair *x)
{
	(void)x;
	ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);
}

/*
 * An error left on the thread's queue by a continuation run inside the
 * server's OpenSSL read is not that read's: the read returns waiting for
 * the rest of the record, the server does not fail, and reads both of
 * the client's records once the rest came.
 */
static void an_error_left_inside_openssls_read_fails_no_session(void **state)
{
	(void)state;
	struct proxied_pair x = {.inside = leave_an_error_queued};
	struct pair *p = pump_inside_the_servers_read(&x);
	assert_int_equal(perch_tls_error(p->server, NULL, 0), 0);
	pass_on_the_rest(&x);
	reads_only(p, p->server, 3000, 'a');
	reads_only(p, p->server, 3000, 'b');
	ERR_clear_error();
	proxied_pair_free(&x);
}

/*
 * An error some other code left on the thread's queue fails no session:
 * not the handshake, and not a read of OpenSSL's that ends waiting for the
 * rest of a record, whose SSL_get_error would read the stale error as its
 * own.
 */
static void an_error_left_on_the_threads_queue_fails_no_session(void **state)
{
	struct relayed_pair rp;
	relayed_pair_new(&rp);
	struct pair *p = rp.p;
	assert_true(turn_until(p->loop, relayed_established, &rp));
	for (int i = 0; i < 20; i++) {   /* anything the client's handshake still had in flight */
		relay_some(&rp.rl, SIZE_MAX);
		perch_loop_run_once(p->loop, 1);
	}
	ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);
	assert_int_equal(write_flush(p, p->client, "ping", 4), 0);
	/* Three bytes of the record: the server's read takes them and waits for the rest. */
	assert_int_equal(relay_some(&rp.rl, 3), 3);
	for (int i = 0; i < 10; i++) {
		ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);
		perch_loop_run_once(p->loop, 1);
	}
	assert_true(relay_some(&rp.rl, SIZE_MAX) > 0);
	ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);
	assert_reads(p, p->server, "ping");
	char why[64];
	assert_int_equal(perch_tls_error(p->server, why, sizeof(why)), 0);
	assert_int_equal(perch_tls_error(p->client, why, sizeof(why)), 0);
	ERR_clear_error();
	pair_free(p);
	perch_pipe_reader_free(rp.rl.from_client);
	perch_pipe_writer_free(rp.rl.to_server);
}

static void bytes_written_before_the_handshake_leave_after_it(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), "early", 5), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_flush(perch_tls_writer(p->client), &h), PERCH_PENDING);
	assert_reads(p, p->server, "early");
	assert_true(perch_tls_established(p->client));
	pair_free(p);
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + (i >> 11));
}

/* The server echoes what it reads while the client sends 1 MiB in 64 KiB flushes. */
static void a_mebibyte_each_way_arrives_whole_and_in_order(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	enum { TOTAL = 1 << 20, CHUNK = 64 << 10 };
	uint8_t *out = malloc(CHUNK), *in = malloc(CHUNK);
	size_t sent = 0, echoed = 0, back = 0;
	struct perch_vtask_handle cf = {0};
	bool cf_pending = false;
	double end = now_ms() + 20000;
	while (back < TOTAL && now_ms() < end) {
		if (!cf_pending && sent < TOTAL) {
			for (size_t i = 0; i < CHUNK; i++)
				out[i] = pattern(sent + i);
			assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), out, CHUNK), 0);
			sent += CHUNK;
			int rc = perch_pipe_flush(perch_tls_writer(p->client), &cf);
			assert_true(rc == 0 || rc == PERCH_PENDING);
			cf_pending = rc == PERCH_PENDING;
		} else if (cf_pending && perch_vtask_status(cf) == 0) {
			int64_t res;
			perch_vtask_result(cf, &res);
			assert_int_equal(res, 0);
			cf_pending = false;
		}
		struct perch_read_result r;
		if (perch_pipe_try_read(perch_tls_reader(p->server), &r) == 0 && r.len) {
			struct perch_pipe_writer *sw = perch_tls_writer(p->server);
			size_t n = r.len;
			uint8_t *tmp = malloc(n);
			perch_segs_copy(&r, 0, tmp, n);
			perch_pipe_advance_to(perch_tls_reader(p->server), n, n);
			assert_int_equal(write_flush(p, p->server, tmp, n), 0);
			(void)sw;
			free(tmp);
			echoed += n;
		}
		if (perch_pipe_try_read(perch_tls_reader(p->client), &r) == 0 && r.len) {
			size_t n = r.len < CHUNK ? r.len : CHUNK;
			perch_segs_copy(&r, 0, in, n);
			for (size_t i = 0; i < n; i++)
				if (in[i] != pattern(back + i))
					fail_msg("byte %zu differs", back + i);
			perch_pipe_advance_to(perch_tls_reader(p->client), n, n);
			back += n;
		}
		perch_loop_run_once(p->loop, 1);
	}
	assert_int_equal(echoed, TOTAL);
	assert_int_equal(back, TOTAL);
	free(out);
	free(in);
	pair_free(p);
}

static void close_notify_is_the_readers_clean_end(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_int_equal(write_flush(p, p->client, "bye", 3), 0);
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(p->client)), 0);
	assert_reads(p, p->server, "bye");
	uint8_t b[8];
	struct got g = read_some(p, p->server, b, sizeof(b));
	assert_int_equal(g.len, 0);
	assert_true(g.completed);
	assert_int_equal(g.error, 0);
	pair_free(p);
}

/* Ciphertext pipes the test holds one end of, to play a peer that misbehaves. */
struct raw_peer {
	struct perch_pipe_writer *to_server;    /* what the server reads */
	struct perch_pipe_reader *from_server;  /* what the server writes */
};

static struct pair *server_only(struct raw_peer *raw, unsigned handshake_ms)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->sctx = server_ctx("server", "http/1.1");
	struct perch_pipe_reader *sr;
	struct perch_pipe_writer *sw;
	cross(&raw->from_server, &raw->to_server, &sr, &sw);
	struct perch_tls_opts so = {.handshake_ms = handshake_ms};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, &so, &p->server), 0);
	return p;
}

static void raw_free(struct raw_peer *raw)
{
	perch_pipe_writer_free(raw->to_server);
	perch_pipe_reader_free(raw->from_server);
}

static void expect_server_error(struct pair *p, int err, const char *reason)
{
	uint8_t b[8];
	struct got g = read_some(p, p->server, b, sizeof(b));
	assert_int_equal(g.len, 0);
	assert_int_equal(g.error, err);
	char why[200];
	assert_int_equal(perch_tls_error(p->server, why, sizeof(why)), err);
	if (!strstr(why, reason))
		fail_msg("reason \"%s\" lacks \"%s\"", why, reason);
}

static void plaintext_http_to_the_server_fails_at_once_saying_so(void **state)
{
	struct raw_peer raw;
	struct pair *p = server_only(&raw, 0);
	const char req[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
	assert_int_equal(perch_pipe_write(raw.to_server, req, sizeof(req) - 1), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_flush(raw.to_server, &h), 0);
	expect_server_error(p, -EPROTO, "http request");
	raw_free(&raw);
	pair_free(p);
}

static void a_garbage_client_hello_fails_the_handshake(void **state)
{
	struct raw_peer raw;
	struct pair *p = server_only(&raw, 0);
	uint8_t junk[64] = {0x16, 0x03, 0x01, 0x00, 0x3b, 0x01, 0x00, 0x00, 0x37, 0x03, 0x03};
	for (size_t i = 11; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37);
	assert_int_equal(perch_pipe_write(raw.to_server, junk, sizeof(junk)), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_flush(raw.to_server, &h), 0);
	uint8_t b[8];
	struct got g = read_some(p, p->server, b, sizeof(b));
	assert_int_equal(g.error, -EPROTO);
	raw_free(&raw);
	pair_free(p);
}

static void a_handshake_cut_short_is_truncation(void **state)
{
	struct raw_peer raw;
	struct pair *p = server_only(&raw, 0);
	const uint8_t half[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00};
	assert_int_equal(perch_pipe_write(raw.to_server, half, sizeof(half)), 0);
	assert_int_equal(perch_pipe_writer_complete(raw.to_server), 0);
	expect_server_error(p, PERCH_TLS_TRUNCATED, "without close_notify");
	raw_free(&raw);
	pair_free(p);
}

static void a_silent_client_times_the_handshake_out(void **state)
{
	struct raw_peer raw;
	struct pair *p = server_only(&raw, 100);
	double t0 = now_ms();
	expect_server_error(p, -ETIMEDOUT, "100 ms");
	assert_true(now_ms() - t0 >= 90);
	raw_free(&raw);
	pair_free(p);
}

/* The client's end of the stream with no close_notify: its ciphertext writer completes. */
static void an_established_stream_ended_without_close_notify_is_truncation(void **state)
{
	struct pair *p = pair_bare();
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	cross(&cr, &cw, &sr, &sw);
	struct perch_tls_opts co = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, NULL, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	assert_int_equal(write_flush(p, p->client, "half", 4), 0);
	assert_reads(p, p->server, "half");
	perch_pipe_writer_complete(cw);   /* the client's ciphertext ends: no close_notify */
	expect_server_error(p, PERCH_TLS_TRUNCATED, "without close_notify");
	pair_free(p);
}

static void expect_client_verify_failure(struct pair *p, const char *reason)
{
	uint8_t b[8];
	struct got g = read_some(p, p->client, b, sizeof(b));
	assert_int_equal(g.error, -EPROTO);
	char why[200];
	perch_tls_error(p->client, why, sizeof(why));
	if (!strstr(why, reason))
		fail_msg("reason \"%s\" lacks \"%s\"", why, reason);
	assert_false(perch_tls_established(p->client));
	/* The server hears of it too: the client's alert. */
	g = read_some(p, p->server, b, sizeof(b));
	assert_int_equal(g.error, -EPROTO);
}

static void a_client_trusting_another_ca_refuses_the_server(void **state)
{
	struct pair *p = pair_new("server", "other-ca.pem", "localhost");
	expect_client_verify_failure(p, "unable to get local issuer certificate");
	pair_free(p);
}

static void a_client_refuses_an_expired_certificate(void **state)
{
	struct pair *p = pair_new("expired", "ca.pem", "localhost");
	expect_client_verify_failure(p, "certificate has expired");
	pair_free(p);
}

static void a_client_refuses_a_certificate_for_another_name(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "example.org");
	/* A flush waiting for the handshake is told the session's error, a later one -EPIPE. */
	struct perch_pipe_writer *w = perch_tls_writer(p->client);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(w, "early", 5), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	expect_client_verify_failure(p, "hostname mismatch");
	int64_t result = 0;
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -EPROTO);
	assert_int_equal(write_flush(p, p->client, "late", 4), -EPIPE);
	pair_free(p);
}

static void a_client_checks_an_address_against_the_certificates_ip_names(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "127.0.0.1");   /* the certificate names IP 127.0.0.1 */
	assert_true(turn_until(p->loop, both_established, p));
	pair_free(p);
	p = pair_new("server", "ca.pem", "127.0.0.2");
	expect_client_verify_failure(p, "IP address mismatch");
	pair_free(p);
}

static void a_second_session_resumes_with_the_first_ones_ticket(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	/* TLS 1.3 tickets come after the handshake: a round trip makes sure they arrived. */
	assert_int_equal(write_flush(p, p->server, "t", 1), 0);
	assert_reads(p, p->client, "t");
	assert_false(perch_tls_resumed(p->client));
	perch_tls_free(p->client);
	perch_tls_free(p->server);
	pair_start(p, "localhost", 0);
	assert_true(turn_until(p->loop, both_established, p));
	assert_true(perch_tls_resumed(p->client));
	assert_true(perch_tls_resumed(p->server));
	pair_free(p);
}

static int choose_other(void *arg, const char *name, struct perch_tls_ctx **use)
{
	if (strcmp(name, "client.test") != 0)
		return -ENOENT;
	*use = arg;
	return 0;
}

/* The "client" certificate names client.test: the client's check passes only if SNI chose it. */
static void a_server_picks_its_context_by_the_name_asked_for(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	struct perch_tls_ctx *other = server_ctx("client", NULL);
	char why[200];
	struct perch_tls_ctx_opts so = {.role = PERCH_TLS_SERVER, .cert_file = cert("server.pem"),
					.key_file = cert("server.key"), .sni = choose_other,
					.sni_arg = other};
	assert_int_equal(perch_tls_ctx_new(&so, &p->sctx, why, sizeof(why)), 0);
	p->cctx = client_ctx("ca.pem", NULL);
	pair_start(p, "client.test", 0);
	assert_true(turn_until(p->loop, both_established, p));
	perch_tls_ctx_free(other);   /* the server session keeps its own reference */
	assert_int_equal(write_flush(p, p->client, "sni", 3), 0);
	assert_reads(p, p->server, "sni");
	pair_free(p);
}

/* A server that never reads: the client's flushes wait, and the decrypted bytes stay near the pause. */
static void a_reader_that_never_reads_holds_the_writer_back(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	static uint8_t chunk[64 << 10];
	size_t sent = 0;
	struct perch_vtask_handle h;
	int rc = 0;
	while (sent < (16u << 20)) {
		assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), chunk, sizeof(chunk)), 0);
		sent += sizeof(chunk);
		rc = perch_pipe_flush(perch_tls_writer(p->client), &h);
		for (int i = 0; rc == PERCH_PENDING && perch_vtask_status(h) == PERCH_PENDING && i < 50; i++)
			perch_loop_run_once(p->loop, 1);
		if (rc == PERCH_PENDING && perch_vtask_status(h) == PERCH_PENDING)
			break;
	}
	assert_int_equal(rc, PERCH_PENDING);
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	/* Held: the server's decrypted bytes (64 KiB pause), its ciphertext pipe (64 KiB), the client's staging. */
	assert_true(sent < (2u << 20));
	struct perch_read_result r;
	assert_int_equal(perch_pipe_try_read(perch_tls_reader(p->server), &r), 0);
	assert_true(r.len >= (64u << 10) && r.len < (64u << 10) + 16384);
	/* Reading all of it lets every flush through. */
	size_t got = 0;
	double end = now_ms() + 10000;
	while (got < sent && now_ms() < end) {
		if (perch_pipe_try_read(perch_tls_reader(p->server), &r) == 0) {
			perch_pipe_advance_to(perch_tls_reader(p->server), r.len, r.len);
			got += r.len;
		}
		perch_loop_run_once(p->loop, 1);
	}
	assert_int_equal(got, sent);
	assert_int_equal(perch_vtask_status(h), 0);
	pair_free(p);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char *buf = calloc(1, 16384);
	size_t n = fread(buf, 1, 16383, f);
	fclose(f);
	assert_true(n > 0);
	return buf;
}

static void a_server_context_from_pem_in_memory_serves_a_handshake(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	char *crt = slurp(cert("server.pem")), *key = slurp(cert("server.key")), why[200];
	struct perch_tls_ctx_opts so = {.role = PERCH_TLS_SERVER, .cert_pem = crt, .key_pem = key};
	assert_int_equal(perch_tls_ctx_new(&so, &p->sctx, why, sizeof(why)), 0);
	so.key_pem = "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n";
	struct perch_tls_ctx *bad = NULL;
	assert_int_equal(perch_tls_ctx_new(&so, &bad, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "key_pem"));
	free(crt);
	free(key);
	p->cctx = client_ctx("ca.pem", NULL);
	pair_start(p, "localhost", 0);
	assert_true(turn_until(p->loop, both_established, p));
	pair_free(p);
}

/* A chain in memory loads whole or not at all: a broken block after the leaf is an error, not the chain's end. */
static void a_cert_pem_with_a_broken_certificate_after_the_leaf_is_refused(void **state)
{
	(void)state;
	char *crt = slurp(cert("server.pem")), *key = slurp(cert("server.key")), *ca = slurp(cert("ca.pem"));
	size_t leaf_len = strlen(crt), ca_len = strlen(ca);
	char *chain = calloc(1, leaf_len + ca_len + 1), why[200];
	memcpy(chain, crt, leaf_len);
	memcpy(chain + leaf_len, ca, ca_len);
	struct perch_tls_ctx_opts so = {.role = PERCH_TLS_SERVER, .cert_pem = chain, .key_pem = key};
	struct perch_tls_ctx *ctx = NULL;
	assert_int_equal(perch_tls_ctx_new(&so, &ctx, why, sizeof(why)), 0);
	perch_tls_ctx_free(ctx);
	ctx = NULL;
	char *body = strchr(chain + leaf_len, '\n') + 1, kept[2]; /* the CA's first line of base64 */
	memcpy(kept, body, 2);
	memcpy(body, "!*", 2);
	assert_int_equal(perch_tls_ctx_new(&so, &ctx, why, sizeof(why)), -EINVAL);
	assert_null(ctx);
	assert_non_null(strstr(why, "cert_pem"));
	assert_non_null(strstr(why, "base64"));
	memcpy(body, kept, 2);
	chain[leaf_len + ca_len / 2] = '\0'; /* and a chain cut inside the CA's block */
	assert_int_equal(perch_tls_ctx_new(&so, &ctx, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "cert_pem"));
	free(chain);
	free(ca);
	free(crt);
	free(key);
}

/* perch_tls_end with no after() is perch_tls_free (ASan sees a leak or a call through NULL). */
static void a_session_ended_with_no_after_is_freed(void **state)
{
	(void)state;
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	assert_int_equal(write_flush(p, p->client, "last", 4), 0);
	perch_tls_end(p->client, NULL, NULL);
	p->client = NULL;
	pair_free(p);
}

/* perch_tls_end's after(): how often it ran, and whether on a thread other than the loop's. */
static pthread_t end_loop_thread;
static int after_runs, after_runs_off_loop;

static void count_after(void *arg)
{
	(void)arg;
	__atomic_fetch_add(&after_runs, 1, __ATOMIC_RELAXED);
	if (!pthread_equal(pthread_self(), end_loop_thread))
		__atomic_fetch_add(&after_runs_off_loop, 1, __ATOMIC_RELAXED);
}

/* after() counted, with the failure of the session `arg` as it stands then (its field: it is still there). */
static int failure_at_after;

static void count_after_noting_the_failure(void *arg)
{
	failure_at_after = ((struct perch_tls *)arg)->error;
	count_after(arg);
}

/* Ends the client with perch_tls_end inside a turn, once its ciphertext flush waits; true if it did wait. */
struct ending {
	struct perch_tls *client;
	void (*then)(struct ending *e);   /* inside the same turn, after the end */
	struct perch_conn *conn;          /* the client's connection, for `then` */
	bool waited, done;
};

static void end_in_a_turn(void *arg)
{
	struct ending *e = arg;
	e->waited = e->client->cout_flushing;
	perch_tls_end(e->client, count_after, NULL);
	if (e->then)
		e->then(e);
	e->done = true;
}

static void end_client_in_a_turn(struct pair *p, struct ending *e)
{
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	e->client = p->client;
	p->client = NULL;
	assert_int_equal(perch_loop_post(p->loop, end_in_a_turn, e), 0);
	for (int i = 0; i < 1000 && !e->done; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(e->done);
	assert_true(e->waited);
	double end = now_ms() + 50;
	while (now_ms() < end && after_runs == 0)
		perch_loop_run_once(p->loop, 5);
	assert_int_equal(after_runs, 1);
	assert_int_equal(after_runs_off_loop, 0);
}

/* An established pair whose client flushed `big` bytes to a server that does not read: its ciphertext flush waits. */
static struct pair *pair_with_a_client_flush_waiting(size_t big)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	uint8_t *data = calloc(1, big);
	struct perch_pipe_writer *w = perch_tls_writer(p->client);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(w, data, big), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	free(data);
	for (int i = 0; i < 200 && !p->client->cout_flushing; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(p->client->cout_flushing);
	return p;
}

/*
 * Ended while its flush, all in records (128 KiB: under what the engine
 * stages before it waits), waits for room in an in-memory pipe, its
 * writer not completed: nothing is left to send, so the end frees the
 * pipe's writer, which fails that flush inside the end. The end must
 * find after() already set, run it there, and leave the session's memory
 * alone (ASan).
 */
static void a_session_ended_while_its_flush_waits_on_an_in_memory_pipe_ends_once(void **state)
{
	(void)state;
	struct pair *p = pair_with_a_client_flush_waiting(128u * 1024u);
	struct ending e = {0};
	end_client_in_a_turn(p, &e);
	pair_free(p);
}

/*
 * With the client's flush waiting: completes its writer and ends it
 * inside a turn while its flush waits (after() has run once then, or not
 * yet: after_ran).
 */
static void complete_and_end(struct pair *p, int after_ran)
{
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(p->client)), 0);
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	struct ending e = {.client = p->client};
	p->client = NULL;
	assert_int_equal(perch_loop_post(p->loop, end_in_a_turn, &e), 0);
	for (int i = 0; i < 1000 && !e.done; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(e.done);
	assert_true(e.waited);
	assert_int_equal(after_runs, after_ran);
}

/* after() runs once, on the loop's thread, within 100 turns; then the pair goes. */
static void after_ran_once_then_free(struct pair *p)
{
	for (int i = 0; i < 100 && after_runs == 0; i++)
		perch_loop_run_once(p->loop, 1);
	assert_int_equal(after_runs, 1);
	assert_int_equal(after_runs_off_loop, 0);
	pair_free(p);
}

/* The server reads to the end of its stream: the bytes it read, *end how. */
static size_t server_reads_to_the_end(struct pair *p, struct got *end)
{
	static uint8_t buf[64 * 1024];
	size_t total = 0;
	do {
		*end = read_some(p, p->server, buf, sizeof(buf));
		total += end->len;
	} while (!end->completed && !end->error);
	return total;
}

/* The same, then the server reads to the end: the bytes it read, *end how. */
static size_t complete_end_and_read_all(struct pair *p, int after_ran, struct got *end)
{
	complete_and_end(p, after_ran);
	return server_reads_to_the_end(p, end);
}

/*
 * The client completes its writer while 128 KiB of plaintext, all in
 * records, wait to be flushed to a server that does not read, and ends
 * at once: the close_notify that could not follow yet goes after that
 * flush, so the server reads every byte and then a clean end, not a
 * truncation. after() runs once, on the loop's thread, only then.
 */
static void an_end_right_after_the_writers_complete_still_sends_close_notify(void **state)
{
	(void)state;
	size_t big = 128u * 1024u;   /* under what the engine stages before it waits */
	struct pair *p = pair_with_a_client_flush_waiting(big);
	struct got g;
	size_t total = complete_end_and_read_all(p, 0, &g);   /* after() waits for the server */
	assert_int_equal(g.error, 0);
	assert_int_equal(total, big);
	after_ran_once_then_free(p);
}

/*
 * The same with 1 MiB flushed: the engine stages 256 KiB before it waits,
 * so most of it is not in records yet when the session ends. The end
 * encrypts and flushes the rest, round after round as the server makes
 * room, then close_notify: the server reads every byte and a clean end.
 */
static void an_end_sends_all_its_waiting_flush_holds_then_close_notify(void **state)
{
	(void)state;
	struct pair *p = pair_with_a_client_flush_waiting(1u << 20);
	struct got g;
	size_t total = complete_end_and_read_all(p, 0, &g);
	assert_int_equal(g.error, 0);
	assert_true(g.completed);
	assert_int_equal(total, 1u << 20);
	after_ran_once_then_free(p);
}

/*
 * The same, but the server never reads: the end's deadline passes with
 * close_notify still owed, and the session failing meanwhile leaves that
 * deadline armed. after() runs once, when it passes, and the session's
 * memory outlives what its free ends (ASan: over an in-memory pipe the
 * writer's free fails its flush, whose completion comes back).
 */
/* Inside a turn: the ended session fails (as a run still under way when it was ended may make it). */
static void fail_the_ended_session(void *arg)
{
	perch__tls_fail(arg, -EPROTO, "a failure after the end");
}

static void an_end_whose_flush_never_ends_runs_after_once_at_its_deadline(void **state)
{
	(void)state;
	struct pair *p = pair_with_a_client_flush_waiting(128u * 1024u);
	struct perch_tls *client = p->client;
	complete_and_end(p, 0);
	/* Freed, the session's timer is the end's deadline: a failure then must not disarm it. */
	assert_int_equal(perch_loop_post(p->loop, fail_the_ended_session, client), 0);
	perch_loop_run_once(p->loop, 0);
	assert_true(perch_timer_is_armed(&client->timer));
	double start = now_ms();
	while (now_ms() < start + PERCH_TLS_END_MS + 200 && after_runs == 0)
		perch_loop_run_once(p->loop, 5);
	assert_true(now_ms() - start >= PERCH_TLS_END_MS - 50);
	for (int i = 0; i < 4; i++)
		perch_loop_run_once(p->loop, 1);
	assert_int_equal(after_runs, 1);
	assert_int_equal(after_runs_off_loop, 0);
	pair_free(p);
}

/* The client's flush continuation: flushes 100 KiB more, completes its writer (or not) and ends, inside the engine's run. */
static bool then_complete;

static void flush_more_and_end(void *arg, int64_t result)
{
	assert_int_equal(result, 0);
	struct pair *p = arg;
	static uint8_t data[100 * 1024];
	struct perch_pipe_writer *w = perch_tls_writer(p->client);
	struct perch_vtask_handle h;
	assert_true(p->client->running);
	assert_int_equal(perch_pipe_write(w, data, sizeof(data)), 0);
	int rc = perch_pipe_flush(w, &h);
	assert_true(rc == 0 || rc == PERCH_PENDING);
	if (then_complete)
		assert_int_equal(perch_pipe_writer_complete(w), 0);
	else
		assert_non_null(p->client->tx_in);   /* handed over, not taken yet */
	perch_tls_end(p->client, count_after, NULL);
	p->client = NULL;
}

/*
 * A session ended inside its engine's run, from a flush's continuation
 * (the engine completes a flush it ended inside tls_ops.send from its
 * next run), right after it flushed 100 KiB more there: the engine had
 * not encrypted those yet. The end does: the server reads all of it,
 * then close_notify if the writer completed (else the stream fails: a
 * freed writer); after() runs once, after.
 */
static void end_inside_the_run_after_a_flush_made_there(bool complete)
{
	then_complete = complete;
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	struct perch_pipe_writer *w = perch_tls_writer(p->client);
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush_or_wait(w, flush_more_and_end, p), PERCH_PENDING);
	struct got g;
	size_t total = server_reads_to_the_end(p, &g);
	assert_null(p->client);
	assert_int_equal(g.error, complete ? 0 : -EPIPE);
	assert_int_equal(total, 1 + 100 * 1024);
	after_ran_once_then_free(p);
}

static void an_end_inside_the_run_sends_the_flush_made_there(void **state)
{
	(void)state;
	end_inside_the_run_after_a_flush_made_there(true);
}

static void an_end_inside_the_run_sends_a_flush_not_taken_yet(void **state)
{
	(void)state;
	end_inside_the_run_after_a_flush_made_there(false);
}

/* The client's reader continuation: frees the server, whose flush is delivering this very read, then ends the client. */
struct free_both {
	struct pair *p;
	bool client_first;  /* the client's end before the server's free */
	bool ran;
	int after_inside;   /* after() ran inside the continuation */
};

static void free_both_from_the_read(void *arg, int64_t result)
{
	(void)result;
	struct free_both *f = arg;
	f->ran = true;
	if (f->client_first)
		perch_tls_end(f->p->client, count_after, NULL);
	perch_tls_free(f->p->server);
	f->p->server = NULL;
	if (!f->client_first)
		perch_tls_end(f->p->client, count_after, NULL);
	f->after_inside = after_runs;
	f->p->client = NULL;
}

/* A pair whose client flushed `big` bytes (its writer then completed, or not) frees both inside the client's read. */
static void free_both_inside_a_read(size_t big, bool complete, bool client_first)
{
	struct pair *p = pair_with_a_client_flush_waiting(big);
	if (complete)
		assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(p->client)), 0);
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	struct free_both f = {.p = p, .client_first = client_first};
	struct perch_read_result r;
	assert_int_equal(perch_pipe_read_or_wait(perch_tls_reader(p->client), &r, free_both_from_the_read, &f),
			 PERCH_PENDING);
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->server), "x", 1), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_flush(perch_tls_writer(p->server), &h), PERCH_PENDING);
	for (int i = 0; i < 100 && !f.ran; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(f.ran);
	/* Ended inside its engine's run: the rest waits for the run to be over, then for the flush. */
	assert_int_equal(f.after_inside, 0);
	after_ran_once_then_free(p);   /* a few turns, not the deadline */
}

/*
 * Over in-memory pipes the server's ciphertext flush delivers to the
 * client at once, inside that flush: the client's engine runs, and its
 * reader's continuation frees both sessions, the flushing server's
 * included. The flush and the server's engine must not touch the pipe,
 * the writer or the session after that (ASan). The client's own 1 MiB
 * flush, waiting for a server that does not read, fails once the
 * server's free is finished, after its run: the client's end then runs
 * after() once, on the loop's thread, a few turns later.
 */
static void both_sessions_freed_inside_the_flush_that_feeds_one(void **state)
{
	(void)state;
	free_both_inside_a_read(1u << 20, false, false);
}

/*
 * The same, the client ended first (inside its engine's run), owing a
 * close_notify after its 128 KiB: the server's free then fails the
 * flush the end waits for, and after() runs then, not at the deadline.
 */
static void an_end_inside_the_run_whose_flush_fails_there_runs_after_at_once(void **state)
{
	(void)state;
	free_both_inside_a_read(128u * 1024u, true, true);
}

/* A continuation of the server's that ends the client, and whether the client's engine was running then. */
struct end_the_client {
	struct pair *p;
	bool ran, client_running, client_flushing;
	size_t write_first;   /* bytes written and flushed on the client before its end */
	bool wrote;
};

static void end_the_client(void *arg, int64_t result)
{
	(void)result;
	struct end_the_client *x = arg;
	x->ran = true;
	x->client_running = x->p->client->running;
	x->client_flushing = x->p->client->cout_flushing;
	perch_tls_end(x->p->client, count_after_noting_the_failure, x->p->client);
	x->p->client = NULL;
}

/*
 * The client's 1 MiB flush goes into a pipe with room for all of it, so
 * the engine's flush of its first 256 KiB of records completes inside
 * its call; that call delivers to the server, whose read continuation
 * ends the client there. The end must still send the rest once the call
 * returned, not stall until its deadline and drop it: the server reads
 * all of it, then a failed stream (the writer never completed).
 */
static void an_end_made_inside_its_own_flush_still_sends_the_rest(void **state)
{
	(void)state;
	struct pair *p = pair_bare();
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	struct perch_pipe_opts roomy = {.pause_bytes = 4u << 20};
	assert_int_equal(perch_pipe_new(&roomy, &sr, &cw), 0);
	assert_int_equal(perch_pipe_new(NULL, &cr, &sw), 0);
	struct perch_tls_opts co = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, NULL, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	assert_true(turn_until(p->loop, both_established, p));
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	struct end_the_client x = {.p = p};
	struct perch_read_result r;
	assert_int_equal(perch_pipe_read_or_wait(perch_tls_reader(p->server), &r, end_the_client, &x), PERCH_PENDING);
	size_t n = 1u << 20;
	uint8_t *data = calloc(1, n);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), data, n), 0);
	assert_int_equal(perch_pipe_flush(perch_tls_writer(p->client), &h), PERCH_PENDING);
	free(data);
	for (int i = 0; i < 100 && !x.ran; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(x.ran && x.client_running && x.client_flushing);
	struct got g;
	size_t total = server_reads_to_the_end(p, &g);
	assert_int_equal(g.error, -EPIPE);
	assert_int_equal(total, n);
	after_ran_once_then_free(p);
}

static void write_then_end_the_client(void *arg, int64_t result)
{
	struct end_the_client *x = arg;
	struct perch_pipe_writer *w = perch_tls_writer(x->p->client);
	uint8_t *data = calloc(1, x->write_first);
	struct perch_vtask_handle h;
	x->client_flushing = x->p->client->cout_flushing;
	x->wrote = data && perch_pipe_write(w, data, x->write_first) == 0 && perch_pipe_flush(w, &h) == PERCH_PENDING;
	free(data);
	bool flushing = x->client_flushing;
	end_the_client(arg, result);
	x->client_flushing = flushing;
}

/* A pair over in-memory pipes, established, with after() counted from now. */
static struct pair *pair_established_to_end(void)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	return p;
}

/* The server writes 1 MiB and flushes it, then x's continuation runs; the client reads until it ran. */
static void client_reads_until_the_continuation(struct pair *p, struct end_the_client *x, perch_vtask_fn cont)
{
	size_t n = 1u << 20;
	uint8_t *data = calloc(1, n);
	assert_non_null(data);
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->server), data, n), 0);
	assert_int_equal(perch_pipe_flush_or_wait(perch_tls_writer(p->server), cont, x), PERCH_PENDING);
	free(data);
	double end = now_ms() + 5000;
	while (!x->ran && now_ms() < end) {
		struct perch_read_result r;
		if (perch_pipe_try_read(perch_tls_reader(p->client), &r) == 0)
			perch_pipe_advance_to(perch_tls_reader(p->client), r.len, r.len);
		perch_loop_run_once(p->loop, 1);
	}
}

/*
 * The client's engine, looking for ciphertext before OpenSSL's read,
 * consumes the last result, which makes room in the in-memory pipe: the
 * server's waiting flush completes there, and its continuation ends the
 * client. OpenSSL's session must outlive the read that follows (the rest
 * of the free waits for the run), and after() runs once, a few turns
 * later.
 */
static void an_end_from_a_continuation_inside_a_ciphertext_advance_waits_for_the_run(void **state)
{
	(void)state;
	struct pair *p = pair_established_to_end();
	struct end_the_client x = {.p = p};
	client_reads_until_the_continuation(p, &x, end_the_client);
	assert_true(x.ran && x.client_running);
	after_ran_once_then_free(p);
}

/*
 * The same, but the continuation first writes and flushes 64 KiB on the
 * client, then ends it, with no ciphertext flush under way: the end has
 * plaintext to send while the engine's look for ciphertext is still in
 * its advance, and leaves it to the run's kick (no pipe freed under its
 * own advance, no OpenSSL call before the run's). The server reads all of
 * it, then a failed stream (the writer never completed); after() runs
 * once, and the client did not fail meanwhile.
 */
static void an_end_with_plaintext_to_send_inside_a_ciphertext_advance_waits_for_the_run(void **state)
{
	(void)state;
	struct pair *p = pair_established_to_end();
	struct end_the_client x = {.p = p, .write_first = 64 * 1024};
	client_reads_until_the_continuation(p, &x, write_then_end_the_client);
	assert_true(x.ran && x.wrote && x.client_running && !x.client_flushing);
	struct got g;
	size_t total = server_reads_to_the_end(p, &g);
	assert_int_equal(g.error, -EPIPE);
	assert_int_equal(total, x.write_first);
	after_ran_once_then_free(p);
	assert_int_equal(failure_at_after, 0);   /* the engine's look went on with its ciphertext reader */
}

static void write_then_end_the_server(struct proxied_pair *x)
{
	static uint8_t data[64 * 1024];
	memset(data, 's', sizeof(data));
	struct perch_tls *server = x->p->server;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(perch_tls_writer(server), data, sizeof(data)), 0);
	assert_int_equal(perch_pipe_flush(perch_tls_writer(server), &h), PERCH_PENDING);
	perch_tls_end(server, count_after_noting_the_failure, server);
	x->p->server = NULL;
}

/*
 * The proxy's pump writes and flushes 64 KiB on the server, then ends it,
 * inside the server's OpenSSL read: the end leaves its rounds and after()
 * to the run's kick (no pipe freed under the read's advance, no OpenSSL
 * call inside it). The client reads the 64 KiB; after() runs once, the
 * server unfailed then.
 */
static void an_end_with_plaintext_to_send_inside_openssls_read_waits_for_the_run(void **state)
{
	(void)state;
	struct proxied_pair x = {.inside = write_then_end_the_server};
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	failure_at_after = 1;
	struct pair *p = pump_inside_the_servers_read(&x);
	struct got g;
	assert_int_equal(reads_through(p, p->client, &x.s2c, 64 * 1024, &g), 64 * 1024);
	for (int i = 0; i < 100 && after_runs == 0; i++)
		perch_loop_run_once(p->loop, 1);
	assert_int_equal(after_runs, 1);
	assert_int_equal(after_runs_off_loop, 0);
	assert_int_equal(failure_at_after, 0);
	proxied_pair_free(&x);
}

static struct perch_conn *adopted[2];

static void on_adopted(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	(void)loop;
	assert_int_equal(result, 0);
	adopted[(intptr_t)arg] = c;
}

static void *close_on_a_thread(void *c)
{
	perch_conn_close(c);
	return NULL;
}

static void close_conn_from_a_thread(struct ending *e)
{
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, close_on_a_thread, e->conn), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
}

/* A pair over a socket pair (adopted[0] the client's connection, adopted[1] the server's), established. */
static struct pair *pair_over_a_socket_pair(size_t client_pause)
{
	struct pair *p = pair_bare();
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	adopted[0] = adopted[1] = NULL;
	for (intptr_t i = 0; i < 2; i++)
		assert_int_equal(perch_conn_adopt(p->loop, sv[i], NULL, on_adopted, (void *)i), 0);
	for (int i = 0; i < 100 && (!adopted[0] || !adopted[1]); i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(adopted[0] && adopted[1]);
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	assert_int_equal(perch_pipe_reader_new(adopted[0], &cr), 0);
	assert_int_equal(perch_pipe_writer_new(adopted[0], &cw), 0);
	assert_int_equal(perch_pipe_reader_new(adopted[1], &sr), 0);
	assert_int_equal(perch_pipe_writer_new(adopted[1], &sw), 0);
	struct perch_tls_opts co = {.server_name = "localhost", .pause_bytes = client_pause};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, NULL, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	assert_true(turn_until(p->loop, both_established, p));
	return p;
}

/*
 * Over a socket pair: ended while its ciphertext flush is in flight, then
 * the connection closed from another thread, which fails that flush there.
 * after() still runs once, on the loop's thread, and the session goes only
 * once its deadline is disarmed (ASan).
 */
static void a_session_ended_then_closed_from_another_thread_ends_on_the_loop(void **state)
{
	(void)state;
	struct pair *p = pair_over_a_socket_pair(0);
	/* A flush in flight at the end: written inside the same turn, so no turn completes it first. */
	struct ending e = {.then = close_conn_from_a_thread, .conn = adopted[0]};
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), "hello", 5), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_flush(perch_tls_writer(p->client), &h), PERCH_PENDING);
	end_client_in_a_turn(p, &e);
	perch_conn_release(adopted[0]);
	perch_conn_close(adopted[1]);
	perch_conn_release(adopted[1]);
	pair_free(p);
}

/* An end made by a plaintext read's continuation, which closes the connection in after(). */
struct end_on_read {
	struct perch_tls *t;
	struct perch_conn *conn;
	bool ran;
	size_t staged;   /* ciphertext staged and not flushed when the end was made */
};

static void close_in_after(void *conn)
{
	count_after(NULL);
	perch_conn_close(conn);
}

static void end_on_read(void *arg, int64_t result)
{
	(void)result;
	struct end_on_read *e = arg;
	e->ran = true;
	e->staged = perch_pipe_writer_staged(e->t->cw);
	perch_tls_end(e->t, close_in_after, e->conn);
}

/*
 * Over a socket pair, the client's engine encrypts a 1000-byte flush and,
 * in the same step, decrypts a record whose read continuation ends the
 * session, with the records staged and not flushed yet: the end sends
 * them before after() closes the connection. The server reads all 1000
 * bytes, then a failed stream (the writer never completed).
 */
static void an_end_from_a_read_sends_the_records_its_step_staged(void **state)
{
	(void)state;
	struct pair *p = pair_over_a_socket_pair(1);   /* the client pauses once 1 byte is unread */
	end_loop_thread = pthread_self();
	after_runs = after_runs_off_loop = 0;
	/* Two records: the client decrypts "A" and pauses, "B" waiting. */
	assert_int_equal(write_flush(p, p->server, "A", 1), 0);
	assert_int_equal(write_flush(p, p->server, "B", 1), 0);
	struct perch_read_result r = {0};
	for (int i = 0; i < 200 && r.len == 0; i++) {
		perch_loop_run_once(p->loop, 1);
		if (perch_pipe_try_read(perch_tls_reader(p->client), &r) != 0)
			r.len = 0;
	}
	assert_int_equal(r.len, 1);
	for (int i = 0; i < 20; i++)
		perch_loop_run_once(p->loop, 1);   /* "B"'s ciphertext reaches the client, still paused */
	/* Between turns: consume "A" (a kick), park a read that ends the client, flush 1000 bytes. */
	assert_int_equal(perch_pipe_advance_to(perch_tls_reader(p->client), 1, 1), 0);
	struct end_on_read e = {.t = p->client, .conn = adopted[0]};
	assert_int_equal(perch_pipe_read_or_wait(perch_tls_reader(p->client), &r, end_on_read, &e), PERCH_PENDING);
	static uint8_t x[1000];
	memset(x, 'x', sizeof(x));
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), x, sizeof(x)), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_flush(perch_tls_writer(p->client), &h), PERCH_PENDING);
	for (int i = 0; i < 100 && !e.ran; i++)
		perch_loop_run_once(p->loop, 1);
	assert_true(e.ran);
	assert_true(e.staged > sizeof(x));   /* the race this test is about: records staged, not flushed */
	p->client = NULL;
	struct got g;
	size_t total = server_reads_to_the_end(p, &g);
	assert_int_equal(total, sizeof(x));
	assert_int_equal(g.error, PERCH_TLS_TRUNCATED);
	after_ran_once_then_free(p);
	perch_conn_release(adopted[0]);
	perch_conn_close(adopted[1]);
	perch_conn_release(adopted[1]);
}

/*
 * Between turns, a flush, the writer's completion and a free: the free
 * drops the flush (its chain waits for a kick), so no close_notify goes
 * either. The server reads none of it, then a failed stream, not a
 * clean end.
 */
static void a_flush_completed_and_freed_between_turns_ends_with_no_close_notify(void **state)
{
	(void)state;
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	struct perch_pipe_writer *w = perch_tls_writer(p->client);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(w, "bytes the peer must get", 23), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_writer_complete(w), 0);
	perch_tls_free(p->client);
	p->client = NULL;
	struct got g;
	assert_int_equal(server_reads_to_the_end(p, &g), 0);
	assert_false(g.completed);
	assert_int_equal(g.error, -EPIPE);
	pair_free(p);
}

static void *free_on_a_thread(void *t)
{
	perch_tls_free(t);
	return NULL;
}

/*
 * Freed between turns on a thread that is not the loop's, while its
 * handshake's deadline is armed: the loop's next turn disarms the timer
 * before the session's memory goes (ASan tells a timer left in freed memory).
 */
static void a_session_freed_off_its_loop_thread_takes_its_deadline_with_it(void **state)
{
	(void)state;
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->cctx = client_ctx("ca.pem", NULL);
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	cross(&cr, &cw, &sr, &sw);
	struct perch_tls_opts co = {.server_name = "localhost", .handshake_ms = 20};
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	struct perch_read_result hello = {0};
	for (int i = 0; i < 100 && hello.len == 0; i++) {
		perch_loop_run_once(p->loop, 1);
		perch_pipe_try_read(sr, &hello);
	}
	assert_true(hello.len > 0);   /* the ClientHello left: the handshake and its deadline began */
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, free_on_a_thread, p->client), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	p->client = NULL;
	double end = now_ms() + 100;   /* five deadlines */
	while (now_ms() < end)
		perch_loop_run_once(p->loop, 5);
	perch_pipe_reader_free(sr);
	perch_pipe_writer_free(sw);
	pair_free(p);
}

/* ---- over TCP: perch's server scaffold with a TLS context, a perch client session ---- */

/* The path the server's first TLS session said, from its loop's thread once it had bytes. */
static char served_why[128];
static int served_noted;

static void note_served_path(struct perch_session *s)
{
	struct perch_tls *t = perch_session_tls(s);
	if (__atomic_load_n(&served_noted, __ATOMIC_RELAXED))
		return;
	snprintf(served_why, sizeof(served_why), "%d %s", t ? perch_tls_path(t) : -1,
		 t ? perch_tls_path_reason(t) : "no TLS session");
	__atomic_store_n(&served_noted, 1, __ATOMIC_RELEASE);
}

/* Writes back what a plaintext reader reads; a server's session (s), or bare pipes. */
struct echo {
	struct perch_session *s;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	bool quiet;   /* writes nothing back: only counts what it read, and how the stream ended */
	bool ended;
};

/* A quiet echo's: the bytes it read, and how its stream ended (1: clean, else the error). */
static size_t counted;
static int counted_end;

static void echo_run(struct echo *e);

static void echo_end(struct echo *e)
{
	e->ended = true;
	if (e->s)
		perch_session_end(e->s, PERCH_SESSION_CLOSE);
}

static void echo_next(void *arg, int64_t result)
{
	struct echo *e = arg;
	if (result < 0)
		echo_end(e);
	else
		echo_run(e);
}

/* Writes back what it reads, one flush a read; ends with the stream. */
static void echo_run(struct echo *e)
{
	for (;;) {
		struct perch_read_result r;
		int rc = perch_pipe_read_or_wait(e->r, &r, echo_next, e);
		if (rc == PERCH_PENDING)
			return;
		if (rc == 0 && r.len && e->s)
			note_served_path(e->s);
		if (rc == 0 && e->quiet)
			__atomic_add_fetch(&counted, r.len, __ATOMIC_RELAXED);
		if (rc == 0 && r.len && !e->quiet) {
			uint8_t *copy = malloc(r.len);
			perch_segs_copy(&r, 0, copy, r.len);
			rc = perch_pipe_write(e->w, copy, r.len);
			free(copy);
		}
		if (rc == 0)
			rc = perch_pipe_advance_to(e->r, r.len, r.len);
		if (rc != 0 || r.completed || r.error || r.closed) {
			if (e->quiet)
				__atomic_store_n(&counted_end, rc ? rc : r.error ? r.error : r.completed ? 1 : -EPIPE,
						 __ATOMIC_RELEASE);
			echo_end(e);
			return;
		}
		if (e->quiet)
			continue;
		rc = perch_pipe_flush_or_wait(e->w, echo_next, e);
		if (rc == PERCH_PENDING)
			return;
		if (rc < 0) {
			echo_end(e);
			return;
		}
	}
}

static void echo_start(struct perch_session *s, struct perch_pipe_reader *r,
		       struct perch_pipe_writer *w, void *app)
{
	struct echo *e = perch_session_state(s);
	*e = (struct echo){.s = s, .r = r, .w = w};
	echo_run(e);
}

static void quiet_start(struct perch_session *s, struct perch_pipe_reader *r,
			struct perch_pipe_writer *w, void *app)
{
	struct echo *e = perch_session_state(s);
	*e = (struct echo){.s = s, .r = r, .w = w, .quiet = true};
	echo_run(e);
}

static void connected(struct perch_loop *loop, struct perch_conn *c, int err, void *arg)
{
	struct perch_conn **out = arg;
	assert_int_equal(err, 0);
	*out = c;
}

static bool conn_there(void *arg)
{
	return *(struct perch_conn **)arg != NULL;
}

/* The test's own question to the kernel: 0 when a connected TCP socket takes TCP_ULP "tls", else -errno. */
static int kernel_takes_tls(void)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0), cs = socket(AF_INET, SOCK_STREAM, 0), rc = 0;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	assert_true(ls >= 0 && cs >= 0);
	assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(ls, 1), 0);
	assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &len), 0);
	assert_int_equal(connect(cs, (struct sockaddr *)&a, sizeof(a)), 0);
	if (setsockopt(cs, IPPROTO_TCP, 31 /* TCP_ULP */, "tls", 4) != 0)
		rc = -errno;
	close(cs);
	close(ls);
	return rc;
}

/*
 * A TLS server whose sessions start with `start` (state_size bytes of
 * state), and a pair holding a perch client session over TCP to it, on
 * a loop the test turns; *c is the client's connection.
 */
static struct pair *tcp_client(perch_session_start_fn start, size_t state_size,
			       struct perch_server **srv, struct perch_conn **c)
{
	struct perch_tls_ctx *sctx = server_ctx("server", "http/1.1");
	struct perch_server_opts so = {.start = start, .state_size = state_size,
				       .tls = sctx, .loop = {.backend = backend}};
	assert_int_equal(perch_server_start(&so, srv), 0);
	perch_tls_ctx_free(sctx);   /* the server keeps its own reference */
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->cctx = client_ctx("ca.pem", "http/1.1");
	*c = NULL;
	assert_int_equal(perch_connect(p->loop, "127.0.0.1", perch_server_port(*srv), NULL, connected, c), 0);
	assert_true(turn_until(p->loop, conn_there, c));
	struct perch_pipe_reader *cr;
	struct perch_pipe_writer *cw;
	assert_int_equal(perch_pipe_reader_new(*c, &cr), 0);
	assert_int_equal(perch_pipe_writer_new(*c, &cw), 0);
	struct perch_tls_opts co = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	return p;
}

static void a_tls_server_echoes_a_perch_client_over_tcp(void **state)
{
	__atomic_store_n(&served_noted, 0, __ATOMIC_RELAXED);
	struct perch_server *srv;
	struct perch_conn *c;
	struct pair *p = tcp_client(echo_start, sizeof(struct echo), &srv, &c);
	assert_int_equal(write_flush(p, p->client, "over tcp", 8), 0);
	assert_reads(p, p->client, "over tcp");
	assert_string_equal(perch_tls_alpn(p->client), "http/1.1");
	/* Over a socket the path is the kernel's question: asked here too, the same answer. */
	int ulp = kernel_takes_tls();
	const char *why = perch_tls_path_reason(p->client);
	assert_int_equal(perch_tls_path(p->client),
			 ulp == 0 ? PERCH_TLS_PATH_KERNEL_TX : PERCH_TLS_PATH_USERSPACE);
	if (ulp != 0 && !strstr(why, strerror(-ulp)))
		fail_msg("the kernel refuses TLS (%s), yet: %s", strerror(-ulp), why);
	/* The server's session, through perch_session_tls, says the same. */
	assert_true(__atomic_load_n(&served_noted, __ATOMIC_ACQUIRE));
	char want[128];
	snprintf(want, sizeof(want), "%d %s", perch_tls_path(p->client), why);
	assert_string_equal(served_why, want);
	/* 4 MiB through it, in one flush. */
	enum { BIG = 4 << 20 };
	uint8_t *big = malloc(BIG), *back = malloc(BIG);
	for (size_t i = 0; i < BIG; i++)
		big[i] = pattern(i);
	assert_int_equal(perch_pipe_write(perch_tls_writer(p->client), big, BIG), 0);
	struct perch_vtask_handle h;
	int rc = perch_pipe_flush(perch_tls_writer(p->client), &h);
	size_t got = 0;
	double end = now_ms() + 20000;
	while (got < BIG && now_ms() < end) {
		struct perch_read_result r;
		if (perch_pipe_try_read(perch_tls_reader(p->client), &r) == 0) {
			size_t n = r.len < BIG - got ? r.len : BIG - got;
			perch_segs_copy(&r, 0, back + got, n);
			perch_pipe_advance_to(perch_tls_reader(p->client), n, n);
			got += n;
		}
		perch_loop_run_once(p->loop, 1);
	}
	assert_int_equal(got, BIG);
	assert_memory_equal(big, back, BIG);
	assert_true(rc == 0 || perch_vtask_status(h) == 0);
	free(big);
	free(back);
	/* Our close_notify ends the server's session, which says close_notify before its FIN: a clean end. */
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(p->client)), 0);
	uint8_t b[8];
	struct got g = read_some(p, p->client, b, sizeof(b));
	assert_int_equal(g.len, 0);
	assert_int_equal(g.error, 0);
	assert_true(g.completed);
	perch_tls_free(p->client);
	p->client = NULL;
	perch_conn_release(c);
	pair_free(p);
	assert_int_equal(perch_server_stop(srv, 1000, NULL), 0);
}

static bool stream_counted(void *arg)
{
	return __atomic_load_n(&counted_end, __ATOMIC_ACQUIRE) != 0;
}

static bool client_established(void *arg)
{
	return perch_tls_established(((struct pair *)arg)->client);
}

/* Inside a turn: flush 1 MiB, complete the writer, end the session and close its connection after. */
struct last_words {
	struct pair *p;
	struct perch_conn *c;
	bool waited, done;
};

static void release_conn(void *arg)
{
	perch_conn_release(arg);
}

static void say_last_words(void *arg)
{
	struct last_words *l = arg;
	enum { BIG = 1 << 20 };
	static uint8_t data[BIG];
	struct perch_pipe_writer *w = perch_tls_writer(l->p->client);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(w, data, BIG), 0);
	int rc = perch_pipe_flush(w, &h);
	assert_true(rc == 0 || rc == PERCH_PENDING);
	assert_int_equal(perch_pipe_writer_complete(w), 0);
	l->waited = l->p->client->cout_flushing;
	perch_tls_end(l->p->client, release_conn, l->c);
	l->p->client = NULL;
	l->done = true;
}

/*
 * Over TCP a hasty ending: 1 MiB flushed right after the handshake, the
 * writer completed and the session ended at once, its connection closed
 * in after(). A flush is under way then (on io_uring the handshake's
 * last flight or the answer's first records are still being sent), and
 * most of the answer is not in records yet; the server must read all of
 * it and then close_notify, a clean end.
 */
static void a_session_ended_as_its_last_flush_leaves_ends_cleanly_over_tcp(void **state)
{
	__atomic_store_n(&counted, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&counted_end, 0, __ATOMIC_RELAXED);
	struct perch_server *srv;
	struct perch_conn *c;
	struct pair *p = tcp_client(quiet_start, sizeof(struct echo), &srv, &c);
	assert_true(turn_until(p->loop, client_established, p));
	struct last_words l = {.p = p, .c = c};
	assert_int_equal(perch_loop_post(p->loop, say_last_words, &l), 0);
	assert_true(turn_until(p->loop, stream_counted, NULL));
	assert_true(l.done);
	assert_true(l.waited || backend == PERCH_BACKEND_EPOLL);
	assert_int_equal(__atomic_load_n(&counted, __ATOMIC_RELAXED), 1 << 20);
	assert_int_equal(__atomic_load_n(&counted_end, __ATOMIC_ACQUIRE), 1);
	pair_free(p);
	assert_int_equal(perch_server_stop(srv, 1000, NULL), 0);
}

static void a_server_refuses_a_client_context_and_keeps_nothing(void **state)
{
	struct perch_tls_ctx *cctx = client_ctx("ca.pem", NULL);
	struct perch_server_opts so = {.start = echo_start, .tls = cctx};
	struct perch_server *srv = NULL;
	assert_int_equal(perch_server_start(&so, &srv), -EINVAL);
	assert_null(srv);
	perch_tls_ctx_free(cctx);
}

/* ---- the plaintext ends used from a thread that is not the loop's ---- */

static void echo_post_start(void *arg)
{
	echo_run(arg);
}

/* Runs the pair's loop until stopped, then frees the sessions on it and turns it until their kicks ran. */
static void *loop_thread(void *arg)
{
	struct pair *p = arg;
	perch_loop_run(p->loop);
	perch_tls_free(p->client);
	perch_tls_free(p->server);
	p->client = p->server = NULL;
	for (int i = 0; i < 4; i++)
		perch_loop_run_once(p->loop, 0);
	return NULL;
}

struct drain {
	struct perch_pipe_reader *r;
	size_t want, got;
	bool same;
	const char *broke;             /* why it stopped early (cmocka's checks stay on the test's thread) */
};

/* A third thread reads every echoed byte and checks it. */
static void *drain_thread(void *arg)
{
	struct drain *d = arg;
	d->same = true;
	while (d->got < d->want && !d->broke) {
		struct perch_read_result res;
		struct perch_vtask_handle h;
		int64_t result;
		int rc = perch_pipe_read(d->r, &res, &h);
		if (rc == PERCH_PENDING) {
			if (perch_vtask_wait(h, 5000, &result) != 0)
				d->broke = "a plaintext read waited 5 s: a lost wake-up";
			continue;
		}
		if (rc != 0 || res.error || res.completed || res.closed) {
			d->broke = "the read ended early";
			continue;
		}
		struct perch_cursor c;
		perch_cursor_init(&c, &res);
		const uint8_t *run;
		size_t n;
		while ((n = perch_cursor_run(&c, &run)) > 0) {
			for (size_t i = 0; i < n; i++)
				d->same &= run[i] == pattern(d->got + perch_cursor_pos(&c) + i);
			perch_cursor_advance(&c, n);
		}
		d->got += res.len;
		if (perch_pipe_advance_to(d->r, res.len, res.len) != 0)
			d->broke = "advance refused";
	}
	return NULL;
}

/*
 * The client's plaintext ends are driven from two threads of the test
 * while the loop (both engines) runs on a third: every flush hands its
 * chain over while the engine may be running, every read is woken from
 * the loop thread. A lost hand-over or wake-up shows as a 5 s wait.
 */
static void plaintext_ends_used_off_the_loop_thread_lose_nothing(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	struct echo e = {.r = perch_tls_reader(p->server), .w = perch_tls_writer(p->server)};
	assert_int_equal(perch_loop_post(p->loop, echo_post_start, &e), 0);
	enum { FLUSHES = 20000, EACH = 24 };
	struct drain d = {.r = perch_tls_reader(p->client), .want = (size_t)FLUSHES * EACH};
	pthread_t loop_th, drain_th;
	assert_int_equal(pthread_create(&loop_th, NULL, loop_thread, p), 0);
	assert_int_equal(pthread_create(&drain_th, NULL, drain_thread, &d), 0);
	struct perch_pipe_writer *w = perch_tls_writer(p->client);
	for (size_t i = 0; i < FLUSHES; i++) {
		uint8_t msg[EACH];
		for (size_t j = 0; j < EACH; j++)
			msg[j] = pattern(i * EACH + j);
		assert_int_equal(perch_pipe_write(w, msg, EACH), 0);
		struct perch_vtask_handle h;
		int rc = perch_pipe_flush(w, &h);
		int64_t result = 0;
		if (rc == PERCH_PENDING && perch_vtask_wait(h, 5000, &result) != 0)
			fail_msg("flush %zu waited 5 s: a lost hand-over", i);
		assert_true(rc == 0 || (rc == PERCH_PENDING && result == 0));
	}
	assert_int_equal(pthread_join(drain_th, NULL), 0);
	if (d.broke)
		fail_msg("%s", d.broke);
	assert_int_equal(d.got, d.want);
	assert_true(d.same);
	assert_int_equal(perch_loop_stop(p->loop), 0);
	assert_int_equal(pthread_join(loop_th, NULL), 0);   /* it freed the sessions: the echo ended then */
	pair_free(p);
}

/* ---- the plaintext writer stages in its loop's pool ---- */

struct pool_write {
	struct perch_tls *t;
	struct perch_loop *loop;
	const void *data;
	size_t len;
	struct perch__txbuf *head;     /* the pool's first buffer, before the write */
	struct perch__txbuf *staged;   /* where the write staged */
	int rc;
	struct perch_vtask_handle h;
	bool done;
};

/* On the loop thread: one write and its flush, and where it staged. */
static void write_on_the_loop(void *arg)
{
	struct pool_write *w = arg;
	w->head = w->loop->txbuf_pool;
	w->rc = perch_pipe_write(perch_tls_writer(w->t), w->data, w->len);
	w->staged = w->t->plain->staged_head;
	if (w->rc == 0)
		w->rc = perch_pipe_flush(perch_tls_writer(w->t), &w->h);
	__atomic_store_n(&w->done, true, __ATOMIC_RELEASE);
}

static bool pool_write_done(void *arg)
{
	struct pool_write *w = arg;
	return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE) &&
	       (w->rc != PERCH_PENDING || perch_vtask_status(w->h) != PERCH_PENDING);
}

/* The server writes and flushes `len` bytes on its loop's thread. */
static void pool_write(struct pair *p, struct pool_write *w, const void *data, size_t len)
{
	*w = (struct pool_write){.t = p->server, .loop = p->loop, .data = data, .len = len};
	assert_int_equal(perch_loop_post(p->loop, write_on_the_loop, w), 0);
	assert_true(turn_until(p->loop, pool_write_done, w));
	int64_t result = 0;
	if (w->rc == PERCH_PENDING)
		assert_int_equal(perch_vtask_result(w->h, &result), 0);
	assert_true(w->rc == 0 || (w->rc == PERCH_PENDING && result == 0));
}

/* A plaintext read's continuation that frees its session, inside the run its ciphertext started. */
struct freeing_read {
	struct pair *p;
	int runs;
	int64_t result;
};

static void free_the_session(void *arg, int64_t result)
{
	struct freeing_read *f = arg;
	f->runs++;
	f->result = result;
	perch_tls_free(f->p->server);
	f->p->server = NULL;
}

static bool freeing_read_ran(void *arg)
{
	return ((struct freeing_read *)arg)->runs > 0;
}

/*
 * The engine runs on the reference of the completion that started it (a
 * parked ciphertext read's): a session freed by a continuation of that
 * run stays whole until the run is over (ASan judges it).
 */
static void a_session_freed_by_its_readers_continuation_outlives_the_run(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	struct freeing_read f = {.p = p};
	struct perch_read_result r;
	assert_int_equal(perch_pipe_read_or_wait(perch_tls_reader(p->server), &r, free_the_session, &f),
			 PERCH_PENDING);
	/* The server's ciphertext reader goes only once that run is over: the client's flush, delivered, completes. */
	assert_int_equal(write_flush(p, p->client, "x", 1), 0);
	assert_true(turn_until(p->loop, freeing_read_ran, &f));
	assert_int_equal(f.runs, 1);
	assert_int_equal(f.result, 0);
	assert_null(p->server);
	pair_free(p);
}

/* A server that fails every handshake at the ClientHello: its chooser refuses every name. */
static int refuse_every_name(void *arg, const char *name, struct perch_tls_ctx **use)
{
	return -EACCES;
}

struct made_in_a_turn {
	struct pair *p;
	struct perch_pipe_reader *cr;
	struct perch_pipe_writer *cw;
	int rc;
	bool made;
	int told;
};

static void free_the_client(void *arg, int64_t result)
{
	struct made_in_a_turn *m = arg;
	m->told++;
	perch_tls_free(m->p->client);
	m->p->client = NULL;
}

static void make_the_client(struct perch_timer *t, void *arg)
{
	struct made_in_a_turn *m = arg;
	struct perch_tls_opts co = {.server_name = "localhost"};
	m->rc = perch_tls_new(m->p->cctx, m->p->loop, m->cr, m->cw, &co, &m->p->client);
	m->made = true;
}

static bool client_made(void *arg)
{
	return ((struct made_in_a_turn *)arg)->made;
}

/*
 * A session made on the loop's thread runs its engine at once, and its
 * ClientHello reaches a server over in-memory pipes inside that run: the
 * server fails, and its reader's continuation frees the new session. The
 * first run holds a reference of its own, so the session stays whole
 * until perch_tls_new returns (ASan judges it).
 */
static void a_session_freed_inside_its_first_run_outlives_it(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	char why[200];
	struct perch_tls_ctx_opts so = {.role = PERCH_TLS_SERVER, .cert_file = cert("server.pem"),
					.key_file = cert("server.key"), .sni = refuse_every_name};
	assert_int_equal(perch_tls_ctx_new(&so, &p->sctx, why, sizeof(why)), 0);
	p->cctx = client_ctx("ca.pem", NULL);
	struct made_in_a_turn m = {.p = p};
	struct perch_pipe_reader *sr;
	struct perch_pipe_writer *sw;
	cross(&m.cr, &m.cw, &sr, &sw);
	struct perch_tls_opts sopts = {0};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, &sopts, &p->server), 0);
	struct perch_read_result r;
	assert_int_equal(perch_pipe_read_or_wait(perch_tls_reader(p->server), &r, free_the_client, &m),
			 PERCH_PENDING);
	for (int i = 0; i < 3; i++)
		perch_loop_run_once(p->loop, 0);   /* the server's first run parks its ciphertext read */
	struct perch_timer t;
	assert_int_equal(perch_timer_init(&t, p->loop, make_the_client, &m), 0);
	assert_int_equal(perch_timer_start(&t, 1), 0);
	assert_true(turn_until(p->loop, client_made, &m));
	assert_int_equal(m.rc, 0);
	assert_int_equal(m.told, 1);
	assert_null(p->client);
	assert_int_not_equal(perch_tls_error(p->server, why, sizeof(why)), 0);
	pair_free(p);
}

static void a_plaintext_write_on_the_loop_stages_in_its_pool(void **state)
{
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	struct pool_write first, second;
	pool_write(p, &first, "pooled", 6);
	assert_reads(p, p->client, "pooled");
	/* The first flush's buffer went back to the pool once its records left, */
	pool_write(p, &second, "pooled", 6);
	assert_reads(p, p->client, "pooled");
	assert_non_null(second.head);
	assert_ptr_equal(second.head, first.staged);
	/* and the next write staged in it, not in a buffer of its own. */
	assert_ptr_equal(second.staged, second.head);
	pair_free(p);
}

/* The engine makes a record of each staged buffer: a record's worth is not cut into the pool's. */
static void a_record_sized_write_on_the_loop_leaves_as_one_record(void **state)
{
	enum { RECORD = 16384 };
	struct pair *p = pair_new("server", "ca.pem", "localhost");
	assert_true(turn_until(p->loop, both_established, p));
	uint8_t *out = malloc(RECORD), *in = malloc(RECORD);
	for (size_t i = 0; i < RECORD; i++)
		out[i] = pattern(i);
	struct pool_write w;
	pool_write(p, &w, "warm", 4);   /* a buffer in the pool, as on a busy loop */
	assert_reads(p, p->client, "warm");
	pool_write(p, &w, out, RECORD);
	/* The client decrypts each record into a segment of its own: one segment, all of it. */
	struct perch_read_result r;
	double end = now_ms() + 5000;
	int rc;
	while ((rc = perch_pipe_try_read(perch_tls_reader(p->client), &r)) != 0 && now_ms() < end)
		perch_loop_run_once(p->loop, 5);
	assert_int_equal(rc, 0);
	assert_int_equal(r.len, RECORD);
	assert_int_equal(r.first->len - r.first_off, RECORD);
	assert_int_equal(perch_segs_copy(&r, 0, in, RECORD), RECORD);
	assert_memory_equal(in, out, RECORD);
	assert_int_equal(perch_pipe_advance_to(perch_tls_reader(p->client), RECORD, RECORD), 0);
	free(out);
	free(in);
	pair_free(p);
}

/*
 * OpenSSL may hold whole records the engine gave it (with read-ahead, one
 * BIO read takes all there is): once decryption resumes, they are read
 * though no new ciphertext comes.
 */
static void records_openssl_holds_are_read_without_more_ciphertext(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));
	pair_loop(p);
	p->sctx = server_ctx("server", "http/1.1");
	p->cctx = client_ctx("ca.pem", "http/1.1");
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	cross(&cr, &cw, &sr, &sw);
	struct perch_tls_opts so = {.pause_bytes = 100};
	struct perch_tls_opts co = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(p->sctx, p->loop, sr, sw, &so, &p->server), 0);
	assert_int_equal(perch_tls_new(p->cctx, p->loop, cr, cw, &co, &p->client), 0);
	assert_true(turn_until(p->loop, both_established, p));
	SSL_set_read_ahead(p->server->ssl, 1);
	enum { EACH = 1000, N = 4 };
	uint8_t out[N * EACH], in[N * EACH];
	for (size_t i = 0; i < sizeof(out); i++)
		out[i] = pattern(i);
	/*
	 * The first record, unread, pauses the server's decryption: the next
	 * three wait in its ciphertext reader as one result, and OpenSSL's
	 * read-ahead takes them all at once when decryption resumes.
	 */
	for (int i = 0; i < N; i++)
		assert_int_equal(write_flush(p, p->client, out + i * EACH, EACH), 0);
	size_t got = 0;
	while (got < sizeof(in)) {
		struct got g = read_some(p, p->server, in + got, EACH);
		assert_int_equal(g.error, 0);
		assert_false(g.completed);
		got += g.len;
	}
	assert_memory_equal(in, out, sizeof(out));
	pair_free(p);
}

static void bad_contexts_are_refused_saying_why(void **state)
{
	struct perch_tls_ctx *ctx = NULL;
	char why[200];
	assert_int_equal(perch_tls_ctx_new(NULL, &ctx, why, sizeof(why)), -EINVAL);
	struct perch_tls_ctx_opts o = {.role = 7};
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "role"));
	o = (struct perch_tls_ctx_opts){.role = PERCH_TLS_SERVER};
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "needs cert_file"));
	o.cert_file = "/nonexistent/cert.pem";
	o.key_file = cert("server.key");
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -ENOENT);
	assert_non_null(strstr(why, "/nonexistent/cert.pem"));
	char under_a_file[200];
	snprintf(under_a_file, sizeof(under_a_file), "%s/x", cert("server.pem"));
	o.cert_file = under_a_file;   /* stat's own errno, not "not there" */
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -ENOTDIR);
	assert_non_null(strstr(why, strerror(ENOTDIR)));
	o.cert_file = cert("server.pem");
	o.key_file = cert("client.key");
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "mismatch"));
	o.key_file = cert("server.key");
	o.alpn = "h2,,http/1.1";
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "alpn"));
	o.alpn = NULL;
	o.cert_file = cert("ca.key");   /* a key where a certificate goes */
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -EINVAL);
	assert_null(ctx);
	/* A session refuses NULLs and frees what it was given. */
	struct perch_tls *t;
	assert_int_equal(perch_tls_new(NULL, NULL, NULL, NULL, NULL, &t), -EINVAL);
	/* A client that verifies must be told which name to check (ASan sees the pipes freed). */
	struct perch_tls_ctx *cctx = client_ctx("ca.pem", NULL);
	struct perch_loop *loop;
	assert_int_equal(perch_loop_new(NULL, &loop), 0);
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	assert_int_equal(perch_pipe_new(NULL, &r, &w), 0);
	assert_int_equal(perch_tls_new(cctx, loop, r, w, NULL, &t), -EINVAL);
	/* A name SNI cannot carry is the caller's error, and leaves no OpenSSL error on the thread. */
	char long_name[300];
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	const char *names[] = {"", long_name};
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(perch_pipe_new(NULL, &r, &w), 0);
		struct perch_tls_opts no = {.server_name = names[i]};
		assert_int_equal(perch_tls_new(cctx, loop, r, w, &no, &t), -EINVAL);
		assert_int_equal(ERR_peek_error(), 0);
	}
	perch_tls_ctx_free(cctx);
	perch_loop_free(loop);
	/* The first error says why: a key given as the certificate has "no start line". */
	o = (struct perch_tls_ctx_opts){.role = PERCH_TLS_SERVER, .cert_file = cert("server.key"),
					.key_file = cert("server.key")};
	assert_int_equal(perch_tls_ctx_new(&o, &ctx, why, sizeof(why)), -EINVAL);
	if (!strstr(why, "no start line"))
		fail_msg("why: %s", why);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_handshake_agrees_alpn_and_carries_bytes_both_ways),
		cmocka_unit_test(an_error_left_on_the_threads_queue_fails_no_session),
		cmocka_unit_test(a_short_record_decrypted_inside_another_sessions_read_keeps_its_room),
		cmocka_unit_test(a_long_record_decrypted_inside_another_sessions_read_keeps_its_room),
		cmocka_unit_test(a_writer_completed_inside_openssls_read_sends_close_notify_after_it),
		cmocka_unit_test(a_writer_completed_then_freed_inside_openssls_read_sends_close_notify),
		cmocka_unit_test(a_flush_completed_and_freed_inside_openssls_read_ends_with_no_close_notify),
		cmocka_unit_test(a_flush_completed_and_freed_between_turns_ends_with_no_close_notify),
		cmocka_unit_test(an_error_left_inside_openssls_read_fails_no_session),
		cmocka_unit_test(an_end_with_plaintext_to_send_inside_openssls_read_waits_for_the_run),
		cmocka_unit_test(bytes_written_before_the_handshake_leave_after_it),
		cmocka_unit_test(a_mebibyte_each_way_arrives_whole_and_in_order),
		cmocka_unit_test(close_notify_is_the_readers_clean_end),
		cmocka_unit_test(plaintext_http_to_the_server_fails_at_once_saying_so),
		cmocka_unit_test(a_garbage_client_hello_fails_the_handshake),
		cmocka_unit_test(a_handshake_cut_short_is_truncation),
		cmocka_unit_test(a_silent_client_times_the_handshake_out),
		cmocka_unit_test(an_established_stream_ended_without_close_notify_is_truncation),
		cmocka_unit_test(a_client_trusting_another_ca_refuses_the_server),
		cmocka_unit_test(a_client_refuses_an_expired_certificate),
		cmocka_unit_test(a_client_refuses_a_certificate_for_another_name),
		cmocka_unit_test(a_client_checks_an_address_against_the_certificates_ip_names),
		cmocka_unit_test(a_second_session_resumes_with_the_first_ones_ticket),
		cmocka_unit_test(a_server_picks_its_context_by_the_name_asked_for),
		cmocka_unit_test(a_reader_that_never_reads_holds_the_writer_back),
		cmocka_unit_test(a_server_context_from_pem_in_memory_serves_a_handshake),
		cmocka_unit_test(a_cert_pem_with_a_broken_certificate_after_the_leaf_is_refused),
		cmocka_unit_test(a_session_freed_off_its_loop_thread_takes_its_deadline_with_it),
		cmocka_unit_test(a_session_ended_with_no_after_is_freed),
		cmocka_unit_test(a_session_ended_while_its_flush_waits_on_an_in_memory_pipe_ends_once),
		cmocka_unit_test(a_session_ended_then_closed_from_another_thread_ends_on_the_loop),
		cmocka_unit_test(an_end_from_a_read_sends_the_records_its_step_staged),
		cmocka_unit_test(an_end_right_after_the_writers_complete_still_sends_close_notify),
		cmocka_unit_test(an_end_sends_all_its_waiting_flush_holds_then_close_notify),
		cmocka_unit_test(an_end_inside_the_run_sends_the_flush_made_there),
		cmocka_unit_test(an_end_inside_the_run_sends_a_flush_not_taken_yet),
		cmocka_unit_test(an_end_whose_flush_never_ends_runs_after_once_at_its_deadline),
		cmocka_unit_test(an_end_made_inside_its_own_flush_still_sends_the_rest),
		cmocka_unit_test(an_end_from_a_continuation_inside_a_ciphertext_advance_waits_for_the_run),
		cmocka_unit_test(an_end_with_plaintext_to_send_inside_a_ciphertext_advance_waits_for_the_run),
		cmocka_unit_test(both_sessions_freed_inside_the_flush_that_feeds_one),
		cmocka_unit_test(an_end_inside_the_run_whose_flush_fails_there_runs_after_at_once),
		cmocka_unit_test(plaintext_ends_used_off_the_loop_thread_lose_nothing),
		cmocka_unit_test(a_session_freed_by_its_readers_continuation_outlives_the_run),
		cmocka_unit_test(a_session_freed_inside_its_first_run_outlives_it),
		cmocka_unit_test(a_plaintext_write_on_the_loop_stages_in_its_pool),
		cmocka_unit_test(a_record_sized_write_on_the_loop_leaves_as_one_record),
		cmocka_unit_test(records_openssl_holds_are_read_without_more_ciphertext),
		cmocka_unit_test(a_tls_server_echoes_a_perch_client_over_tcp),
		cmocka_unit_test(a_session_ended_as_its_last_flush_leaves_ends_cleanly_over_tcp),
		cmocka_unit_test(a_server_refuses_a_client_context_and_keeps_nothing),
		cmocka_unit_test(bad_contexts_are_refused_saying_why),
	};
	make_certs();
	int failed = RUN_ON_BOTH_BACKENDS("tls", tests, backend);
	remove_certs();
	return failed;
}
