/* pipes/tls_session.c: a TLS session's making: the plaintext connection it drives, kicks to the loop, and what it says. */
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

static void kick_run(struct perch_loop *loop, struct perch__msg *m)
{
	struct perch_tls *s = perch__container_of(m, struct perch_tls, kick_msg);
	/* Taken down before the engine looks at what was handed over: a hand-over after it posts again. */
	perch__xchg_u32(&s->kick_posted, 0);
	perch__fence_rmw_then_load();
	if (!s->freed)
		perch__tls_run_held(s);   /* the posted kick's reference, dropped below */
	else
		perch__tls_freed_kicked(s);
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

/* ---- the session's timers ---- */

/* The session's first timer: the handshake's deadline, then perch_tls_end's. */
static void handshake_late(struct perch_timer *t, void *arg)
{
	struct perch_tls *s = arg;
	if (s->freed) {
		perch__tls_end_out_of_time(s);
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

/* ---- making a session ---- */

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
