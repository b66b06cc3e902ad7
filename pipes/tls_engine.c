/* pipes/tls_engine.c: the TLS engine on the loop thread: handshake, encryption of the plaintext flushes, close_notify. */
#include "config.h"

#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "loop_internal.h"
#include "tls_internal.h"

#define STAGE_MAX (256u * 1024u)   /* ciphertext staged before it is flushed and waited for */

/* ---- plaintext flushes ---- */

/* Ends the chain being encrypted; inside tls_ops.send its completion waits for a kick. */
static void send_done(struct perch_tls *s, int result)
{
	struct perch__txbuf *chain = s->tx;
	s->tx = s->tx_at = NULL;
	s->tx_off = 0;
	s->tx_encrypted = false;
	if (s->in_send) {
		s->deferred = chain;
		s->deferred_result = result;
		s->has_deferred = true;
		perch__tls_kick_later(s);
		return;
	}
	perch__conn_send_done(s->plain, chain, result);
}

void perch__tls_drop_sends(struct perch_tls *s, int result)
{
	if (s->has_deferred) {
		s->has_deferred = false;
		perch__conn_send_done(s->plain, s->deferred, s->deferred_result);
	}
	if (s->ending)
		return;   /* perch_tls_end still sends them */
	if (s->tx)
		send_done(s, result);
	struct perch__txbuf *chain = perch__xchg_ptr((void **)&s->tx_in, NULL);
	if (chain)
		perch__conn_send_done(s->plain, chain, result);
}

/* ---- the ciphertext pipes' completions (any thread) ---- */

static void cipher_ready(void *arg, int64_t result)
{
	struct perch_tls *s = arg;
	perch__for_u32(&s->asks, TLS_ASK_CIPHER_READY);
	if (result != -ECANCELED)
		perch__tls_kick(s);
	perch__conn_unref(s->plain);   /* the parked read's */
}

static void cipher_flushed(void *arg, int64_t result)
{
	struct perch_tls *s = arg;
	/*
	 * perch_tls_end's after() runs on the loop's thread: elsewhere, the
	 * kick posted below runs it. Freed before the kick, or this is not the
	 * flush the end waits for: the kick's run may start another and end.
	 */
	bool ended = perch__loop_is_current(s->loop) && s->freed;   /* freed is the loop thread's to read */
	perch__store_u32((uint32_t *)&s->flush_result, (uint32_t)(int32_t)result);
	perch__for_u32(&s->asks, TLS_ASK_FLUSHED);
	perch__tls_kick(s);
	if (ended && !s->end_flushing)
		perch__tls_run_after(s);
	perch__conn_unref(s->plain);   /* the waited flush's */
}

/* ---- the engine's steps ---- */

/* A plaintext flush's chain handed over (tls_ops.send) becomes the one encrypted, if none is. */
static void take_handed_chain(struct perch_tls *s)
{
	/* Looked at first: tls_send's exchange is followed by a kick (or by `again` on the loop thread). */
	if (!s->tx && perch__load_ptr((void **)&s->tx_in))
		s->tx = s->tx_at = perch__xchg_ptr((void **)&s->tx_in, NULL);
}

static void take_asks(struct perch_tls *s)
{
	uint32_t asks = perch__load_u32(&s->asks) ? perch__xchg_u32(&s->asks, 0) : 0;
	if (asks & TLS_ASK_CLOSE_NOTIFY)
		s->close_notify_wanted = true;
	if (asks & TLS_ASK_CIPHER_READY)
		s->cin_parked = false;
	if (asks & TLS_ASK_FLUSHED) {
		s->cout_flushing = false;
		int rc = (int32_t)perch__load_u32((uint32_t *)&s->flush_result);
		if (rc < 0)
			s->io_error = s->io_error ? s->io_error : rc;
	}
	take_handed_chain(s);
}

static void established(struct perch_tls *s)
{
	s->state = TLS_OPEN;
	s->established = true;
	perch__tls_choose_path(s);
	if (!s->freed && perch_timer_is_armed(&s->timer))   /* freed, it is perch_tls_end's deadline */
		perch_timer_stop(&s->timer);
}

