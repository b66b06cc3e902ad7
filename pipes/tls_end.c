/* pipes/tls_end.c: a TLS session's end: its free, and perch_tls_end sending what was flushed, then close_notify, in time. */
#include "config.h"

#include "atomic.h"
#include "loop_internal.h"
#include "pipe_internal.h"
#include "tls_internal.h"

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

/* perch_tls_end's deadline passed, or could not be set: after() runs, and no flush starts now. */
void perch__tls_end_out_of_time(struct perch_tls *s)
{
	s->ending = false;
	s->end_now = true;   /* for the kick, when this is inside the engine's run */
	perch__tls_run_after(s);
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

/*
 * A close_notify a writer completed inside OpenSSL's read asked for,
 * with no flushed chain before it: outside a read it would have been
 * sent then, so the free still sends it. With a chain waiting it would
 * not have been, and the free drops that chain: no clean end after it.
 */
static bool close_notify_owed(const struct perch_tls *s)
{
	return s->close_notify_deferred && !s->close_notify_sent && !s->cout_flushing && !s->tx &&
	       !s->has_deferred && !perch__load_ptr((void *const *)&s->tx_in);
}

/* The rest of a free: at once, or for a free made inside the engine's run (free_left) from its kick. */
static void free_rest(struct perch_tls *s)
{
	bool ending = s->ending;   /* a flush ending inside this may end the ending */
	bool owed = !ending && close_notify_owed(s);   /* decided before the chains are dropped */
	s->free_left = false;
	perch__tls_drop_sends(s, -EPIPE);
	perch_pipe_reader_free(s->cr);   /* a parked ciphertext read is canceled here */
	s->cr = NULL;
	if (ending)
		return;
	if (owed) {
		perch__tls_close_notify_now(s);
		/* A kernel-path retry it armed (on the loop's thread only): dropped, as perch_tls_free says. */
		if (perch_timer_is_armed(&s->ktls_retry))
			perch_timer_stop(&s->ktls_retry);   /* not s->timer: perch_tls_end's deadline stays */
	}
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
		free_rest(s);
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
		free_rest(s);
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

/*
 * Whether an open session still has something to send: records staged
 * and not flushed (an end from a continuation of the step that encrypted
 * them), plaintext flushed, or a close_notify its completed writer asked for.
 */
static bool more_to_send(const struct perch_tls *s)
{
	if (s->state != TLS_OPEN || s->io_error)
		return false;
	bool asked = s->close_notify_wanted || (perch__load_u32(&s->asks) & TLS_ASK_CLOSE_NOTIFY);
	return (asked && !s->close_notify_sent) || (s->tx && !s->tx_encrypted) ||
	       perch_pipe_writer_staged(s->cw) > 0 || perch__load_ptr((void *const *)&s->tx_in);
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
		perch__tls_end_out_of_time(s);
	else if (s->after && !s->cout_flushing)
		perch__tls_run_after(s);   /* nothing under way: the rest is sent now (or after the run it was made in) */
	perch__conn_unref(s->plain);
}

void perch__tls_freed_kicked(struct perch_tls *s)
{
	if (s->free_left)
		free_rest(s);
	perch__tls_drop_sends(s, -EPIPE);   /* a chain ended inside tls_ops.send before the free */
	/* perch_tls_end's flush ended on another thread, or the end was made inside a run. */
	if (s->after && (s->end_now || !s->cout_flushing || (perch__load_u32(&s->asks) & TLS_ASK_FLUSHED)))
		perch__tls_run_after(s);
	if (s->timers_left)
		stop_timers(s);
}
