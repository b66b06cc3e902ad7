/* stress/race_tls.c: races through the TLS layer: a plaintext flush handed over off the loop while the engine runs, a parked plaintext read against the close beneath. */
/*
 * Actor 0 is the loop's thread: its half is one turn of the loop, which
 * runs both sessions' engines (a byte the server flushed in setup crosses
 * to the client: the client's engine decrypts it). Actor 1 is another
 * thread using the client's plaintext ends. The judge, on actor 0's thread
 * too, turns the loop until the round's work is delivered, a bounded
 * number of turns: a hand-over or a wake-up that was lost never is.
 *
 * Each race is judged by stress/harness.c: it fails unless its two halves
 * overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS), free and scheduled, and every round
 * delivered exactly once. Mutants 381, 385, 386 and 456 fail them.
 *
 * One client/server pair over in-memory pipes serves every round of the
 * flush race (a handshake a round would cost more than the race); the
 * close race makes a pair a round, resumed from the first one's ticket.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <perch.h>

#include "atomic.h"
#include "harness.h"
#include "../pipes/pipe_internal.h"
#include "../pipes/tls_internal.h"

#define JUDGE_TURNS 64   /* turns the judge allows the round's work: each hand-over needs one or two */

struct tls_race {
	struct perch_loop *loop;
	struct perch_tls_ctx *cctx, *sctx;
	struct perch_tls *client, *server;
	char certs[64];
	bool established;
	uint64_t resumed;              /* handshakes that resumed the last session's ticket */
	SSL_SESSION *ticket;           /* the first session's: every later one resumes a copy */
	/* the round's */
	int rc;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	uint32_t deliveries;           /* deliveries of the round's parked read or flush */
	void (*read_ready)(struct perch_recv_listener *, struct perch_conn *, uint64_t);
	void (*flush_done)(struct perch_flush_listener *, struct perch_conn *, uint64_t, int);
};

/* One race runs at a time: the counting wrappers find their round's state here. */
static struct tls_race *current;

static void counted_read_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	perch__faa_u32(&current->deliveries, 1);
	current->read_ready(l, c, cookie);
}

static void counted_flush_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie,
			       int result)
{
	perch__faa_u32(&current->deliveries, 1);
	current->flush_done(l, c, cookie, result);
}

/* Counts each delivery to the plaintext ends of `t` before the adapter sees it. */
static void count_deliveries(struct tls_race *s, struct perch_tls *t)
{
	struct perch_pipe_reader *r = perch_tls_reader(t);
	struct perch_pipe_writer *w = perch_tls_writer(t);
	s->read_ready = r->listener.on_recv_ready;
	r->listener.on_recv_ready = counted_read_ready;
	s->flush_done = w->listener.on_flush_done;
	w->listener.on_flush_done = counted_flush_done;
}

static void make_certs(struct tls_race *s)
{
	snprintf(s->certs, sizeof(s->certs), "/tmp/perch-race-tls-XXXXXX");
	char cmd[256];
	if (!mkdtemp(s->certs) ||
	    snprintf(cmd, sizeof(cmd), "sh %s %s", TLS_CERTS_SCRIPT, s->certs) >= (int)sizeof(cmd) ||
	    system(cmd) != 0) {
		fprintf(stderr, "race_tls: %s failed\n", TLS_CERTS_SCRIPT);
		abort();
	}
}

static struct perch_tls_ctx *ctx_for(struct tls_race *s, int role)
{
	char crt[128], key[128], ca[128], why[256];
	snprintf(crt, sizeof(crt), "%s/server.pem", s->certs);
	snprintf(key, sizeof(key), "%s/server.key", s->certs);
	snprintf(ca, sizeof(ca), "%s/ca.pem", s->certs);
	struct perch_tls_ctx_opts o = {.role = role};
	if (role == PERCH_TLS_SERVER) {
		o.cert_file = crt;
		o.key_file = key;
	} else {
		o.ca_file = ca;
	}
	struct perch_tls_ctx *ctx;
	if (perch_tls_ctx_new(&o, &ctx, why, sizeof(why)) != 0) {
		fprintf(stderr, "race_tls: %s\n", why);
		abort();
	}
	return ctx;
}

