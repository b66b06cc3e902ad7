/* examples/common/serve.h: the examples' shared skeleton on perch's server: the command line, and a session pumped through a protocol's on_data. */
#ifndef PERCH_EXAMPLES_SERVE_H
#define PERCH_EXAMPLES_SERVE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include <perch.h>

/* What a server is asked for on its command line; serve_opts_default fills the defaults. */
struct serve_opts {
	const char *host;              /* numeric address to listen on; "127.0.0.1" */
	int port;                      /* 0: the kernel picks (serve_port says which) */
	/*
	 * A Unix socket to listen on instead of host and port: a path, or
	 * "@name" (abstract); NULL (default): TCP. A stale socket file left at
	 * the path by a server that died is replaced (unlink_stale); one a
	 * running server listens on is not (-EADDRINUSE). One loop only: a Unix
	 * name has one listener, so threads > 1 is -EINVAL.
	 */
	const char *unix_name;
	int threads;                   /* loops, one per thread; > 1 share the port (SO_REUSEPORT); 1 */
	const char *backend;           /* "uring", "epoll" or NULL (the library's choice) */
	enum perch_recv_mode recv;     /* per-connection receive mode; PERCH_RECV_DEFAULT */
	/*
	 * A connection that gets no answer flushed for this long is closed
	 * (counted from its accept, then from each completed flush): an idle
	 * keep-alive client, one that trickles a request byte by byte, and one
	 * that stops reading its answers all end; so does a request whose
	 * body takes longer than this to arrive. 0: never;
	 * SERVE_IDLE_TIMEOUT_MS by default; at most PERCH_TIMER_MAX_MS.
	 */
	unsigned idle_timeout_ms;
	/*
	 * Keep Nagle's algorithm on every connection (perch_conn_opts.nagle):
	 * fewer, fuller segments for a bulk stream (echo, a proxy), but a small
	 * answer may wait for the peer's ACK. false by default: TCP_NODELAY,
	 * what request/answer protocols want.
	 */
	bool nagle;
	/*
	 * Each loop's receive buffers (perch_loop_opts.buf_count: a power of
	 * two, at most 32768); 0: the library's default, 512.
	 */
	uint32_t recv_buffers;
	/*
	 * io_uring: one receive buffer per completion even where the kernel
	 * bundles them (perch_loop_opts.recv_bundles_off): to measure bundles.
	 */
	bool recv_bundles_off;
	/*
	 * io_uring: no registered file table (perch_loop_opts.fixed_files_off):
	 * every operation looks its socket's fd up; to measure the table.
	 */
	bool fixed_files_off;
	/*
	 * perch_conn_opts.pause_bytes of every connection: the unconsumed
	 * bytes at which it stops receiving, and so what a peer the other
	 * side cannot keep up with (a proxy's) pins; 0: the library's
	 * default, 256 KiB.
	 */
	size_t pause_bytes;
	/*
	 * perch_conn_opts.zerocopy_min of every connection: a referenced write
	 * this long or longer goes out zero-copy on io_uring; 0: the
	 * library's default; PERCH_ZEROCOPY_OFF: never.
	 */
	size_t zerocopy_min;
	/*
	 * serve_stop's grace (perch_server_stop's deadline): sessions waiting
	 * for a request end at once, one inside a request answers it first,
	 * and what is still open after this long is reset.
	 * SERVE_STOP_DEADLINE_MS by default; 0: reset at once.
	 */
	unsigned stop_deadline_ms;
	/*
	 * TLS on every connection (perch/tls.h): the certificate chain and
	 * key, PEM files; both or neither. NULL: plain TCP.
	 */
	const char *tls_cert;
	const char *tls_key;
};

#define SERVE_IDLE_TIMEOUT_MS 60000u
#define SERVE_STOP_DEADLINE_MS 5000u

/* on_data's "more is waiting": see struct serve_proto. */
#define SERVE_YIELD 2

/*
 * A protocol: what a connection does with the bytes it receives. Every
 * callback runs on the connection's loop thread and must not block.
 */
