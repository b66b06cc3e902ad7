/* pipes/tls_session.c: a TLS session's life: the plaintext connection it drives, kicks to the loop, and what it says. */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "loop_internal.h"
#include "pipe_internal.h"
#include "tls_internal.h"

#define DEFAULT_HANDSHAKE_MS 10000u
#define DEFAULT_PAUSE (64u * 1024u)

/* ---- kicks: the engine runs on the loop thread ---- */

/* Disarms the session's timers; only the loop's thread can, so elsewhere it says they stay armed. */
static bool stop_timers(struct perch_tls *s)
{
	if (perch_timer_is_armed(&s->timer))
		perch_timer_stop(&s->timer);
	if (perch_timer_is_armed(&s->ktls_retry))
		perch_timer_stop(&s->ktls_retry);
	s->timers_left = perch_timer_is_armed(&s->timer) || perch_timer_is_armed(&s->ktls_retry);
	return !s->timers_left;
}

static void kick_run(struct perch_loop *loop, struct perch__msg *m)
{
	struct perch_tls *s = perch__container_of(m, struct perch_tls, kick_msg);
	/* Taken down before the engine looks at what was handed over: a hand-over after it posts again. */
	perch__xchg_u32(&s->kick_posted, 0);
	perch__fence_rmw_then_load();
	if (!s->freed) {
		perch__tls_run_held(s);   /* the posted kick's reference, dropped below */
	} else {
		if (s->free_left)
			perch__tls_free_rest(s);
		perch__tls_drop_sends(s, -EPIPE);   /* a chain ended inside tls_ops.send before the free */
		/* perch_tls_end's flush ended on another thread, or the end was made inside a run. */
		if (s->after && (s->end_now || !s->cout_flushing || (perch__load_u32(&s->asks) & TLS_ASK_FLUSHED)))
			perch__tls_run_after(s);
		if (s->timers_left)
			stop_timers(s);
	}
	perch__conn_unref(s->plain);
}

void perch__tls_kick_later(struct perch_tls *s)
{
	/* After the caller's hand-over (a read-modify-write), before the look: pairs with kick_run's. */
	perch__fence_rmw_then_load();
	if (perch__load_u32(&s->kick_posted) || perch__xchg_u32(&s->kick_posted, 1))
		return;
	perch__conn_ref(s->plain);   /* the posted kick keeps the session */
	perch__inbox_push(s->loop, &s->kick_msg);
}

void perch__tls_kick(struct perch_tls *s)
{
	if (perch__loop_is_current(s->loop) && !s->in_send)
		perch__tls_run_held(s);
	else
		perch__tls_kick_later(s);
}

/* ---- the plaintext connection's transport ---- */

/*
 * A plaintext flush: the chain waits for the engine, which completes it
 * once its records were flushed. Never completed inside this call (the
 * core's contract): on the loop thread the engine runs here, with any
 * completion it reaches deferred to a kick.
 */
static void tls_send(struct perch_conn *c, struct perch__txbuf *chain)
{
	struct perch_tls *s = c->transport;
	perch__xchg_ptr((void **)&s->tx_in, chain);
	if (!perch__loop_is_current(s->loop)) {
		perch__tls_kick_later(s);   /* running, again: the loop thread's own */
		return;
	}
	if (s->running) {
		s->again = true;
		return;
	}
	s->in_send = true;
	perch__tls_run(s);
	s->in_send = false;
}

static void tls_release_seg(struct perch_seg *seg)
{
	free(seg);
}

/* The reader consumed n bytes: decryption paused for room goes on at the resume mark. */
static void tls_consumed(struct perch_conn *c, uint64_t n)
{
	struct perch_tls *s = c->transport;
	uint64_t left = perch__faa_u64(&s->unread, (uint64_t)0 - n) - n;
	perch__fence_rmw_then_load();
	if (left <= s->resume && perch__load_u32(&s->paused) && perch__xchg_u32(&s->paused, 0))
		perch__tls_kick_later(s);
}

static void tls_close(struct perch_conn *c)
{
	/* Held chains are the engine's to end (perch_tls_free ends them). */
}

/*
 * The plaintext writer completed: close_notify after what was flushed.
 * On the loop thread it is flushed now, so that a close right after
 * (a server ending its session) sends it before its FIN.
 */
static void tls_end_of_writes(struct perch_conn *c)
{
	struct perch_tls *s = c->transport;
	if (s->freed)
		return;
	perch__for_u32(&s->asks, TLS_ASK_CLOSE_NOTIFY);
	if (perch__loop_is_current(s->loop))
		perch__tls_close_notify_now(s);
	else
		perch__tls_kick_later(s);
}