static void *tls_create(void)
{
	struct tls_race *s = calloc(1, sizeof(*s));
	current = s;
	make_certs(s);
	/* Not run here: actor 0's thread must be the first to turn it, and so its owner. */
	if (perch_loop_new(NULL, &s->loop) != 0)
		abort();
	s->sctx = ctx_for(s, PERCH_TLS_SERVER);
	s->cctx = ctx_for(s, PERCH_TLS_CLIENT);
	/*
	 * TLS 1.2: its resumption is an abbreviated handshake with no key
	 * exchange, so a session a round costs little next to 1.3's (which
	 * always derives a new ECDHE key): the layer is the same either way.
	 */
	if (SSL_CTX_set_max_proto_version(s->cctx->ssl, TLS1_2_VERSION) != 1)
		abort();
	return s;
}

static void pair_free(struct tls_race *s)
{
	perch_tls_free(s->client);
	perch_tls_free(s->server);
	s->client = s->server = NULL;
	s->established = false;
}

static void tls_destroy(void *p)
{
	struct tls_race *s = p;
	pair_free(s);
	if (s->resumed)
		fprintf(stderr, "race_tls: %llu handshakes resumed a ticket\n", (unsigned long long)s->resumed);
	SSL_SESSION_free(s->ticket);
	perch_tls_ctx_free(s->cctx);
	perch_tls_ctx_free(s->sctx);
	perch_loop_free(s->loop);
	current = NULL;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", s->certs);
	if (system(cmd) != 0)
		fprintf(stderr, "race_tls: could not remove %s\n", s->certs);
	free(s);
}

/* A client and a server over two in-memory pipes, established (actor 0's thread). */
static void pair_new(struct tls_race *s)
{
	struct perch_pipe_reader *cr, *sr;
	struct perch_pipe_writer *cw, *sw;
	if (perch_pipe_new(NULL, &sr, &cw) != 0 || perch_pipe_new(NULL, &cr, &sw) != 0)
		abort();
	struct perch_tls_opts co = {.server_name = "localhost"};
	if (perch_tls_new(s->sctx, s->loop, sr, sw, NULL, &s->server) != 0 ||
	    perch_tls_new(s->cctx, s->loop, cr, cw, &co, &s->client) != 0)
		abort();
	for (int i = 0; i < 1000 && !(perch_tls_established(s->client) && perch_tls_established(s->server)); i++)
		perch_loop_run_once(s->loop, 0);
	if (!perch_tls_established(s->client) || !perch_tls_established(s->server)) {
		char why[200];
		perch_tls_error(s->client, why, sizeof(why));
		fprintf(stderr, "race_tls: no handshake: %s\n", why);
		abort();
	}
	s->established = true;
	s->resumed += perch_tls_resumed(s->client);
	/* A copy: the live one is marked unresumable if this client fails. */
	SSL_SESSION *live = s->ticket ? NULL : perch__tls_ctx_cached(s->cctx, "localhost");
	if (live) {
		s->ticket = SSL_SESSION_dup(live);
		SSL_SESSION_free(live);
	}
	count_deliveries(s, s->client);
	count_deliveries(s, s->server);
}

/* Takes every plaintext byte waiting on `t` (actor 0's thread, between turns); returns how many. */
static size_t take_all(struct perch_tls *t, struct perch_read_result *last)
{
	struct perch_read_result r;
	if (perch_pipe_try_read(perch_tls_reader(t), &r) != 0)
		return 0;
	perch_pipe_advance_to(perch_tls_reader(t), r.len, r.len);
	if (last)
		*last = r;
	return r.len;
}

/* ---- a plaintext flush off the loop thread while the engine runs ---- */

static void flush_setup(void *p, uint64_t round)
{
	struct tls_race *s = p;
	if (!s->established)
		pair_new(s);
	s->rc = 0;
	s->deliveries = 0;
	s->h = (struct perch_vtask_handle){NULL, 0};
	/* Work for actor 0's turn: a byte from the server, posted (between turns), decrypted by the client. */
	if (perch_pipe_write(perch_tls_writer(s->server), "s", 1) != 0)
		abort();
	struct perch_vtask_handle h;
	int rc = perch_pipe_flush(perch_tls_writer(s->server), &h);
	if (rc != 0 && rc != PERCH_PENDING)
		abort();
	/*
	 * And, every other round, a kick posted for the client: the turn runs
	 * its engine from the inbox too, so actor 1's hand-over may find that
	 * kick still posted while the run looks for a chain (kick_run must take
	 * it down first). Not every round: a second run a turn picks up a chain
	 * the first stranded, and mutant 381 strands one.
	 */
	if (round & 1)
		perch__tls_kick_later(s->client);
}

