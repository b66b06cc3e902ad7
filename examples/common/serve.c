/* examples/common/serve.c: one loop per thread on a shared port, and each connection driven as a pipe session by continuations. */
#include "serve.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* One loop, its thread and listener, and what runs on it (touched on the loop thread only). */
struct serve_worker {
	struct serve *srv;
	struct perch_loop *loop;
	struct perch_listener *ls;
	pthread_t th;
	bool running;
	struct serve_item *items;
};

struct serve {
	const struct serve_proto *proto;
	void *app;
	int port;
	unsigned idle_timeout_ms;
	struct perch_conn_opts conn_opts; /* every accepted connection's */
	int nworkers;
	struct serve_worker wk[];
};

/* A connection with its pipe reader and writer, followed by the protocol's state. */
struct session {
	struct serve_item item;        /* first: a session is its item */
	struct serve_worker *wk;
	struct perch_conn *c;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	bool close_after_flush;
	bool *ended;                   /* set by session_end while session_stop waits on a close */
	struct perch_timer idle;       /* armed while idle_timeout_ms is set: closes a stalled session */
	alignas(max_align_t) unsigned char state[];
};

/* ---- what a worker tracks ---- */

struct perch_loop *serve_worker_loop(struct serve_worker *wk)
{
	return wk->loop;
}

unsigned serve_worker_idle_timeout(const struct serve_worker *wk)
{
	return wk->srv->idle_timeout_ms;
}

struct perch_conn_opts serve_worker_conn_opts(const struct serve_worker *wk)
{
	return wk->srv->conn_opts;
}

void serve_track(struct serve_worker *wk, struct serve_item *it)
{
	it->wk = wk;
	it->prev = NULL;
	it->next = wk->items;
	if (it->next)
		it->next->prev = it;
	wk->items = it;
}

void serve_untrack(struct serve_item *it)
{
	if (!it->wk)
		return;
	if (it->prev)
		it->prev->next = it->next;
	else
		it->wk->items = it->next;
	if (it->next)
		it->next->prev = it->prev;
	it->wk = NULL;
}

/* Ends every item: each stop untracks its own (serve_item's contract). */
static void worker_stop_items(struct serve_worker *wk)
{
	while (wk->items)
		wk->items->stop(wk->items);
}

/* ---- sessions ---- */

/*
 * Ends a session: the close first (nothing is parked when a session ends,
 * so it delivers nothing here), then the pipes, then our reference. After
 * a last answer flushed whole (`linger`), the connection is handed to a
 * lingering close instead: a client still sending (the rest of a request
 * answered with an error) reads that answer and the end, not a reset.
 */
static void session_end(struct session *s, bool linger)
{
	struct serve_worker *wk = s->wk;
	serve_untrack(&s->item);
	perch_timer_stop(&s->idle); /* before the free: the loop links an armed timer */
	if (wk->srv->proto->fini)
		wk->srv->proto->fini(s->state);
	if (!linger)
		perch_conn_close(s->c);
	perch_pipe_reader_free(s->r);
	perch_pipe_writer_free(s->w);
	if (!linger || perch_conn_close_lingering(s->c, NULL) != 0)
		perch_conn_release(s->c); /* closes it, if the linger could not start */
	if (s->ended)
		*s->ended = true;
	free(s);
}

static void session_pump(struct session *s);

/*
 * An answer reached the kernel (a flush completed: over a connection one
 * waits whenever something was staged): the idle time starts again. Bytes
 * alone are not progress, or a client trickling a request would never end.
 */
static void session_progressed(struct session *s)
{
	if (s->wk->srv->idle_timeout_ms)
		perch_timer_start(&s->idle, s->wk->srv->idle_timeout_ms);
}

static void session_read_ready(void *arg, int64_t result)
{
	if (result < 0)
		session_end(arg, false); /* -ECANCELED: the reader was completed under us */
	else
		session_pump(arg);
}