static void handshake(struct perch_tls *s)
{
	if (!s->timer_started) {
		s->timer_started = true;
		perch__tls_kernel_offer(s);
		int rc = perch_timer_start(&s->timer, s->handshake_ms);
		if (rc != 0)
			perch__tls_fail(s, rc, "the handshake's deadline could not be set");
	}
	if (s->state != TLS_HANDSHAKE)
		return;
	s->want_input = false;
	perch__tls_clear_errors();
	int r = SSL_do_handshake(s->ssl);
	if (r == 1) {
		established(s);
		return;
	}
	int e = SSL_get_error(s->ssl, r);
	if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
		perch__tls_fail_from_ssl(s, e);
}

/* Encrypts the plaintext chain into staged records, up to STAGE_MAX at a time. */
static void encrypt(struct perch_tls *s)
{
	while (s->tx_at && !s->cout_flushing && perch_pipe_writer_staged(s->cw) < STAGE_MAX) {
		struct perch__txbuf *b = s->tx_at;
		if (s->tx_off == b->len) {
			s->tx_at = b->next;
			s->tx_off = 0;
			continue;
		}
		size_t n;
		s->want_input = false;
		perch__tls_clear_errors();
		if (SSL_write_ex(s->ssl, b->bytes + s->tx_off, b->len - s->tx_off, &n) == 1) {
			s->tx_off += n;
			continue;
		}
		int e = SSL_get_error(s->ssl, 0);
		if (e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_WANT_READ)
			perch__tls_fail_from_ssl(s, e);
		return;
	}
	if (s->tx && !s->tx_at)
		s->tx_encrypted = true;
}

static void send_close_notify(struct perch_tls *s)
{
	if (!s->close_notify_wanted || s->close_notify_sent || s->tx || s->cout_flushing ||
	    s->state != TLS_OPEN)
		return;
	perch__tls_clear_errors();
	int r = SSL_shutdown(s->ssl);
	if (r >= 0) {
		s->close_notify_sent = true;
		return;
	}
	int e = SSL_get_error(s->ssl, r);
	if (e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_WANT_READ)
		perch__tls_fail_from_ssl(s, e);
}

/* Flushes the staged records; a flush that waits holds the session until it completes. */
static void flush_cipher(struct perch_tls *s)
{
	if (s->cout_flushing || perch_pipe_writer_staged(s->cw) == 0)
		return;
	s->cout_flushing = true;
	perch__conn_ref(s->plain);
	int rc = perch_pipe_flush_or_wait(s->cw, cipher_flushed, s);
	if (rc == PERCH_PENDING)
		return;
	perch__conn_unref(s->plain);
	s->cout_flushing = false;
	if (rc < 0)
		s->io_error = s->io_error ? s->io_error : rc;
	s->again = true;
}

/* A plaintext flush is done once its records are all flushed. */
static void finish_send(struct perch_tls *s)
{
	/* A failed session's records may not have left: report_failure ends the chain instead. */
	if (s->tx_encrypted && !s->cout_flushing && perch_pipe_writer_staged(s->cw) == 0 &&
	    s->state != TLS_FAILED && !s->io_error)
		send_done(s, 0);
}

/* OpenSSL wants ciphertext that is not there yet: park the read, its delivery kicks. */
static void park_cipher_read(struct perch_tls *s)
{
	if (!s->want_input || s->cin_parked || s->cin_have || s->state == TLS_FAILED)
		return;
	s->want_input = false;
	s->cin_parked = true;
	perch__conn_ref(s->plain);
	int rc = perch_pipe_read_or_wait(s->cr, &s->cin, cipher_ready, s);
	if (rc == PERCH_PENDING)
		return;
	s->cin_parked = false;
	perch__conn_unref(s->plain);
	if (rc != 0) {
		s->io_error = s->io_error ? s->io_error : rc;
		perch__tls_fail_from_ssl(s, SSL_ERROR_SYSCALL);
		return;
	}
	s->cin_have = true;   /* OpenSSL's next read takes it (or its end) */
	s->cin_off = 0;
	s->again = true;
}

/* Tells the plaintext side about a failure once, outside tls_ops.send. */
static void report_failure(struct perch_tls *s)
{
	if (!s->fail_unreported)
		return;
	if (s->in_send) {
		perch__tls_kick_later(s);   /* told outside the caller's flush */
		return;
	}
	s->fail_unreported = false;
	perch__conn_failed(s->plain, s->error);
	if (!s->freed)
		perch__tls_drop_sends(s, -EPIPE);
}