/* The plaintext writer stages in its loop's pool, as a socket's does: the engine runs there. */
static struct perch__txbuf *tls_txbuf_get(struct perch_conn *c)
{
	return perch__loop_txbuf_get(((struct perch_tls *)c->transport)->loop);
}

static bool tls_txbuf_put(struct perch_conn *c, struct perch__txbuf *b)
{
	return perch__loop_txbuf_put(((struct perch_tls *)c->transport)->loop, b);
}

static void tls_destroy(struct perch_conn *c)
{
	free(c->transport);
}

static const struct perch__transport_ops tls_ops = {
	.send = tls_send,
	.release_seg = tls_release_seg,
	.close = tls_close,
	.destroy = tls_destroy,
	.consumed = tls_consumed,
	.end_of_writes = tls_end_of_writes,
	.txbuf_get = tls_txbuf_get,
	.txbuf_put = tls_txbuf_put,
	.txbuf_pooled_max = PERCH__TXBUF_CAP,   /* the engine makes a record of each buffer */
};

/* ---- handshake deadline ---- */

/* perch_tls_end's deadline passed, or could not be set: after() runs, and no flush starts now. */
static void end_out_of_time(struct perch_tls *s)
{
	s->ending = false;
	s->end_now = true;   /* for the kick, when this is inside the engine's run */
	perch__tls_run_after(s);
}

/* The session's first timer: the handshake's deadline, then perch_tls_end's. */
static void handshake_late(struct perch_timer *t, void *arg)
{
	struct perch_tls *s = arg;
	if (s->freed) {
		end_out_of_time(s);
		return;
	}
	if (s->state != TLS_HANDSHAKE)
		return;
	char why[64];
	snprintf(why, sizeof(why), "the handshake took more than %u ms", s->handshake_ms);
	perch__tls_fail(s, -ETIMEDOUT, why);
	perch__tls_run(s);   /* the alert, if one is staged */
}

/* A control record for the kernel found no room in the socket: the engine writes it again. */
static void ktls_retry_due(struct perch_timer *t, void *arg)
{
	struct perch_tls *s = arg;
	if (!s->freed)
		perch__tls_run(s);
}

/* ---- creating and freeing ---- */

/*
 * The name a client asks for (SNI) and checks the certificate against; an
 * address ("127.0.0.1", "::1") is checked against the certificate's IP
 * names and sent as no SNI, which takes host names only (RFC 6066).
 */
static int expect_name(SSL *ssl, const char *name)
{
	size_t len = strlen(name);
	if (len == 0 || len > TLSEXT_MAXLEN_host_name)
		return -EINVAL;
	unsigned char addr[sizeof(struct in6_addr)];
	if (inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1)
		return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1 ? 0 : -ENOMEM;
	if (SSL_set_tlsext_host_name(ssl, name) != 1 || SSL_set1_host(ssl, name) != 1)
		return -ENOMEM;
	return 0;
}

static int make_ssl(struct perch_tls *s, const struct perch_tls_opts *o)
{
	s->ssl = SSL_new(s->ctx->ssl);
	BIO *bio = s->ssl ? perch__tls_bio_new(s) : NULL;
	if (!bio)
		return -ENOMEM;
	SSL_set_bio(s->ssl, bio, bio);
	if (SSL_set_app_data(s->ssl, s) != 1)
		return -ENOMEM;   /* its callbacks find the session by it */
	if (s->ctx->role == PERCH_TLS_SERVER) {
		SSL_set_accept_state(s->ssl);
		return 0;
	}
	SSL_set_connect_state(s->ssl);
	const char *name = o->server_name;
	/* A chain checked with no name checked would take any certificate its CAs signed. */
	if (!name && (SSL_CTX_get_verify_mode(s->ctx->ssl) & SSL_VERIFY_PEER))
		return -EINVAL;
	int rc = name ? expect_name(s->ssl, name) : 0;
	if (rc != 0)
		return rc;
	SSL_SESSION *sess = perch__tls_ctx_cached(s->ctx, name);
	if (sess) {
		SSL_set_session(s->ssl, sess);
		SSL_SESSION_free(sess);
	}
	return 0;
}

static int make_plain(struct perch_tls *s)
{
	s->plain = perch__conn_new(&tls_ops, s);
	if (!s->plain)
		return -ENOMEM;
	int rc = perch__pipe_reader_init(&s->pr, s->plain);
	if (rc == 0)
		rc = perch__pipe_writer_init(&s->pw, s->plain, false);
	return rc;
}

