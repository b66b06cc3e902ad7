/* perch/server.h: a server scaffold: N loops on N threads sharing a listener's address, a pipe session per accepted connection, idle timeouts and a graceful stop. */
#ifndef PERCH_SERVER_H
#define PERCH_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <perch/common.h>
#include <perch/conn.h>
#include <perch/loop.h>
#include <perch/pipe.h>
#include <perch/timer.h>

#ifdef __cplusplus
extern "C" {
#endif

struct perch_server;
struct perch_tls;
struct perch_tls_ctx;

/*
 * One accepted connection with its pipe reader and writer, and the
 * protocol's state. Every perch_session_* call is made on the session's
 * loop thread.
 */
struct perch_session;

/*
 * A connection was accepted: the session starts. Runs on its loop thread,
 * with the session's state zeroed (perch_session_state). From here the
 * protocol drives `r` and `w` (perch_pipe_read_or_wait,
 * perch_pipe_flush_or_wait, ...) and ends the session with
 * perch_session_end; the reader and writer are the session's, freed by
 * its end.
 */
typedef void (*perch_session_start_fn)(struct perch_session *s, struct perch_pipe_reader *r,
				       struct perch_pipe_writer *w, void *app);

/* A session callback other than start (stop, fini): loop thread. */
typedef void (*perch_session_fn)(struct perch_session *s, void *app);

/*
 * A server; a zeroed struct plus a start callback is a one-loop server on
 * 127.0.0.1 at a port the kernel picks (perch_server_port says which).
 */
struct perch_server_opts {
	const char *host;              /* numeric IPv4 or IPv6 address; NULL: "127.0.0.1" */
	int port;                      /* 0..65535; 0: the kernel picks one, shared by every loop */
	/*
	 * A Unix socket instead of host and port: a path or "@name"
	 * (abstract). A stale socket file at the path is replaced, one a live
	 * server listens on is not (-EADDRINUSE). One loop only.
	 */
	const char *unix_name;
	int threads;                   /* loops, one thread each; 0: 1; > 1 share the port (SO_REUSEPORT) */
	/*
	 * A session whose idle time runs out is ended as perch_server_stop's
	 * deadline ends one (below), its connection closed as idle_end says.
	 * The time counts from the accept, and again from each
	 * perch_session_touch. To save a clock read at every touch, both
	 * count from a time the loop read earlier in the same pass over its
	 * events: a session may end early by as long as that pass's
	 * callbacks ran before the touch (microseconds, unless callbacks do
	 * heavy work), and on a busy loop late by up to one pass. 0: never;
	 * at most PERCH_TIMER_MAX_MS.
	 */
	unsigned idle_timeout_ms;
	/*
	 * PERCH_SESSION_CLOSE (0, default): a FIN, as for an idle keep-alive
	 * client; PERCH_SESSION_ABORT: a reset, where going quiet means the
	 * stream failed (a proxy). -EINVAL for anything else.
	 */
	int idle_end;
	struct perch_loop_opts loop;   /* each loop's (perch_loop_new) */
	struct perch_conn_opts conn;   /* each accepted connection's */
	size_t state_size;             /* per-session state (perch_session_state), zeroed; at most 1 GiB */
	perch_session_start_fn start;  /* required */
	/*
	 * Optional: a graceful stop began (perch_server_stop). The protocol
	 * ends the session at its next message boundary (a session parked on
	 * a read with nothing pending can end at once); without it, sessions
	 * are left to end by themselves until the deadline.
	 * perch_session_stopping tells the same from anywhere. It may end
	 * any session, its own or others.
	 */
	perch_session_fn stop;
	/*
	 * Optional: the session ended, however it ended (perch_session_end,
	 * its idle time, the stop's deadline); the last call for it, before
	 * its state is freed. Its connection is closed (or closing,
	 * lingering), its reader and writer are freed and every continuation
	 * of theirs has run; do not use them or the connection here.
	 */
	perch_session_fn fini;
	void *app;                     /* handed to every callback */
	/*
	 * Optional: a server context (perch/tls.h): every accepted connection
	 * speaks TLS, and the session's reader and writer (start's r and w)
	 * are its plaintext ends. The server keeps its own reference until it
	 * is stopped. -EINVAL for a client's context; -EOPNOTSUPP from a perch
	 * built without TLS.
	 */
	struct perch_tls_ctx *tls;
};

/*
 * Creates opts->threads loops, each listening on the same address (one
 * listener on a Unix name), and runs each on a thread of its own. Any
 * thread but a perch loop's. SIGPIPE and other signals stay the caller's:
 * block SIGINT and SIGTERM before this call and sigwait for them (the
 * threads inherit the mask) to stop on a signal. Returns 0 with *out set,
 * or a negative errno: -EINVAL for a NULL argument, a missing start, a
 * port out of range, threads below 0 or above 1024, threads > 1 on a Unix
 * name, an idle timeout above PERCH_TIMER_MAX_MS, a bad idle_end, a
 * state_size above 1 GiB, a host that is not a numeric address;
 * -EADDRINUSE when a socket already holds the port or the name (a
 * SO_REUSEPORT listener of another server included); -EAGAIN when a
 * thread cannot be made; perch_loop_new's, perch_listen_tcp's or
 * perch_listen_unix's errors; -ENOMEM. Nothing is left running on an
 * error, and no callback of the server's has run.
 */
PERCH_API int perch_server_start(const struct perch_server_opts *opts, struct perch_server **out);

/* The port every loop listens on (0 on a Unix name); -EINVAL for NULL. Any thread. */
PERCH_API int perch_server_port(const struct perch_server *srv);

/* Loop i of the server (0 <= i < threads), for its backend name or a post; NULL out of range. Any thread. */
PERCH_API struct perch_loop *perch_server_loop(const struct perch_server *srv, int i);

/* How the sessions ended, filled by perch_server_stop. */
struct perch_server_report {
	uint64_t sessions;             /* accepted over the server's life */
	uint64_t idle_closed;          /* of them, closed when their idle time ran out */
	uint64_t open_at_stop;         /* open when the stop began */
	uint64_t finished;             /* of those, ended before the deadline (by the protocol or idle) */
	uint64_t aborted;              /* of those, cut at the deadline (a reset); and a failed loop's */
	uint64_t loops_failed;         /* loops whose run failed (a broken ring): their sessions were reset */
};

/*
 * Stops the server gracefully and frees it: every loop stops accepting
 * (its listener closes), each open session gets the stop callback, and
 * the server waits until they have ended, and their lingering closes
 * too (PERCH_SESSION_LINGER), or until `deadline_ms` has passed (0: no
 * wait); then it aborts the rest: each connection is reset, which
 * delivers its parked read or flush with an error (whose continuation
 * ends the session), and a session still not ended then is ended by the
 * server. Then the loops stop and are freed (ending any linger left),
 * and the threads joined.
 * Call it once, from any thread but the server's loops. Returns 0 with
 * *report filled when report is not NULL; -EINVAL for a NULL server or a
 * deadline above PERCH_TIMER_MAX_MS (nothing is stopped); -EDEADLK from
 * one of its own loop threads.
 */
PERCH_API int perch_server_stop(struct perch_server *srv, unsigned deadline_ms,
				struct perch_server_report *report);

/* The session's state (perch_server_opts.state_size bytes, zeroed at its start; NULL for size 0 or a NULL session). */
PERCH_API void *perch_session_state(struct perch_session *s);

/*
 * The session's reader and writer, the ones its start callback was given
 * (over TLS, the plaintext ends): a session's state need not keep them.
 * NULL for a NULL session, and in fini (the pipes are freed by then). The
 * loop's thread, from start to fini.
 */
PERCH_API struct perch_pipe_reader *perch_session_reader(struct perch_session *s);
PERCH_API struct perch_pipe_writer *perch_session_writer(struct perch_session *s);

/* The server's perch_server_opts.app, as its callbacks are given it. NULL for a NULL session. */
PERCH_API void *perch_session_app(struct perch_session *s);

/*
 * The TLS session a server with perch_server_opts.tls runs the session
 * over (perch/tls.h: its path, ALPN, version once the handshake
 * completed), or NULL for a plain one, a NULL session, and in fini. The
 * loop's thread, from start to fini.
 */
PERCH_API struct perch_tls *perch_session_tls(struct perch_session *s);

/* The session's connection, for the calls pipes do not wrap (perch_conn_shutdown, its address). */
PERCH_API struct perch_conn *perch_session_conn(struct perch_session *s);

/* The session's loop, for connects and timers of its own (a proxy's upstream). */
PERCH_API struct perch_loop *perch_session_loop(struct perch_session *s);

/* The options the server's connections were accepted with, for connections a session opens. */
PERCH_API const struct perch_conn_opts *perch_session_conn_opts(struct perch_session *s);

/* True once the server's graceful stop began: end the session at the next message boundary. */
PERCH_API bool perch_session_stopping(const struct perch_session *s);

/*
 * The session made progress (an answer's flush completed): its idle time
 * starts again. Bytes received are not progress, or a client trickling a
 * request byte by byte would never time out. Returns 0; -EINVAL for NULL.
 */
PERCH_API int perch_session_touch(struct perch_session *s);

/* How perch_session_end closes the connection. */
enum perch_session_end_how {
	PERCH_SESSION_CLOSE = 0,       /* perch_conn_close: a FIN after what was flushed */
	/*
	 * perch_conn_close_lingering with its default bounds, after a final
	 * answer: a peer still sending reads that answer, not a reset. A close
	 * when the linger cannot start.
	 */
	PERCH_SESSION_LINGER = 1,
	PERCH_SESSION_ABORT = 2,       /* perch_conn_abort: a reset; the peer sees the stream fail */
};

/*
 * Ends the session: closes its connection as `how` says (a read or flush
 * still parked on it is delivered inside this call, with an error; a
 * perch_session_end made from that continuation, or from fini, does
 * nothing), frees the reader and the writer, calls the fini callback,
 * drops the connection and frees the state. `s` is gone when it returns
 * (unless the server holds it across one of its callbacks: then it is
 * freed when that callback returns); do not use it again. Over TLS the
 * end completes the writer and calls perch_tls_end: what was flushed is
 * sent, then close_notify, then the close, within PERCH_TLS_END_MS.
 * Returns 0, or -EINVAL for NULL or a bad `how` (nothing is done).
 */
PERCH_API int perch_session_end(struct perch_session *s, enum perch_session_end_how how);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_SERVER_H */
