/* examples/common/serve.c: the examples' command line, and each connection driven as a pipe session by continuations on perch's server. */
#include "serve.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>

struct serve {
	struct perch_server *ps;
	const struct serve_proto *proto;
	void *app;
	unsigned stop_deadline_ms;
	struct perch_server_report *report; /* filled by serve_stop when set */
};

/*
 * A session driven by on_data, followed by the protocol's state. Its pipes
 * and its server are the session's to say: an idle connection keeps no
 * copy of them (doc/perf/scale).
 */
struct pump {
	struct perch_session *s;
	bool close_after_flush;
	bool reading;                  /* a read is parked */
	bool partial;                  /* bytes of a message not yet whole are held */
	alignas(max_align_t) unsigned char state[];
};

/*
 * After a last answer flushed whole (`linger`), the connection is handed
 * to a lingering close: a client still sending (the rest of a request
 * answered with an error) reads that answer and the end, not a reset.
 */
static void pump_end(struct pump *p, bool linger)
{
	perch_session_end(p->s, linger ? PERCH_SESSION_LINGER : PERCH_SESSION_CLOSE);
}

static void pump_run(struct pump *p);

static void pump_read_ready(void *arg, int64_t result)
{
	struct pump *p = arg;
	p->reading = false;
	if (result < 0)
		pump_end(p, false); /* -ECANCELED: the reader was completed under us */
	else
		pump_run(p);
}

/* An answer reached the kernel: the idle time starts again (perch_session_touch). */
static void pump_flushed(void *arg, int64_t result)
{
	struct pump *p = arg;
	/* A stop that began while this flush waited finds the session between messages now. */
	if (result < 0 || p->close_after_flush || (!p->partial && perch_session_stopping(p->s))) {
		pump_end(p, result == 0);
		return;
	}
	perch_session_touch(p->s);
	pump_run(p);
}

/* Answers one read's complete messages; returns whether to close once they are flushed. */
static bool pump_answer(struct pump *p, const struct perch_read_result *res, struct perch_pipe_reader *r,
			struct perch_pipe_writer *w)
{
	const struct serve *srv = perch_session_app(p->s);
	const struct serve_proto *proto = srv->proto;
	size_t consumed = 0;
	int stop = proto->on_data(p->state, srv->app, res, w, &consumed);
	/* Examined to the end: a partial message waits for more bytes instead of spinning. */
	if (proto->forward_consumed) {
		if (perch_pipe_forward(r, consumed, res->len, w) != 0)
			stop = 1; /* closed, or out of memory: what was staged is still flushed */
	} else {
		/* Yielded: only what it consumed was examined, so the next read returns the rest at once. */
		perch_pipe_advance_to(r, consumed, stop == SERVE_YIELD ? consumed : res->len);
	}
	p->partial = consumed < res->len;
	/* A FIN behind messages not yet answered waits: the next read reports it again. */
	if ((res->completed && stop != SERVE_YIELD) || res->error || res->closed || res->canceled)
		return true;
	/* A graceful stop ends the session at a message boundary. */
	return stop == 1 || (stop == 0 && !p->partial && perch_session_stopping(p->s));
}

/*
 * Reads, answers every complete message of the result, flushes once, and
 * reads again, until a read or a flush has to wait (its continuation picks
 * up here) or the session ends. Waiting for the flush before reading more
 * is the backpressure: a client that does not read its answers stops being
 * read.
 */
static void pump_run(struct pump *p)
{
	struct perch_pipe_reader *r = perch_session_reader(p->s);
	for (;;) {
		struct perch_read_result res;
		int rc = perch_pipe_read_or_wait(r, &res, pump_read_ready, p);
		if (rc == PERCH_PENDING) {
			p->reading = true;
			return;
		}
		if (rc != 0) {
			pump_end(p, false);
			return;
		}
		struct perch_pipe_writer *w = perch_session_writer(p->s); /* asked for once a read is served */
		p->close_after_flush = pump_answer(p, &res, r, w);
		bool answered = perch_pipe_writer_staged(w) > 0;
		rc = perch_pipe_flush_or_wait(w, pump_flushed, p);
		if (rc == PERCH_PENDING)
			return;
		if (rc < 0 || p->close_after_flush) {
			pump_end(p, rc == 0);
			return;
		}
		if (answered)
			perch_session_touch(p->s); /* an answer's flush completed at once */
	}
}

