/* tests/test_tls_oom.c: out of memory at each allocation in turn while TLS contexts and sessions are made and speak. */
#include "config.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_prelude.h"
#include "tls_test_certs.h"

#include <perch.h>
#include <perch/segs.h>
#include <perch/tls.h>

/*
 * OpenSSL's allocations come here (set before its first), and perch's
 * malloc and calloc (the test links with --wrap for both): armed with n,
 * the n-th allocation from now fails.
 */
static int fails_in;
static int fails_seen;

static bool fail_now(void)
{
	if (fails_in > 0 && --fails_in == 0) {
		fails_seen++;
		return true;
	}
	return false;
}

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);

void *__wrap_malloc(size_t size)
{
	return fail_now() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return fail_now() ? NULL : __real_calloc(n, size);
}

static void *oom_malloc(size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return fail_now() ? NULL : __real_malloc(n);
}

static void *oom_realloc(void *p, size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return fail_now() ? NULL : realloc(p, n);
}

static void oom_free(void *p, const char *file, int line)
{
	(void)file;
	(void)line;
	free(p);
}

/* The most allocations one call is swept over: a bound, not a guess of the count. */
#define SWEEP_MAX 20000

/*
 * Fails the 1st, 2nd, ... allocation of `make(arg)` in turn until one run
 * makes no allocation fail. Each run must return 0 (OpenSSL got past the
 * failure) or -ENOMEM, or for a context -EINVAL too (some of OpenSSL's
 * PEM reads fail for want of memory saying only "PEM lib"), and leave no
 * OpenSSL error on the thread; ASan's leak check sees what a failed run
 * left behind. Returns the allocations of a whole run, plus one.
 */
static int sweep(int (*make)(void *arg), void *arg, bool einval_too)
{
	for (int n = 1; n <= SWEEP_MAX; n++) {
		ERR_clear_error();
		fails_seen = 0;
		fails_in = n;
		int rc = make(arg);
		fails_in = 0;
		if (rc != 0 && rc != -ENOMEM && !(einval_too && rc == -EINVAL))
			fail_msg("allocation %d failed: %d", n, rc);
		if (ERR_peek_error() != 0) {
			char e[200];
			ERR_error_string_n(ERR_peek_error(), e, sizeof(e));
			fail_msg("allocation %d failed (%d): OpenSSL's error is left on the thread: %s", n, rc, e);
		}
		if (!fails_seen) {
			assert_int_equal(rc, 0);
			return n;
		}
	}
	fail_msg("more than %d allocations", SWEEP_MAX);
	return 0;
}

static struct perch_loop *loop;
static struct perch_tls_ctx *client_ctx, *server_ctx;
/* For the handshakes: no tickets, so that every run makes a full handshake, none resumes. */
static struct perch_tls_ctx *hs_client_ctx, *sni_server_ctx;

/* A context of the options `arg`, freed at once when made. */
static int make_ctx(void *arg)
{
	struct perch_tls_ctx *ctx = NULL;
	char why[200];
	int rc = perch_tls_ctx_new(arg, &ctx, why, sizeof(why));
	perch_tls_ctx_free(ctx);
	return rc;
}

/* A session of `arg`'s context over a fresh in-memory pipe pair, freed at once when made. */
static int make_session(void *arg)
{
	struct perch_tls_ctx *ctx = arg;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	if (perch_pipe_new(NULL, &r, &w) != 0)
		return -ENOMEM;
	struct perch_tls_opts o = {.server_name = ctx == client_ctx ? "localhost" : NULL};
	struct perch_tls *t = NULL;
	int rc = perch_tls_new(ctx, loop, r, w, &o, &t);
	perch_tls_free(t);
	for (int i = 0; i < 4; i++)
		perch_loop_run_once(loop, 0);
	return rc;
}

/* The server's SNI chooser: every name moves the session to the second server context. */
static struct perch_tls_ctx *sni_ctx;

static int choose_sni_ctx(void *arg, const char *name, struct perch_tls_ctx **use)
{
	(void)arg;
	(void)name;
	*use = sni_ctx;
	return 0;
}

/* Whether a handshake is over: both ends established, or one failed. */
static bool handshake_over(struct perch_tls *c, struct perch_tls *s)
{
	return (perch_tls_established(c) && perch_tls_established(s)) || perch_tls_error(c, NULL, 0) ||
	       perch_tls_error(s, NULL, 0);
}

/* The first failure either session has told, as the sweep takes it; 0 while neither failed. */
static int told_failure(struct perch_tls *a, struct perch_tls *b)
{
	return perch_tls_error(a, NULL, 0) || perch_tls_error(b, NULL, 0) ? -ENOMEM : 0;
}

