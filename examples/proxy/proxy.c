/* examples/proxy/proxy.c: the proxy's sessions: a client, its upstream, and two pumps that forward each side's bytes to the other. */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct proxy_session;

/* One direction: reads one side, forwards to the other side's writer, flushes, reads again. */
struct pump {
	struct proxy_session *ps;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	struct perch_conn *dst;        /* the connection w writes to: shut once r's side ended */
	bool dst_tls;                  /* w is a TLS session's: its end is close_notify, not a FIN */
	bool src_ended;                /* the result being flushed was r's last */
	bool done;                     /* r's side ended and the end was passed on */
};

/*
 * A client's session (its perch_session's state points here: a session
 * cut while connecting ends before its connect reports, which frees this).
 */
struct proxy_session {
	struct perch_session *sess;    /* NULL once it ended: the client side is gone */
	const struct proxy_target *to;
	struct perch_conn *upstream;   /* NULL until connected */
	struct perch_tls *tls;         /* over --to-tls: the upstream's session, whose ends the pumps use */
	struct pump up, down;          /* client -> upstream, upstream -> client */
	bool connecting;               /* on_upstream is still to come, and frees this */
	bool ending;                   /* the end began: continuations it delivers do nothing */
	bool clean;                    /* both sides ended and their FINs were passed on */
	bool held;                     /* on_upstream still uses it: it frees it */
};

/* ---- ending ---- */

/*
 * Ends both sides: closed when both ended cleanly (their FINs were passed
 * on), aborted when the session is cut (a reset, a failed flush, a stop),
 * so that each peer sees its stream fail rather than end. The client's
 * side goes with the session; proxy_end takes the upstream's.
 */
static void session_end(struct proxy_session *ps, bool cut)
{
	if (ps->ending)
		return;
	ps->ending = true;
	ps->clean = !cut;
	perch_session_end(ps->sess, cut ? PERCH_SESSION_ABORT : PERCH_SESSION_CLOSE);
}

static void upstream_close(void *conn)
{
	perch_conn_close(conn);
	perch_conn_release(conn);
}

/* The upstream side's end: over TLS a clean end closes once close_notify (pass_end's) left. */
static void upstream_end(struct proxy_session *ps)
{
	if (ps->tls && ps->clean) {
		perch_tls_end(ps->tls, upstream_close, ps->upstream);
		return;
	}
	(ps->clean ? perch_conn_close : perch_conn_abort)(ps->upstream);
	if (ps->tls) {
		perch_tls_free(ps->tls); /* with the connection's reader and writer */
	} else {
		perch_pipe_reader_free(ps->down.r);
		perch_pipe_writer_free(ps->up.w);
	}
	perch_conn_release(ps->upstream);
}

/*
 * The session ended (by session_end, its idle time, or the stop's
 * deadline), its client closed: the upstream side goes the same way. The
 * close delivers whatever read or flush was parked (its continuation sees
 * `ending` and returns), then the adapters and the connection go.
 */
static void proxy_end(struct perch_session *sess, void *app)
{
	struct proxy_session *ps = *(struct proxy_session **)perch_session_state(sess);
	if (!ps)
		return; /* out of memory at its start */
	ps->ending = true;
	ps->sess = NULL;
	if (ps->upstream)
		upstream_end(ps);
	if (!ps->connecting && !ps->held)
		free(ps);
}

/*
 * A flush completed one way or the other: the idle time starts again. A
 * session where no flush completes (both sides quiet, or the side being
 * written to reads too slowly to take one flush in that time) is cut
 * once it runs out.
 */
static void session_moved(struct proxy_session *ps)
{
	perch_session_touch(ps->sess);
}

/* ---- pumps ---- */

static void pump_run(struct pump *p);
static void upstream_failed(const struct proxy_target *to, const char *why);
static void pump_failed(struct pump *p);

/* Passes r's end on: a FIN, or over TLS close_notify (a FIN under it would cut the TLS stream short). */
static int pass_end(struct pump *p)
{
	return p->dst_tls ? perch_pipe_writer_complete(p->w) : perch_conn_shutdown(p->dst);
}

/*
 * After a flush with `result`: false to read on; true when the pump is
 * done or the session ended (then p may be freed). A side that ended is
 * passed on only after every byte before its end was flushed: after a
 * failed flush the stream was cut short, and the session is cut with
 * resets, never a FIN that would say it ended cleanly.
 */
static bool pump_stops_after_flush(struct pump *p, int result)
{
	struct proxy_session *ps = p->ps;
	if (result != 0 || (p->src_ended && pass_end(p) != 0)) {
		pump_failed(p);
		return true;
	}
	session_moved(ps);
	if (!p->src_ended)
		return false;
	p->done = true;
	if (ps->up.done && ps->down.done)
		session_end(ps, false);
	return true;
}

/*
 * A read or a flush failed: the session is cut. A TLS upstream's failure
 * (its certificate refused, its handshake late), seen by either pump, is
 * said, as a refused connect is.
 */