static void session_flushed(void *arg, int64_t result)
{
	struct session *s = arg;
	if (result < 0 || s->close_after_flush) {
		session_end(s, result == 0);
		return;
	}
	session_progressed(s);
	session_pump(s);
}


/*
 * Reads, answers every complete message of the result, flushes once, and
 * reads again, until a read or a flush has to wait (its continuation picks
 * up here) or the session ends. Waiting for the flush before reading more
 * is the backpressure: a client that does not read its answers stops being
 * read.
 */
static void session_pump(struct session *s)
{
	const struct serve_proto *proto = s->wk->srv->proto;
	for (;;) {
		struct perch_read_result res;
		int rc = perch_pipe_read_or_wait(s->r, &res, session_read_ready, s);
		if (rc == PERCH_PENDING)
			return;
		if (rc != 0) {
			session_end(s, false);
			return;
		}
		size_t consumed = 0;
		int stop = proto->on_data(s->state, s->wk->srv->app, &res, s->w, &consumed);
		/* Examined to the end: a partial message waits for more bytes instead of spinning. */
		if (proto->forward_consumed) {
			if (perch_pipe_forward(s->r, consumed, res.len, s->w) != 0)
				stop = 1; /* closed, or out of memory: what was staged is still flushed */
		} else {
			/* Yielded: only what it consumed was examined, so the next read returns the rest at once. */
			perch_pipe_advance_to(s->r, consumed, stop == SERVE_YIELD ? consumed : res.len);
		}
		/* A FIN behind messages not yet answered waits: the next read reports it again. */
		if ((res.completed && stop != SERVE_YIELD) || res.error || res.closed || res.canceled)
			stop = 1;
		else if (stop == SERVE_YIELD)
			stop = 0;
		s->close_after_flush = stop;
		rc = perch_pipe_flush_or_wait(s->w, session_flushed, s);
		if (rc == PERCH_PENDING)
			return;
		if (rc < 0 || stop) {
			session_end(s, rc == 0);
			return;
		}
	}
}

/* Closing the connection delivers its parked read or flush here, which ends the session. */
static void session_stop(struct serve_item *it)
{
	struct session *s = (struct session *)it;
	bool ended = false;
	s->ended = &ended;
	perch_conn_close(s->c); /* a parked read or flush is delivered here, and ends s */
	if (!ended)
		session_end(s, false); /* nothing was parked (none should be, between turns) */
}

/* Nothing happened for idle_timeout_ms: the session ends as serve_stop would end it. */
static void session_idle(struct perch_timer *t, void *arg)
{
	struct session *s = arg;
	session_stop(&s->item);
}

static void on_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	struct serve_worker *wk = arg;
	if (wk->srv->proto->accept) {
		wk->srv->proto->accept(wk, c, wk->srv->app);
		return;
	}
	struct session *s = calloc(1, sizeof(*s) + wk->srv->proto->state_size);
	if (!s || perch_pipe_reader_new(c, &s->r) != 0 || perch_pipe_writer_new(c, &s->w) != 0) {
		if (s) {
			perch_pipe_reader_free(s->r);
			free(s);
		}
		perch_conn_release(c); /* out of memory: refuse this one, keep serving the others */
		return;
	}
	s->wk = wk;
	s->c = c;
	s->item.stop = session_stop;
	serve_track(wk, &s->item);
	perch_timer_init(&s->idle, wk->loop, session_idle, s);
	session_progressed(s); /* a client that never sends is idle from its accept */
	session_pump(s);
}

/* ---- workers ---- */

/* Posted to the loop by serve_stop: the connections must be released before the loop is freed. */
static void worker_shutdown(void *arg)
{
	struct serve_worker *wk = arg;
	if (wk->ls)
		perch_listener_close(wk->ls);
	wk->ls = NULL;
	worker_stop_items(wk);
	perch_loop_stop(wk->loop);
}