static void loop_turn(void *p, uint64_t round)
{
	struct tls_race *s = p;
	perch_loop_run_once(s->loop, 0);
}

static void client_flush_off_loop(void *p, uint64_t round)
{
	struct tls_race *s = p;
	s->rc = perch_pipe_write(perch_tls_writer(s->client), "c", 1);
	if (s->rc == 0)
		s->rc = perch_pipe_flush(perch_tls_writer(s->client), &s->h);
}

static bool flush_complete(struct tls_race *s)
{
	return s->rc == 0 || (s->rc == PERCH_PENDING && perch_vtask_status(s->h) == 0);
}

static bool judge_flush_vs_engine(struct race *r, void *p, uint64_t round)
{
	struct tls_race *s = p;
	if (s->rc != 0 && s->rc != PERCH_PENDING) {
		race_fail(r, round, "the plaintext flush returned %d", s->rc);
		return false;
	}
	race_branch(r, flush_complete(s) ? 0 : 1);
	size_t to_server = 0, to_client = 0;
	for (int i = 0; i < JUDGE_TURNS && !(flush_complete(s) && to_server == 1 && to_client == 1); i++) {
		perch_loop_run_once(s->loop, 0);
		to_server += take_all(s->server, NULL);
		to_client += take_all(s->client, NULL);
	}
	if (!flush_complete(s)) {
		race_fail(r, round, "the plaintext flush never completed (%d turns): a lost hand-over", JUDGE_TURNS);
		return false;
	}
	int64_t result = 0;
	if (s->rc == PERCH_PENDING && (perch_vtask_result(s->h, &result) != 0 || result != 0)) {
		race_fail(r, round, "the plaintext flush completed with %lld", (long long)result);
		return false;
	}
	if (to_server != 1 || to_client != 1) {
		race_fail(r, round, "%zu bytes reached the server, %zu the client (1 each)", to_server, to_client);
		return false;
	}
	/* The server's flush parks too (its delivery is counted): at most one each. */
	if (s->deliveries > 2) {
		race_fail(r, round, "%u deliveries for two flushes", s->deliveries);
		return false;
	}
	return true;
}

const struct race_def race_tls_flush_off_loop_vs_engine = {
	.name = "tls: a plaintext flush off the loop is handed over while the engine runs",
	.actors = 2, .create = tls_create, .destroy = tls_destroy, .setup = flush_setup,
	.actor = {loop_turn, client_flush_off_loop}, .judge = judge_flush_vs_engine,
	.branch_names = {"done by the round's end", "done in the judge's turns"},
};

/* ---- a parked plaintext read off the loop against the end of the ciphertext beneath ---- */

/*
 * The client's cache gets a copy of the first session's ticket: a round
 * whose client fails (the flush race's) leaves its session unresumable,
 * which would make every later handshake a full one.
 */
static void offer_ticket(struct tls_race *s)
{
	if (!s->ticket)
		return;   /* the first handshake is a full one: pair_new keeps its ticket */
	SSL_SESSION *copy = SSL_SESSION_dup(s->ticket);
	if (!copy)
		abort();
	pthread_mutex_lock(&s->cctx->cache_lock);
	SSL_SESSION_free(s->cctx->cached);
	s->cctx->cached = copy;
	pthread_mutex_unlock(&s->cctx->cache_lock);
}

static void read_setup(void *p, uint64_t round)
{
	struct tls_race *s = p;
	pair_free(s);
	offer_ticket(s);
	pair_new(s);
	s->rc = 0;
	s->deliveries = 0;
	s->h = (struct perch_vtask_handle){NULL, 0};
	memset(&s->res, 0, sizeof(s->res));
}

/*
 * The client goes, without close_notify: its ciphertext writer's end
 * reaches the server as truncation. (Freed while open, its session
 * stays resumable: the next round's handshake is a resumption.)
 */
static void client_gone_on_loop(void *p, uint64_t round)
{
	struct tls_race *s = p;
	perch_tls_free(s->client);
	s->client = NULL;
	perch_loop_run_once(s->loop, 0);
}

