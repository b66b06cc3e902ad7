/* pipes/server.c: the server scaffold: a loop per thread, each listening on the shared address, and the graceful stop. */
#include "atomic.h"
#include "server_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define SERVER_THREADS_MAX 1024
#define SERVER_STATE_MAX (1u << 30)

#define LINGER_POLL_MS 10

static bool worker_lingers(struct perch__server_worker *wk)
{
	struct perch_loop_stats st;
	return perch_loop_stats(wk->loop, &st) == 0 && st.lingering > 0;
}

/*
 * Stops the loop once a stop is under way and its last session ended,
 * after the lingering closes they left (an answer still on its way to a
 * peer that keeps sending), unless the deadline passed.
 */
void perch__server_session_ended(struct perch__server_worker *wk)
{
	if (!wk->stopping || wk->open > 0 || wk->run_returned)
		return;
	if (!wk->aborting && worker_lingers(wk)) {
		perch_timer_start(&wk->linger_poll, LINGER_POLL_MS);
		return;
	}
	perch_timer_stop(&wk->deadline);
	perch_timer_stop(&wk->linger_poll);
	perch_loop_stop(wk->loop);
}

static void worker_linger_poll(struct perch_timer *t, void *arg)
{
	perch__server_session_ended(arg);
}

static void worker_deadline(struct perch_timer *t, void *arg)
{
	struct perch__server_worker *wk = arg;
	perch__session_abort_all(wk);
	perch__server_session_ended(wk); /* none was open: only lingers were left */
}

/* Posted by perch_server_stop: stop accepting, ask the sessions to end, and wait for them until the deadline. */
static void worker_begin_stop(void *arg)
{
	struct perch__server_worker *wk = arg;
	if (wk->stopping || wk->run_returned)
		return;
	wk->stopping = true;
	if (wk->ls)
		perch_listener_close(wk->ls);
	wk->ls = NULL;
	wk->counts.open_at_stop = wk->open;
	perch__session_stop_all(wk);
	if (wk->srv->deadline_ms)
		perch_timer_start(&wk->deadline, wk->srv->deadline_ms);
	else
		perch__session_abort_all(wk);
	perch__server_session_ended(wk); /* none open: the loop stops now, or once its lingers end */
}

/* Waits until every thread was made (true) or the start failed and the server stops (false). */
static bool worker_may_run(struct perch_server *srv)
{
	pthread_mutex_lock(&srv->mu);
	while (!srv->go && !srv->stop_requested)
		pthread_cond_wait(&srv->stop_cond, &srv->mu);
	bool go = srv->go;
	pthread_mutex_unlock(&srv->mu);
	return go;
}

/*
 * Runs the loop until the stop (or a broken ring), cuts what is left, and
 * frees the loop only once perch_server_stop asked, since until then other
 * threads may post to it. A server whose start failed never runs its
 * loops: no callback of its runs.
 */
static void *worker_main(void *arg)
{
	struct perch__server_worker *wk = arg;
	struct perch_server *srv = wk->srv;
	int rc = worker_may_run(srv) ? perch_loop_run(wk->loop) : 0;
	if (rc != 0) {
		fprintf(stderr, "perch_server: loop %d failed: %s\n", (int)(wk - srv->wk), strerror(-rc));
		wk->counts.loops_failed = 1;
	}
	wk->run_returned = true;
	perch_timer_stop(&wk->deadline);
	perch_timer_stop(&wk->linger_poll);
	perch__session_abort_all(wk);
	if (wk->ls)
		perch_listener_close(wk->ls);
	wk->ls = NULL;
	pthread_mutex_lock(&srv->mu);
	wk->exited = true;
	while (!srv->stop_requested)
		pthread_cond_wait(&srv->stop_cond, &srv->mu);
	pthread_mutex_unlock(&srv->mu);
	perch_loop_free(wk->loop);
	return NULL;
}

/*
 * With threads > 1 the listeners set SO_REUSEPORT, and so would join
 * another such server's listener on the port without a word: a bind
 * without the option finds any listener first (best effort: two servers
 * starting at the same instant may both pass). 0, -EADDRINUSE, or -EINVAL
 * for a host that is not a numeric address.
 */