static void *worker_main(void *arg)
{
	struct serve_worker *wk = arg;
	int rc = perch_loop_run(wk->loop);
	if (rc != 0)
		fprintf(stderr, "serve: loop failed: %s\n", strerror(-rc));
	worker_stop_items(wk); /* only when the shutdown could not be posted */
	perch_loop_free(wk->loop);
	if (wk->srv->proto->thread_fini)
		wk->srv->proto->thread_fini();
	return NULL;
}

void serve_opts_default(struct serve_opts *o)
{
	*o = (struct serve_opts){ .host = "127.0.0.1", .port = 0, .threads = 1,
				  .idle_timeout_ms = SERVE_IDLE_TIMEOUT_MS };
}

/* Creates worker i's loop and listener; the first one fixes the port for the others. */
static int worker_init(struct serve *srv, int i, const struct serve_opts *o)
{
	struct serve_worker *wk = &srv->wk[i];
	wk->srv = srv;
	struct perch_loop_opts lopts = { .buf_count = o->recv_buffers };
	int rc = perch_loop_new(&lopts, &wk->loop);
	if (rc != 0)
		return rc;
	/*
	 * One loop per thread shares the port: SO_REUSEPORT, and only then (a
	 * second server is refused). A Unix socket is one loop's; a file left
	 * by a server that died is replaced, a live server's is not.
	 */
	struct perch_listen_opts lo = { .reuseport = o->threads > 1, .unlink_stale = true };
	if (o->unix_name)
		rc = perch_listen_unix(wk->loop, o->unix_name, &lo, &srv->conn_opts, on_accept, wk, &wk->ls);
	else
		rc = perch_listen_tcp(wk->loop, o->host, i == 0 ? o->port : srv->port, &lo, &srv->conn_opts,
				      on_accept, wk, &wk->ls);
	if (rc != 0)
		return rc;
	if (i == 0)
		srv->port = perch_listener_port(wk->ls);
	return 0;
}

/*
 * With --threads N > 1 the listeners set SO_REUSEPORT (a loop per thread
 * shares the port), and so would join another such server's listener on
 * it without a word: a bind without the option finds any listener first
 * (best effort: two servers starting at the same instant may both pass).
 * A single loop needs no check (perch_listen refuses a port in use), but
 * one bind costs nothing and keeps the message the same. 0, -EADDRINUSE,
 * or -EINVAL for a host that is not a numeric address.
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
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc = 0;
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); /* as perch_listen: TIME_WAIT is no owner */
	if (ss.ss_family == AF_INET6) /* as perch_listen: "::" must not collide with IPv4 listeners */
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

int serve_start(const struct serve_opts *o, const struct serve_proto *proto, void *app,
		struct serve **out)
{
	if (!o || !o->host || o->port < 0 || o->port > 65535 || !proto ||
	    !(proto->on_data || proto->accept) || !out || o->threads < 1 ||
	    o->idle_timeout_ms > PERCH_TIMER_MAX_MS || (o->unix_name && o->threads > 1))
		return -EINVAL;
	int rc = o->port && !o->unix_name ? port_is_free(o->host, o->port) : 0;
	if (rc != 0)
		return rc;
	struct serve *srv = calloc(1, sizeof(*srv) + (size_t)o->threads * sizeof(srv->wk[0]));
	if (!srv)
		return -ENOMEM;
	srv->proto = proto;
	srv->app = app;
	srv->idle_timeout_ms = o->idle_timeout_ms;
	srv->conn_opts = (struct perch_conn_opts){ .recv_mode = o->recv, .nagle = o->nagle,
						   .zerocopy_min = o->zerocopy_min };
	srv->nworkers = o->threads;
	for (int i = 0; i < o->threads && rc == 0; i++)
		rc = worker_init(srv, i, o);
	for (int i = 0; i < o->threads && rc == 0; i++) {
		if (pthread_create(&srv->wk[i].th, NULL, worker_main, &srv->wk[i]) != 0)
			rc = -EAGAIN;
		else
			srv->wk[i].running = true;
	}
	if (rc != 0) {
		serve_stop(srv);
		return rc;
	}
	*out = srv;
	return 0;
}

