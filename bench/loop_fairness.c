/* bench/loop_fairness.c: a flooding connection and a light one on the same loop: the light one's latency and the flood's throughput, with and without the epoll read budget.
 *
 * Build (from the repo, after ./dev build build):
 *   gcc -O2 -Iinclude -Ilib -Ibuild -Itests bench/loop_fairness.c build/.libs/libperch.a -luring -lck -lpthread -o /tmp/loop_fairness
 * Run: /tmp/loop_fairness [ROUNDS [SECONDS [BACKEND]]]   (default 3 rounds of 3 s, epoll)
 *
 * One loop (one thread) serves two connections. A writes 'F' bytes in 64 KiB
 * writes as fast as its socket takes them (a deep pipeline of requests that
 * need no answer); the server consumes them. B sends one 'Q' every 5 ms and
 * waits for the server's 'R': its round trip is B's latency. C does what B
 * does on a second loop, the control: its latency is the machine's. Each round runs
 * two arms back to back, the default budget (64 KiB) and
 * PERCH_READ_BUDGET_UNBOUNDED, in alternating order; each arm is a fresh
 * loop. Loopback only; bounded in time; stops by itself.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>

#include "loop_util.h"

#define B_PERIOD_US 5000

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the server: consumes everything, answers each 'Q' with an 'R' ---- */

struct srv_conn {
	struct perch_recv_listener rl;
	struct perch_flush_listener fl;
	struct perch_conn *c;
	uint64_t consumed;            /* loop thread only; read after the loop stopped */
	struct srv_conn *next;
};

struct srv {
	struct lu_loop l;
	struct perch_listener *ls;
	struct srv_conn *conns;
};

static uint64_t noop_parking_r(struct perch_recv_listener *l, struct perch_conn *c) { return 0; }
static uint64_t noop_parking_f(struct perch_flush_listener *l, struct perch_conn *c) { return 0; }

static void srv_pump(struct srv_conn *sc)
{
	for (;;) {
		struct perch_read_result r;
		int rc = perch_conn_try_read_or_park(sc->c, &sc->rl, &r);
		if (rc != 0 || r.closed || r.error || (r.completed && r.len == 0))
			return;
		size_t off = r.first_off, left = r.len, answers = 0;
		for (struct perch_seg *s = r.first; s && left; s = s->next, off = 0) {
			size_t n = s->len - off < left ? s->len - off : left;
			for (const uint8_t *p = s->data + off, *end = p + n;
			     (p = memchr(p, 'Q', (size_t)(end - p))) != NULL; p++)
				answers++;
			left -= n;
		}
		sc->consumed += r.len;
		perch_conn_advance(sc->c, r.len, r.len);
		for (size_t i = 0; i < answers; i++)
			perch_conn_write(sc->c, "R", 1);
		if (answers && perch_conn_try_flush_or_park(sc->c, &sc->fl) == PERCH_PENDING)
			return; /* srv_flushed pumps again */
	}
}

static void srv_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	srv_pump((struct srv_conn *)((char *)l - offsetof(struct srv_conn, rl)));
}

static void srv_flushed(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie, int result)
{
	if (result == 0)
		srv_pump((struct srv_conn *)((char *)l - offsetof(struct srv_conn, fl)));
}

static void srv_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct srv *sv = arg;
	struct srv_conn *sc = calloc(1, sizeof(*sc));
	sc->rl = (struct perch_recv_listener){ noop_parking_r, srv_ready };
	sc->fl = (struct perch_flush_listener){ noop_parking_f, srv_flushed };
	sc->c = c;
	sc->next = sv->conns;
	sv->conns = sc;
	srv_pump(sc);
}

/* On the loop thread: close and release every server conn (their listeners stay valid until freed). */
static void srv_close_all(void *arg)
{
	struct srv *sv = arg;
	for (struct srv_conn *sc = sv->conns; sc; sc = sc->next) {
		perch_conn_close(sc->c);
		perch_conn_release(sc->c);
	}
}

/* ---- the clients ---- */

struct flood {
	int fd;
	volatile int stop;
	pthread_t th;
};