static int port_is_free(const char *host, int port)
{
	struct sockaddr_storage ss = { 0 };
	struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
	socklen_t len;
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)port);
		len = sizeof(*in4);
	} else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		len = sizeof(*in6);
	} else {
		return -EINVAL;
	}
	if (port == 0)
		return 0;
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc = 0;
	if (fd < 0)
		return -errno;
	/* As perch_listen: TIME_WAIT owns nothing, and "::" must not collide with IPv4 listeners. */
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    (ss.ss_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(fd, (struct sockaddr *)&ss, len) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

static bool opts_valid(const struct perch_server_opts *o)
{
	int threads = o->threads ? o->threads : 1;
	if (!o->start || o->port < 0 || o->port > 65535 || threads < 1 || threads > SERVER_THREADS_MAX)
		return false;
	if (o->state_size > SERVER_STATE_MAX || o->idle_timeout_ms > PERCH_TIMER_MAX_MS ||
	    (o->idle_end != PERCH_SESSION_CLOSE && o->idle_end != PERCH_SESSION_ABORT))
		return false;
	if (o->unix_name)
		return threads == 1 && strlen(o->unix_name) < sizeof(((struct perch_server *)0)->unix_name);
	return !o->host || strlen(o->host) < sizeof(((struct perch_server *)0)->host);
}

/* Creates worker i's loop and listener; the first one fixes the port for the others. */
static int worker_init(struct perch_server *srv, int i)
{
	struct perch__server_worker *wk = &srv->wk[i];
	const struct perch_server_opts *o = &srv->opts;
	wk->srv = srv;
	int rc = perch_loop_new(&o->loop, &wk->loop);
	if (rc != 0)
		return rc;
	perch_timer_init(&wk->deadline, wk->loop, worker_deadline, wk);
	perch_timer_init(&wk->linger_poll, wk->loop, worker_linger_poll, wk);
	struct perch_listen_opts lo = { .reuseport = srv->nworkers > 1, .unlink_stale = true };
	if (o->unix_name)
		rc = perch_listen_unix(wk->loop, o->unix_name, &lo, &o->conn, perch__session_accept, wk, &wk->ls);
	else
		rc = perch_listen_tcp(wk->loop, o->host, i == 0 ? o->port : srv->port, &lo, &o->conn,
				      perch__session_accept, wk, &wk->ls);
	if (rc == 0 && i == 0)
		srv->port = o->unix_name ? 0 : perch_listener_port(wk->ls);
	return rc;
}

/* Frees a server none of whose loops runs; closes what the others made. */
static void server_free(struct perch_server *srv)
{
	for (int i = 0; i < srv->nworkers; i++)
		perch_loop_free(srv->wk[i].loop); /* never ran: any thread may free it, its listener with it */
	pthread_mutex_destroy(&srv->mu);
	pthread_cond_destroy(&srv->stop_cond);
	if (srv->opts.tls)
		perch__tls_hooks_get()->ctx_free(srv->opts.tls);
	free(srv);
}

static struct perch_server *server_new(const struct perch_server_opts *o)
{
	int n = o->threads ? o->threads : 1;
	struct perch_server *srv = calloc(1, sizeof(*srv) + (size_t)n * sizeof(srv->wk[0]));
	if (!srv)
		return NULL;
	srv->opts = *o;
	srv->opts.threads = srv->nworkers = n;
	strcpy(srv->host, o->host ? o->host : "127.0.0.1");
	srv->opts.host = srv->host;
	if (o->unix_name)
		srv->opts.unix_name = strcpy(srv->unix_name, o->unix_name);
	/* Default attributes: glibc does not fail these, but a libc may (ENOMEM). */
	if (pthread_mutex_init(&srv->mu, NULL) != 0) {
		free(srv);
		return NULL;
	}
	if (pthread_cond_init(&srv->stop_cond, NULL) != 0) {
		pthread_mutex_destroy(&srv->mu);
		free(srv);
		return NULL;
	}
	if (o->tls)
		perch__tls_hooks_get()->ctx_ref(o->tls);
	return srv;
}

static const struct perch__tls_hooks *tls_hooks;

const struct perch__tls_hooks *perch__tls_hooks_get(void)
{
	return perch__load_ptr((void *const *)&tls_hooks);
}

void perch__tls_hooks_set(const struct perch__tls_hooks *hooks)
{
	perch__store_ptr((void **)&tls_hooks, (void *)hooks);
}

/* A TLS context must be a server's; without the table no context was ever made (or TLS is not built). */
static int tls_usable(const struct perch_tls_ctx *ctx)
{
	if (!ctx)
		return 0;
	const struct perch__tls_hooks *h = perch__tls_hooks_get();
	if (!h)
		return -EOPNOTSUPP;
	return h->ctx_role(ctx) == PERCH_TLS_SERVER ? 0 : -EINVAL;
}

int perch_server_start(const struct perch_server_opts *opts, struct perch_server **out)
{
	if (!opts || !out || !opts_valid(opts))
		return -EINVAL;
	int tls = tls_usable(opts->tls);
	if (tls != 0)
		return tls;
	int rc = opts->unix_name ? 0 : port_is_free(opts->host ? opts->host : "127.0.0.1", opts->port);
	if (rc != 0)
		return rc;
	struct perch_server *srv = server_new(opts);
	if (!srv)
		return -ENOMEM;
	for (int i = 0; i < srv->nworkers && rc == 0; i++)
		rc = worker_init(srv, i);
	int made = 0;
	for (; rc == 0 && made < srv->nworkers; made++) {
		struct perch__server_worker *wk = &srv->wk[made];
		if (pthread_create(&wk->th, NULL, worker_main, wk) != 0)
			rc = -EAGAIN;
		else
			wk->thread_made = true;
	}
	if (rc == 0) {
		pthread_mutex_lock(&srv->mu);
		srv->go = true;
		pthread_cond_broadcast(&srv->stop_cond);
		pthread_mutex_unlock(&srv->mu);
		*out = srv;
		return 0;
	}
	if (made > 0) /* some loops run and may have sessions already: stop them as a stop would */
		perch_server_stop(srv, 0, NULL);
	else
		server_free(srv);
	return rc;
}

int perch_server_port(const struct perch_server *srv)
{
	return srv ? srv->port : -EINVAL;
}

struct perch_loop *perch_server_loop(const struct perch_server *srv, int i)
{
	return srv && i >= 0 && i < srv->nworkers ? srv->wk[i].loop : NULL;
}

static void report_add(struct perch_server_report *sum, const struct perch_server_report *c)
{
	sum->sessions += c->sessions;
	sum->idle_closed += c->idle_closed;
	sum->open_at_stop += c->open_at_stop;
	sum->finished += c->finished;
	sum->aborted += c->aborted;
	sum->loops_failed += c->loops_failed;
}

int perch_server_stop(struct perch_server *srv, unsigned deadline_ms, struct perch_server_report *report)
{
	if (!srv || deadline_ms > PERCH_TIMER_MAX_MS)
		return -EINVAL;
	for (int i = 0; i < srv->nworkers; i++)
		if (srv->wk[i].thread_made && perch_loop_is_current(srv->wk[i].loop))
			return -EDEADLK;
	srv->deadline_ms = deadline_ms;
	pthread_mutex_lock(&srv->mu);
	srv->stop_requested = true;
	for (int i = 0; i < srv->nworkers; i++) {
		struct perch__server_worker *wk = &srv->wk[i];
		if (wk->thread_made && !wk->exited && perch_loop_post(wk->loop, worker_begin_stop, wk) != 0)
			perch_loop_stop(wk->loop); /* no memory for the post: the sessions are cut instead */
	}
	pthread_cond_broadcast(&srv->stop_cond);
	pthread_mutex_unlock(&srv->mu);
	struct perch_server_report sum = { 0 };
	for (int i = 0; i < srv->nworkers; i++) {
		struct perch__server_worker *wk = &srv->wk[i];
		if (!wk->thread_made)
			continue;
		pthread_join(wk->th, NULL);
		wk->loop = NULL; /* freed by its thread */
		report_add(&sum, &wk->counts);
	}
	if (report)
		*report = sum;
	server_free(srv);
	return 0;
}