/* Undoes what a failed perch_tls_new made (no kick was posted, the engine never ran). */
static void unmake(struct perch_tls *s)
{
	s->freed = true;   /* the plaintext writer's end asks for a kick, which must not run */
	perch_pipe_reader_free(s->pr);
	perch_pipe_writer_free(s->pw);
	perch_pipe_reader_free(s->cr);
	perch_pipe_writer_free(s->cw);
	/* OpenSSL takes a session freed before close_notify for a failed one, not to be resumed. */
	if (s->state == TLS_OPEN)
		SSL_set_shutdown(s->ssl, SSL_SENT_SHUTDOWN);
	SSL_free(s->ssl);
	perch_tls_ctx_free(s->ctx);
	if (s->plain)
		perch__conn_unref(s->plain);   /* destroy frees s */
	else
		free(s);
}

int perch_tls_new(struct perch_tls_ctx *ctx, struct perch_loop *loop,
		  struct perch_pipe_reader *cipher_r, struct perch_pipe_writer *cipher_w,
		  const struct perch_tls_opts *opts, struct perch_tls **out)
{
	static const struct perch_tls_opts defaults;
	const struct perch_tls_opts *o = opts ? opts : &defaults;
	bool bad = !ctx || !loop || !cipher_r || !cipher_w || !out;
	struct perch_tls *s = bad ? NULL : calloc(1, sizeof(*s));
	if (!s) {
		perch_pipe_reader_free(cipher_r);
		perch_pipe_writer_free(cipher_w);
		return bad ? -EINVAL : -ENOMEM;
	}
	perch__tls_ctx_ref(ctx);
	s->ctx = ctx;
	s->loop = loop;
	s->cr = cipher_r;
	s->cw = cipher_w;
	s->kick_msg.run = kick_run;
	s->pause = o->pause_bytes ? o->pause_bytes : DEFAULT_PAUSE;
	s->resume = s->pause / 2;
	s->handshake_ms = o->handshake_ms ? o->handshake_ms : DEFAULT_HANDSHAKE_MS;
	s->path = PERCH_TLS_PATH_USERSPACE;
	s->ktls_ctrl_type = -1;
	ERR_set_mark();   /* a failure leaves the caller's thread no OpenSSL error of ours */
	int rc = make_ssl(s, o);
	if (rc == 0)
		rc = make_plain(s);
	if (rc == 0)
		rc = perch_timer_init(&s->timer, loop, handshake_late, s);
	if (rc == 0)
		rc = perch_timer_init(&s->ktls_retry, loop, ktls_retry_due, s);
	if (rc != 0) {
		unmake(s);
		ERR_pop_to_mark();
		return rc;
	}
	ERR_clear_last_mark();
	*out = s;
	/* The first run's own reference: a continuation inside it may free the session. */
	perch__conn_ref(s->plain);
	perch__tls_kick(s);
	perch__conn_unref(s->plain);
	return 0;
}

/*
 * What a close_notify needs: the ciphertext writer, OpenSSL's session and
 * their contexts. Once: an in-memory pipe's writer ends its flush inside
 * its free, which may run after(), which comes here again.
 */
static void free_cipher_side(struct perch_tls *s)
{
	SSL *ssl = s->ssl;
	struct perch_pipe_writer *cw = s->cw;
	if (!ssl)
		return;
	s->ssl = NULL;
	s->cw = NULL;
	perch_pipe_writer_free(cw);
	/* OpenSSL takes a session freed before close_notify for a failed one, not to be resumed. */
	if (s->state == TLS_OPEN)
		SSL_set_shutdown(ssl, SSL_SENT_SHUTDOWN);
	SSL_free(ssl);
	OPENSSL_cleanse(&s->ktls_keys, sizeof(s->ktls_keys));   /* handed over, and never switched to */
	perch_tls_ctx_free(s->sni_ctx);
	perch_tls_ctx_free(s->ctx);
}

void perch__tls_free_rest(struct perch_tls *s)
{
	bool ending = s->ending;   /* a flush ending inside this may end the ending */
	s->free_left = false;
	perch__tls_drop_sends(s, -EPIPE);
	perch_pipe_reader_free(s->cr);   /* a parked ciphertext read is canceled here */
	s->cr = NULL;
	if (!ending)
		free_cipher_side(s);
}