static void *flood_main(void *p)
{
	struct flood *f = p;
	static uint8_t buf[65536];
	memset(buf, 'F', sizeof(buf));
	while (!f->stop)
		if (!lu_write_all(f->fd, buf, sizeof(buf)))
			break;
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct lat {
	double p50_ms, p99_ms, max_ms;
	int samples;
};

struct arm_result {
	struct lat b, c;
	double a_mib_s;
	double loop_cpu_us_per_mib;   /* the serving loop thread's CPU time per MiB consumed */
};

/* The calling thread's CPU time (user + system), in seconds. */
static void thread_cpu(void *arg)
{
	struct rusage ru;
	getrusage(RUSAGE_THREAD, &ru);
	*(double *)arg = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
			 (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* A light client: one request every 5 ms for `secs`, each round trip timed. */
struct pinger {
	int fd;
	double secs;
	double *ms;
	int n;
	pthread_t th;
};

static void *pinger_main(void *p)
{
	struct pinger *pg = p;
	int cap = (int)(pg->secs * 1e6 / B_PERIOD_US) + 16;
	pg->ms = malloc((size_t)cap * sizeof(*pg->ms));
	double t0 = now_s(), next = t0;
	while (now_s() - t0 < pg->secs && pg->n < cap) {
		next += B_PERIOD_US / 1e6;
		double start = now_s();
		char q = 'Q', r = 0;
		if (write(pg->fd, &q, 1) != 1 || read(pg->fd, &r, 1) != 1 || r != 'R') {
			fprintf(stderr, "loop_fairness: a request lost its answer\n");
			exit(1);
		}
		pg->ms[pg->n++] = (now_s() - start) * 1e3;
		double wait = next - now_s();
		if (wait > 0)
			usleep((useconds_t)(wait * 1e6));
	}
	return NULL;
}

static void pinger_start(struct pinger *pg, int port, double secs)
{
	pg->fd = lu_plain_connect(port);
	pg->secs = secs;
	struct timeval tv = { 5, 0 };
	setsockopt(pg->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	int one = 1;
	setsockopt(pg->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	pthread_create(&pg->th, NULL, pinger_main, pg);
}

static struct lat pinger_end(struct pinger *pg)
{
	pthread_join(pg->th, NULL);
	close(pg->fd);
	qsort(pg->ms, (size_t)pg->n, sizeof(*pg->ms), cmp_double);
	struct lat l = { pg->ms[pg->n / 2], pg->ms[(int)(pg->n * 0.99)], pg->ms[pg->n - 1], pg->n };
	free(pg->ms);
	return l;
}

static void srv_start(struct srv *sv, enum perch_backend backend, uint32_t budget)
{
	struct perch_loop_opts lo = { .backend = backend, .read_budget = budget };
	sv->conns = NULL;
	if (lu_start(&sv->l, &lo) != 0 ||
	    perch_listen(sv->l.loop, "127.0.0.1", 0, NULL, srv_accept, sv, &sv->ls) != 0) {
		fprintf(stderr, "loop_fairness: no loop or listener\n");
		exit(1);
	}
}

/* Stops the server; returns the most bytes one of its conns consumed. */
static uint64_t srv_end(struct srv *sv)
{
	lu_on_loop(&sv->l, srv_close_all, sv); /* the conns go before the loop that owns their buffers */
	lu_stop(&sv->l);
	uint64_t most = 0;
	for (struct srv_conn *sc = sv->conns, *next; sc; sc = next) {
		next = sc->next;
		if (sc->consumed > most)
			most = sc->consumed;
		free(sc);
	}
	return most;
}

/*
 * One arm: a fresh loop with `budget` serving A (flooding) and B; C on a
 * second loop of its own is the control: what C sees is the machine (two
 * CPUs shared by every thread here), not the first loop.
 */
static struct arm_result run_arm(enum perch_backend backend, uint32_t budget, double secs)
{
	struct srv sv, control;
	srv_start(&sv, backend, budget);
	srv_start(&control, backend, 0);
	struct flood a = { .fd = lu_plain_connect(perch_listener_port(sv.ls)) };
	struct pinger b = { 0 }, c = { 0 };
	double cpu0 = 0, cpu1 = 0;
	lu_on_loop(&sv.l, thread_cpu, &cpu0);
	double t0 = now_s();
	pthread_create(&a.th, NULL, flood_main, &a);
	pinger_start(&b, perch_listener_port(sv.ls), secs);
	pinger_start(&c, perch_listener_port(control.ls), secs);
	struct arm_result res = { .b = pinger_end(&b), .c = pinger_end(&c) };
	double elapsed = now_s() - t0;
	lu_on_loop(&sv.l, thread_cpu, &cpu1);
	a.stop = 1;
	shutdown(a.fd, SHUT_RDWR); /* unblocks a write stuck on a full socket */
	pthread_join(a.th, NULL);
	close(a.fd);
	double mib = (double)srv_end(&sv) / (1 << 20);
	res.a_mib_s = mib / elapsed;
	res.loop_cpu_us_per_mib = (cpu1 - cpu0) * 1e6 / mib;
	srv_end(&control);
	return res;
}

static void print_arm(const char *name, int round, struct arm_result r)
{
	printf("round %d  %-9s B p50 %6.3f p99 %7.3f max %8.3f ms (%d)  C p50 %6.3f p99 %7.3f max %7.3f ms  A %5.0f MiB/s, loop %4.0f us CPU/MiB\n",
	       round, name, r.b.p50_ms, r.b.p99_ms, r.b.max_ms, r.b.samples, r.c.p50_ms, r.c.p99_ms,
	       r.c.max_ms, r.a_mib_s, r.loop_cpu_us_per_mib);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 3;
	double secs = argc > 2 ? atof(argv[2]) : 3.0;
	enum perch_backend backend = argc > 3 && strcmp(argv[3], "uring") == 0 ? PERCH_BACKEND_URING
									      : PERCH_BACKEND_EPOLL;
	if (rounds < 1 || rounds > 20 || secs <= 0 || secs > 30) {
		fprintf(stderr, "usage: loop_fairness [ROUNDS 1..20 [SECONDS 0..30 [epoll|uring]]]\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN); /* A's last write meets its own shutdown */
	printf("backend %s, %d rounds of %.1f s per arm; B sends one request every %d ms\n",
	       backend == PERCH_BACKEND_URING ? "io_uring" : "epoll", rounds, secs, B_PERIOD_US / 1000);
	for (int i = 0; i < rounds; i++) {
		/* Alternate which arm goes first, so drift in the machine's load hits both. */
		for (int k = 0; k < 2; k++) {
			bool budget = (k == 0) == (i % 2 == 0);
			struct arm_result r = run_arm(backend, budget ? 0 : PERCH_READ_BUDGET_UNBOUNDED, secs);
			print_arm(budget ? "budget" : "unbounded", i + 1, r);
		}
	}
	return 0;
}
