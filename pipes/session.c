/* pipes/session.c: a server's session: an accepted connection with its pipe reader and writer, its idle timer, and its one end. */
#include "server_internal.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "loop_internal.h"

static void session_link(struct perch_session *s)
{
	struct perch__server_worker *wk = s->wk;
	s->next = wk->sessions;
	if (s->next)
		s->next->prev = s;
	wk->sessions = s;
	wk->open++;
	wk->counts.sessions++;
}

static void session_unlink(struct perch_session *s)
{
	struct perch__server_worker *wk = s->wk;
	if (s->prev)
		s->prev->next = s->next;
	else
		wk->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	assert(wk->open > 0);
	wk->open--;
	if (wk->aborting)
		wk->counts.aborted++;
	else if (wk->stopping)
		wk->counts.finished++;
}

/*
 * Closes the connection as `how` says: first for a close or an abort, so
 * that a parked read or flush is delivered while the pipes still exist;
 * after the pipes for a linger, which wants no read parked. Every
 * continuation has run before fini, the session's last call.
 */
/* The connection's end after a TLS session's: its close_notify flushed first. */
static void close_after_tls(void *c)
{
	perch_conn_close(c);
	perch_conn_release(c);
}

static void linger_after_tls(void *c)
{
	/* A linger that starts takes the reference over. */
	if (perch_conn_close_lingering(c, NULL) != 0)
		close_after_tls(c);
}

/*
 * A TLS session's end: close_notify (the peer's session stays resumable),
 * then the connection's close or linger once that flush completed; an
 * abort resets at once.
 */
static void session_close_tls(struct perch_session *s, enum perch_session_end_how how)
{
	const struct perch_server_opts *o = &s->wk->srv->opts;
	if (how == PERCH_SESSION_ABORT) {
		perch_conn_abort(s->c);
		perch__tls_hooks_get()->free(s->tls);
	} else {
		perch_pipe_writer_complete(s->w);
		perch__tls_hooks_get()->end(s->tls, how == PERCH_SESSION_LINGER ? linger_after_tls : close_after_tls,
					    s->c);
	}
	s->r = NULL; /* the TLS session's ends: freed with it, or once its close_notify is flushed */
	s->w = NULL;
	s->tls = NULL;
	if (o->fini)
		o->fini(s, o->app);
	if (how == PERCH_SESSION_ABORT)
		perch_conn_release(s->c);
}

static void session_close(struct perch_session *s, enum perch_session_end_how how)
{
	const struct perch_server_opts *o = &s->wk->srv->opts;
	if (s->tls) {
		session_close_tls(s, how);
		return;
	}
	if (how == PERCH_SESSION_ABORT)
		perch_conn_abort(s->c);
	else if (how == PERCH_SESSION_CLOSE)
		perch_conn_close(s->c);
	perch_pipe_reader_free(s->r);
	perch_pipe_writer_free(s->w);
	s->r = NULL; /* fini's perch_session_reader and _writer say they are gone */
	s->w = NULL;
	/* A linger that starts takes the reference over. */
	bool lingers = how == PERCH_SESSION_LINGER && perch_conn_close_lingering(s->c, NULL) == 0;
	if (!lingers)
		perch_conn_close(s->c);
	if (o->fini)
		o->fini(s, o->app);
	if (!lingers)
		perch_conn_release(s->c);
}

int perch_session_end(struct perch_session *s, enum perch_session_end_how how)
{
	if (!s || (how != PERCH_SESSION_CLOSE && how != PERCH_SESSION_LINGER && how != PERCH_SESSION_ABORT))
		return -EINVAL;
	if (s->ending)
		return 0; /* from a continuation its own close delivered, or from fini */
	struct perch__server_worker *wk = s->wk;
	s->ending = true;
	session_unlink(s);
	perch_timer_stop(&s->idle); /* before the free: the loop links an armed timer */
	session_close(s, how);
	if (!s->held)
		free(s);
	perch__server_session_ended(wk);
	return 0;
}

/*
 * The server ends a session: its connection closed or reset (idle_end
 * for an idle one, a reset at the stop's deadline) delivers a parked read or flush, whose continuation
 * ends it; one with nothing parked is ended here. Held across the close,
 * so that an end inside it leaves the free to this call.
 */