struct serve_proto {
	size_t state_size;             /* per-connection state, zeroed, handed to each call */
	/*
	 * Handles every complete message in `r` (bytes first; r->completed and
	 * friends are the session's business), staging the answers on `w`.
	 * Sets *consumed to the bytes it is done with; a partial message stays
	 * unconsumed and comes back with more bytes. Returns 0 to go on, 1 to
	 * close once the answers are flushed, or SERVE_YIELD when it stopped at
	 * a bound on one read's work with complete messages maybe left after
	 * *consumed: its answers are flushed, then the rest is read again at
	 * once (a FIN behind it waits its turn). Not with forward_consumed.
	 * While the server stops, a session whose messages were all answered
	 * closes after its flush.
	 */
	int (*on_data)(void *state, void *app, const struct perch_read_result *r,
		       struct perch_pipe_writer *w, size_t *consumed);
	/*
	 * The consumed bytes are written back after on_data's answers, without
	 * a copy where they fill whole receive buffers (perch_pipe_forward):
	 * an echo.
	 */
	bool forward_consumed;
	void (*fini)(void *state);     /* optional: frees what the state holds */
	/*
	 * Optional, instead of on_data: a protocol that drives its sessions
	 * itself (a proxy). Handed to perch_server_opts as they are (start,
	 * stop, and end as its fini), with state_size and the serve_start's
	 * app.
	 */
	perch_session_start_fn start;
	perch_session_fn stop;
	perch_session_fn end;
	bool idle_reset;               /* an idle session is reset, not closed (perch_server_opts.idle_end) */
	const char *alpn;              /* over TLS: the protocol ALPN names ("http/1.1"), or NULL */
};

struct serve;

void serve_opts_default(struct serve_opts *o);

/* The longest "HOST" serve_parse_hostport writes, its NUL included (an IPv6 address). */
#define SERVE_HOST_MAX 46

/*
 * Parses "HOST:PORT" (a numeric IPv4 address, or an IPv6 one in
 * brackets: "[::1]:8080") into host (SERVE_HOST_MAX bytes) and *port, a
 * port of min_port..65535. Returns 0, or -EINVAL (host and *port then
 * untouched).
 */
int serve_parse_hostport(const char *s, int min_port, char *host, int *port);

/*
 * Parses --listen tcp:HOST:PORT|unix:NAME (or --port P and --host ADDR),
 * --threads N, --backend uring|epoll,
 * --recv multishot|singleshot, --idle-timeout MS, --nagle and --help into *o
 * (defaults first). A
 * backend is exported as PERCH_BACKEND, which is how the library picks the
 * loop's backend: call this before creating any loop. Returns 0; 1 after
 * --help; -1 after printing what was wrong (both with the usage on stderr).
 */
int serve_parse_args(int argc, char **argv, const char *prog, struct serve_opts *o);

/*
 * Starts a perch_server (o->threads loops on the same port, or one loop
 * on o->unix_name) whose sessions run `proto` with `app`. Returns 0 with
 * *out set, or -EINVAL (a NULL argument, a proto with neither on_data
 * nor start) or perch_server_start's error.
 */
int serve_start(const struct serve_opts *o, const struct serve_proto *proto, void *app,
		struct serve **out);

/* The port every loop listens on (0 on a Unix socket). */
int serve_port(const struct serve *s);

/*
 * Stops the server gracefully (perch_server_stop with the options'
 * stop_deadline_ms) and frees it. NULL is ignored.
 */
void serve_stop(struct serve *s);

/* Makes serve_stop fill *report (perch_server_report) with how the sessions ended. */
void serve_report_to(struct serve *s, struct perch_server_report *report);

/* The `app` a server was started with. */
void *serve_app(const struct serve *s);

/* How a server starts and stops: each example offers the pair (its tests start it in-process). */
typedef int (*serve_start_fn)(const struct serve_opts *o, struct serve **out);
typedef void (*serve_stop_fn)(struct serve *s);

/* A start that fails after saying why on stderr calls it: serve_main then adds no line of its own. */
void serve_said_why(void);

/*
 * A server's main: parses the command line, starts it with SIGINT and
 * SIGTERM blocked in every thread, prints "PROG: listening on HOST:PORT, N
 * thread(s), backend ..." on stdout, waits for one of the two signals and
 * stops it. Returns the process's exit status.
 */
int serve_main(int argc, char **argv, const char *prog, serve_start_fn start, serve_stop_fn stop);

/* Lines a program's own options add to the usage (each ending in a newline), or NULL. */
extern const char *serve_extra_usage;
/* Its options in the usage's first lines, after the shared ones ("[--copy]"), or NULL. */
extern const char *serve_extra_synopsis;

#endif /* PERCH_EXAMPLES_SERVE_H */