int serve_port(const struct serve *s)
{
	return s ? s->port : -EINVAL;
}

void *serve_app(const struct serve *s)
{
	return s ? s->app : NULL;
}

void serve_stop(struct serve *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->nworkers; i++) {
		struct serve_worker *wk = &s->wk[i];
		if (wk->running && perch_loop_post(wk->loop, worker_shutdown, wk) != 0)
			perch_loop_stop(wk->loop);
	}
	for (int i = 0; i < s->nworkers; i++) {
		struct serve_worker *wk = &s->wk[i];
		if (wk->running)
			pthread_join(wk->th, NULL);
		else
			perch_loop_free(wk->loop); /* never ran: any thread may free it */
	}
	free(s);
}

/* ---- the command line ---- */

const char *serve_extra_usage;
const char *serve_extra_synopsis;

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [--listen tcp:HOST:PORT|unix:PATH | --port P] [--host ADDR] [--threads N]\n"
		"       [--backend uring|io_uring|epoll] [--recv multishot|singleshot] [--idle-timeout MS]\n"
		"       [--nagle] [--zerocopy-min BYTES|off]%s%s\n"
		"  --listen tcp:HOST:PORT  TCP on a numeric address ([V6]:PORT for IPv6; port 0: the\n"
		"                 kernel picks one, printed at start)\n"
		"  --listen unix:PATH  a Unix socket (unix:@NAME: an abstract name); a stale socket\n"
		"                 file left by a server that died is replaced; one loop (--threads 1)\n"
		"  --port P       TCP port, as --listen tcp:HOST:P (default 0)\n"
		"  --host ADDR    numeric IPv4 or IPv6 address to listen on (default 127.0.0.1)\n"
		"  --threads N    loops, one per thread; N > 1 shares the port among them with\n"
		"                 SO_REUSEPORT (default 1: no SO_REUSEPORT)\n"
		"  --backend B    the loop's backend, passed to the library as PERCH_BACKEND=B\n"
		"  --recv M       receive mode of each connection (default: the loop's, multishot)\n"
		"  --idle-timeout MS  close a connection that gets no answer flushed for this long\n"
		"                 (idle, trickling a request, or not reading; default 60000; 0: never;\n"
		"                 at most 86400000, a day)\n"
		"  --nagle        keep Nagle's algorithm instead of TCP_NODELAY (the default): fuller\n"
		"                 segments for bulk streams; a small answer may wait for the peer's ACK\n"
		"  --zerocopy-min BYTES|off  io_uring: an answer sent by reference this long or longer\n"
		"                 goes out zero-copy (SEND_ZC; default: off, the library's)\n"
		"%s",
		prog, serve_extra_synopsis ? " " : "", serve_extra_synopsis ? serve_extra_synopsis : "",
		serve_extra_usage ? serve_extra_usage : "");
}

/* Decimal digits only (no sign, no space) making a number in [lo, hi], or -1. */
static long parse_num(const char *s, long lo, long hi)
{
	char *end;
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	long v = strtol(s, &end, 10);
	return (errno || *end || v < lo || v > hi) ? -1 : v;
}

int serve_parse_hostport(const char *s, int min_port, char *host, int *port)
{
	const char *colon = s ? strrchr(s, ':') : NULL;
	if (!colon || !host || !port)
		return -EINVAL;
	size_t hlen = (size_t)(colon - s);
	const char *h = s;
	bool bracketed = hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']';
	if (bracketed) {
		h++;
		hlen -= 2;
	} else if (memchr(h, ':', hlen)) {
		return -EINVAL; /* an IPv6 address takes brackets, or its last group would read as the port */
	}
	long p = parse_num(colon + 1, min_port, 65535);
	char buf[SERVE_HOST_MAX];
	unsigned char addr[sizeof(struct in6_addr)];
	if (p < 0 || hlen >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, h, hlen);
	buf[hlen] = 0;
	if (inet_pton(bracketed ? AF_INET6 : AF_INET, buf, addr) != 1)
		return -EINVAL;
	memcpy(host, buf, hlen + 1);
	*port = (int)p;
	return 0;
}