static void step(struct perch_tls *s)
{
	if (s->has_deferred && !s->in_send) {
		s->has_deferred = false;
		perch__conn_send_done(s->plain, s->deferred, s->deferred_result);
		if (s->freed)
			return;
	}
	take_asks(s);
	if (s->io_error && s->state != TLS_FAILED)
		perch__tls_fail_from_ssl(s, SSL_ERROR_SYSCALL);
	if (s->state == TLS_HANDSHAKE)
		handshake(s);
	if (s->state == TLS_OPEN) {
		encrypt(s);
		if (!s->in_send)
			perch__tls_decrypt(s);
		else if (SSL_pending(s->ssl) > 0 || (s->cin_have && s->cin_off < s->cin.len))
			perch__tls_kick_later(s);   /* decryption runs outside the caller's flush */
		if (s->freed)
			return;
		send_close_notify(s);
	}
	flush_cipher(s);
	finish_send(s);
	if (s->freed)
		return;
	park_cipher_read(s);
	report_failure(s);
}

void perch__tls_close_notify_now(struct perch_tls *s)
{
	if (s->in_openssl_read) {
		s->again = true;   /* no SSL_shutdown inside SSL_read: the run sends it once the read returned */
		s->close_notify_deferred = true;
		return;
	}
	bool nested = s->running;
	s->running = true;
	perch__conn_ref(s->plain);
	take_asks(s);
	send_close_notify(s);
	flush_cipher(s);
	s->running = nested;
	if (nested)
		s->again = true;            /* the run this is inside looks again */
	else
		perch__tls_kick_later(s);   /* what take_asks took, and a close_notify that had to wait */
	perch__conn_unref(s->plain);
}

/* The end's waited flush ended (or none was under way): whether it ended well. Takes every ask. */
static bool end_flush_ended_well(struct perch_tls *s)
{
	/* Taken, so that a kick before the next flush ends does not run after() early. */
	uint32_t asks = perch__xchg_u32(&s->asks, 0);
	if (asks & TLS_ASK_CLOSE_NOTIFY)
		s->close_notify_wanted = true;
	if (!s->cout_flushing)
		return true;
	if (!(asks & TLS_ASK_FLUSHED) || perch__load_u32((uint32_t *)&s->flush_result) != 0)
		return false;   /* it still waits, or it failed: the peer sees no clean end */
	s->cout_flushing = false;
	return true;
}

/* Stages the records of what is left to send, chain after chain, until some are staged or none is left. */
static void end_encrypt(struct perch_tls *s)
{
	for (;;) {
		take_handed_chain(s);
		encrypt(s);
		if (!s->tx || perch_pipe_writer_staged(s->cw) > 0)
			return;
		finish_send(s);   /* all in records, and they left */
		if (s->tx)
			return;       /* OpenSSL took nothing more */
	}
}

/* One round of the end: records of what is left, close_notify after them, flushed. Whether it flushed any. */
static bool end_round(struct perch_tls *s)
{
	end_encrypt(s);
	send_close_notify(s);
	/* Failed: the peer sees no clean end, so nothing more is flushed. */
	if (s->state != TLS_OPEN || s->io_error || perch_pipe_writer_staged(s->cw) == 0)
		return false;
	s->end_flushing = true;   /* a flush that ends inside its call leaves after() to this caller */
	flush_cipher(s);
	s->end_flushing = false;
	return true;
}

bool perch__tls_end_waits(struct perch_tls *s)
{
	PERCH_ASSERT(s->freed && s->ending);
	while (end_flush_ended_well(s) && end_round(s))
		if (s->cout_flushing && !(perch__load_u32(&s->asks) & TLS_ASK_FLUSHED))
			return true;
	s->ending = false;
	return false;
}

void perch__tls_run_held(struct perch_tls *s)
{
	if (s->freed)
		return;
	if (s->running) {
		s->again = true;
		return;
	}
	s->running = true;
	do {
		s->again = false;
		step(s);
	} while (s->again && !s->freed);
	s->running = false;
}

void perch__tls_run(struct perch_tls *s)
{
	perch__conn_ref(s->plain);   /* a continuation may free the session meanwhile */
	perch__tls_run_held(s);
	perch__conn_unref(s->plain);
}