static void session_cut(struct perch_session *s, enum perch_session_end_how how)
{
	s->held = true;
	if (how == PERCH_SESSION_ABORT)
		perch_conn_abort(s->c);
	else
		perch_conn_close(s->c);
	if (!s->ending)
		perch_session_end(s, how);
	free(s);
}

static void session_idle(struct perch_timer *t, void *arg)
{
	struct perch_session *s = arg;
	s->wk->counts.idle_closed++;
	session_cut(s, s->wk->srv->opts.idle_end);
}

int perch_session_touch(struct perch_session *s)
{
	if (!s)
		return -EINVAL;
	unsigned ms = s->wk->srv->opts.idle_timeout_ms;
	/* From the turn's clock: a touch at every answer reads no clock of its own. */
	if (ms && !s->ending)
		perch__timer_restart(&s->idle, ms);
	return 0;
}

/* The session's reader and writer: the connection's, or a TLS session's plaintext ends over them. */
static int session_pipes(struct perch_session *s, struct perch_conn *c, struct perch_tls_ctx *tls)
{
	int rc = perch_pipe_reader_new(c, &s->r);
	if (rc == 0 && (rc = perch_pipe_writer_new(c, &s->w)) != 0)
		perch_pipe_reader_free(s->r);
	if (rc != 0 || !tls)
		return rc;
	const struct perch__tls_hooks *h = perch__tls_hooks_get();   /* set: the server checked at its start */
	rc = h->session_new(tls, s->wk->loop, s->r, s->w, NULL, &s->tls);   /* takes them */
	s->r = rc == 0 ? h->reader(s->tls) : NULL;
	s->w = rc == 0 ? h->writer(s->tls) : NULL;
	return rc;
}

void perch__session_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	struct perch__server_worker *wk = arg;
	const struct perch_server_opts *o = &wk->srv->opts;
	struct perch_session *s = wk->stopping ? NULL : calloc(1, sizeof(*s) + o->state_size);
	if (s)
		s->wk = wk;
	if (!s || session_pipes(s, c, o->tls) != 0) {
		free(s);
		perch_conn_release(c); /* out of memory (or stopping): refuse this one, keep the others */
		return;
	}
	s->c = c;
	perch_timer_init(&s->idle, wk->loop, session_idle, s);
	session_link(s);
	perch_session_touch(s); /* a client that never sends is idle from its accept */
	o->start(s, s->r, s->w, o->app);
}

/*
 * Every open session is held for the walk, so a callback may end any of
 * them (its own, or others) and the walk still reads only live memory;
 * the ended ones are freed after it.
 */
void perch__session_stop_all(struct perch__server_worker *wk)
{
	const struct perch_server_opts *o = &wk->srv->opts;
	if (!o->stop)
		return;
	for (struct perch_session *s = wk->sessions; s; s = s->next) {
		s->held = true;
		s->stop_next = s->next;
	}
	struct perch_session *first = wk->sessions;
	for (struct perch_session *s = first; s; s = s->stop_next)
		if (!s->ending)
			o->stop(s, o->app);
	for (struct perch_session *s = first, *next; s; s = next) {
		next = s->stop_next;
		s->held = false;
		if (s->ending)
			free(s);
	}
}

void perch__session_abort_all(struct perch__server_worker *wk)
{
	wk->aborting = true;
	while (wk->sessions)
		session_cut(wk->sessions, PERCH_SESSION_ABORT);
}

void *perch_session_state(struct perch_session *s)
{
	return s && s->wk->srv->opts.state_size ? s->state : NULL;
}

struct perch_pipe_reader *perch_session_reader(struct perch_session *s)
{
	return s ? s->r : NULL;
}

struct perch_pipe_writer *perch_session_writer(struct perch_session *s)
{
	return s ? s->w : NULL;
}

void *perch_session_app(struct perch_session *s)
{
	return s ? s->wk->srv->opts.app : NULL;
}

struct perch_tls *perch_session_tls(struct perch_session *s)
{
	return s ? s->tls : NULL;
}

struct perch_conn *perch_session_conn(struct perch_session *s)
{
	return s ? s->c : NULL;
}

struct perch_loop *perch_session_loop(struct perch_session *s)
{
	return s ? s->wk->loop : NULL;
}

const struct perch_conn_opts *perch_session_conn_opts(struct perch_session *s)
{
	return s ? &s->wk->srv->opts.conn : NULL;
}

bool perch_session_stopping(const struct perch_session *s)
{
	return s && s->wk->stopping;
}