static void pump_start(struct perch_session *s, struct perch_pipe_reader *r, struct perch_pipe_writer *w,
		       void *app)
{
	struct pump *p = perch_session_state(s);
	*p = (struct pump){ .s = s };
	pump_run(p);
}

/* The server is stopping: a session waiting for a new message ends now; one inside a message answers it first. */
static void pump_stop(struct perch_session *s, void *app)
{
	struct pump *p = perch_session_state(s);
	if (p->reading && !p->partial)
		perch_conn_close(perch_session_conn(s)); /* delivers the parked read, which ends it */
}

static void pump_fini(struct perch_session *s, void *app)
{
	struct serve *srv = app;
	if (srv->proto->fini)
		srv->proto->fini(((struct pump *)perch_session_state(s))->state);
}

void serve_opts_default(struct serve_opts *o)
{
	*o = (struct serve_opts){ .host = "127.0.0.1", .port = 0, .threads = 1,
				  .idle_timeout_ms = SERVE_IDLE_TIMEOUT_MS,
				  .stop_deadline_ms = SERVE_STOP_DEADLINE_MS };
}

/* Set when a start failed and said why (serve_said_why): serve_main adds nothing to it. */
static bool start_said_why;

void serve_said_why(void)
{
	start_said_why = true;
}

/* The server's TLS context when a certificate is given (NULL otherwise); says why it cannot be made. */
static int serve_tls_ctx(const struct serve_opts *o, const struct serve_proto *proto,
			 struct perch_tls_ctx **out)
{
	*out = NULL;
	if (!o->tls_cert && !o->tls_key)
		return 0;
	if (!o->tls_cert || !o->tls_key) {
		fprintf(stderr, "tls: a certificate needs its key: give --tls-cert and --tls-key\n");
		serve_said_why();
		return -EINVAL;
	}
	struct perch_tls_ctx_opts to = { .role = PERCH_TLS_SERVER, .cert_file = o->tls_cert,
					 .key_file = o->tls_key, .alpn = proto->alpn };
	char why[256];
	int rc = perch_tls_ctx_new(&to, out, why, sizeof(why));
	if (rc != 0) {
		fprintf(stderr, "tls: %s\n", why);
		serve_said_why();
	}
	return rc;
}

int serve_start(const struct serve_opts *o, const struct serve_proto *proto, void *app,
		struct serve **out)
{
	if (!o || !proto || !(proto->on_data || proto->start) || !out)
		return -EINVAL;
	struct serve *srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	*srv = (struct serve){ .proto = proto, .app = app, .stop_deadline_ms = o->stop_deadline_ms };
	struct perch_server_opts so = {
		.host = o->host, .port = o->port, .unix_name = o->unix_name, .threads = o->threads,
		.idle_timeout_ms = o->idle_timeout_ms, .loop = { .buf_count = o->recv_buffers, .recv_bundles_off = o->recv_bundles_off,
			  .fixed_files_off = o->fixed_files_off },
		.conn = { .recv_mode = o->recv, .nagle = o->nagle, .zerocopy_min = o->zerocopy_min,
			  .pause_bytes = o->pause_bytes },
		.idle_end = proto->idle_reset ? PERCH_SESSION_ABORT : PERCH_SESSION_CLOSE,
	};
	if (proto->start) { /* the protocol drives its sessions itself */
		so.state_size = proto->state_size;
		so.start = proto->start;
		so.stop = proto->stop;
		so.fini = proto->end;
		so.app = app;
	} else {
		so.state_size = sizeof(struct pump) + proto->state_size;
		so.start = pump_start;
		so.stop = pump_stop;
		so.fini = pump_fini;
		so.app = srv;
	}
	int rc = serve_tls_ctx(o, proto, &so.tls);
	if (rc == 0)
		rc = perch_server_start(&so, &srv->ps);
	perch_tls_ctx_free(so.tls); /* the server keeps its own reference */
	if (rc != 0) {
		free(srv);
		return rc;
	}
	*out = srv;
	return 0;
}