static void pump_failed(struct pump *p)
{
	struct proxy_session *ps = p->ps;
	char why[256], line[300];
	if (ps->tls && perch_tls_error(ps->tls, why, sizeof(why)) != 0) {
		snprintf(line, sizeof(line), "TLS: %s", why);
		upstream_failed(ps->to, line);
	}
	session_end(ps, true);
}

static void pump_read_ready(void *arg, int64_t result)
{
	struct pump *p = arg;
	if (p->ps->ending)
		return;
	if (result < 0)
		pump_failed(p);
	else
		pump_run(p);
}

static void pump_flushed(void *arg, int64_t result)
{
	struct pump *p = arg;
	if (p->ps->ending)
		return;
	if (!pump_stops_after_flush(p, (int)result))
		pump_run(p);
}

/*
 * Reads, forwards everything read to the other side, flushes, and reads
 * again only once the flush is done: a side that stops reading stops the
 * other side being read (the source pauses, doc/loop.md). A reset or a
 * local close cuts the session both ways.
 */
static void pump_run(struct pump *p)
{
	for (;;) {
		struct perch_read_result res;
		int rc = perch_pipe_read_or_wait(p->r, &res, pump_read_ready, p);
		if (rc == PERCH_PENDING)
			return;
		if (rc != 0 || res.error || res.closed || res.canceled ||
		    perch_pipe_forward(p->r, res.len, res.len, p->w) != 0) {
			pump_failed(p);
			return;
		}
		p->src_ended = res.completed;
		rc = perch_pipe_flush_or_wait(p->w, pump_flushed, p);
		if (rc == PERCH_PENDING || pump_stops_after_flush(p, rc))
			return;
	}
}

/* ---- connecting ---- */

#define UPSTREAM_LOG_MS 10000.0 /* at most one line a loop thread this often: a dead upstream fails every client */

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Says why clients are being reset (a mistyped --to, an upstream
 * certificate the CAs do not vouch for): a proxy hanging up otherwise.
 */
static void upstream_failed(const struct proxy_target *to, const char *why)
{
	static _Thread_local double logged_at;
	static _Thread_local unsigned unlogged;
	unlogged++;
	double now = mono_ms();
	if (logged_at != 0 && now - logged_at < UPSTREAM_LOG_MS)
		return;
	char at[160];
	fprintf(stderr, "proxy: upstream %s: %s (%u client%s reset since the last line)\n",
		proxy_target_text(to, at, sizeof(at)), why, unlogged,
		unlogged == 1 ? "" : "s");
	logged_at = now;
	unlogged = 0;
}

/*
 * The upstream's reader and writer for the pumps: the connection's, or
 * over --to-tls the plaintext ends of a TLS session over them (what the
 * client sent waits in it for the handshake).
 */
static int upstream_pipes(struct proxy_session *ps, struct perch_conn *c)
{
	const struct proxy_target *to = ps->to;
	struct perch_pipe_reader *r = NULL;
	struct perch_pipe_writer *w = NULL;
	int rc = perch_pipe_writer_new(c, &w);
	if (rc == 0)
		rc = perch_pipe_reader_new(c, &r);
	if (rc != 0 || !to->tls) {
		ps->up.w = w;
		ps->down.r = r;
		return rc;
	}
	struct perch_tls_opts o = { .server_name = to->name[0] ? to->name : to->host };
	rc = perch_tls_new(to->tls_ctx, perch_session_loop(ps->sess), r, w, &o, &ps->tls);
	if (rc != 0)
		return rc; /* r and w went with it */
	ps->up.w = perch_tls_writer(ps->tls);
	ps->down.r = perch_tls_reader(ps->tls);
	ps->up.dst_tls = true;
	return 0;
}

static void on_upstream(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct proxy_session *ps = arg;
	ps->connecting = false;
	if (!ps->sess) { /* the session ended while connecting */
		if (c) {
			perch_conn_close(c);
			perch_conn_release(c);
		}
		free(ps);
		return;
	}
	if (result != 0) {
		upstream_failed(ps->to, strerror(-result));
		session_end(ps, true); /* refused, unreachable or timed out: the client is reset */
		return;
	}
	ps->upstream = c;
	ps->up.dst = c;
	session_moved(ps); /* the idle time starts again with the connection */
	ps->held = true;
	if (upstream_pipes(ps, c) != 0)
		session_end(ps, true);
	if (!ps->ending)
		pump_run(&ps->up);
	if (!ps->ending)
		pump_run(&ps->down);
	ps->held = false;
	if (ps->ending)
		free(ps);
}