/*
 * Writes and flushes `msg` on a's plaintext writer and reads it whole on
 * b's reader, turning the loop: 0 once b read it and a's flush completed;
 * -ENOMEM when a call, the flush or either session failed; -EBADMSG for
 * other bytes; -ETIMEDOUT when nothing moved in 1,000 turns.
 */
static int carry(struct perch_tls *a, struct perch_tls *b, const char *msg)
{
	size_t len = strlen(msg), got = 0;
	struct perch_pipe_writer *w = perch_tls_writer(a);
	struct perch_vtask_handle flush;
	if (perch_pipe_write(w, msg, len) != 0)
		return -ENOMEM;
	int rc = perch_pipe_flush(w, &flush);
	if (rc != 0 && rc != PERCH_PENDING)
		return -ENOMEM;
	bool flushing = rc == PERCH_PENDING;
	for (int turn = 0; turn < 1000; turn++) {
		int64_t flushed = 0;
		if (flushing && perch_vtask_status(flush) != PERCH_PENDING) {
			flushing = false;
			if (perch_vtask_result(flush, &flushed) != 0 || flushed != 0)
				return -ENOMEM;
		}
		struct perch_pipe_reader *rd = perch_tls_reader(b);
		struct perch_read_result r;
		rc = got == len ? -EAGAIN : perch_pipe_try_read(rd, &r);
		if (rc == 0) {
			if (r.error || r.completed || r.closed || r.canceled)
				return -ENOMEM;   /* the session's failure, told to its reader */
			if (r.len > len || !perch_segs_equal(&r, 0, msg, r.len))
				return -EBADMSG;
			got = r.len;
			perch_pipe_advance_to(rd, got == len ? len : 0, got);   /* a part: wait for the rest */
		} else if (rc != -EAGAIN) {
			return -ENOMEM;
		}
		if (got == len && !flushing)
			return 0;
		if ((rc = told_failure(a, b)) != 0)
			return rc;
		perch_loop_run_once(loop, 0);
	}
	return -ETIMEDOUT;
}

/*
 * A client and a server session over crossed in-memory pipes, turned
 * until their handshake is over (and, with `arg`, a message carried each
 * way), then freed. Returns 0 for a handshake whose ALPN says the SNI
 * moved the server; -ENOMEM when a session could not be made, or the
 * handshake or a message failed and said so; else an error the sweep
 * fails on: -ETIMEDOUT when it neither ended nor failed (a lost failure),
 * -EPROTOTYPE when it ended on the first context, -EBADMSG for bytes
 * other than those sent.
 */
static int make_handshake(void *arg)
{
	(void)arg;
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	if (perch_pipe_new(NULL, &sr, &cw) != 0)
		return -ENOMEM;
	if (perch_pipe_new(NULL, &cr, &sw) != 0) {
		perch_pipe_reader_free(sr);
		perch_pipe_writer_free(cw);
		return -ENOMEM;
	}
	struct perch_tls *c = NULL, *s = NULL;
	struct perch_tls_opts so = {0}, co = {.server_name = "localhost"};
	int rc = perch_tls_new(sni_server_ctx, loop, sr, sw, &so, &s);
	if (rc == 0)
		rc = perch_tls_new(hs_client_ctx, loop, cr, cw, &co, &c);
	else {
		perch_pipe_reader_free(cr);
		perch_pipe_writer_free(cw);
	}
	for (int i = 0; rc == 0 && !handshake_over(c, s); i++)
		if (i == 1000)
			rc = -ETIMEDOUT;
		else
			perch_loop_run_once(loop, 0);
	if (rc == 0 && !(perch_tls_established(c) && perch_tls_established(s)))
		rc = -ENOMEM;   /* failed for want of memory: what the sweep asks */
	const char *alpn = rc == 0 ? perch_tls_alpn(c) : NULL;
	if (rc == 0 && (!alpn || strcmp(alpn, "http/1.1") != 0))
		rc = -EPROTOTYPE;   /* only the SNI's context speaks ALPN: the move was lost */
	if (rc == 0 && arg)
		rc = carry(c, s, "ping");
	if (rc == 0 && arg)
		rc = carry(s, c, "pong");
	perch_tls_free(c);
	perch_tls_free(s);
	for (int i = 0; i < 4; i++)
		perch_loop_run_once(loop, 0);
	return rc;
}