void perch_tls_free(struct perch_tls *t)
{
	if (!t || t->freed)
		return;
	struct perch_tls *s = t;
	s->freed = true;
	if (!stop_timers(s))
		perch__tls_kick_later(s);   /* its reference keeps the timers' memory until it disarms them */
	perch_pipe_reader_free(s->pr);
	perch_pipe_writer_free(s->pw);
	perch_conn_close(s->plain);
	if (s->running) {
		/* A continuation the engine runs, maybe inside OpenSSL's read: OpenSSL and the pipes stay till the kick. */
		s->free_left = true;
		perch__tls_kick_later(s);
	} else {
		perch__tls_free_rest(s);
	}
	perch__conn_unref(s->plain);
}

void perch__tls_run_after(struct perch_tls *s)
{
	void (*after)(void *) = s->after;
	void *arg = s->after_arg;
	if (!after || s->running)
		return;   /* inside the engine's run, freed there: its kick comes here again */
	if (s->free_left)
		perch__tls_free_rest(s);
	if (s->ending && perch__tls_end_waits(s))
		return;
	s->after = NULL;
	bool timer_held = s->after_timer;
	s->after_timer = false;
	stop_timers(s);   /* the close_notify's retry too, on the kernel's path */
	perch__tls_drop_sends(s, -EPIPE);   /* what the end could not send */
	/* Taken first: the free may end a flush, whose completion then finds after() gone. */
	free_cipher_side(s);
	after(arg);
	if (timer_held)
		perch__conn_unref(s->plain);   /* the timer's, last: s may go with it */
}

/* Whether an open session still has plaintext flushed to send, or a close_notify its completed writer asked for. */
static bool more_to_send(const struct perch_tls *s)
{
	if (s->state != TLS_OPEN || s->io_error)
		return false;
	bool asked = s->close_notify_wanted || (perch__load_u32(&s->asks) & TLS_ASK_CLOSE_NOTIFY);
	return (asked && !s->close_notify_sent) || (s->tx && !s->tx_encrypted) ||
	       perch__load_ptr((void *const *)&s->tx_in);
}

void perch_tls_end(struct perch_tls *s, void (*after)(void *arg), void *arg)
{
	if (!s)
		return;
	if (!after) {
		perch_tls_free(s);
		return;
	}
	perch__conn_ref(s->plain);   /* this call's: the free below may end the flush and drop the rest */
	s->ending = more_to_send(s);
	bool wait = s->cout_flushing || s->ending;
	if (wait) {
		/* Set before the free: an in-memory pipe's flush ends inside it, and runs after() there. */
		s->after = after;
		s->after_arg = arg;
		perch__conn_ref(s->plain);   /* the timer's */
		s->after_timer = true;
	}
	perch_tls_free(s);
	if (!wait)
		after(arg);
	else if (s->after && perch_timer_start(&s->timer, PERCH_TLS_END_MS) != 0)
		end_out_of_time(s);
	else if (s->after && !s->cout_flushing)
		perch__tls_run_after(s);   /* nothing under way: the rest is sent now (or after the run it was made in) */
	perch__conn_unref(s->plain);
}

/* ---- what a session says ---- */

struct perch_pipe_reader *perch_tls_reader(struct perch_tls *t)
{
	return t ? t->pr : NULL;
}

struct perch_pipe_writer *perch_tls_writer(struct perch_tls *t)
{
	return t ? t->pw : NULL;
}

bool perch_tls_established(const struct perch_tls *t)
{
	return t && t->established;
}

const char *perch_tls_alpn(const struct perch_tls *t)
{
	static __thread char name[256];
	const unsigned char *p;
	unsigned len;
	if (!perch_tls_established(t) || !t->ssl)
		return NULL;
	SSL_get0_alpn_selected(t->ssl, &p, &len);
	if (!len)
		return NULL;
	memcpy(name, p, len);
	name[len] = '\0';
	return name;
}

const char *perch_tls_version(const struct perch_tls *t)
{
	return perch_tls_established(t) && t->ssl ? SSL_get_version(t->ssl) : NULL;
}

const char *perch_tls_cipher(const struct perch_tls *t)
{
	return perch_tls_established(t) && t->ssl ? SSL_get_cipher_name(t->ssl) : NULL;
}

bool perch_tls_resumed(const struct perch_tls *t)
{
	return perch_tls_established(t) && t->ssl && SSL_session_reused(t->ssl);
}

int perch_tls_path(const struct perch_tls *t)
{
	return t ? t->path : PERCH_TLS_PATH_USERSPACE;
}

const char *perch_tls_path_reason(const struct perch_tls *t)
{
	return perch_tls_established(t) ? t->path_why : NULL;
}

int perch_tls_error(const struct perch_tls *t, char *buf, size_t len)
{
	if (!t)
		return -EINVAL;
	if (buf && len)
		snprintf(buf, len, "%s", t->reason);
	return t->error;
}