int serve_port(const struct serve *s)
{
	return s ? perch_server_port(s->ps) : -EINVAL;
}

void *serve_app(const struct serve *s)
{
	return s ? s->app : NULL;
}

void serve_report_to(struct serve *s, struct perch_server_report *report)
{
	s->report = report;
}

void serve_stop(struct serve *s)
{
	if (!s)
		return;
	perch_server_stop(s->ps, s->stop_deadline_ms, s->report);
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
		"       [--nagle] [--zerocopy-min BYTES|off] [--stop-deadline MS] [--recv-buffers N]\n"
		"       [--pause-bytes BYTES] [--recv-bundles-off] [--fixed-files-off]\n"
		"       [--tls-cert FILE --tls-key FILE]%s%s\n"
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
		"  --stop-deadline MS  on SIGINT or SIGTERM, stop accepting and let open sessions\n"
		"                 finish their request for up to this long, then reset the rest\n"
		"                 (default 5000; 0: reset them at once)\n"
		"  --recv-buffers N  each loop's receive buffers of 16 KiB, a power of two up to\n"
		"                 32768 (default 512); their memory is taken as they are first used\n"
		"  --pause-bytes BYTES  a connection stops receiving while this much it received is\n"
		"                 not consumed (default 262144, at most 1073741824); above the largest\n"
		"                 message held whole\n"
		"  --recv-bundles-off  io_uring: one receive buffer per completion even where the\n"
		"                 kernel hands over several at once (recv bundles; to measure them)\n"
		"  --fixed-files-off  io_uring: no registered file table: each send looks its\n"
		"                 socket's fd up (to measure the table)\n"
		"  --tls-cert FILE --tls-key FILE  speak TLS on every connection (OpenSSL 3): the PEM\n"
		"                 certificate chain, leaf first, and its key\n"
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

/* What a refused value must be, for the options whose rule their name does not say. */
static const char *value_rule(const char *name)
{
	if (strcmp(name, "recv-buffers") == 0)
		return " (a power of two, 1 to 32768)";
	if (strcmp(name, "pause-bytes") == 0)
		return " (bytes, 1 to 1073741824)";
	return "";
}

int serve_parse_args(int argc, char **argv, const char *prog, struct serve_opts *o)
{
	static const struct option longs[] = {
		{ "port", required_argument, NULL, 'p' },    { "host", required_argument, NULL, 'H' },
		{ "threads", required_argument, NULL, 't' }, { "backend", required_argument, NULL, 'b' },
		{ "recv", required_argument, NULL, 'r' },    { "help", no_argument, NULL, 'h' },
		{ "idle-timeout", required_argument, NULL, 'i' }, { "nagle", no_argument, NULL, 'n' },
		{ "listen", required_argument, NULL, 'l' }, { "zerocopy-min", required_argument, NULL, 'z' },
		{ "stop-deadline", required_argument, NULL, 'd' }, { "recv-buffers", required_argument, NULL, 'B' },
		{ "pause-bytes", required_argument, NULL, 'P' }, { "recv-bundles-off", no_argument, NULL, 'U' },
		{ "fixed-files-off", no_argument, NULL, 'F' },
		{ "tls-cert", required_argument, NULL, 'C' }, { "tls-key", required_argument, NULL, 'K' },
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
		case 'U':
			o->recv_bundles_off = true;
			break;
		case 'F':
			o->fixed_files_off = true;
			break;
		case 'z':
			if (strcmp(optarg, "off") == 0)
				o->zerocopy_min = PERCH_ZEROCOPY_OFF;
			else if ((v = parse_num(optarg, 1, UINT32_MAX)) < 0)
				goto bad;
			else
				o->zerocopy_min = (size_t)v;
			break;
		case 'd':
			if ((v = parse_num(optarg, 0, PERCH_TIMER_MAX_MS)) < 0)
				goto bad;
			o->stop_deadline_ms = (unsigned)v;
			break;
		case 'B':
			if ((v = parse_num(optarg, 1, 32768)) < 0 || (v & (v - 1)) != 0)
				goto bad;
			o->recv_buffers = (uint32_t)v;
			break;
		case 'P':
			if ((v = parse_num(optarg, 1, 1L << 30)) < 0)
				goto bad;
			o->pause_bytes = (size_t)v;
			break;
		case 'C':
			o->tls_cert = optarg;
			break;
		case 'K':
			o->tls_key = optarg;
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
	if (!o->tls_cert != !o->tls_key) {
		fprintf(stderr, "%s: --tls-cert and --tls-key go together\n", prog);
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
	fprintf(stderr, "%s: bad value '%s' for --%s%s\n", prog, optarg, longs[idx].name, value_rule(longs[idx].name));
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

/* A loop's counters, read on its thread (perch_loop_stats is the loop thread's call). */
static struct {
	struct perch_loop_stats st;
	int rc;
	sem_t done;
} stats_call;

static void stats_on_loop(void *loop)
{
	stats_call.rc = perch_loop_stats(loop, &stats_call.st);
	sem_post(&stats_call.done);
}

/*
 * " (registered files)" when loop's io_uring has a file table for its
 * sockets, " (no registered files)" when it has none, "" on epoll or when
 * the loop did not answer within 5 s. Once, before the stop.
 */
static const char *files_text(struct perch_loop *loop)
{
	if (strcmp(perch_loop_backend_name(loop), "io_uring") != 0 || sem_init(&stats_call.done, 0, 0) != 0)
		return "";
	/* sem_timedwait, whose deadline is on the wall clock (a step of it only moves this wait): TSan sees its order. */
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	stats_call.rc = -1;
	if (perch_loop_post(loop, stats_on_loop, loop) != 0)
		return "";
	while (sem_timedwait(&stats_call.done, &until) != 0)
		if (errno != EINTR)
			return ""; /* the call may still run: stats_call is not the stack's */
	if (stats_call.rc != 0)
		return "";
	return stats_call.st.fixed_files ? " (registered files)" : " (no registered files)";
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
	if (rc != 0 && start_said_why)
		return 1;   /* the line saying why was written */
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
	struct perch_loop *loop0 = perch_server_loop(srv->ps, 0);
	printf("%s: listening on %s, %d thread%s, backend %s%s, idle timeout ", prog,
	       listen_text(&o, serve_port(srv), at, sizeof(at)), o.threads, o.threads == 1 ? "" : "s",
	       perch_loop_backend_name(loop0), files_text(loop0));
	if (o.idle_timeout_ms)
		printf("%u ms", o.idle_timeout_ms);
	else
		printf("none");
	printf("%s%s\n", o.nagle ? ", Nagle's algorithm on" : "", o.tls_cert ? ", TLS" : "");
	fflush(stdout);
	int sig;
	while (sigwait(&set, &sig) != 0)
		;
	struct perch_server_report rep;
	serve_report_to(srv, &rep);
	printf("%s: %s: stopping (sessions get up to %u ms)\n", prog, strsignal(sig), o.stop_deadline_ms);
	fflush(stdout);
	stop(srv);
	printf("%s: stopped: %llu sessions served, %llu closed idle; of %llu open at the stop, %llu finished, "
	       "%llu reset at the deadline\n", prog, (unsigned long long)rep.sessions,
	       (unsigned long long)rep.idle_closed, (unsigned long long)rep.open_at_stop,
	       (unsigned long long)rep.finished, (unsigned long long)rep.aborted);
	return 0;
}