static void server_read_off_loop(void *p, uint64_t round)
{
	struct tls_race *s = p;
	s->rc = perch_pipe_read(perch_tls_reader(s->server), &s->res, &s->h);
}

static bool judge_read_vs_end(struct race *r, void *p, uint64_t round)
{
	struct tls_race *s = p;
	if (s->rc == 0) {
		race_branch(r, 0);
		if (s->deliveries != 0) {
			race_fail(r, round, "served at once and delivered %u times", s->deliveries);
			return false;
		}
	} else if (s->rc == PERCH_PENDING) {
		race_branch(r, 1);
		for (int i = 0; i < JUDGE_TURNS && perch_vtask_status(s->h) == PERCH_PENDING; i++)
			perch_loop_run_once(s->loop, 0);
		if (s->deliveries != 1) {
			race_fail(r, round, "the parked read was delivered %u times", s->deliveries);
			return false;
		}
		int64_t result = -1;
		if (perch_vtask_result(s->h, &result) != 0 || result != 0) {
			race_fail(r, round, "the parked read %s (%lld)",
				  perch_vtask_status(s->h) == PERCH_PENDING ? "was never delivered" : "failed",
				  (long long)result);
			return false;
		}
		/* Delivered once: the next read is served at once, with the end. */
		if (perch_pipe_read(perch_tls_reader(s->server), &s->res, &s->h) != 0) {
			race_fail(r, round, "the read after the delivery was not served");
			return false;
		}
	} else {
		race_fail(r, round, "the plaintext read returned %d", s->rc);
		return false;
	}
	perch_pipe_advance_to(perch_tls_reader(s->server), s->res.len, s->res.len);
	/* Truncation, or the pipe's own end (-EPIPE): a failure either way, never a clean end. */
	if (s->res.error == 0 || s->res.completed) {
		race_fail(r, round, "the read says error %d, completed %d: not a failure", s->res.error,
			  s->res.completed);
		return false;
	}
	return true;
}

const struct race_def race_tls_read_vs_cipher_end = {
	.name = "tls: a parked plaintext read off the loop races the peer's end, told once",
	.actors = 2, .create = tls_create, .destroy = tls_destroy, .setup = read_setup,
	.actor = {client_gone_on_loop, server_read_off_loop}, .judge = judge_read_vs_end,
	.branch_names = {"served at once (failed)", "parked, delivered by the loop"},
};

/* ---- a plaintext flush off the loop against the peer's end ---- */

/* The server goes: the client's records find no reader, and its stream ends. */
static void server_gone_on_loop(void *p, uint64_t round)
{
	struct tls_race *s = p;
	perch_tls_free(s->server);
	s->server = NULL;
	perch_loop_run_once(s->loop, 0);
}

static bool judge_flush_vs_end(struct race *r, void *p, uint64_t round)
{
	struct tls_race *s = p;
	if (s->rc != 0 && s->rc != PERCH_PENDING) {
		/* Refused at once: the session had failed already; nothing parked, nothing delivered. */
		race_branch(r, 0);
		if (s->deliveries != 0) {
			race_fail(r, round, "refused (%d) and delivered %u times", s->rc, s->deliveries);
			return false;
		}
		return true;
	}
	for (int i = 0; i < JUDGE_TURNS && !flush_complete(s); i++)
		perch_loop_run_once(s->loop, 0);
	if (!flush_complete(s)) {
		race_fail(r, round, "the plaintext flush never completed (%d turns)", JUDGE_TURNS);
		return false;
	}
	int64_t result = 0;
	if (s->rc == PERCH_PENDING)
		perch_vtask_result(s->h, &result);
	race_branch(r, result == 0 ? 1 : 2);
	if (s->rc == PERCH_PENDING && s->deliveries != 1) {
		race_fail(r, round, "the parked flush was delivered %u times", s->deliveries);
		return false;
	}
	return true;
}

const struct race_def race_tls_flush_vs_peer_end = {
	.name = "tls: a plaintext flush off the loop races the peer's end, told once",
	.actors = 2, .create = tls_create, .destroy = tls_destroy, .setup = read_setup,
	.actor = {server_gone_on_loop, client_flush_off_loop}, .judge = judge_flush_vs_end,
	.branch_names = {"refused at once", "completed (0)", "failed"},
};