static void contexts_fail_cleanly_at_every_allocation(void **state)
{
	(void)state;
	struct perch_tls_ctx_opts so = {.role = PERCH_TLS_SERVER, .cert_file = cert("server.pem"),
					.key_file = cert("server.key"), .alpn = "http/1.1"};
	struct perch_tls_ctx_opts co = {.role = PERCH_TLS_CLIENT, .ca_file = cert("ca.pem"), .alpn = "h2,http/1.1"};
	int server_n = sweep(make_ctx, &so, true);
	int client_n = sweep(make_ctx, &co, true);
	print_message("a server context made %d allocations, a client's %d: each failed in turn\n",
		      server_n - 1, client_n - 1);
	assert_true(server_n > 10 && client_n > 10);
}

static void sessions_fail_cleanly_at_every_allocation(void **state)
{
	(void)state;
	int client_n = sweep(make_session, client_ctx, false);
	int server_n = sweep(make_session, server_ctx, false);
	print_message("a client session made %d allocations, a server's %d: each failed in turn\n",
		      client_n - 1, server_n - 1);
	assert_true(client_n > 5 && server_n > 5);
}

static void handshakes_fail_cleanly_at_every_allocation(void **state)
{
	(void)state;
	int n = sweep(make_handshake, NULL, false);
	print_message("a handshake (SNI moving the server to another context) made %d allocations: each failed in turn\n",
		      n - 1);
	assert_true(n > 100);
}

static void exchanges_fail_cleanly_at_every_allocation(void **state)
{
	(void)state;
	int n = sweep(make_handshake, "and a message each way", false);
	print_message("a handshake and a message each way made %d allocations, perch's and OpenSSL's: "
		      "each failed in turn\n", n - 1);
	assert_true(n > 100);
}

int main(void)
{
#ifdef __SANITIZE_THREAD__
	/* One thread, and 26 s under TSan: nothing for it to check that the plain and ASan runs do not. */
	fprintf(stderr, "test_tls_oom: skipped under TSan (one thread: no race to find)\n");
	return 77;
#endif
	/* Before OpenSSL's first allocation: it takes no other allocator once it has one. */
	if (!CRYPTO_set_mem_functions(oom_malloc, oom_realloc, oom_free)) {
		fprintf(stderr, "test_tls_oom: OpenSSL allocated before main; cannot count its allocations\n");
		return 1;
	}
	make_certs();
	/* One of each first, whole: OpenSSL's one-time set-up is not what is swept. */
	char why[200];
	struct perch_tls_ctx_opts so = {.role = PERCH_TLS_SERVER, .cert_file = cert("server.pem"),
					.key_file = cert("server.key")};
	struct perch_tls_ctx_opts co = {.role = PERCH_TLS_CLIENT, .ca_file = cert("ca.pem")};
	struct perch_tls_ctx_opts hs_so = so, hs_co = co, moved_so = so;
	hs_so.no_tickets = hs_co.no_tickets = moved_so.no_tickets = true;
	hs_so.sni = choose_sni_ctx;
	hs_co.alpn = moved_so.alpn = "http/1.1";
	if (perch_loop_new(NULL, &loop) != 0 || perch_tls_ctx_new(&so, &server_ctx, why, sizeof(why)) != 0 ||
	    perch_tls_ctx_new(&co, &client_ctx, why, sizeof(why)) != 0 || make_session(client_ctx) != 0 ||
	    make_session(server_ctx) != 0 || perch_tls_ctx_new(&hs_co, &hs_client_ctx, why, sizeof(why)) != 0 ||
	    perch_tls_ctx_new(&moved_so, &sni_ctx, why, sizeof(why)) != 0 ||
	    perch_tls_ctx_new(&hs_so, &sni_server_ctx, why, sizeof(why)) != 0 || make_handshake("once") != 0) {
		fprintf(stderr, "test_tls_oom: the set-up failed\n");
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(contexts_fail_cleanly_at_every_allocation),
		cmocka_unit_test(sessions_fail_cleanly_at_every_allocation),
		cmocka_unit_test(handshakes_fail_cleanly_at_every_allocation),
		cmocka_unit_test(exchanges_fail_cleanly_at_every_allocation),
	};
	int failed = cmocka_run_group_tests_name("tls out of memory", tests, NULL, NULL);
	perch_tls_ctx_free(client_ctx);
	perch_tls_ctx_free(server_ctx);
	perch_tls_ctx_free(hs_client_ctx);
	perch_tls_ctx_free(sni_server_ctx);
	perch_tls_ctx_free(sni_ctx);
	perch_loop_free(loop);
	remove_certs();
	return failed;
}