/* A client was accepted: its upstream is connected on the same loop, and the pumps start once it is. */
static void proxy_start_session(struct perch_session *sess, struct perch_pipe_reader *r,
				struct perch_pipe_writer *w, void *app)
{
	const struct proxy_target *to = app;
	struct proxy_session *ps = calloc(1, sizeof(*ps));
	if (!ps) {
		perch_session_end(sess, PERCH_SESSION_ABORT); /* out of memory: refuse this one */
		return;
	}
	*(struct proxy_session **)perch_session_state(sess) = ps;
	*ps = (struct proxy_session){ .sess = sess, .to = to, .connecting = true };
	ps->up = (struct pump){ .ps = ps, .r = r };
	ps->down = (struct pump){ .ps = ps, .w = w, .dst = perch_session_conn(sess), .dst_tls = to->clients_tls };
	struct perch_conn_opts co = *perch_session_conn_opts(sess); /* as the client's side: --recv, --nagle */
	co.connect_timeout_ms = to->connect_timeout_ms;
	int rc = to->unix_name[0] ? perch_connect_unix(perch_session_loop(sess), to->unix_name, &co, on_upstream, ps)
				  : perch_connect(perch_session_loop(sess), to->host, to->port, &co, on_upstream, ps);
	if (rc != 0) {
		ps->connecting = false;
		upstream_failed(to, strerror(-rc));
		session_end(ps, true);
	}
}

/* ---- the server ---- */

static const struct serve_proto proxy_proto = { .state_size = sizeof(struct proxy_session *),
					       .start = proxy_start_session, .end = proxy_end,
					       .idle_reset = true };

static bool target_ok(const struct proxy_target *t)
{
	unsigned char addr[sizeof(struct in6_addr)];
	if (t->connect_timeout_ms > PERCH_CONNECT_TIMEOUT_MAX_MS || !memchr(t->name, '\0', sizeof(t->name)))
		return false;
	if (t->tls && t->unix_name[0] && !t->name[0])
		return false; /* no address to check the certificate against */
	if (t->unix_name[0])
		return memchr(t->unix_name, '\0', sizeof(t->unix_name)) && strcmp(t->unix_name, "@") != 0;
	return t->port >= 1 && t->port <= 65535 && memchr(t->host, '\0', sizeof(t->host)) &&
	       (inet_pton(AF_INET, t->host, addr) == 1 || inet_pton(AF_INET6, t->host, addr) == 1);
}

int proxy_parse_target(const char *s, struct proxy_target *t)
{
	if (!s || !t)
		return -EINVAL;
	struct proxy_target parsed = { .connect_timeout_ms = t->connect_timeout_ms, .tls = t->tls,
				       .ca_file = t->ca_file };
	memcpy(parsed.name, t->name, sizeof(parsed.name));
	if (strncmp(s, "unix:", 5) == 0) {
		size_t n = strlen(s + 5);
		if (n == 0 || n >= sizeof(parsed.unix_name))
			return -EINVAL;
		memcpy(parsed.unix_name, s + 5, n + 1);
	} else if (serve_parse_hostport(strncmp(s, "tcp:", 4) == 0 ? s + 4 : s, 1, parsed.host, &parsed.port) != 0) {
		return -EINVAL;
	}
	if (!target_ok(&parsed))
		return -EINVAL;
	*t = parsed;
	return 0;
}

const char *proxy_target_text(const struct proxy_target *t, char *buf, size_t size)
{
	bool v6 = strchr(t->host, ':') != NULL;
	if (t->unix_name[0])
		snprintf(buf, size, "unix:%s", t->unix_name);
	else
		snprintf(buf, size, "%s%s%s:%d", v6 ? "[" : "", t->host, v6 ? "]" : "", t->port);
	return buf;
}

/* The client context every upstream session is made with: t->ca_file's CAs, or the system's. */
static int upstream_tls_ctx(struct proxy_target *t)
{
	struct perch_tls_ctx_opts co = { .role = PERCH_TLS_CLIENT, .ca_file = t->ca_file };
	char why[256];
	int rc = perch_tls_ctx_new(&co, &t->tls_ctx, why, sizeof(why));
	if (rc != 0) {
		fprintf(stderr, "proxy: --to-tls: %s\n", why);
		serve_said_why();
	}
	return rc;
}

int proxy_start(const struct serve_opts *o, const struct proxy_target *to, struct serve **out)
{
	if (!o || !to || !target_ok(to))
		return -EINVAL;
	struct serve_opts so = *o;
	if (!so.pause_bytes)
		so.pause_bytes = PROXY_PAUSE_BYTES;
	if (!so.recv_buffers)
		so.recv_buffers = PROXY_RECV_BUFFERS;
	struct proxy_target *copy = malloc(sizeof(*copy));
	if (!copy)
		return -ENOMEM;
	*copy = *to;
	copy->clients_tls = o->tls_cert != NULL;
	copy->tls_ctx = NULL;
	int rc = copy->tls ? upstream_tls_ctx(copy) : 0;
	if (rc == 0)
		rc = serve_start(&so, &proxy_proto, copy, out);
	if (rc != 0) {
		perch_tls_ctx_free(copy->tls_ctx);
		free(copy);
	}
	return rc;
}

void proxy_stop(struct serve *s)
{
	struct proxy_target *to = serve_app(s);
	serve_stop(s);
	if (to)
		perch_tls_ctx_free(to->tls_ctx); /* sessions still ending keep their own reference */
	free(to);
}