/* The host a --listen tcp:HOST:PORT names: serve_opts.host points here. */
static char listen_host[SERVE_HOST_MAX];

/* --listen tcp:HOST:PORT or unix:NAME (a path, or @name) into *o; -1 for anything else. */
static int parse_listen(const char *s, struct serve_opts *o)
{
	if (strncmp(s, "unix:", 5) == 0) {
		size_t n = strlen(s + 5);
		if (n == 0 || n > 107 || strcmp(s + 5, "@") == 0)
			return -1; /* unix(7): 107 bytes and a NUL; perch_listen_unix would say so later */
		o->unix_name = s + 5;
		return 0;
	}
	if (strncmp(s, "tcp:", 4) != 0 || serve_parse_hostport(s + 4, 0, listen_host, &o->port) != 0)
		return -1;
	o->host = listen_host;
	o->unix_name = NULL;
	return 0;
}

static int parse_recv(const char *s, enum perch_recv_mode *m)
{
	if (strcmp(s, "multishot") == 0)
		*m = PERCH_RECV_MULTISHOT;
	else if (strcmp(s, "singleshot") == 0)
		*m = PERCH_RECV_SINGLESHOT;
	else
		return -1;
	return 0;
}

int serve_parse_args(int argc, char **argv, const char *prog, struct serve_opts *o)
{
	static const struct option longs[] = {
		{ "port", required_argument, NULL, 'p' },    { "host", required_argument, NULL, 'H' },
		{ "threads", required_argument, NULL, 't' }, { "backend", required_argument, NULL, 'b' },
		{ "recv", required_argument, NULL, 'r' },    { "help", no_argument, NULL, 'h' },
		{ "idle-timeout", required_argument, NULL, 'i' }, { "nagle", no_argument, NULL, 'n' },
		{ "listen", required_argument, NULL, 'l' }, { "zerocopy-min", required_argument, NULL, 'z' },
		{ NULL, 0, NULL, 0 },
	};
	serve_opts_default(o);
	bool listen_given = false, host_or_port_given = false;
	int opt, idx = 0;
	long v;
	optind = 1;
	opterr = 0; /* getopt's own messages name argv[0], a path: say it with prog, as every other message does */
	while ((opt = getopt_long(argc, argv, ":", longs, &idx)) != -1) {
		switch (opt) {
		case 'p':
			if ((v = parse_num(optarg, 0, 65535)) < 0)
				goto bad;
			o->port = (int)v;
			host_or_port_given = true;
			break;
		case 'H':
			o->host = optarg;
			host_or_port_given = true;
			break;
		case 'l':
			if (parse_listen(optarg, o) != 0)
				goto bad;
			listen_given = true;
			break;
		case 't':
			if ((v = parse_num(optarg, 1, 256)) < 0)
				goto bad;
			o->threads = (int)v;
			break;
		case 'b':
			/* The library's spellings: "io_uring" is the name the banner prints. */
			if (strcmp(optarg, "uring") != 0 && strcmp(optarg, "io_uring") != 0 &&
			    strcmp(optarg, "epoll") != 0)
				goto bad;
			o->backend = optarg;
			break;
		case 'r':
			if (parse_recv(optarg, &o->recv) != 0)
				goto bad;
			break;
		case 'i':
			if ((v = parse_num(optarg, 0, PERCH_TIMER_MAX_MS)) < 0)
				goto bad;
			o->idle_timeout_ms = (unsigned)v;
			break;
		case 'n':
			o->nagle = true;
			break;
		case 'z':
			if (strcmp(optarg, "off") == 0)
				o->zerocopy_min = PERCH_ZEROCOPY_OFF;
			else if ((v = parse_num(optarg, 1, UINT32_MAX)) < 0)
				goto bad;
			else
				o->zerocopy_min = (size_t)v;
			break;
		case 'h':
			usage(prog);
			return 1;
		case ':':
			fprintf(stderr, "%s: %s needs a value\n", prog, argv[optind - 1]);
			usage(prog);
			return -1;
		default:
			fprintf(stderr, "%s: unknown option '%s'\n", prog, argv[optind - 1]);
			usage(prog);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
		usage(prog);
		return -1;
	}
	if (listen_given && host_or_port_given) {
		fprintf(stderr, "%s: --listen says where to listen: give it or --host/--port, not both\n", prog);
		usage(prog);
		return -1;
	}
	if (o->unix_name && o->threads > 1) {
		fprintf(stderr, "%s: a Unix socket has one listener: --threads must be 1 with --listen unix:\n", prog);
		usage(prog);
		return -1;
	}
	/* The library reads PERCH_BACKEND when it creates a loop: this is what selects it. */
	if (o->backend && setenv("PERCH_BACKEND", o->backend, 1) != 0)
		return -1;
	return 0;
bad:
	fprintf(stderr, "%s: bad value '%s' for --%s\n", prog, optarg, longs[idx].name);
	usage(prog);
	return -1;
}

/* Where o listens, as --listen says it: "unix:NAME", or "HOST:PORT" ("[V6]:PORT"). */
static const char *listen_text(const struct serve_opts *o, int port, char *buf, size_t size)
{
	bool v6 = strchr(o->host, ':') != NULL;
	if (o->unix_name)
		snprintf(buf, size, "unix:%s", o->unix_name);
	else
		snprintf(buf, size, "%s%s%s:%d", v6 ? "[" : "", o->host, v6 ? "]" : "", port);
	return buf;
}

int serve_main(int argc, char **argv, const char *prog, serve_start_fn start, serve_stop_fn stop)
{
	struct serve_opts o;
	int rc = serve_parse_args(argc, argv, prog, &o);
	if (rc != 0)
		return rc > 0 ? 0 : 2;
	/* Blocked before the loops' threads exist, so they inherit the mask and sigwait alone takes them. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	struct serve *srv;
	rc = start(&o, &srv);
	if (rc != 0) {
		/* A loop refused before any listen: the backend named in the environment is the usual cause. */
		const char *be = getenv("PERCH_BACKEND");
		char at[SERVE_HOST_MAX + 120];
		fprintf(stderr, "%s: cannot start its loops or listen on %s: %s%s%s%s\n", prog,
			listen_text(&o, o.port, at, sizeof(at)), strerror(-rc), rc == -EINVAL && be ? " (PERCH_BACKEND=" : "",
			rc == -EINVAL && be ? be : "", rc == -EINVAL && be ? ": uring, io_uring or epoll?)" : "");
		return 1;
	}
	/* What the loop really runs: io_uring refused falls back to epoll (one line on stderr says why). */
	char at[SERVE_HOST_MAX + 120];
	printf("%s: listening on %s, %d thread%s, backend %s, idle timeout ", prog,
	       listen_text(&o, serve_port(srv), at, sizeof(at)), o.threads, o.threads == 1 ? "" : "s",
	       perch_loop_backend_name(srv->wk[0].loop));
	if (o.idle_timeout_ms)
		printf("%u ms", o.idle_timeout_ms);
	else
		printf("none");
	printf("%s\n", o.nagle ? ", Nagle's algorithm on" : "");
	fflush(stdout);
	int sig;
	while (sigwait(&set, &sig) != 0)
		;
	stop(srv);
	return 0;
}
