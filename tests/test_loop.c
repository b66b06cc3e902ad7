/* tests/test_loop.c: the loop on loopback TCP (or Unix sockets: LU_UNIX), one behaviour per test, built once per backend (LU_BACKEND). */
#include "config.h"

#include "cmocka_prelude.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <inttypes.h>
#include <sys/wait.h>
#include <linux/sockios.h>
#include <signal.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "loop_util.h"

/* ---- where a test listens: loopback TCP, or a Unix socket (LU_UNIX) ---- */

/*
 * Built with LU_UNIX, every test that does not need TCP itself runs over
 * a Unix socket: an abstract name of its own (no file left behind; the
 * paths are test_unix's). Else on 127.0.0.1, on a port the kernel picks.
 */
static int test_listen(struct perch_loop *loop, const struct perch_conn_opts *copts,
		       perch_accept_fn on_accept, void *arg, struct perch_listener **ls)
{
#ifdef LU_UNIX
	static uint32_t n;
	char name[64];
	snprintf(name, sizeof(name), "@perch-test-loop-%d-%u", (int)getpid(), n++);
	return perch_listen_unix(loop, name, NULL, copts, on_accept, arg, ls);
#else
	return perch_listen(loop, "127.0.0.1", 0, copts, on_accept, arg, ls);
#endif
}

/* perch_connect to where the listening socket `fd` is bound (a Unix name, or 127.0.0.1 and its port). */
static int test_connect_fd_start(struct perch_loop *loop, int fd, const struct perch_conn_opts *copts,
				 perch_connect_fn on_connected, void *arg)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	if (ss.ss_family == AF_UNIX) {
		char name[sizeof(((struct sockaddr_un *)0)->sun_path) + 1] = "@";
		size_t n = len - offsetof(struct sockaddr_un, sun_path) - 1; /* abstract: after the NUL */
		memcpy(name + 1, ((struct sockaddr_un *)&ss)->sun_path + 1, n);
		name[n + 1] = 0;
		return perch_connect_unix(loop, name, copts, on_connected, arg);
	}
	return perch_connect(loop, "127.0.0.1", ntohs(((struct sockaddr_in *)&ss)->sin_port), copts,
			     on_connected, arg);
}

static int test_connect_start(struct perch_loop *loop, const struct perch_listener *ls,
			      const struct perch_conn_opts *copts, perch_connect_fn on_connected, void *arg)
{
	return test_connect_fd_start(loop, ls->sk.fd, copts, on_connected, arg);
}

/* lu_connect to where the listening socket `fd` is bound: the caller's reference, or NULL. */
static struct perch_conn *test_connect_fd(struct lu_loop *l, int fd, const struct perch_conn_opts *copts)
{
	struct lu_connect k = { .c = NULL };
	sem_init(&k.done, 0, 0);
	if (test_connect_fd_start(l->loop, fd, copts, lu_connected, &k) != 0 ||
	    lu_sem_wait(&k.done, LU_TIMEOUT_MS) != 0)
		k.c = NULL;
	sem_destroy(&k.done);
	return k.c;
}

/* A plain listening socket (not perch's) on a test address of its own: a peer perch connects to. */
static int plain_listener(int backlog)
{
#ifdef LU_UNIX
	static uint32_t n;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int len = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "perch-test-plain-%d-%u", (int)getpid(), n++);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)), 0);
	assert_int_equal(listen(fd, backlog), 0);
	return fd;
#else
	int port;
	return lu_plain_listener(backlog, &port);
#endif
}

/* ---- helpers ---- */

struct server {
	struct lu_loop l;
	struct perch_listener *ls;
	struct lu_echo_stats stats;
	int port;
};

static void server_start(struct server *s, const struct perch_loop_opts *lopts,
			 const struct perch_conn_opts *copts)
{
	memset(s, 0, sizeof(*s));
	assert_int_equal(lu_start(&s->l, lopts), 0);
	assert_int_equal(test_listen(s->l.loop, copts, lu_echo_accept, &s->stats, &s->ls), 0);
	s->port = perch_listener_port(s->ls);
}

/* A plain socket bound to 127.0.0.1 on a free port (not listening yet). */
static int loopback_bound_socket(int *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t alen = sizeof(a);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* Waits until `*counter` reaches `want` (bounded). */
static bool wait_u32(uint32_t *counter, uint32_t want)
{
	for (int i = 0; i < LU_TIMEOUT_MS; i++) {
		if (perch__load_u32(counter) >= want)
			return true;
		usleep(1000);
	}
	return false;
}

static void echo_roundtrip(struct server *s, const char *host, const struct perch_conn_opts *copts)
{
	lu_echo_through(host ? lu_connect(&s->l, host, s->port, copts) : test_connect_fd(&s->l, s->ls->sk.fd, copts),
			256 * 1024);
	assert_true(wait_u32(&s->stats.ended, 1));
}

/* ---- tests ---- */

static void echo_reads_and_flushes_on_the_loop_thread_and_from_a_second_thread(void **state)
{
	struct server s;
	server_start(&s, NULL, NULL);
	echo_roundtrip(&s, NULL, NULL);
	assert_int_equal(s.stats.bytes, 256 * 1024);
	assert_int_equal(lu_stop(&s.l), 0);
}

static void echo_with_singleshot_recv(void **state)
{
	struct perch_conn_opts single = { .recv_mode = PERCH_RECV_SINGLESHOT };
	struct server s;
	server_start(&s, NULL, &single);
	echo_roundtrip(&s, NULL, &single);
	assert_int_equal(lu_stop(&s.l), 0);
}

static void echo_over_ipv6(void **state)
{
	struct server s;
	memset(&s, 0, sizeof(s));
	assert_int_equal(lu_start(&s.l, NULL), 0);
	int rc = perch_listen(s.l.loop, "::1", 0, NULL, lu_echo_accept, &s.stats, &s.ls);
	if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT) {
		/* No IPv6 loopback here: nothing to prove (automake's TAP driver has no skip). */
		lu_stop(&s.l);
		return;
	}
	assert_int_equal(rc, 0);
	s.port = perch_listener_port(s.ls);
	echo_roundtrip(&s, "::1", NULL);
	assert_int_equal(lu_stop(&s.l), 0);
}

struct churn {
	uint32_t connected;
	uint32_t failed;
	sem_t batch;
};

static void churn_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct churn *k = arg;
	if (result == 0) {
		k->connected++;
		perch_conn_release(c); /* open, then closed at once */
	} else {
		k->failed++;
	}
	sem_post(&k->batch);
}

struct live_probe {
	struct perch_loop *loop;
	uint32_t live;
};

static void read_live(void *p)
{
	struct live_probe *lp = p;
	lp->live = lp->loop->live;
}

static void ten_thousand_connections_open_and_close_without_leaking_fds(void **state)
{
	enum { TOTAL = 10000, BATCH = 100 };
	struct server s;
	int fds_before = lu_count_fds();
	server_start(&s, NULL, NULL);
	struct churn k = { 0 };
	sem_init(&k.batch, 0, 0);
	for (int done = 0; done < TOTAL; done += BATCH) {
		for (int i = 0; i < BATCH; i++)
			assert_int_equal(test_connect_start(s.l.loop, s.ls, NULL, churn_connected, &k), 0);
		for (int i = 0; i < BATCH; i++)
			assert_int_equal(lu_sem_wait(&k.batch, LU_TIMEOUT_MS), 0);
	}
	assert_int_equal(k.connected, TOTAL);
	assert_int_equal(k.failed, 0);
	/* Every server side sees the FIN and ends; then only the listener is left on the loop. */
	assert_true(wait_u32(&s.stats.ended, TOTAL));
	struct live_probe lp = { s.l.loop, 0 };
	for (int i = 0; i < 1000; i++) {
		lu_on_loop(&s.l, read_live, &lp);
		if (lp.live == 1)
			break;
		usleep(1000);
	}
	assert_int_equal(lp.live, 1);
	assert_int_equal(lu_stop(&s.l), 0);
	sem_destroy(&k.batch);
	assert_int_equal(lu_count_fds(), fds_before);
}

static void connects_beyond_the_submission_queue_all_complete(void **state)
{
	enum { N = 512 };
	/* Eight SQEs and a CQ of sixteen for 512 connects posted at once (and their 512 accepts). */
	struct perch_loop_opts tiny = { .sq_entries = 8 };
	struct server s;
	server_start(&s, &tiny, NULL);
	struct churn k = { 0 };
	sem_init(&k.batch, 0, 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(test_connect_start(s.l.loop, s.ls, NULL, churn_connected, &k), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(lu_sem_wait(&k.batch, LU_TIMEOUT_MS), 0);
	assert_int_equal(k.connected, N);
	assert_true(wait_u32(&s.stats.ended, N));
	assert_int_equal(lu_stop(&s.l), 0);
	sem_destroy(&k.batch);
}

/* A plain-socket writer on its own thread. */
struct writer {
	int fd;
	const uint8_t *data;
	size_t len;
	uint64_t written;
	int how;                   /* 0: FIN (shutdown), 1: RST after the peer took every byte */
	pthread_t th;
};

static void *writer_main(void *p)
{
	struct writer *w = p;
	size_t off = 0;
	while (off < w->len) {
		size_t n = w->len - off < 65536 ? w->len - off : 65536;
		if (!lu_write_all(w->fd, w->data + off, n))
			break;
		off += n;
		perch__store_u64(&w->written, off);
	}
	if (w->how == 0) {
		shutdown(w->fd, SHUT_WR);
		return NULL;
	}
	/* Wait until the peer's kernel acknowledged every byte, then reset. */
	for (int i = 0; i < LU_TIMEOUT_MS; i++) {
		int outq = 0;
		ioctl(w->fd, SIOCOUTQ, &outq);
		if (outq == 0)
			break;
		usleep(1000);
	}
	struct linger lg = { 1, 0 };
	setsockopt(w->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(w->fd);
	w->fd = -1;
	return NULL;
}

/*
 * One stream under test: a loop whose listener hands its one accepted conn
 * to the test thread, a plain client socket writing `n` pattern bytes from
 * its own thread (started by stream_write), and a buffer to read them into.
 */
struct stream {
	struct lu_loop l;
	struct lu_catcher k;
	struct writer w;
	uint8_t *out, *in;
	size_t n;
	bool writing;
};

/*
 * `sockbuf` > 0: the accepted socket's SO_RCVBUF (set on the listener, so
 * the accepted one inherits it before its first byte) and the writer's
 * SO_SNDBUF, so what sits in the kernel between the two is bounded.
 */
static void stream_open_on(struct stream *st, const struct perch_loop_opts *lopts, size_t n,
			   const struct perch_conn_opts *copts, int how, int sockbuf);

static void stream_open(struct stream *st, size_t n, const struct perch_conn_opts *copts, int how,
			int sockbuf)
{
	stream_open_on(st, NULL, n, copts, how, sockbuf);
}

/* As stream_open, on a loop made with lopts. */
static void stream_open_on(struct stream *st, const struct perch_loop_opts *lopts, size_t n,
			   const struct perch_conn_opts *copts, int how, int sockbuf)
{
	struct perch_listener *ls;
	memset(st, 0, sizeof(*st));
	st->n = n;
	st->out = malloc(n);
	st->in = malloc(n);
	lu_fill(st->out, n);
	sem_init(&st->k.got, 0, 0);
	assert_int_equal(lu_start(&st->l, lopts), 0);
	assert_int_equal(test_listen(st->l.loop, copts, lu_catch_accept, &st->k, &ls), 0);
	if (sockbuf > 0)
		assert_int_equal(setsockopt(ls->sk.fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf)), 0);
	st->w = (struct writer){ .fd = lu_plain_connect_to(ls), .data = st->out,
				 .len = n, .how = how };
	assert_true(st->w.fd >= 0);
	if (sockbuf > 0)
		assert_int_equal(setsockopt(st->w.fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf)), 0);
	assert_int_equal(lu_sem_wait(&st->k.got, LU_TIMEOUT_MS), 0);
}

static void stream_write(struct stream *st)
{
	pthread_create(&st->w.th, NULL, writer_main, &st->w);
	st->writing = true;
}

static void stream_join(struct stream *st)
{
	if (st->writing)
		pthread_join(st->w.th, NULL);
	st->writing = false;
}

/* Reads to the end; every byte must have come, in order. */
static struct lu_end stream_read_all(struct stream *st)
{
	struct lu_end e = lu_read_to_end(st->k.c, st->in, st->n);
	stream_join(st);
	assert_false(e.timed_out);
	assert_int_equal(e.got, st->n);
	assert_memory_equal(st->in, st->out, st->n);
	return e;
}

static void stream_close(struct stream *st)
{
	perch_conn_release(st->k.c);
	if (st->w.fd >= 0)
		close(st->w.fd);
	assert_int_equal(lu_stop(&st->l), 0);
	sem_destroy(&st->k.got);
	free(st->out);
	free(st->in);
}

/* ---- staging buffers: pooled per loop, on its thread only ---- */

/* What runs on the loop thread only records; the test thread asserts (cmocka's asserts are its own). */
struct pooled {
	struct lu_loop l;
	struct lu_catcher k;
	int fd;
	struct perch_vtask_handle h;
	int write_rc, flush_rc;
	struct perch__txbuf *head;   /* the pool's first buffer, before a write */
	uint32_t pooled;             /* and its count */
	struct perch__txbuf *staged; /* where the write staged */
	uint32_t pooled_after;       /* the count after it */
};

static void pooled_open(struct pooled *p)
{
	struct perch_listener *ls;
	memset(p, 0, sizeof(*p));
	sem_init(&p->k.got, 0, 0);
	assert_int_equal(lu_start(&p->l, NULL), 0);
	assert_int_equal(test_listen(p->l.loop, NULL, lu_catch_accept, &p->k, &ls), 0);
	p->fd = lu_plain_connect_to(ls);
	assert_true(p->fd >= 0);
	assert_int_equal(lu_sem_wait(&p->k.got, LU_TIMEOUT_MS), 0);
}

static void pooled_close(struct pooled *p)
{
	perch_conn_release(p->k.c);
	close(p->fd);
	assert_int_equal(lu_stop(&p->l), 0);
	sem_destroy(&p->k.got);
}

/* Waits for the flush started in p->h, after the client read its `n` bytes. */
static void pooled_flushed(struct pooled *p, size_t n)
{
	assert_int_equal(p->write_rc, 0);
	assert_int_equal(p->flush_rc, PERCH_PENDING);
	uint8_t *in = malloc(n);
	assert_true(lu_read_all(p->fd, in, n));
	int64_t res = -1;
	assert_int_equal(perch_vtask_wait(p->h, LU_TIMEOUT_MS, &res), 0);
	assert_int_equal(res, 0);
	free(in);
}

static void look_at_the_pool(void *arg)
{
	struct pooled *p = arg;
	p->head = p->l.loop->txbuf_pool;
	p->pooled = p->l.loop->txbuf_pooled;
}

#define POOL_BURST (PERCH__TXBUF_POOL_MAX + 44)
#define SEGMENT_SIZE (4 * PERCH__TXBUF_CAP)

/* A write of a received segment's size, made while the pool is empty. */
static void write_a_segment(void *arg)
{
	struct pooled *p = arg;
	static uint8_t segment[SEGMENT_SIZE];
	p->write_rc = perch_conn_write(p->k.c, segment, sizeof(segment));
	p->pooled_after = 0;
	for (struct perch__txbuf *b = p->k.c->staged_head; b; b = b->next)
		p->pooled_after += b->cap == PERCH__TXBUF_CAP;   /* buffers of the pool's size */
	p->flush_rc = perch_conn_flush(p->k.c, &p->h);
}

/* One flush of more full buffers than the pool keeps. */
static void write_a_burst(void *arg)
{
	struct pooled *p = arg;
	static uint8_t block[PERCH__TXBUF_CAP];
	for (unsigned i = 0; i < POOL_BURST && p->write_rc == 0; i++)
		p->write_rc = perch_conn_write(p->k.c, block, sizeof(block));
	p->flush_rc = perch_conn_flush(p->k.c, &p->h);
}

static void write_one_byte_and_flush(void *arg)
{
	struct pooled *p = arg;
	look_at_the_pool(p);
	p->write_rc = perch_conn_write(p->k.c, "a", 1);
	p->staged = p->k.c->staged_head;
	p->pooled_after = p->l.loop->txbuf_pooled;
	p->flush_rc = perch_conn_flush(p->k.c, &p->h);
}

static void staging_on_the_loop_thread_reuses_what_sends_gave_back_and_the_pool_is_bounded(void **state)
{
	struct pooled p;
	pooled_open(&p);
	/* An empty pool still stages in buffers of its size, new ones, so that they come back to it. */
	assert_int_equal(lu_on_loop(&p.l, write_a_segment, &p), 0);
	assert_int_equal(p.pooled_after, SEGMENT_SIZE / PERCH__TXBUF_CAP);
	pooled_flushed(&p, SEGMENT_SIZE);
	assert_int_equal(lu_on_loop(&p.l, look_at_the_pool, &p), 0);
	assert_int_equal(p.pooled, SEGMENT_SIZE / PERCH__TXBUF_CAP);
	/* The burst's buffers come back on the loop thread: the pool keeps its bound, frees the rest. */
	assert_int_equal(lu_on_loop(&p.l, write_a_burst, &p), 0);
	pooled_flushed(&p, (size_t)POOL_BURST * PERCH__TXBUF_CAP);
	assert_int_equal(lu_on_loop(&p.l, look_at_the_pool, &p), 0);
	assert_int_equal(p.pooled, PERCH__TXBUF_POOL_MAX);
	/* A write on the loop thread stages in the pool's first buffer. */
	assert_int_equal(lu_on_loop(&p.l, write_one_byte_and_flush, &p), 0);
	assert_non_null(p.head);
	assert_ptr_equal(p.staged, p.head);
	assert_int_equal(p.pooled_after, PERCH__TXBUF_POOL_MAX - 1);
	pooled_flushed(&p, 1);
	/* A write from another thread leaves the pool alone: it belongs to the loop's thread. */
	assert_int_equal(lu_on_loop(&p.l, look_at_the_pool, &p), 0);
	assert_int_equal(p.pooled, PERCH__TXBUF_POOL_MAX);
	assert_int_equal(perch_conn_write(p.k.c, "b", 1), 0);
	assert_ptr_not_equal(p.k.c->staged_head, p.head);
	assert_int_equal(lu_on_loop(&p.l, look_at_the_pool, &p), 0);
	assert_int_equal(p.pooled, PERCH__TXBUF_POOL_MAX);
	p.flush_rc = perch_conn_flush(p.k.c, &p.h);
	pooled_flushed(&p, 1);
	pooled_close(&p);
}

/* A buffer dropped off the loop's thread (a flush refused as closed) is freed: the pool is the loop's. */
static void staging_dropped_off_the_loop_thread_is_freed_not_pooled(void **state)
{
	struct pooled p;
	pooled_open(&p);
	assert_int_equal(perch_conn_write(p.k.c, "x", 1), 0);
	assert_int_equal(perch_conn_close(p.k.c), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_flush(p.k.c, &h), -EPIPE);
	assert_int_equal(lu_on_loop(&p.l, look_at_the_pool, &p), 0);
	assert_int_equal(p.pooled, 0);
	assert_null(p.head);
	pooled_close(&p);
}

/* Writes of every size, and a staged room bigger than a pooled buffer, made inside a turn. */
#define MIXED_HINT (PERCH__TXBUF_CAP + 904)
#define MIXED_BIG (64 * 1024 + 1)
#define MIXED_TOTAL (100 + SEGMENT_SIZE + MIXED_HINT + MIXED_BIG)

struct mixed {
	struct pooled *p;
	uint8_t *out;
	int rc[5];
	size_t room;            /* what staging MIXED_HINT bytes lent */
	uint32_t tail_cap;      /* the buffer the big write went into */
};

static void write_every_size(void *arg)
{
	struct mixed *m = arg;
	struct perch_conn *c = m->p->k.c;
	const uint8_t *at = m->out;
	uint8_t *buf;
	m->rc[0] = perch_conn_write(c, at, 100);
	m->rc[1] = perch_conn_write(c, at += 100, SEGMENT_SIZE);
	m->rc[2] = perch__conn_stage_buffer(c, MIXED_HINT, &buf, &m->room);
	size_t n = m->rc[2] == 0 && m->room >= MIXED_HINT ? MIXED_HINT : 0;
	memcpy(buf, at += SEGMENT_SIZE, n);
	m->rc[3] = perch__conn_stage_commit(c, n);
	m->rc[4] = perch_conn_write(c, at += MIXED_HINT, MIXED_BIG);
	m->tail_cap = c->staged_tail->cap;
	m->p->flush_rc = perch_conn_flush(c, &m->p->h);
}

static void staging_on_the_loop_thread_gives_the_room_asked_and_a_big_write_its_own_buffer(void **state)
{
	struct pooled p;
	struct mixed m = { .p = &p, .out = malloc(MIXED_TOTAL) };
	lu_fill(m.out, MIXED_TOTAL);
	pooled_open(&p);
	assert_int_equal(lu_on_loop(&p.l, write_every_size, &m), 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(m.rc[i], 0);
	assert_true(m.room >= MIXED_HINT);
	assert_int_equal(m.tail_cap, MIXED_BIG);
	uint8_t *in = malloc(MIXED_TOTAL);
	assert_true(lu_read_all(p.fd, in, MIXED_TOTAL));
	assert_memory_equal(in, m.out, MIXED_TOTAL);
	pooled_flushed(&p, 0);
	free(in);
	free(m.out);
	pooled_close(&p);
}

static void burst_of_2mib_then_fin_is_read_completely_before_eof(void **state)
{
	struct stream st;
	stream_open(&st, 2 * 1024 * 1024, NULL, 0, 0);
	stream_write(&st);
	struct lu_end e = stream_read_all(&st);
	assert_true(e.completed);
	assert_int_equal(e.error, 0);
	stream_close(&st);
}

/* The writer sends everything and resets; nothing is read before that. Every byte comes, then the reset. */
static void every_byte_then_the_reset(struct stream *st)
{
	stream_write(st);
	stream_join(st);
	usleep(50 * 1000);
	struct lu_end e = stream_read_all(st);
	assert_false(e.completed);
	assert_int_equal(e.error, -ECONNRESET);
	stream_close(st);
}

static void write_of_1mib_then_rst_surfaces_the_error_after_the_delivered_bytes(void **state)
{
	/* No pause before the RST: every byte sits in the conn when the error lands. */
	struct perch_conn_opts big = { .pause_bytes = 4 * 1024 * 1024 };
	struct stream st;
	stream_open(&st, 1024 * 1024, &big, 1, 0);
	every_byte_then_the_reset(&st);
}

/*
 * Two 4 KiB buffers for 64 KiB (all of it in the kernel's receive queue
 * before the writer resets): the multishot recv runs out of buffers
 * (ENOBUFS) and parks long before the reset, and is re-armed only once
 * the reader gives buffers back, over bytes and a reset that are both
 * waiting. Every byte comes, then the reset: a multishot re-armed with
 * POLL_FIRST there returned the bytes and never the reset, and the reader
 * waited for good.
 */
static void a_reset_waiting_behind_a_parked_recv_still_surfaces_after_the_bytes(void **state)
{
	struct perch_loop_opts two = { .buf_count = 2, .buf_size = 4096 };
	struct perch_conn_opts big = { .pause_bytes = 4 * 1024 * 1024 };
	struct stream st;
	stream_open_on(&st, &two, 64 * 1024, &big, 1, 0);
	every_byte_then_the_reset(&st);
}

struct rx_probe {
	struct perch_conn *c;
	uint64_t unconsumed;
	bool paused;
	uint64_t pauses;
	uint64_t ring_target;
	uint64_t limit_refused;
	uint32_t pool_held;
	int rcvbuf;
};

static void read_rx_state(void *p)
{
	struct rx_probe *rp = p;
	struct perch__sock *s = rp->c->transport;
	socklen_t len = sizeof(rp->rcvbuf);
	rp->unconsumed = s->unconsumed;
	rp->paused = s->rx_paused;
	rp->pauses = s->loop->stats.recv_pauses;
	rp->ring_target = s->loop->stats.ring_target;
	rp->limit_refused = s->loop->stats.recv_limit_refused;
	rp->pool_held = s->pool_held;
	getsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &rp->rcvbuf, &len);
}

static void stalled_reader_pauses_recv_and_resuming_delivers_everything_in_order(enum perch_recv_mode mode)
{
	enum { N = 32 * 1024 * 1024, PAUSE = 64 * 1024, SOCKBUF = 64 * 1024, BUF = 16 * 1024,
	       STABLE_MS = 100 };
	struct perch_conn_opts bp = { .recv_mode = mode, .pause_bytes = PAUSE, .resume_bytes = PAUSE / 4 };
	struct stream st;
	stream_open(&st, N, &bp, 0, SOCKBUF);
	stream_write(&st);
	/*
	 * The reader stalls: recv pauses, the kernel buffers fill, the writer
	 * blocks. No fixed sleep: wait (bounded) until recv is paused and the
	 * writer's count has not moved for STABLE_MS.
	 */
	struct rx_probe rp = { .c = st.k.c };
	uint64_t written = 0;
	double deadline = lu_now_ms() + LU_TIMEOUT_MS, since = lu_now_ms();
	bool blocked = false;
	while (!blocked && lu_now_ms() < deadline) {
		usleep(10 * 1000);
		assert_int_equal(lu_on_loop(&st.l, read_rx_state, &rp), 0);
		uint64_t now = perch__load_u64(&st.w.written);
		if (now != written || !rp.paused) {
			written = now;
			since = lu_now_ms();
		}
		blocked = rp.paused && written > 0 && lu_now_ms() - since >= STABLE_MS;
	}
	print_message("mode %d: unconsumed %llu, written %llu, SO_RCVBUF %d\n", (int)mode,
		      (unsigned long long)rp.unconsumed, (unsigned long long)written, rp.rcvbuf);
	assert_true(blocked);
	assert_true(rp.pauses >= 1);
	assert_true(written < N);
	assert_true(rp.unconsumed >= PAUSE);
	if (mode == PERCH_RECV_SINGLESHOT || !rp.limit_refused) {
		/*
		 * Not read past the threshold: at most the buffer that crossed it
		 * (epoll pauses inside the turn; a multishot stops at its byte limit).
		 */
		assert_true(rp.unconsumed < PAUSE + BUF);
	} else {
		/*
		 * A multishot on a kernel without the byte limit: what it took
		 * before the cancel landed. One pass of its task work drains the
		 * receive queue while the writer refills it, so a pass can run
		 * until the ring is empty: the bound is the ring's buffers.
		 */
		assert_true(rp.unconsumed <= PAUSE + rp.ring_target * BUF);
	}
	/* Resume: everything arrives, in order, then EOF. */
	struct lu_end e = stream_read_all(&st);
	assert_true(e.completed);
	stream_close(&st);
}

static void stalled_reader_pauses_multishot_recv_and_resuming_delivers_everything_in_order(void **state)
{
	stalled_reader_pauses_recv_and_resuming_delivers_everything_in_order(PERCH_RECV_MULTISHOT);
}

static void stalled_reader_pauses_singleshot_recv_and_resuming_delivers_everything_in_order(void **state)
{
	stalled_reader_pauses_recv_and_resuming_delivers_everything_in_order(PERCH_RECV_SINGLESHOT);
}

/* Polls c on its loop until recv is paused and `unconsumed` has not moved for 100 ms (bounded). */
static struct rx_probe paused_and_still(struct lu_loop *l, struct perch_conn *c)
{
	struct rx_probe rp = { .c = c };
	uint64_t last = UINT64_MAX;
	double deadline = lu_now_ms() + LU_TIMEOUT_MS, since = lu_now_ms();
	while (lu_now_ms() < deadline) {
		usleep(10 * 1000);
		assert_int_equal(lu_on_loop(l, read_rx_state, &rp), 0);
		if (rp.unconsumed != last || !rp.paused) {
			last = rp.unconsumed;
			since = lu_now_ms();
		} else if (lu_now_ms() - since >= 100) {
			return rp;
		}
	}
	fail_msg("recv never paused and settled");
	return rp;
}

/*
 * Once paused, a connection takes no more bytes from its socket: the
 * multishot recv is canceled (io_uring), the fd leaves the interest set
 * (epoll), a single-shot recv is not re-armed. How far past the
 * threshold the pause lands is a_receive_with_bytes_waiting_stops_at_the_
 * pause's to check; bytes written once it has settled stay in the kernel
 * until the reader consumes. Then everything arrives, in order, and EOF.
 */
static void a_paused_connection_takes_no_more_bytes_until_consumed(enum perch_recv_mode mode)
{
	enum { PAUSE = 64 * 1024, FIRST = 192 * 1024, LATER = 64 * 1024 };
	struct perch_conn_opts bp = { .recv_mode = mode, .pause_bytes = PAUSE, .resume_bytes = PAUSE / 4 };
	struct stream st;
	stream_open(&st, FIRST + LATER, &bp, 0, 256 * 1024); /* the kernel holds all of it unread */
	assert_true(lu_write_all(st.w.fd, st.out, FIRST));
	struct rx_probe settled = paused_and_still(&st.l, st.k.c);
	assert_true(settled.unconsumed >= PAUSE && settled.unconsumed <= FIRST);

	assert_true(lu_write_all(st.w.fd, st.out + FIRST, LATER));
	/* Probed twice: the first probe's turn may be the first since the sleep, its poll after it. */
	for (int probe = 0; probe < 2; probe++) {
		usleep(50 * 1000);
		struct rx_probe later = { .c = st.k.c };
		assert_int_equal(lu_on_loop(&st.l, read_rx_state, &later), 0);
		assert_true(later.paused);
		assert_int_equal(later.unconsumed, settled.unconsumed);
	}

	assert_int_equal(shutdown(st.w.fd, SHUT_WR), 0);
	struct lu_end e = stream_read_all(&st);
	assert_true(e.completed);
	stream_close(&st);
}

static void a_paused_multishot_recv_takes_no_more_bytes_until_consumed(void **state)
{
	a_paused_connection_takes_no_more_bytes_until_consumed(PERCH_RECV_MULTISHOT);
}

static void a_paused_singleshot_recv_takes_no_more_bytes_until_consumed(void **state)
{
	a_paused_connection_takes_no_more_bytes_until_consumed(PERCH_RECV_SINGLESHOT);
}

/* One plain client per thread: write, read the echo back, compare. */
struct echo_client {
	const struct perch_listener *ls;
	size_t len;
	bool ok;
	pthread_t th;
};

static void *echo_client_main(void *p)
{
	struct echo_client *ec = p;
	uint8_t *out = malloc(ec->len), *in = malloc(ec->len);
	lu_fill(out, ec->len);
	int fd = lu_plain_connect_to(ec->ls);
	struct timeval tv = { LU_TIMEOUT_MS / 1000, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	ec->ok = fd >= 0 && lu_write_all(fd, out, ec->len) && lu_read_all(fd, in, ec->len) &&
		 memcmp(in, out, ec->len) == 0;
	if (fd >= 0)
		close(fd);
	free(out);
	free(in);
	return NULL;
}

/* CONNS echo clients moving LEN bytes each through a server with these buffers: every byte comes back. */
static void echo_through_few_buffers(const struct perch_loop_opts *opts, int conns, size_t len,
				     uint64_t *parks, uint64_t *ring_target)
{
	struct server s;
	server_start(&s, opts, NULL);
	struct echo_client *ec = calloc((size_t)conns, sizeof(*ec));
	for (int i = 0; i < conns; i++) {
		ec[i] = (struct echo_client){ .ls = s.ls, .len = len };
		pthread_create(&ec[i].th, NULL, echo_client_main, &ec[i]);
	}
	for (int i = 0; i < conns; i++) {
		pthread_join(ec[i].th, NULL);
		assert_true(ec[i].ok);
	}
	free(ec);
	assert_true(wait_u32(&s.stats.ended, (uint32_t)conns));
	assert_int_equal(s.stats.bytes, (uint64_t)conns * len);
	struct live_probe lp = { s.l.loop, 0 };
	lu_on_loop(&s.l, read_live, &lp); /* after the loop's last write of its stats */
	*parks = s.l.loop->stats.enobufs_parks;
	*ring_target = s.l.loop->stats.ring_target;
	assert_int_equal(lu_stop(&s.l), 0);
	print_message("ENOBUFS parks: %llu, ring target %llu\n", (unsigned long long)*parks,
		      (unsigned long long)*ring_target);
}

static void exhausted_buffer_ring_still_serves_every_connection(void **state)
{
	/* Eight 4 KiB buffers for 32 connections moving 64 KiB each. */
	struct perch_loop_opts small = { .buf_count = 8, .buf_size = 4096 };
	uint64_t parks, target;
	echo_through_few_buffers(&small, 32, 64 * 1024, &parks, &target);
	assert_true(parks > 0);
}

/*
 * 128 buffers of 4 KiB, the ring starting with 64 and the rest spare, for
 * 64 connections moving 256 KiB each: buffers come and go while the ring
 * runs short, every byte comes back, and on io_uring the kernel's ENOBUFS
 * grows the ring (the count of free buffers, behind the kernel's within a
 * batch of completions, would leave the spares unused while connections
 * park by the thousand).
 */
static void a_ring_that_grows_while_buffers_come_and_go_loses_nothing(void **state)
{
	/* One buffer a completion: a bundle takes what is queued at once, and the ring need not run short. */
	struct perch_loop_opts opts = { .buf_count = 128, .buf_size = 4096, .recv_bundles_off = true };
	uint64_t parks, target;
	echo_through_few_buffers(&opts, 64, 256 * 1024, &parks, &target);
	if (target != 0) { /* io_uring (epoll has no ring, and its pool may never run short here) */
		assert_true(parks > 0); /* the ring ran short: what this test is for */
		assert_true(target > 64);
	}
}

/* Reads until at least `n` bytes are shown or the stream ended or failed (each shorter result examined whole); fills *r. */
static void read_until(struct perch_conn *c, size_t n, struct perch_read_result *r)
{
	for (;;) {
		struct perch_vtask_handle h;
		int rc = perch_conn_read(c, r, &h);
		if (rc == PERCH_PENDING) {
			int64_t v;
			assert_int_equal(perch_vtask_wait(h, LU_TIMEOUT_MS, &v), 0);
			rc = perch_conn_try_read(c, r);
		}
		if (rc == -EAGAIN)
			continue;
		assert_int_equal(rc, 0);
		if (r->len >= n || r->completed || r->closed || r->error)
			return;
		assert_int_equal(perch_conn_advance(c, 0, r->len), 0);
	}
}

/* Reads until at least `n` bytes are shown; fills *r. */
static void read_at_least(struct perch_conn *c, size_t n, struct perch_read_result *r)
{
	read_until(c, n, r);
	assert_true(r->len >= n); /* the stream did not end before them */
}

/* Reads on, consuming nothing, until the stream ends or fails; fills *r. */
static void read_to_the_end(struct perch_conn *c, struct perch_read_result *r)
{
	read_until(c, SIZE_MAX, r);
}

/* Waits for the next bytes on c and consumes them; returns the buffer id of the first segment. */
static uint32_t read_and_consume_one(struct perch_conn *c)
{
	struct perch_read_result r;
	read_at_least(c, 1, &r);
	uint32_t id = r.first->buf_id;
	perch_conn_advance(c, r.len, r.len);
	return id;
}

static void on_loop_nothing(void *arg) {}

/*
 * How many distinct buffers `msgs` one-byte messages landed in, each
 * consumed, and its buffer back in the loop's hands, before the next is
 * sent. A return the loop sees only after a later receive finds the ring
 * two short and tops it up from the spare stack: right, but it would make
 * the count depend on how the threads were scheduled.
 */
static uint32_t distinct_buffers_of_round_trips(struct lu_loop *l, int fd, struct perch_conn *c, int msgs)
{
	static bool used[32768];
	memset(used, 0, sizeof(used));
	uint32_t distinct = 0;
	for (int i = 0; i < msgs; i++) {
		assert_true(lu_write_all(fd, (const uint8_t *)"x", 1));
		uint32_t id = read_and_consume_one(c);
		assert_int_equal(lu_on_loop(l, on_loop_nothing, NULL), 0); /* the posted release ran first */
		assert_true(id < 32768);
		distinct += !used[id];
		used[id] = true;
	}
	return distinct;
}

/* A started loop with one accepted connection (k->c); returns the client's fd. */
static int one_connection(struct lu_loop *l, struct lu_catcher *k)
{
	struct perch_listener *ls;
	*k = (struct lu_catcher){ .c = NULL };
	sem_init(&k->got, 0, 0);
	assert_int_equal(lu_start(l, NULL), 0);
	assert_int_equal(test_listen(l->loop, NULL, lu_catch_accept, k, &ls), 0);
	int fd = lu_plain_connect_to(ls);
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&k->got, LU_TIMEOUT_MS), 0);
	return fd;
}

static void one_connection_end(struct lu_loop *l, struct lu_catcher *k, int fd)
{
	perch_conn_release(k->c);
	close(fd);
	assert_int_equal(lu_stop(l), 0);
	sem_destroy(&k->got);
}

/*
 * One byte at a time, each consumed before the next is sent: the kernel
 * needs one buffer at a time, and gets it from a few warm ones, not
 * round the whole ring (512 by default) where each is cold.
 */
static void a_quiet_connection_reuses_a_few_warm_buffers_not_the_whole_ring(void **state)
{
	enum { MSGS = 1000, WARM = 64 };
	struct lu_loop l;
	struct lu_catcher k;
	int fd = one_connection(&l, &k);
	uint32_t distinct = distinct_buffers_of_round_trips(&l, fd, k.c, MSGS);
	print_message("%s: %u distinct buffers for %d messages\n", perch_loop_backend_name(l.loop), distinct, MSGS);
	assert_true(distinct <= WARM);
	one_connection_end(&l, &k, fd);
}

/* The bytes of a result, gathered across its segments (at most cap). */
static size_t gather(const struct perch_read_result *r, char *out, size_t cap)
{
	size_t n = 0, off = r->first_off;
	for (const struct perch_seg *s = r->first; s && n < r->len && n < cap; s = s->next, off = 0)
		for (size_t i = off; i < s->len && n < r->len && n < cap; i++)
			out[n++] = (char)s->data[i];
	return n;
}

/* buf_id of a segment of the loop's own memory: a compacted tail, or received while the pool was empty (lib/conn_internal.h). */
#define HEAP_SEGMENT (UINT32_MAX - 1)

/*
 * A reader that examined all it was shown waits for more: the short tail
 * it left moves out of the loop's receive buffer into memory of the
 * loop's own, and reads on whole with the bytes that come after it.
 * A reader that left bytes unexamined reads again at once: nothing moves.
 */
static void a_waiting_short_tail_leaves_its_receive_buffer_and_reads_on_whole(void **state)
{
	struct lu_loop l;
	struct lu_catcher k;
	int fd = one_connection(&l, &k);
	struct perch_read_result r;
	char got[64];
	assert_true(lu_write_all(fd, (const uint8_t *)"hello ", 6));
	read_at_least(k.c, 6, &r);
	assert_int_equal(perch_conn_advance(k.c, 2, 6), 0); /* "he" consumed, "llo " waits */
	assert_true(lu_write_all(fd, (const uint8_t *)"world", 5));
	read_at_least(k.c, 9, &r);
	assert_int_equal(r.first->buf_id, HEAP_SEGMENT);
	assert_int_equal(r.first_off, 0);
	assert_int_equal(r.first->len, 4);
	assert_int_equal(gather(&r, got, sizeof(got)), 9);
	assert_memory_equal(got, "llo world", 9);
	assert_int_equal(perch_conn_advance(k.c, 9, 9), 0);
	assert_true(lu_write_all(fd, (const uint8_t *)"xyz", 3));
	read_at_least(k.c, 3, &r);
	assert_int_equal(perch_conn_advance(k.c, 1, 1), 0); /* "yz" not examined: no wait, no move */
	assert_int_equal(perch_conn_try_read(k.c, &r), 0);
	assert_true(r.first->buf_id < HEAP_SEGMENT); /* a pool buffer */
	assert_int_equal(gather(&r, got, sizeof(got)), 2);
	assert_memory_equal(got, "yz", 2);
	assert_int_equal(perch_conn_advance(k.c, 2, 2), 0);
	one_connection_end(&l, &k, fd);
}

/* Whether the peer of `fd` ended its stream (EOF or reset) within ms. */
static bool peer_ended_within(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;
	return poll(&p, 1, ms) == 1 && recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

/*
 * The peer's FIN ended the receive and no send is under way: a close then
 * has nothing in flight to cancel, and must still close the fd (the
 * peer sees its end) without waiting for the loop's free.
 */
static void a_close_with_nothing_in_flight_closes_the_fd_at_once(void **state)
{
	struct lu_loop l;
	struct lu_catcher k;
	int fd = one_connection(&l, &k);
	struct perch_read_result r = { 0 };
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	while (!r.completed) {
		read_at_least(k.c, 0, &r);
		assert_int_equal(perch_conn_advance(k.c, r.len, r.len), 0);
	}
	assert_int_equal(perch_conn_close(k.c), 0);
	assert_true(peer_ended_within(fd, LU_TIMEOUT_MS));
	one_connection_end(&l, &k, fd);
}

/* ---- a connection waiting for a receive buffer still hears its peer ---- */

/* The loop's counters (perch_loop.stats), copied on its thread. */
typedef __typeof__(((struct perch_loop *)0)->stats) loop_stats_t;

struct stats_copy {
	struct perch_loop *loop;
	loop_stats_t stats;
};

static void copy_stats(void *arg)
{
	struct stats_copy *c = arg;
	c->stats = c->loop->stats;
}

static loop_stats_t loop_stats(struct lu_loop *l)
{
	struct stats_copy c = { .loop = l->loop };
	assert_int_equal(lu_on_loop(l, copy_stats, &c), 0);
	return c.stats;
}

/* A loop of POOL_BUFS receive buffers whose first connection holds them all: its reader reads nothing. */
enum { POOL_BUFS = 4, POOL_BUF_SIZE = 4096 };

struct hogged_pool {
	struct lu_loop l;
	struct lu_catcher k;
	struct perch_listener *ls;
	int hog_fd;
	struct perch_conn *hog;
};

/* copts: every accepted connection's (the hog's pause must be above the pool, or it pauses instead of waiting). */
static void hog_the_pool(struct hogged_pool *h, const struct perch_conn_opts *copts)
{
	struct perch_loop_opts o = { .buf_count = POOL_BUFS, .buf_size = POOL_BUF_SIZE };
	h->k = (struct lu_catcher){ .c = NULL };
	sem_init(&h->k.got, 0, 0);
	assert_int_equal(lu_start(&h->l, &o), 0);
	assert_int_equal(test_listen(h->l.loop, copts, lu_catch_accept, &h->k, &h->ls), 0);
	h->hog_fd = lu_plain_connect_to(h->ls);
	assert_true(h->hog_fd >= 0);
	assert_int_equal(lu_sem_wait(&h->k.got, LU_TIMEOUT_MS), 0);
	h->hog = h->k.c;
	static uint8_t more_than_the_pool[2 * POOL_BUFS * POOL_BUF_SIZE];
	assert_true(lu_write_all(h->hog_fd, more_than_the_pool, sizeof(more_than_the_pool)));
	double t0 = lu_now_ms();
	while (loop_stats(&h->l).enobufs_parks == 0 && lu_now_ms() - t0 < LU_TIMEOUT_MS)
		usleep(1000);
	assert_true(loop_stats(&h->l).enobufs_parks > 0); /* every buffer is the hog's: it waits for more itself */
}

/* A second client of the hogged loop; its accepted connection in *c. */
static int hogged_pool_connect(struct hogged_pool *h, struct perch_conn **c)
{
	int fd = lu_plain_connect_to(h->ls);
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&h->k.got, LU_TIMEOUT_MS), 0);
	*c = h->k.c;
	return fd;
}

static void hogged_pool_end(struct hogged_pool *h)
{
	perch_conn_release(h->hog);
	close(h->hog_fd);
	assert_int_equal(lu_stop(&h->l), 0);
	sem_destroy(&h->k.got);
}

/*
 * Every receive buffer is held by a connection whose reader reads
 * nothing. Another connection's peer sends the start of a request and
 * hangs up: waiting for a buffer, the connection still hears it (a poll
 * for the end on io_uring, EPOLLRDHUP on epoll), receives the bytes into
 * memory of its own and then the end, and its close gives the fd back.
 */
static void a_connection_waiting_for_a_receive_buffer_still_hears_its_peer_end(void **state)
{
	struct hogged_pool h;
	hog_the_pool(&h, NULL);
	struct perch_conn *c;
	int fd = hogged_pool_connect(&h, &c);
	assert_true(lu_write_all(fd, (const uint8_t *)"GET / HT", 8));
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	struct perch_read_result r;
	char got[16];
	read_to_the_end(c, &r);
	assert_true(r.completed);
	assert_int_equal(gather(&r, got, sizeof(got)), 8);
	assert_memory_equal(got, "GET / HT", 8);
	assert_true(r.first->buf_id >= HEAP_SEGMENT); /* the loop's own memory, or the conn's copy of it */
	assert_int_equal(perch_conn_advance(c, r.len, r.len), 0);
	assert_true(loop_stats(&h.l).own_receives > 0);
	assert_int_equal(perch_conn_close(c), 0);
	perch_conn_release(c);
	assert_true(peer_ended_within(fd, LU_TIMEOUT_MS)); /* its fd closed: our end reads the end */
	close(fd);
	hogged_pool_end(&h);
}

/*
 * The peer sends several times the connection's pause_bytes and hangs up
 * while every pool buffer is held: the connection receives into its own
 * memory up to the pause, waits for its reader to consume, then receives
 * the next part (parked again, it hears the end again), until the end.
 */
static void a_connection_waiting_for_a_buffer_receives_more_than_its_pause_part_by_part(void **state)
{
	enum { PAUSE = 8 * POOL_BUF_SIZE, SENT = 3 * PAUSE + 1000 };
	struct perch_conn_opts copts = { .pause_bytes = PAUSE };
	struct hogged_pool h;
	hog_the_pool(&h, &copts);
	struct perch_conn *c;
	int fd = hogged_pool_connect(&h, &c);
	uint8_t *sent = malloc(SENT), *got = malloc(SENT);
	lu_fill(sent, SENT);
	assert_true(lu_write_all(fd, sent, SENT));
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	size_t n = 0;
	struct perch_read_result r = { 0 };
	while (!r.completed) {
		read_until(c, 1, &r); /* each part consumed whole: r holds only new bytes */
		assert_false(r.error || r.closed);
		assert_true(r.len <= SENT - n);
		assert_int_equal(gather(&r, (char *)got + n, SENT - n), r.len);
		n += r.len;
		assert_int_equal(perch_conn_advance(c, r.len, r.len), 0);
		r.len = 0;
		if (n == SENT && !r.completed)
			read_to_the_end(c, &r);
	}
	assert_int_equal(n, SENT);
	assert_memory_equal(got, sent, SENT);
	assert_true(loop_stats(&h.l).own_receives >= 4); /* at least one receive a part */
	perch_conn_release(c);
	close(fd);
	free(sent);
	free(got);
	hogged_pool_end(&h);
}

/* ---- a peer sending a few bytes a segment: the buffers a connection holds are bounded ---- */

/* The loop's view of a connection: pool buffers held, bytes unconsumed, paused. */
struct sock_view {
	struct perch_conn *c;
	uint32_t pool_held;
	uint64_t unconsumed;
	bool paused;
};

static void read_sock_view(void *arg)
{
	struct sock_view *v = arg;
	struct perch__sock *s = perch__conn_sock(v->c);
	v->pool_held = s->pool_held;
	v->unconsumed = s->unconsumed;
	v->paused = s->rx_paused;
}

static struct sock_view sock_view(struct lu_loop *l, struct perch_conn *c)
{
	struct sock_view v = { .c = c };
	assert_int_equal(lu_on_loop(l, read_sock_view, &v), 0);
	return v;
}

/* Sends one chunk and waits (bounded) until the connection received it as a segment of its own, or paused. */
static void dribble(struct lu_loop *l, int fd, struct perch_conn *c, const uint8_t *chunk, size_t len)
{
	uint64_t before = perch__load_u64(&c->rx_total);
	assert_true(lu_write_all(fd, chunk, len));
	double t0 = lu_now_ms();
	bool arrived = false, paused = false;
	while (!arrived && !paused && lu_now_ms() - t0 < LU_TIMEOUT_MS) {
		usleep(500);
		arrived = perch__load_u64(&c->rx_total) >= before + len;
		paused = sock_view(l, c).paused;
	}
	assert_true(arrived || paused); /* neither: it waits for a buffer the pool has no more of */
}

/* A loop of its own, a listener on it and one connection to it: the peer's fd and the accepted conn. */
struct one_conn {
	struct lu_loop l;
	struct lu_catcher k;
	struct perch_listener *ls;
	int fd;
	struct perch_conn *c;
};

static void one_conn_open(struct one_conn *oc, const struct perch_loop_opts *o, const struct perch_conn_opts *copts)
{
	oc->k.c = NULL;
	sem_init(&oc->k.got, 0, 0);
	assert_int_equal(lu_start(&oc->l, o), 0);
	assert_int_equal(test_listen(oc->l.loop, copts, lu_catch_accept, &oc->k, &oc->ls), 0);
	oc->fd = lu_plain_connect_to(oc->ls);
	assert_true(oc->fd >= 0);
	assert_int_equal(lu_sem_wait(&oc->k.got, LU_TIMEOUT_MS), 0);
	oc->c = oc->k.c;
}

static void one_conn_close(struct one_conn *oc)
{
	perch_conn_release(oc->c);
	close(oc->fd);
	assert_int_equal(perch_listener_close(oc->ls), 0);
	assert_int_equal(lu_stop(&oc->l), 0);
	sem_destroy(&oc->k.got);
}

/*
 * A loop of 16 buffers of 4 KiB; a connection with a 16 KiB pause (so at
 * most 2 x 4 + 2 = 10 pool buffers) whose peer sends 200 bytes a segment,
 * each received before the next is sent. Its reader reads nothing: it
 * pauses at 10 buffers with 2,000 bytes, far below its pause_bytes, and a
 * second connection is still served from the 6 left. Then its reader
 * waits for a line: each wait gives the thin tail up (into the loop's own
 * memory, counted as before), the connection resumes, and 8,000 bytes
 * and the newline arrive whole and in order.
 */
static void a_peer_sending_a_few_bytes_a_segment_holds_a_bounded_number_of_buffers(void **state)
{
	enum { BUFS = 16, BUF = 4096, PAUSE = 4 * BUF, CHUNK = 200, CHUNKS = 40, HELD_MAX = 2 * PAUSE / BUF + 2 };
	struct perch_loop_opts o = { .buf_count = BUFS, .buf_size = BUF };
	struct perch_conn_opts copts = { .pause_bytes = PAUSE };
	struct one_conn oc;
	one_conn_open(&oc, &o, &copts);
	struct lu_loop *l = &oc.l;
	struct perch_conn *c = oc.c;
	int fd = oc.fd;
	static uint8_t sent[CHUNKS * CHUNK + 1];
	lu_fill(sent, sizeof(sent) - 1);
	sent[sizeof(sent) - 1] = '\n';
	int i = 0;
	while (i < CHUNKS && !sock_view(l, c).paused) {
		dribble(l, fd, c, sent + i * CHUNK, CHUNK);
		i++;
	}
	struct sock_view v = sock_view(l, c);
	print_message("%s: paused after %d segments: %u buffers, %" PRIu64 " bytes\n", perch_loop_backend_name(l->loop), i,
		      v.pool_held, v.unconsumed);
	assert_true(v.paused);
	assert_true(v.pool_held <= HELD_MAX + 1); /* a multishot's segment may land as the pause does */
	assert_true(v.unconsumed < PAUSE);
	/*
	 * Paused, it takes no more: two turns later its multishot's cancel has
	 * been submitted (io_uring; epoll left the fd out of its interest), and
	 * a segment sent then stays in the kernel though the pause's byte room
	 * is not used up.
	 */
	assert_int_equal(lu_on_loop(l, on_loop_nothing, NULL), 0);
	assert_int_equal(lu_on_loop(l, on_loop_nothing, NULL), 0);
	assert_true(lu_write_all(fd, sent + i * CHUNK, CHUNK));
	usleep(100 * 1000);
	struct sock_view later = sock_view(l, c);
	assert_int_equal(later.pool_held, v.pool_held);
	assert_int_equal(later.unconsumed, v.unconsumed);
	i++;

	struct perch_conn *other;
	int other_fd = lu_plain_connect_to(oc.ls);
	assert_true(other_fd >= 0);
	assert_int_equal(lu_sem_wait(&oc.k.got, LU_TIMEOUT_MS), 0);
	other = oc.k.c;
	assert_true(lu_write_all(other_fd, (const uint8_t *)"ping", 4));
	struct perch_read_result r;
	read_at_least(other, 4, &r);
	assert_int_equal(perch_conn_advance(other, 4, 4), 0);

	/* The reader waits for its line; the peer sends the rest a chunk at a time. */
	for (;;) {
		read_at_least(c, 1, &r);
		if (r.len == sizeof(sent))
			break;
		assert_int_equal(perch_conn_advance(c, 0, r.len), 0);
		if (i < CHUNKS)
			dribble(l, fd, c, sent + i++ * CHUNK, CHUNK);
		else if (i++ == CHUNKS)
			assert_true(lu_write_all(fd, sent + sizeof(sent) - 1, 1));
	}
	static uint8_t got[sizeof(sent)];
	assert_int_equal(gather(&r, (char *)got, sizeof(got)), sizeof(sent));
	assert_memory_equal(got, sent, sizeof(sent));
	assert_int_equal(perch_conn_advance(c, r.len, r.len), 0);
	assert_int_equal(lu_on_loop(l, on_loop_nothing, NULL), 0); /* the posted releases ran */
	v = sock_view(l, c);
	assert_int_equal(v.pool_held, 0);
	assert_int_equal(v.unconsumed, 0);
	perch_conn_release(other);
	close(other_fd);
	one_conn_close(&oc);
}

/*
 * A pause of 4 GiB, above what the kernel's multishot byte limit takes (it
 * subtracts as an int): 16 MiB, 1,024 buffers, streamed to a reader that
 * keeps up take a few multishot arms (io_uring; epoll arms none), not one
 * a buffer as a limit of 2 GiB or more would. TCP only; recv bundles off.
 */
static void a_pause_above_2_gib_keeps_one_multishot_receiving(void **state)
{
#ifdef LU_UNIX
	skip(); /* a Unix socket receives single-shot on io_uring: one arm a receive */
#endif
	struct perch_conn_opts huge = { .pause_bytes = (size_t)4 << 30 };
	/* One buffer a completion, so one a multishot would be one an arm; a bundle hides it. */
	struct perch_loop_opts one_each = { .recv_bundles_off = true };
	struct stream st;
	stream_open_on(&st, &one_each, 16 << 20, &huge, 0, 0);
	stream_write(&st);
	stream_read_all(&st);
	uint64_t arms = loop_stats(&st.l).recv_arms;
	print_message("%s: %" PRIu64 " receive arms for 16 MiB\n", perch_loop_backend_name(st.l.loop), arms);
	assert_true(arms < 256);
	stream_close(&st);
}

/* ---- bytes already waiting when a receive runs: it stops at the pause ---- */

struct held_loop {
	sem_t holding, release;
};

/* Posted: keeps the loop's thread away from the kernel until the test lets it go. */
static void hold_the_loop(void *arg)
{
	struct held_loop *h = arg;
	sem_post(&h->holding);
	sem_wait(&h->release);
}

/* Writes what the socket takes without blocking, up to cap: the count. */
static size_t write_what_fits(int fd, const uint8_t *p, size_t cap)
{
	size_t n = 0;
	while (n < cap) {
		ssize_t w = send(fd, p + n, cap - n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w <= 0)
			break;
		n += (size_t)w;
	}
	return n;
}

/*
 * The loop is held while the peer queues far more than the connection's
 * pause (16 KiB) in its socket; let go, one pass of the kernel's receive
 * finds it all waiting. It takes the pause's room and stops, buffer size
 * granular (io_uring: the multishot's byte limit; epoll: the read turn
 * pauses inline), not the 32 buffers one multishot pass drains without
 * the limit. Then every byte arrives in order.
 */
static void a_receive_with_bytes_waiting_stops_at_the_pause(void **state)
{
	enum { BUF = 4096, PAUSE = 4 * BUF, MAX = 1024 * 1024 };
	struct perch_loop_opts o = { .buf_count = 128, .buf_size = BUF };
	struct perch_conn_opts copts = { .pause_bytes = PAUSE, .resume_bytes = PAUSE / 2 };
	struct one_conn oc;
	struct held_loop h;
	sem_init(&h.holding, 0, 0);
	sem_init(&h.release, 0, 0);
	one_conn_open(&oc, &o, &copts);
	struct perch_conn *c = oc.c;
	uint8_t *sent = malloc(MAX), *got = malloc(MAX);
	lu_fill(sent, MAX);

	assert_int_equal(perch_loop_post(oc.l.loop, hold_the_loop, &h), 0);
	assert_int_equal(lu_sem_wait(&h.holding, LU_TIMEOUT_MS), 0);
	size_t queued = write_what_fits(oc.fd, sent, MAX);
	sem_post(&h.release);
	struct rx_probe v = paused_and_still(&oc.l, c);
	print_message("%s: %zu bytes queued, paused at %" PRIu64 " in %u buffers\n", perch_loop_backend_name(oc.l.loop),
		      queued, v.unconsumed, v.pool_held);
	assert_true(queued >= 8 * PAUSE); /* enough for a drain to overshoot by far */
	if (v.limit_refused)
		print_message("this kernel refused the multishot byte limit: the bound is not checked\n");
	else
		assert_true(v.unconsumed >= PAUSE && v.unconsumed < PAUSE + BUF);

	size_t n = 0;
	while (n < queued) {
		struct perch_read_result r;
		read_at_least(c, 1, &r);
		assert_true(r.len <= queued - n);
		assert_int_equal(gather(&r, (char *)got + n, queued - n), r.len);
		n += r.len;
		assert_int_equal(perch_conn_advance(c, r.len, r.len), 0);
	}
	assert_memory_equal(got, sent, queued);
	free(sent);
	free(got);
	one_conn_close(&oc);
	sem_destroy(&h.holding);
	sem_destroy(&h.release);
}

/* ---- a quiet loop gives back the pages of the buffers a burst used ---- */

/* How many of the n buffers at bufs[i] (each `size` bytes, page aligned) have a page backed. */
static int resident_buffers(uint8_t *const *bufs, int n, size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = size / page;
	unsigned char vec[64];
	assert_true(pages >= 1 && pages <= sizeof(vec));
	int count = 0;
	for (int i = 0; i < n; i++) {
		assert_int_equal(mincore(bufs[i], size, vec), 0);
		bool any = false;
		for (size_t p = 0; p < pages; p++)
			any |= vec[p] & 1;
		count += any;
	}
	return count;
}

/*
 * Reads n bytes whole into got, held until all came and then hold_ms more
 * (nothing consumed before); the buffers they were in, in bufs.
 */
static int hold_then_consume(struct perch_conn *c, uint8_t *got, size_t n, unsigned hold_ms, uint8_t **bufs, int cap)
{
	struct perch_read_result r;
	read_at_least(c, n, &r);
	assert_int_equal(r.len, n);
	usleep(hold_ms * 1000);
	int nbufs = 0;
	for (struct perch_seg *seg = r.first; seg; seg = seg->next) {
		assert_true(nbufs < cap);
		bufs[nbufs++] = seg->data;
	}
	assert_int_equal(gather(&r, (char *)got, n), n);
	assert_int_equal(perch_conn_advance(c, n, n), 0);
	return nbufs;
}

/*
 * A reader holds 4 MiB whole for 1.5 s before it consumes them: 256
 * buffers of a loop's 512 (io_uring's ring grows to hold them), while the
 * loop's trim ticks run (a buffer used before armed them), which must not
 * touch the held ones. Once consumed the buffers are free with their pages
 * backed; with nothing received for a second or two, the loop gives those
 * pages back, but for io_uring's warm ring (64 buffers), and counts them.
 * Then 4 MiB more arrive whole, into buffers whose pages went back.
 */
static void a_quiet_loop_gives_back_the_pages_of_the_buffers_a_burst_used(void **state)
{
	enum { BUF = 16384, N = 4 << 20, HELD = N / BUF, WARM = 64 };
	struct perch_loop_opts o = { .buf_count = 512, .buf_size = BUF };
	struct perch_conn_opts copts = { .pause_bytes = 2 * N };
	struct one_conn oc;
	one_conn_open(&oc, &o, &copts);
	bool uring = strcmp(perch_loop_backend_name(oc.l.loop), "io_uring") == 0;
	uint8_t *sent = malloc(N), *got = malloc(N);
	static uint8_t *bufs[2 * HELD];
	lu_fill(sent, N);
	assert_true(lu_write_all(oc.fd, sent, 100));
	hold_then_consume(oc.c, got, 100, 0, bufs, 2 * HELD);
	assert_true(lu_write_all(oc.fd, sent, N));
	int nbufs = hold_then_consume(oc.c, got, N, 1500, bufs, 2 * HELD);
	assert_memory_equal(got, sent, N);
	assert_int_equal(lu_on_loop(&oc.l, on_loop_nothing, NULL), 0); /* the posted releases ran */
	int before = resident_buffers(bufs, nbufs, BUF), now = before;
	uint64_t ring = loop_stats(&oc.l).ring_target, grown = ring;
	double t0 = lu_now_ms();
	while ((now > (uring ? WARM : 0) || ring > WARM) && lu_now_ms() - t0 < LU_TIMEOUT_MS) {
		usleep(50 * 1000);
		now = resident_buffers(bufs, nbufs, BUF);
		ring = loop_stats(&oc.l).ring_target;
	}
	uint64_t given = lu_stats(&oc.l).bufs_given_back;
	print_message("%s: %d buffers held; backed: %d once consumed, %d after %.0f ms; ring %" PRIu64 " then %" PRIu64
		      "; %" PRIu64 " given back\n",
		      perch_loop_backend_name(oc.l.loop), nbufs, before, now, lu_now_ms() - t0, grown, ring, given);
	assert_true(nbufs >= HELD && before >= HELD);
	assert_true(now <= (uring ? WARM : 0));
	assert_true(ring <= WARM); /* io_uring: the ring grew for the burst, and is back to its warm size */
	assert_true(given >= (uint64_t)(nbufs - WARM));

	lu_fill(sent, N);
	for (size_t i = 0; i < N; i++)
		sent[i] ^= 0x5a; /* not what the buffers held before */
	assert_true(lu_write_all(oc.fd, sent, N));
	hold_then_consume(oc.c, got, N, 0, bufs, 2 * HELD);
	assert_memory_equal(got, sent, N);
	free(sent);
	free(got);
	one_conn_close(&oc);
}

/* As above, but the peer resets: the waiting connection's reader sees the reset. TCP only. */
static void a_connection_waiting_for_a_receive_buffer_still_hears_its_peer_reset(void **state)
{
	struct hogged_pool h;
	hog_the_pool(&h, NULL);
	int fds = lu_count_fds();
	struct perch_conn *c;
	int fd = hogged_pool_connect(&h, &c);
	assert_true(lu_write_all(fd, (const uint8_t *)"GET / HT", 8));
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(fd); /* a reset */
	struct perch_read_result r;
	read_to_the_end(c, &r);
	assert_int_equal(r.error, -ECONNRESET); /* the bytes before it may be read or dropped */
	assert_int_equal(perch_conn_advance(c, r.len, r.len), 0);
	assert_int_equal(perch_conn_close(c), 0);
	perch_conn_release(c);
	double t0 = lu_now_ms();
	while (lu_count_fds() != fds && lu_now_ms() - t0 < LU_TIMEOUT_MS)
		usleep(1000);
	assert_int_equal(lu_count_fds(), fds); /* the server's end is closed too */
	hogged_pool_end(&h);
}

/* Whether a plain connect to `a` (TCP or Unix) is refused: nothing listens there. */
static bool connect_refused(const struct sockaddr_storage *a, socklen_t len)
{
	int fd = socket(a->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	bool refused = lu_connect_addr(fd, (const struct sockaddr *)a, len) != 0 && errno == ECONNREFUSED;
	close(fd);
	return refused;
}

static void release_accepted(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	perch_conn_release(c);
}

/* A listener's close ends its accept in flight and closes its fd at once: the port stops listening. */
static void a_closed_listener_stops_listening_without_the_loops_free(void **state)
{
	struct lu_loop l;
	struct perch_listener *ls;
	assert_int_equal(lu_start(&l, NULL), 0);
	assert_int_equal(test_listen(l.loop, NULL, release_accepted, NULL, &ls), 0);
	struct sockaddr_storage a;
	socklen_t len = sizeof(a);
	assert_int_equal(getsockname(ls->sk.fd, (struct sockaddr *)&a, &len), 0);
	if (a.ss_family == AF_INET)
		((struct sockaddr_in *)&a)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_false(connect_refused(&a, len));
	assert_int_equal(perch_listener_close(ls), 0);
	double t0 = lu_now_ms();
	while (!connect_refused(&a, len) && lu_now_ms() - t0 < LU_TIMEOUT_MS)
		usleep(10 * 1000);
	assert_true(connect_refused(&a, len));
	assert_int_equal(lu_stop(&l), 0);
}

/* Accepts every conn into the next slot of `c`, in order (beyond 512, released at once). */
struct many_accepts {
	struct perch_conn *c[512];
	uint32_t n;
};

static void many_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct many_accepts *k = arg;
	uint32_t i = perch__load_u32(&k->n);
	if (i < 512)
		k->c[i] = c;
	else
		perch_conn_release(c);
	perch__store_u32(&k->n, i + 1);
}

struct held_probe {
	struct many_accepts *k;
	uint32_t n;
	uint64_t unconsumed, ring_target, parks;
};

static void read_held(void *p)
{
	struct held_probe *hp = p;
	hp->unconsumed = 0;
	for (uint32_t i = 0; i < hp->n; i++)
		hp->unconsumed += ((struct perch__sock *)hp->k->c[i]->transport)->unconsumed;
	struct perch_loop *loop = ((struct perch__sock *)hp->k->c[0]->transport)->loop;
	hp->ring_target = loop->stats.ring_target;
	hp->parks = loop->stats.enobufs_parks;
}

/*
 * 300 connections each send 16 KiB that nobody consumes: they hold more
 * buffers than the ring starts with (64), so it runs dry, and must grow
 * from the buffers held back for it, or the rest wait for good (on epoll,
 * whose pool has no ring, they are simply all received).
 */
static void a_burst_holding_more_buffers_than_the_ring_has_grows_it(void **state)
{
	enum { CONNS = 300, LEN = 16 * 1024 };
	struct lu_loop l;
	static struct many_accepts k;
	memset(&k, 0, sizeof(k));
	struct perch_listener *ls;
	assert_int_equal(lu_start(&l, NULL), 0);
	assert_int_equal(test_listen(l.loop, NULL, many_accept, &k, &ls), 0);
	int fds[CONNS];
	static uint8_t data[LEN];
	lu_fill(data, LEN);
	for (int i = 0; i < CONNS; i++) {
		fds[i] = lu_plain_connect_to(ls);
		assert_true(fds[i] >= 0);
	}
	for (double t = lu_now_ms(); perch__load_u32(&k.n) < CONNS && lu_now_ms() - t < LU_TIMEOUT_MS;)
		usleep(1000);
	assert_int_equal(perch__load_u32(&k.n), CONNS);
	for (int i = 0; i < CONNS; i++)
		assert_true(lu_write_all(fds[i], data, LEN));
	struct held_probe hp = { .k = &k, .n = CONNS };
	for (double t = lu_now_ms(); lu_now_ms() - t < LU_TIMEOUT_MS; usleep(1000)) {
		assert_int_equal(lu_on_loop(&l, read_held, &hp), 0);
		if (hp.unconsumed == (uint64_t)CONNS * LEN)
			break;
	}
	print_message("%s: %llu of %d bytes held, ring target %llu, ENOBUFS parks %llu\n",
		      perch_loop_backend_name(l.loop), (unsigned long long)hp.unconsumed, CONNS * LEN,
		      (unsigned long long)hp.ring_target, (unsigned long long)hp.parks);
	assert_int_equal(hp.unconsumed, (uint64_t)CONNS * LEN);
	if (strcmp(perch_loop_backend_name(l.loop), "io_uring") == 0) {
		assert_true(hp.ring_target > 64); /* grew: the ring starts with 64 */
		assert_true(hp.parks > 0);
	}
	for (int i = 0; i < CONNS; i++) {
		perch_conn_release(k.c[i]);
		close(fds[i]);
	}
	assert_int_equal(lu_stop(&l), 0);
}

static void read_ring_target(void *p)
{
	struct held_probe *hp = p;
	struct perch_loop *loop = ((struct perch__sock *)hp->k->c[0]->transport)->loop;
	hp->ring_target = loop->stats.ring_target;
}

/*
 * A burst grows the ring (200 connections holding 16 KiB each); once they
 * are gone and one quiet connection is left, the ring halves back to 64
 * (a ring never half used for RING_SHRINK_POLLS polls), and the quiet
 * connection's receives cycle through 64 buffers again, not 256.
 */
static void a_ring_grown_by_a_burst_shrinks_back_once_quiet(void **state)
{
	enum { CONNS = 200, LEN = 16 * 1024, QUIET_MAX = 40000, DRAIN = 600, MSGS = 1000 };
	struct lu_loop l;
	static struct many_accepts k;
	memset(&k, 0, sizeof(k));
	struct perch_listener *ls;
	assert_int_equal(lu_start(&l, NULL), 0);
	if (strcmp(perch_loop_backend_name(l.loop), "io_uring") != 0) {
		assert_int_equal(lu_stop(&l), 0);
		skip(); /* epoll's pool has no ring */
	}
	assert_int_equal(test_listen(l.loop, NULL, many_accept, &k, &ls), 0);
	static int fds[CONNS + 1];
	static uint8_t data[LEN];
	for (int i = 0; i <= CONNS; i++)
		assert_true((fds[i] = lu_plain_connect_to(ls)) >= 0);
	for (double t = lu_now_ms(); perch__load_u32(&k.n) <= CONNS && lu_now_ms() - t < LU_TIMEOUT_MS;)
		usleep(1000);
	assert_int_equal(perch__load_u32(&k.n), CONNS + 1);
	for (int i = 0; i < CONNS; i++)
		assert_true(lu_write_all(fds[i], data, LEN));
	struct held_probe hp = { .k = &k, .n = CONNS };
	for (double t = lu_now_ms(); hp.unconsumed < (uint64_t)CONNS * LEN && lu_now_ms() - t < LU_TIMEOUT_MS;
	     usleep(1000))
		assert_int_equal(lu_on_loop(&l, read_held, &hp), 0);
	assert_true(hp.ring_target >= 256);
	for (int i = 0; i < CONNS; i++) { /* the burst leaves: its buffers come back */
		perch_conn_release(k.c[i]);
		close(fds[i]);
	}
	struct perch_conn *quiet = k.c[CONNS];
	hp.k = &(struct many_accepts){ .c = { quiet } };
	int sent = 0;
	for (; sent < QUIET_MAX && hp.ring_target > 64; sent += 100) {
		distinct_buffers_of_round_trips(&l, fds[CONNS], quiet, 100);
		assert_int_equal(lu_on_loop(&l, read_ring_target, &hp), 0);
	}
	print_message("ring back to %llu after %d quiet messages\n", (unsigned long long)hp.ring_target, sent);
	assert_int_equal(hp.ring_target, 64);
	distinct_buffers_of_round_trips(&l, fds[CONNS], quiet, DRAIN); /* the extra entries leave as they are used */
	uint32_t distinct = distinct_buffers_of_round_trips(&l, fds[CONNS], quiet, MSGS);
	assert_int_equal(lu_on_loop(&l, read_ring_target, &hp), 0);
	print_message("then %u distinct buffers for %d messages, ring %llu\n", distinct, MSGS,
		      (unsigned long long)hp.ring_target);
	assert_true(distinct <= 64);
	assert_int_equal(hp.ring_target, 64); /* and no further: 64 is the floor */
	perch_conn_release(quiet);
	close(fds[CONNS]);
	assert_int_equal(lu_stop(&l), 0);
}


static void read_parks(void *p)
{
	struct live_probe *lp = p;
	lp->live = (uint32_t)lp->loop->stats.enobufs_parks;
}

static uint32_t parks_now(struct lu_loop *l)
{
	struct live_probe lp = { l->loop, 0 };
	assert_int_equal(lu_on_loop(l, read_parks, &lp), 0);
	return lp.live;
}

/* Waits (bounded) until the loop has counted `want` ENOBUFS parks. */
static bool wait_parks(struct lu_loop *l, uint32_t want)
{
	for (int i = 0; i < LU_TIMEOUT_MS; i++) {
		if (parks_now(l) >= want)
			return true;
		usleep(1000);
	}
	return false;
}

static bool wait_rx(struct perch_conn *c, uint64_t want, int ms)
{
	for (int i = 0; i < ms; i++) {
		if (perch__load_u64(&c->rx_total) >= want)
			return true;
		usleep(1000);
	}
	return false;
}

/* On a loop of one buffer: a listener, and H (accepted as k->c[0]) holding the buffer. Returns H's fd. */
static int hold_the_only_buffer(struct lu_loop *l, struct many_accepts *k, struct perch_listener **ls)
{
	assert_int_equal(test_listen(l->loop, NULL, many_accept, k, ls), 0);
	int h = lu_plain_connect_to(*ls);
	assert_true(h >= 0 && wait_u32(&k->n, 1));
	assert_int_equal(write(h, "h", 1), 1);
	assert_true(wait_rx(k->c[0], 1, LU_TIMEOUT_MS)); /* H holds the only buffer */
	return h;
}

/*
 * One buffer in the ring. H takes it and holds it (nothing reads H). F
 * sends only a FIN and parks (ENOBUFS); D sends one byte and parks behind
 * F. H's buffer comes back: F is re-armed first, and gets its FIN without
 * taking a buffer. The buffer is still free, so D must be served too.
 */
static void parked_connection_is_served_when_the_one_before_it_takes_no_buffer(bool fin)
{
	struct perch_loop_opts one = { .buf_count = 1, .buf_size = 4096 };
	struct lu_loop l;
	struct many_accepts k = { .n = 0 };
	struct perch_listener *ls;
	assert_int_equal(lu_start(&l, &one), 0);
	int h = hold_the_only_buffer(&l, &k, &ls);
	int f = lu_plain_connect_to(ls);
	assert_true(f >= 0 && wait_u32(&k.n, 2));
	uint32_t parks = 0;
	if (fin) {
		shutdown(f, SHUT_WR);
		assert_true(wait_parks(&l, 1)); /* F parks on its FIN */
		parks = 1;
	} else {
		/* Two turns: F's first recv has been submitted and answered (if it parks, it did by now). */
		parks_now(&l);
		parks = parks_now(&l);
	}
	int d = lu_plain_connect_to(ls);
	assert_true(d >= 0 && wait_u32(&k.n, 3));
	assert_int_equal(write(d, "d", 1), 1);
	assert_true(wait_parks(&l, parks + 1)); /* D parks behind F (if F parked) */
	/* H's reader consumes: its buffer goes back to the ring. */
	struct perch_read_result r;
	assert_int_equal(perch_conn_try_read(k.c[0], &r), 0);
	assert_int_equal(r.len, 1);
	assert_int_equal(perch_conn_advance(k.c[0], 1, 1), 0);
	assert_true(wait_rx(k.c[2], 1, 2000)); /* D is served */
	if (fin) {
		struct lu_end e = lu_read_to_end(k.c[1], NULL, 0);
		assert_true(e.completed);
	}
	close(h);
	close(f);
	close(d);
	for (uint32_t i = 0; i < 3; i++)
		perch_conn_release(k.c[i]);
	assert_int_equal(lu_stop(&l), 0);
}

static void parked_connection_is_served_when_the_one_before_it_only_gets_a_fin(void **state)
{
	parked_connection_is_served_when_the_one_before_it_takes_no_buffer(true);
}

static void parked_connection_is_served_when_the_one_before_it_stays_idle(void **state)
{
	parked_connection_is_served_when_the_one_before_it_takes_no_buffer(false);
}

#if defined(__SANITIZE_ADDRESS__)
/* What a close posted to a loop freed off its thread holds is never let go: the contract's cost, not a leak to report. */
static void posted_close_never_runs(struct perch_conn *c)
{
	__lsan_ignore_object(c);
}
#else
static void posted_close_never_runs(struct perch_conn *c)
{
	(void)c;
}
#endif

static void *run_only(void *arg)
{
	struct lu_loop *l = arg;
	l->run_rc = perch_loop_run(l->loop);
	return NULL;
}

/*
 * One buffer; H holds it and D parks for it. The loop stops, both are
 * released (their closes posted, never run), and the loop is freed off
 * its owner's thread: its backend finalizes D still parked, which must
 * leave the park list with its slot (a parked socket's link is its
 * slot's), and no buffer that comes back serves it.
 */
static void a_loop_freed_off_its_thread_with_a_connection_parked_lets_it_go(void **state)
{
	struct perch_loop_opts one = { .buf_count = 1, .buf_size = 4096 };
	struct lu_loop l = { 0 };
	assert_int_equal(perch_loop_new(&one, &l.loop), 0);
	assert_int_equal(pthread_create(&l.th, NULL, run_only, &l), 0);
	struct many_accepts k = { .n = 0 };
	struct perch_listener *ls;
	int h = hold_the_only_buffer(&l, &k, &ls);
	int d = lu_plain_connect_to(ls);
	assert_true(d >= 0 && wait_u32(&k.n, 2));
	assert_int_equal(write(d, "d", 1), 1);
	assert_true(wait_parks(&l, 1)); /* D waits for it */
	perch_loop_stop(l.loop);
	assert_int_equal(pthread_join(l.th, NULL), 0);
	assert_int_equal(l.run_rc, 0);
	for (int i = 0; i < 2; i++) {
		posted_close_never_runs(k.c[i]);
		perch_conn_release(k.c[i]);
	}
	assert_int_equal(perch_listener_close(ls), 0);
	perch_loop_free(l.loop);
	close(h);
	close(d);
}

/* A reader parked on the loop thread that closes its conn when the first bytes arrive. */
struct closing_reader {
	struct perch_recv_listener rl;
	struct perch_conn *c;
	uint32_t ready;
	sem_t go, held, closed;
};

static uint64_t closing_reader_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	return 0;
}

static void closing_reader_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	struct closing_reader *k = (struct closing_reader *)l;
	if (perch__faa_u32(&k->ready, 1) == 0) {
		perch_conn_close(c); /* on the loop thread: the rest of this batch comes after it */
		sem_post(&k->closed);
	}
}

static void closing_reader_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct closing_reader *k = arg;
	struct perch_read_result r;
	k->c = c;
	k->rl.on_parking = closing_reader_parking;
	k->rl.on_recv_ready = closing_reader_ready;
	int rc = perch_conn_try_read_or_park(c, &k->rl, &r);
	if (rc != PERCH_PENDING)
		abort();
	sem_post(&k->go);
}

static void block_loop(void *p)
{
	struct closing_reader *k = p;
	sem_post(&k->held);
	lu_sem_wait(&k->go, LU_TIMEOUT_MS);
}

/*
 * Bytes and FIN arrive together while the loop thread is held; the reader
 * woken by the bytes closes the conn on the loop thread. The FIN's CQE,
 * in the same batch, comes after the close: it must not reach the closed
 * conn (a later read sees "closed" only, never "completed" too).
 */
static void fin_arriving_after_a_local_close_is_not_delivered(void **state)
{
	struct lu_loop l;
	struct closing_reader k = { .ready = 0 };
	struct perch_listener *ls;
	sem_init(&k.go, 0, 0);
	sem_init(&k.held, 0, 0);
	sem_init(&k.closed, 0, 0);
	assert_int_equal(lu_start(&l, NULL), 0);
	assert_int_equal(test_listen(l.loop, NULL, closing_reader_accept, &k, &ls), 0);
	int fd = lu_plain_connect_to(ls);
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&k.go, LU_TIMEOUT_MS), 0); /* accepted and parked */
	assert_int_equal(perch_loop_post(l.loop, block_loop, &k), 0);
	assert_int_equal(lu_sem_wait(&k.held, LU_TIMEOUT_MS), 0); /* the loop thread is held */
	assert_int_equal(write(fd, "abc", 3), 3);
	shutdown(fd, SHUT_WR);
	sem_post(&k.go); /* the loop runs again: bytes and FIN in one batch */
	assert_int_equal(lu_sem_wait(&k.closed, LU_TIMEOUT_MS), 0);
	/* Once the loop has finished with the conn (only our reference left), read it. */
	for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&k.c->refs) != 1; i++)
		usleep(1000);
	assert_int_equal(perch__load_u32(&k.c->refs), 1);
	struct perch_read_result r;
	assert_int_equal(perch_conn_try_read(k.c, &r), 0);
	assert_true(r.closed);
	assert_false(r.completed);
	assert_int_equal(r.error, 0);
	perch_conn_release(k.c);
	close(fd);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.go);
	sem_destroy(&k.held);
	sem_destroy(&k.closed);
}

/* A plain reader on its own thread: reads until `len` bytes or EOF, slowly if asked. */
struct slow_reader {
	int fd;
	uint8_t *in;
	size_t len;
	uint64_t got;
	int pause_us;
	pthread_t th;
};

static void *slow_reader_main(void *p)
{
	struct slow_reader *r = p;
	while (r->got < r->len) {
		size_t want = r->len - r->got < 65536 ? r->len - r->got : 65536;
		ssize_t n = read(r->fd, r->in + r->got, want);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		perch__store_u64(&r->got, r->got + (uint64_t)n);
		if (r->pause_us)
			usleep((useconds_t)r->pause_us);
	}
	return NULL;
}

/* A perch conn connected to a plain accepted socket; 8 MiB staged as 2048 x 4 KiB buffers. */
struct big_send {
	struct lu_loop l;
	int lfd;
	struct perch_conn *c;
	struct slow_reader r;
	uint8_t *out;
	struct counted_flush f;
	uint32_t releases;            /* a referenced write's (BIG_REF, BIG_ZC, BIG_ZC_ALL) */
	bool released_on_loop;
	uint64_t zc_owed_at_release;  /* zero-copy notifications the loop still awaited then */
};

/*
 * write_size BIG_REF: the BIG_N bytes are one referenced write, the
 * caller's memory sent in place; BIG_ZC (BIG_ZC_ALL): the same on a connection whose
 * zerocopy_min lets it go zero-copy (io_uring, where the kernel has it).
 */
enum { BIG_N = 8 * 1024 * 1024, BIG_W = 4096, BIG_REF = 0, BIG_ZC = 1, BIG_ZC_ALL = 2 };

/* A referenced write sent zero-copy where the loop can. */
static bool big_zerocopy(size_t write_size)
{
	return write_size == BIG_ZC || write_size == BIG_ZC_ALL;
}

static void big_send_released(void *arg, const void *data, size_t len)
{
	struct big_send *b = arg;
	b->released_on_loop = pthread_equal(pthread_self(), b->l.th) && data == b->out && len == BIG_N;
	b->zc_owed_at_release = b->l.loop->stats.zerocopy_sends - b->l.loop->stats.zerocopy_notifs;
	perch__faa_u32(&b->releases, 1);
}

/* Whether this loop tries zero-copy sends: io_uring on a kernel that has them. */
static bool tries_zerocopy(struct lu_loop *l)
{
	return strcmp(perch_loop_backend_name(l->loop), "io_uring") == 0 && lu_stats(l).zerocopy_available;
}

/* Whether they go: on a Unix socket the kernel refuses the first, and the socket sends plain after. */
static bool sends_zerocopy(struct lu_loop *l)
{
#ifdef LU_UNIX
	return false;
#else
	return tries_zerocopy(l);
#endif
}

/*
 * A BIG_ZC (BIG_ZC_ALL) send went zero-copy where the loop can (else plain), and its
 * release waited for every notification; any other sent nothing zero-copy.
 */
static void big_send_zerocopy_checked(struct big_send *b, size_t write_size)
{
	struct perch_loop_stats st = lu_stats(&b->l);
	print_message("%s: %llu zero-copy sends, %llu notifications\n", perch_loop_backend_name(b->l.loop),
		      (unsigned long long)st.zerocopy_sends, (unsigned long long)st.zerocopy_notifs);
	if (write_size == BIG_ZC && sends_zerocopy(&b->l)) {
		assert_int_equal(st.zerocopy_sends, 1); /* the resumed sends are shorter than zerocopy_min: plain */
	} else if (big_zerocopy(write_size) && sends_zerocopy(&b->l)) {
		assert_true(st.zerocopy_sends > 0);
	} else if (big_zerocopy(write_size) && tries_zerocopy(&b->l)) {
		assert_int_equal(st.zerocopy_sends, 1); /* refused once, then plain */
		assert_int_equal(st.zerocopy_refused, 1);
	} else {
		assert_int_equal(st.zerocopy_sends, 0);
	}
	assert_int_equal(b->zc_owed_at_release, 0);
	assert_int_equal(st.zerocopy_notifs, st.zerocopy_sends); /* a refused one's too (kernel 6.18) */
}

/* A referenced write's memory was released once, on the loop's thread, by now or within the timeout. */
static void big_send_released_once(struct big_send *b)
{
	for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&b->releases) == 0; i++)
		usleep(1000);
	assert_int_equal(perch__load_u32(&b->releases), 1);
	assert_true(b->released_on_loop);
}

/* BIG_N bytes staged in writes of `write_size` (each write its own staging buffer), not yet flushed. */
static void big_send_open(struct big_send *b, size_t write_size)
{
	memset(b, 0, sizeof(*b));
	assert_int_equal(lu_start(&b->l, NULL), 0);
	b->lfd = plain_listener(1);
	/*
	 * BIG_ZC: exactly the write's size, so its first send goes zero-copy
	 * and a resumed one (shorter) plain; BIG_ZC_ALL: every send but the
	 * last 64 KiB's.
	 */
	struct perch_conn_opts zc = { .zerocopy_min = BIG_N }, all = { .zerocopy_min = 64 * 1024 },
			       plain = { .zerocopy_min = PERCH_ZEROCOPY_OFF };
	b->c = test_connect_fd(&b->l, b->lfd, write_size == BIG_ZC ? &zc : write_size == BIG_ZC_ALL ? &all : &plain);
	assert_non_null(b->c);
	b->r.fd = accept(b->lfd, NULL, NULL);
	assert_true(b->r.fd >= 0);
	/* A send that stops short must fail the test, not hang it. */
	struct timeval tv = { LU_TIMEOUT_MS / 1000, 0 };
	setsockopt(b->r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	b->r.len = BIG_N;
	b->r.in = malloc(BIG_N);
	b->out = malloc(BIG_N);
	lu_fill(b->out, BIG_N);
	bool by_ref = write_size == BIG_REF || big_zerocopy(write_size);
	if (by_ref)
		assert_int_equal(perch_conn_write_ref(b->c, b->out, BIG_N, big_send_released, b), 0);
	for (size_t off = 0; !by_ref && off < BIG_N; off += write_size)
		assert_int_equal(perch_conn_write(b->c, b->out + off, write_size), 0);
	b->f.fl.on_parking = counted_flush_parking;
	b->f.fl.on_flush_done = counted_flush_done;
	sem_init(&b->f.done, 0, 0);
}

static void big_send_close(struct big_send *b)
{
	perch_conn_release(b->c);
	if (b->r.fd >= 0)
		close(b->r.fd);
	close(b->lfd);
	assert_int_equal(lu_stop(&b->l), 0);
	sem_destroy(&b->f.done);
	free(b->r.in);
	free(b->out);
}

/* A reader slower than the sender: short sends, each resumed where it stopped; every byte, in order, one delivery. */
static void big_send_to_a_slow_reader(size_t write_size)
{
	struct big_send b;
	big_send_open(&b, write_size);
	b.r.pause_us = 1000;
	pthread_create(&b.r.th, NULL, slow_reader_main, &b.r);
	assert_int_equal(perch_conn_try_flush_or_park(b.c, &b.f.fl), PERCH_PENDING);
	assert_int_equal(lu_sem_wait(&b.f.done, 60000), 0);
	assert_int_equal(b.f.result, 0);
	pthread_join(b.r.th, NULL);
	assert_int_equal(b.r.got, BIG_N);
	assert_memory_equal(b.r.in, b.out, BIG_N);
	assert_int_equal(perch__load_u32(&b.f.deliveries), 1);
	if (write_size == BIG_REF || big_zerocopy(write_size)) {
		big_send_released_once(&b);
		big_send_zerocopy_checked(&b, write_size);
	}
	big_send_close(&b);
}

/* More than 64 iovecs: sendmsg, resumed mid-chain. */
static void flush_of_8mib_in_2048_buffers_to_a_slow_reader_arrives_whole_and_in_order(void **state)
{
	big_send_to_a_slow_reader(BIG_W);
}

/* One 8 MiB buffer: on io_uring a single-buffer send (IORING_OP_SEND), resubmitted from where it stopped. */
static void flush_of_8mib_in_one_buffer_reaches_a_slow_reader_whole_and_in_order(void **state)
{
	big_send_to_a_slow_reader(BIG_N);
}

/* The caller's 8 MiB, referenced: sent in place, whole and in order, released once on the loop's thread. */
static void a_referenced_8mib_write_reaches_a_slow_reader_whole_and_is_released_once(void **state)
{
	big_send_to_a_slow_reader(BIG_REF);
}

/*
 * Flushes b until the send is stuck (the kernel holds bytes for the reader
 * and they stop growing), then closes the conn: the flush gets -EPIPE
 * exactly once, and the cancelled send's completion returns its reference
 * (refs back to 1: send_done ran, the socket was finalized).
 */
static void big_send_stuck_then_closed(struct big_send *b)
{
	assert_int_equal(perch_conn_try_flush_or_park(b->c, &b->f.fl), PERCH_PENDING);
	int queued = 0, before = -1;
	for (int i = 0; i < LU_TIMEOUT_MS / 10 && (queued == 0 || queued != before); i++) {
		before = queued;
		usleep(10 * 1000);
		ioctl(b->r.fd, FIONREAD, &queued);
	}
	assert_true(queued > 0 && queued < BIG_N);
	perch_conn_close(b->c);
	assert_int_equal(lu_sem_wait(&b->f.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(b->f.result, -EPIPE);
	for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&b->c->refs) != 1; i++)
		usleep(1000);
	assert_int_equal(perch__load_u32(&b->c->refs), 1);
	/* send_done delivers before it drops the send's reference: any second delivery came by now. */
	assert_int_equal(perch__load_u32(&b->f.deliveries), 1);
}

/*
 * After the close of a stuck zero-copy send the connection answers its
 * peer as a closed one does: a write of the peer's gets a reset (not an
 * ACK from a socket kept open for the notification), the reset drops the
 * unsent bytes, and the memory is released, the peer still open.
 */
static void a_peer_writing_after_a_zerocopy_close_is_reset_and_the_memory_released(void **state)
{
	struct big_send b;
	big_send_open(&b, BIG_ZC_ALL);
	big_send_stuck_then_closed(&b);
	ssize_t w = send(b.r.fd, "hello", 5, MSG_NOSIGNAL); /* answered with a reset */
	int err = 0;
	for (int i = 0; i < LU_TIMEOUT_MS / 10 && err == 0; i++) {
		usleep(10 * 1000);
		if (send(b.r.fd, "hello", 5, MSG_NOSIGNAL) < 0)
			err = errno;
	}
	print_message("the peer's first write %zd, a later one failed with errno %d\n", w, err);
	assert_true(err == ECONNRESET || err == EPIPE);
	big_send_released_once(&b);
	big_send_zerocopy_checked(&b, BIG_ZC_ALL);
	big_send_close(&b);
}

/*
 * A chain holding a received segment a forward lent is never sent
 * zero-copy, not even its resumed sends past the segment: held for a
 * notification, the segment would stay out of its loop's receive pool.
 */
static void a_chain_with_a_forwarded_segment_is_sent_plain_to_the_end(void **state)
{
	struct big_send b;
	big_send_open(&b, BIG_ZC_ALL);
	int lfd2 = plain_listener(1);
	struct perch_conn *src = test_connect_fd(&b.l, lfd2, NULL);
	assert_non_null(src);
	int fd2 = accept(lfd2, NULL, NULL);
	assert_true(fd2 >= 0);
	char head[4096]; /* one segment, big enough for the forward to lend it (not copy it) */
	memset(head, 'f', sizeof(head));
	assert_int_equal(write(fd2, head, sizeof(head)), (ssize_t)sizeof(head));
	struct perch_read_result r;
	read_at_least(src, sizeof(head), &r);
	/* The staged chain: the 8 MiB reference, then the lent segment after it. */
	assert_int_equal(perch_conn_forward(src, sizeof(head), sizeof(head), b.c), 0);
	b.r.len = BIG_N + sizeof(head);
	b.r.in = realloc(b.r.in, b.r.len);
	b.r.pause_us = 1000;
	pthread_create(&b.r.th, NULL, slow_reader_main, &b.r);
	assert_int_equal(perch_conn_try_flush_or_park(b.c, &b.f.fl), PERCH_PENDING);
	assert_int_equal(lu_sem_wait(&b.f.done, 60000), 0);
	assert_int_equal(b.f.result, 0);
	pthread_join(b.r.th, NULL);
	assert_int_equal(b.r.got, BIG_N + sizeof(head));
	assert_memory_equal(b.r.in, b.out, BIG_N);
	assert_memory_equal(b.r.in + BIG_N, head, sizeof(head));
	big_send_released_once(&b);
	assert_int_equal(lu_stats(&b.l).zerocopy_sends, 0);
	perch_conn_release(src);
	close(fd2);
	close(lfd2);
	big_send_close(&b);
}

/*
 * perch_loop_stats: the loop's own counters on its thread (the ones the
 * loop keeps, field by field); from another thread while the loop runs,
 * -EEXIST; NULL, -EINVAL.
 */
static void loop_stats_are_read_on_the_loop_thread_only(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	struct perch_loop_stats pub = lu_stats(&l);
	loop_stats_t in = loop_stats(&l);
	assert_int_equal(pub.zerocopy_available, in.zerocopy_available);
	assert_int_equal(pub.enobufs_parks, in.enobufs_parks);
	assert_int_equal(pub.accept_errors, in.accept_errors);
	struct perch_loop_stats st;
	assert_int_equal(perch_loop_stats(l.loop, &st), -EEXIST);
	assert_int_equal(perch_loop_stats(NULL, &st), -EINVAL);
	assert_int_equal(perch_loop_stats(l.loop, NULL), -EINVAL);
	assert_int_equal(lu_stop(&l), 0);
}

/* The same, its first send zero-copy (SEND_ZC), the resumed ones plain: released once, after the notification. */
static void a_zerocopy_8mib_write_reaches_a_slow_reader_whole_and_is_released_after_its_notifications(void **state)
{
	big_send_to_a_slow_reader(BIG_ZC);
}

/*
 * Every resumed send zero-copy too: notifications of earlier sends come
 * while a later one is out, and the chain waits for all of them.
 */
static void a_write_sent_zero_copy_send_after_send_is_released_after_the_last_notification(void **state)
{
	big_send_to_a_slow_reader(BIG_ZC_ALL);
}

/*
 * The reader reads nothing: the send is stuck in the kernel when the conn
 * is closed. The flush gets -EPIPE exactly once, and the cancelled send's
 * completion still returns its reference (refs back to 1: send_done ran,
 * the socket was finalized).
 */
static void big_send_closed_while_stuck(size_t write_size)
{
	struct big_send b;
	big_send_open(&b, write_size);
	big_send_stuck_then_closed(&b);
	if (big_zerocopy(write_size)) {
		/*
		 * Delivered on this host, the bytes the peer has not read are the
		 * caller's pages still: the kernel lets go of them when the peer
		 * reads or closes, so the release waits for the peer's close.
		 */
		usleep(50 * 1000);
		if (sends_zerocopy(&b.l))
			assert_int_equal(perch__load_u32(&b.releases), 0);
		close(b.r.fd);
		b.r.fd = -1;
	}
	if (write_size == BIG_REF || big_zerocopy(write_size)) {
		big_send_released_once(&b);
		big_send_zerocopy_checked(&b, write_size);
	}
	big_send_close(&b);
}

static void close_during_a_stuck_send_fails_the_flush_once_and_returns_every_reference(void **state)
{
	big_send_closed_while_stuck(BIG_W);
}

/* A referenced write stuck in the kernel when the conn closes: the flush fails once, the memory is released once. */
static void close_during_a_stuck_referenced_send_releases_the_memory_once(void **state)
{
	big_send_closed_while_stuck(BIG_REF);
}

/* A zero-copy send stuck when the conn closes: the cancel ends it, the memory goes back after its notifications. */
static void close_during_a_stuck_zerocopy_send_releases_the_memory_after_its_notifications(void **state)
{
	big_send_closed_while_stuck(BIG_ZC_ALL); /* the stuck send is zero-copy: the close cancels it */
}

/*
 * The loop is freed while the peer has read none of a zero-copy write: no
 * notification can come once the ring is gone, so the free resets the
 * connection (the kernel drops the bytes it has not sent) and then
 * releases the memory, once, on the loop's thread. The caller may change
 * it then: the peer reads what it had, never a changed byte.
 */
static void a_loop_freed_before_the_kernel_let_go_of_a_zerocopy_write_releases_it_once(void **state)
{
	struct big_send b;
	big_send_open(&b, BIG_ZC_ALL);
	assert_int_equal(perch_conn_try_flush_or_park(b.c, &b.f.fl), PERCH_PENDING);
	int queued = 0;
	for (int i = 0; i < LU_TIMEOUT_MS && queued == 0; i++) {
		usleep(1000);
		ioctl(b.r.fd, FIONREAD, &queued);
	}
	assert_true(queued > 0);
	bool zc = sends_zerocopy(&b.l);
	perch_conn_release(b.c);
	assert_int_equal(lu_stop(&b.l), 0);
	if (zc)
		assert_true(b.zc_owed_at_release >= 1); /* the ring went with notifications owed */
	assert_int_equal(perch__load_u32(&b.releases), 1);
	assert_true(b.released_on_loop);
	uint8_t *want = malloc(BIG_N);
	memcpy(want, b.out, BIG_N);
	memset(b.out, 0xEE, BIG_N);
	slow_reader_main(&b.r); /* here, at full speed: to the end or the reset */
	print_message("the peer read %llu bytes after the free\n", (unsigned long long)b.r.got);
	assert_true(b.r.got < BIG_N); /* reset: not everything came */
	assert_memory_equal(b.r.in, want, b.r.got);
	free(want);
	close(b.r.fd);
	close(b.lfd);
	sem_destroy(&b.f.done);
	free(b.r.in);
	free(b.out);
}

/* The same with one 8 MiB buffer: the single-buffer send on io_uring. */
static void close_during_a_stuck_one_buffer_send_fails_the_flush_once(void **state)
{
	big_send_closed_while_stuck(BIG_N);
}

struct order {
	uint32_t next[2];
	uint32_t wrong;
	uint32_t ran;
};

struct order_item {
	struct order *o;
	uint32_t who, seq;
};

static void order_run(void *p)
{
	struct order_item *it = p;
	if (it->o->next[it->who] != it->seq)
		it->o->wrong++;
	it->o->next[it->who] = it->seq + 1;
	it->o->ran++;
}

struct poster {
	struct perch_loop *loop;
	struct order_item items[5000];
	pthread_t th;
};

static void *poster_main(void *p)
{
	struct poster *ps = p;
	for (int i = 0; i < 5000; i++)
		perch_loop_post(ps->loop, order_run, &ps->items[i]);
	return NULL;
}

static void posts_from_two_threads_run_once_each_in_posting_order(void **state)
{
	struct lu_loop l;
	struct order o = { 0 };
	static struct poster ps[2];
	assert_int_equal(lu_start(&l, NULL), 0);
	for (uint32_t t = 0; t < 2; t++) {
		ps[t].loop = l.loop;
		for (uint32_t i = 0; i < 5000; i++)
			ps[t].items[i] = (struct order_item){ &o, t, i };
		pthread_create(&ps[t].th, NULL, poster_main, &ps[t]);
	}
	pthread_join(ps[0].th, NULL);
	pthread_join(ps[1].th, NULL);
	struct live_probe lp = { l.loop, 0 };
	lu_on_loop(&l, read_live, &lp); /* after every post above */
	assert_int_equal(o.ran, 10000);
	assert_int_equal(o.wrong, 0);
	assert_int_equal(lu_stop(&l), 0);
}

static void connect_to_a_closed_port_reports_the_error_once(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	/* A port held by a plain socket that is bound and never listens: a connect is refused. */
	int port;
	int held = loopback_bound_socket(&port);
	struct lu_connect k = { .c = NULL };
	sem_init(&k.done, 0, 0);
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, NULL, lu_connected, &k), 0);
	assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
	assert_null(k.c);
	assert_int_equal(k.result, -ECONNREFUSED);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.done);
	close(held);
}

/* What the loop's table says of the sockets under conns: whether any has a connect's fields by its slot. */
struct slot_probe {
	struct perch_loop *loop;
	struct perch_conn **c;
	uint32_t n, live, first_slot, cap, with_fields;
};

static void probe_slots(void *arg)
{
	struct slot_probe *p = arg;
	p->live = p->loop->live;
	p->cap = p->loop->cap;
	p->with_fields = 0;
	for (uint32_t i = 0; i < p->n; i++)
		p->with_fields += perch__sock_cx(perch__conn_sock(p->c[i])) != NULL;
	if (p->n)
		p->first_slot = perch__conn_sock(p->c[0])->slot;
}

/*
 * A connect keeps its fields by its socket's slot, in an array the loop
 * makes at the first connect. A refused one's slot is taken next by an
 * accepted connection, and seventy more make the table (and the array)
 * grow: none of them may find a connect's fields by its slot.
 */
static void a_connects_slot_holds_nothing_for_the_sockets_after_it(void **state)
{
	enum { N = 70 };
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	struct many_accepts k = { .n = 0 };
	struct perch_listener *ls;
	assert_int_equal(test_listen(l.loop, NULL, many_accept, &k, &ls), 0);
	int port;
	int held = loopback_bound_socket(&port);
	struct lu_connect r = { .c = NULL };
	sem_init(&r.done, 0, 0);
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, NULL, lu_connected, &r), 0);
	assert_int_equal(lu_sem_wait(&r.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(r.result, -ECONNREFUSED);
	struct slot_probe p = { .loop = l.loop, .c = k.c };
	double deadline = lu_now_ms() + LU_TIMEOUT_MS;
	do /* the refused socket leaves the table once its close completes */
		assert_int_equal(lu_on_loop(&l, probe_slots, &p), 0);
	while (p.live > 1 && lu_now_ms() < deadline);
	assert_int_equal(p.live, 1);
	int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = lu_plain_connect_to(ls);
		assert_true(fds[i] >= 0 && wait_u32(&k.n, (uint32_t)i + 1));
	}
	p.n = N;
	assert_int_equal(lu_on_loop(&l, probe_slots, &p), 0);
	assert_int_equal(p.first_slot, 1); /* the refused connect's, the listener having 0 */
	assert_true(p.cap > 64);           /* the table grew past its first 64 slots */
	assert_int_equal(p.with_fields, 0);
	for (int i = 0; i < N; i++) {
		perch_conn_release(k.c[i]);
		close(fds[i]);
	}
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&r.done);
	close(held);
}

/* Whether the socket under a conn has TCP_NODELAY set; -1 when it cannot be read. */
static int conn_nodelay(struct perch_conn *c)
{
	struct perch__sock *s = c->transport;
	int v = -1;
	socklen_t len = sizeof(v);
	if (getsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &v, &len) != 0)
		return -1;
	return v != 0;
}

/* An accept and a connect whose callbacks record TCP_NODELAY: set before either runs, or a greeting could wait. */
struct nodelay_seen {
	struct perch_conn *in, *out;
	int in_nodelay, out_nodelay, result;
	sem_t accepted, connected;
};

static void nodelay_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct nodelay_seen *n = arg;
	n->in = c;
	n->in_nodelay = conn_nodelay(c);
	sem_post(&n->accepted);
}

static void nodelay_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct nodelay_seen *n = arg;
	n->out = c;
	n->result = result;
	n->out_nodelay = c ? conn_nodelay(c) : -1;
	sem_post(&n->connected);
}

/*
 * Requests and answers leave at once by default; a bulk stream may keep
 * Nagle's algorithm. Either way the option is in place when the accept
 * or connect callback runs, timed connects included.
 */
static void nagle_option_decides_tcp_nodelay_of_accepted_and_connected_conns(void **state)
{
	for (int i = 0; i < 4; i++) {
		bool nagle = i & 1;
		struct perch_conn_opts co = { .nagle = nagle, .connect_timeout_ms = i & 2 ? 5000 : 0 };
		struct lu_loop l;
		struct nodelay_seen n = { .in_nodelay = -1, .out_nodelay = -1 };
		struct perch_listener *ls;
		sem_init(&n.accepted, 0, 0);
		sem_init(&n.connected, 0, 0);
		assert_int_equal(lu_start(&l, NULL), 0);
		assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, &co, nodelay_accept, &n, &ls), 0);
		assert_int_equal(perch_connect(l.loop, "127.0.0.1", perch_listener_port(ls), &co,
					       nodelay_connected, &n), 0);
		assert_int_equal(lu_sem_wait(&n.connected, LU_TIMEOUT_MS), 0);
		assert_int_equal(lu_sem_wait(&n.accepted, LU_TIMEOUT_MS), 0);
		assert_int_equal(n.result, 0);
		assert_int_equal(n.in_nodelay, !nagle);
		assert_int_equal(n.out_nodelay, !nagle);
		perch_conn_release(n.out);
		perch_conn_release(n.in);
		assert_int_equal(lu_stop(&l), 0);
		sem_destroy(&n.accepted);
		sem_destroy(&n.connected);
	}
}

/* A connect's callbacks, counted: each must come once. */
struct timed_connect {
	struct perch_conn *c;
	int result;
	uint32_t calls;
	sem_t done;
};

static void timed_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct timed_connect *k = arg;
	k->c = c;
	k->result = result;
	perch__faa_u32(&k->calls, 1);
	sem_post(&k->done);
}

/*
 * A port that never answers a SYN: a listener with backlog 0 whose accept
 * queue holds one connection nobody accepts, so the kernel drops the next
 * SYN (and its retries, a second apart). Returns the listener; *queued is
 * the connection that fills it.
 */
static int unanswering_port(int *port, int *queued)
{
	int lfd = loopback_bound_socket(port);
	assert_int_equal(listen(lfd, 0), 0);
	*queued = lu_plain_connect(*port);
	assert_true(*queued >= 0);
	return lfd;
}

/* Waits until the process has `want` fds again: a timed-out socket's close may finish a turn later. */
static bool fds_back_to(int want)
{
	for (int i = 0; i < LU_TIMEOUT_MS && lu_count_fds() != want; i++)
		usleep(1000);
	return lu_count_fds() == want;
}

static void a_connect_that_gets_no_answer_times_out_once_and_its_socket_is_closed(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	int port, queued;
	int lfd = unanswering_port(&port, &queued);
	int fds = lu_count_fds();
	struct timed_connect k = { .result = 1 };
	sem_init(&k.done, 0, 0);
	struct perch_conn_opts o = { .connect_timeout_ms = 100 };
	double t0 = lu_now_ms();
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, &o, timed_connected, &k), 0);
	assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
	assert_true(lu_now_ms() - t0 >= 100); /* never before its time */
	assert_null(k.c);
	assert_int_equal(k.result, -ETIMEDOUT);
	assert_true(fds_back_to(fds));
	usleep(200 * 1000);
	assert_int_equal(perch__load_u32(&k.calls), 1);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(perch__load_u32(&k.calls), 1);
	sem_destroy(&k.done);
	close(queued);
	close(lfd);
}

/*
 * A connect with a long timeout, then one with a short one: the short one
 * times out first (the list is kept by deadline, not by arrival), and the
 * long one is still waiting then.
 */
static void a_shorter_connect_timeout_behind_a_longer_one_fires_first(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	int port, queued;
	int lfd = unanswering_port(&port, &queued);
	struct timed_connect slow = { .result = 1 }, fast = { .result = 1 };
	sem_init(&slow.done, 0, 0);
	sem_init(&fast.done, 0, 0);
	struct perch_conn_opts so = { .connect_timeout_ms = 3000 }, fo = { .connect_timeout_ms = 100 };
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, &so, timed_connected, &slow), 0);
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, &fo, timed_connected, &fast), 0);
	assert_int_equal(lu_sem_wait(&fast.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(fast.result, -ETIMEDOUT);
	assert_int_equal(perch__load_u32(&slow.calls), 0);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(slow.result, -ECANCELED);
	sem_destroy(&slow.done);
	sem_destroy(&fast.done);
	close(queued);
	close(lfd);
}

/* Answered at once: connected, and its timeout passing later neither calls again nor closes it. */
static void a_connect_answered_before_its_timeout_stays_connected_after_it(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	int port;
	int lfd = loopback_bound_socket(&port);
	assert_int_equal(listen(lfd, 4), 0);
	struct timed_connect k = { .result = 1 };
	sem_init(&k.done, 0, 0);
	/* Long enough that a loaded machine still answers first: the test is about what comes after. */
	struct perch_conn_opts o = { .connect_timeout_ms = 500 };
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, &o, timed_connected, &k), 0);
	assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(k.result, 0);
	assert_non_null(k.c);
	int peer = accept(lfd, NULL, NULL);
	assert_true(peer >= 0);
	usleep(700 * 1000); /* past the timeout */
	assert_int_equal(perch__load_u32(&k.calls), 1);
	assert_int_equal(perch_conn_write(k.c, "ok", 2), 0);
	assert_int_equal(lu_flush(k.c), 0);
	uint8_t got[2];
	assert_true(lu_read_all(peer, got, 2));
	assert_memory_equal(got, "ok", 2);
	perch_conn_close(k.c);
	perch_conn_release(k.c);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.done);
	close(peer);
	close(lfd);
}

/* A timed connect still waiting when the loop is freed gets -ECANCELED, not its timeout. */
static void a_timed_connect_waiting_when_the_loop_is_freed_is_canceled(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	int port, queued;
	int lfd = unanswering_port(&port, &queued);
	struct timed_connect k = { .result = 1 };
	sem_init(&k.done, 0, 0);
	struct perch_conn_opts o = { .connect_timeout_ms = PERCH_CONNECT_TIMEOUT_MAX_MS };
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, &o, timed_connected, &k), 0);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(perch__load_u32(&k.calls), 1);
	assert_int_equal(k.result, -ECANCELED);
	sem_destroy(&k.done);
	close(queued);
	close(lfd);
}

/* Posted to a loop that never ran and is then freed: the free's drain starts it, and must end it. */
static void a_connect_posted_to_a_loop_being_freed_is_canceled(void **state)
{
	int fds = lu_count_fds();
	struct perch_loop *loop;
	assert_int_equal(perch_loop_new(NULL, &loop), 0);
	struct timed_connect k = { .result = 1 };
	sem_init(&k.done, 0, 0);
	struct perch_conn_opts o = { .connect_timeout_ms = 1000 };
	assert_int_equal(perch_connect(loop, "127.0.0.1", 9, &o, timed_connected, &k), 0);
	perch_loop_free(loop);
	assert_int_equal(perch__load_u32(&k.calls), 1);
	assert_int_equal(k.result, -ECANCELED);
	assert_null(k.c);
	assert_int_equal(lu_count_fds(), fds);
	sem_destroy(&k.done);
}

static void a_connect_timeout_above_the_maximum_is_refused(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	struct timed_connect k = { .result = 1 };
	struct perch_conn_opts o = { .connect_timeout_ms = PERCH_CONNECT_TIMEOUT_MAX_MS + 1 };
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", 9, &o, timed_connected, &k), -EINVAL);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(k.calls, 0);
}

struct nested {
	struct perch_loop *loop;
	int rc;
};

static void run_once_inside(void *p)
{
	struct nested *n = p;
	n->rc = perch_loop_run_once(n->loop, 0);
}

static void run_once_from_inside_a_callback_is_refused_with_ebusy(void **state)
{
	struct lu_loop l;
	assert_int_equal(lu_start(&l, NULL), 0);
	struct nested n = { l.loop, 0 };
	assert_int_equal(lu_on_loop(&l, run_once_inside, &n), 0);
	assert_int_equal(n.rc, -EBUSY);
	assert_int_equal(lu_stop(&l), 0);
}

static void *run_once_on_this_thread(void *p)
{
	struct nested *n = p;
	n->rc = perch_loop_run_once(n->loop, 0);
	return NULL;
}

/* The thread that first ran the loop owns it; a second thread, or a fork child of the owner, is refused. */
/* A child process made `how`: its run_once on the parent's loop must be refused (-EEXIST). */
enum child_kind { BY_FORK, BY_UNDERSCORE_FORK, BY_FORK_SYSCALL, BY_CLONE };

static struct perch_loop *child_loop;

static int child_runs_the_parents_loop(void *unused)
{
	return perch_loop_run_once(child_loop, 0) == -EEXIST ? 0 : 1;
}

static pid_t make_child(enum child_kind how)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	pid_t pid;
	switch (how) {
	case BY_FORK: pid = fork(); break;
	case BY_UNDERSCORE_FORK: pid = _Fork(); break;   /* runs no atfork handler */
	case BY_FORK_SYSCALL: pid = (pid_t)syscall(SYS_fork); break;
	default:
		return clone(child_runs_the_parents_loop, stack + sizeof(stack), SIGCHLD, NULL);
	}
	if (pid == 0)
		_exit(child_runs_the_parents_loop(NULL));
	return pid;
}

static void run_once_off_the_owning_thread_is_refused_with_eexist(void **state)
{
	struct perch_loop *loop;
	assert_int_equal(perch_loop_new(NULL, &loop), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	struct nested n = { loop, 0 };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, run_once_on_this_thread, &n), 0);
	pthread_join(th, NULL);
	assert_int_equal(n.rc, -EEXIST);
	/* A child inherits the owner's thread-local id cache, not its identity, however it was made. */
	child_loop = loop;
	for (enum child_kind how = BY_FORK; how <= BY_CLONE; how++) {
		pid_t pid = make_child(how);
		assert_true(pid > 0);
		int status;
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	perch_loop_free(loop);
}

static void noop_accept(struct perch_listener *l, struct perch_conn *c, void *arg) {}
static void noop_connected(struct perch_loop *loop, struct perch_conn *c, int r, void *arg) {}
static void noop_fn(void *arg) {}

/* ---- forwarding: received buffers lent to another connection's send ---- */

struct fd_reader {
	int fd;
	uint8_t *p;
	size_t n;
	bool ok;
	pthread_t th;
};

static void *fd_reader_main(void *arg)
{
	struct fd_reader *r = arg;
	r->ok = lu_read_all(r->fd, r->p, r->n);
	return NULL;
}

/* Reads what `c` has (waiting when nothing is new); the result stays for the caller to advance. */
static size_t read_some(struct perch_conn *c)
{
	struct perch_read_result r;
	struct perch_vtask_handle h;
	int64_t v;
	int rc;
	while ((rc = perch_conn_read(c, &r, &h)) == PERCH_PENDING) {
		assert_int_equal(perch_vtask_wait(h, LU_TIMEOUT_MS, &v), 0);
		if ((rc = perch_conn_try_read(c, &r)) != -EAGAIN)
			break;
	}
	assert_int_equal(rc, 0);
	return r.len;
}

/*
 * A proxy across two loops, read and written from the test thread: 4 MiB
 * from a client on one loop's connection, forwarded to an upstream on the
 * other's. Each lent buffer comes back from the other loop's send, and the
 * source is released before the last flush: what it lent outlives it.
 */
static void forwarded_bytes_cross_loops_and_outlive_their_connection(void **state)
{
	struct stream src, dst;
	size_t n = 4u << 20;
	stream_open(&src, n, NULL, 0, 0);
	stream_open(&dst, n, NULL, 0, 0);
	struct fd_reader up = { .fd = dst.w.fd, .p = dst.in, .n = n };
	pthread_create(&up.th, NULL, fd_reader_main, &up);
	stream_write(&src);
	size_t moved = 0;
	while (moved < n) {
		size_t got = read_some(src.k.c);
		assert_true(got > 0 && moved + got <= n);
		assert_int_equal(perch_conn_forward(src.k.c, got, got, dst.k.c), 0);
		moved += got;
		if (moved == n) {
			perch_conn_release(src.k.c);
			src.k.c = NULL;
		}
		assert_int_equal(lu_flush(dst.k.c), 0);
	}
	pthread_join(up.th, NULL);
	assert_true(up.ok);
	assert_memory_equal(dst.in, src.out, n);
	stream_join(&src);
	stream_close(&src);
	stream_close(&dst);
}

/* ---- half-close: the write side ends, reading goes on ---- */

struct shut_call {
	struct perch_conn *c;
	int rc;
};

static void shut_on_loop(void *arg)
{
	struct shut_call *k = arg;
	k->rc = perch_conn_shutdown(k->c);
}

/*
 * The peer reads every flushed byte, then end-of-stream, and can still
 * write: its bytes and its own end reach the reader. `on_loop`: the
 * shutdown is made on the loop thread (at once); else from the test
 * thread (posted to the loop).
 */
static void shutdown_then_read_both_ways(bool on_loop)
{
	enum { R = 32 * 1024 };
	struct stream st;
	stream_open(&st, 256 * 1024, NULL, 0, 0);
	uint8_t *reply = malloc(R), *got = malloc(R), byte;
	lu_fill(reply, R);
	assert_int_equal(perch_conn_write(st.k.c, reply, R), 0);
	assert_int_equal(lu_flush(st.k.c), 0);
	struct shut_call k = { .c = st.k.c, .rc = 1 };
	if (on_loop)
		assert_int_equal(lu_on_loop(&st.l, shut_on_loop, &k), 0);
	else
		shut_on_loop(&k);
	assert_int_equal(k.rc, 0);
	assert_int_equal(perch_conn_write(st.k.c, "x", 1), -EPIPE);
	struct timeval tv = { .tv_sec = LU_TIMEOUT_MS / 1000 };
	assert_int_equal(setsockopt(st.w.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	assert_true(lu_read_all(st.w.fd, got, R));
	assert_memory_equal(got, reply, R);
	assert_int_equal(lu_read_once(st.w.fd, &byte, 1), 0); /* the end, after the last byte */
	stream_write(&st);
	assert_true(stream_read_all(&st).completed);
	stream_close(&st);
	free(reply);
	free(got);
}

static void shutdown_from_another_thread_sends_the_end_after_the_flushed_bytes(void **state)
{
	shutdown_then_read_both_ways(false);
}

static void shutdown_on_the_loop_thread_sends_the_end_after_the_flushed_bytes(void **state)
{
	shutdown_then_read_both_ways(true);
}

/* ---- abort: the peer sees its stream fail ---- */

static void abort_on_loop(void *arg)
{
	struct shut_call *k = arg;
	k->rc = perch_conn_abort(k->c);
}

/*
 * What the peer reads after the connection ends, bytes it was sent still
 * unread: ECONNRESET after an abort, the bytes then the end after a close.
 * `on_loop` as for the shutdown.
 */
static void peer_reads_after_the_end(bool abort, bool on_loop)
{
	struct stream st;
	stream_open(&st, 1, NULL, 0, 0);
	assert_int_equal(perch_conn_write(st.k.c, "unread", 6), 0);
	assert_int_equal(lu_flush(st.k.c), 0);
	struct shut_call k = { .c = st.k.c, .rc = 1 };
	if (!abort)
		k.rc = perch_conn_close(st.k.c);
	else if (on_loop)
		assert_int_equal(lu_on_loop(&st.l, abort_on_loop, &k), 0);
	else
		abort_on_loop(&k);
	assert_int_equal(k.rc, 0);
	struct timeval tv = { .tv_sec = LU_TIMEOUT_MS / 1000 };
	assert_int_equal(setsockopt(st.w.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	char got[8];
	ssize_t r;
	if (!abort)
		assert_true(lu_read_all(st.w.fd, (uint8_t *)got, 6));
	/* After an abort what arrived before the reset may be read or dropped. */
	while ((r = lu_read_once(st.w.fd, got, sizeof(got))) > 0)
		assert_true(abort);
	if (abort) {
		assert_int_equal(r, -1);
		assert_int_equal(errno, ECONNRESET);
	} else {
		assert_int_equal(r, 0);
	}
	stream_close(&st);
}

static void abort_from_another_thread_resets_the_peer(void **state)
{
	peer_reads_after_the_end(true, false);
}

static void abort_on_the_loop_thread_resets_the_peer(void **state)
{
	peer_reads_after_the_end(true, true);
}

static void close_ends_the_peers_stream_after_its_bytes(void **state)
{
	peer_reads_after_the_end(false, false);
}

/* ---- accepting when fds run out ---- */

#define ACCEPTED_MAX 8

struct acceptor {
	struct perch_conn *c[ACCEPTED_MAX];
	uint32_t n;
};

static void count_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	struct acceptor *a = arg;
	uint32_t i = perch__load_u32(&a->n);
	if (i < ACCEPTED_MAX)
		a->c[i] = c;
	else
		perch_conn_release(c);
	perch__store_u32(&a->n, i + 1);
}

/* The test lowers RLIMIT_NOFILE; whatever happens, the next test gets it back. */
static struct rlimit saved_nofile;

static int restore_nofile(void **state)
{
	setrlimit(RLIMIT_NOFILE, &saved_nofile);
	return 0;
}

/* Lowers RLIMIT_NOFILE so that exactly `free` more fd numbers can be opened (saved_nofile keeps the old). */
static void leave_fds_free(int free)
{
	int lowest_free = dup(0);
	assert_true(lowest_free >= 0);
	close(lowest_free);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved_nofile), 0);
	struct rlimit low = { (rlim_t)(lowest_free + free), saved_nofile.rlim_max };
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
}

/*
 * Two turns of the loop: the first runs a posted listen (its accept is
 * prepared), the second starts after that turn's submit. io_uring takes an
 * fd when it submits an accept (and reads the limit then): not while the
 * test lowers the limit and takes the last fd.
 */
static void settle(struct lu_loop *l)
{
	loop_stats(l);
	loop_stats(l);
}

struct pin {
	struct perch_loop *loop;
	bool pinned;
};

/* Pins a paused listener's retry time far away, so that only a socket's close can resume it. */
static void pin_retry(void *arg)
{
	struct pin *p = arg;
	p->pinned = p->loop->accept_paused != NULL;
	if (p->pinned)
		perch__timer_arm_at(&p->loop->accept_retry, 1e18, PERCH__ACCEPT_RETRY_MS);
}

static void no_retry(struct lu_loop *l)
{
	struct pin p = { .loop = l->loop };
	for (int i = 0; i < LU_TIMEOUT_MS && !p.pinned; i++) /* not between a retry and its failure */
		assert_int_equal(lu_on_loop(l, pin_retry, &p), 0);
	assert_true(p.pinned);
}

static loop_stats_t wait_for_a_pause(struct lu_loop *l)
{
	loop_stats_t st = loop_stats(l);
	for (int i = 0; i < LU_TIMEOUT_MS && st.accept_pauses == 0; i++) {
		usleep(1000);
		st = loop_stats(l);
	}
	assert_true(st.accept_pauses >= 1);
	return st;
}

/*
 * Out of fds, a listener's accept fails with EMFILE until one is freed.
 * Retrying at once would spin (a multishot accept re-armed every
 * completion, a level-triggered listener every turn): the listener pauses
 * instead, and resumes when a socket of the loop closes, or to try again
 * every PERCH__ACCEPT_RETRY_MS. No client is lost: each is accepted once an
 * fd is there. (io_uring reads the limit when an accept is submitted, so
 * the listener is made after the limit is lowered: its socket takes the
 * last free fd.)
 */
static void accepting_pauses_when_fds_run_out_and_resumes_when_one_is_freed(void **state)
{
	enum { CLIENTS = 4 };
	struct lu_loop l;
	struct acceptor a = { .n = 0 };
	struct perch_listener *spare, *ls;
	int fds[CLIENTS];
	assert_int_equal(lu_start(&l, NULL), 0);
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, count_accept, &a, &spare), 0);
	settle(&l);
	for (int i = 0; i < CLIENTS; i++)
		assert_true((fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	leave_fds_free(1);
	assert_int_equal(test_listen(l.loop, NULL, count_accept, &a, &ls), 0);
	for (int i = 0; i < CLIENTS; i++)
		assert_int_equal(lu_connect_fd(fds[i], perch_listener_port(ls)), 0); /* the backlog takes them */
	loop_stats_t st = wait_for_a_pause(&l);
	/* Paused, not spinning: in 300 ms a retry per 100 ms, 3 or 4 (a spin makes thousands). */
	usleep(300 * 1000);
	loop_stats_t later = loop_stats(&l);
	assert_in_range(later.accept_errors - st.accept_errors, 0, 10);
	assert_int_equal(perch__load_u32(&a.n), 0);
	/* A socket of the loop closes: its fd is free, and one waiting client gets it (no retry timer). */
	no_retry(&l);
	perch_listener_close(spare);
	assert_true(wait_u32(&a.n, 1));
	/* Fds back: every client is accepted. */
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved_nofile), 0);
	assert_true(wait_u32(&a.n, CLIENTS));
	for (uint32_t i = 0; i < a.n; i++)
		perch_conn_release(a.c[i]);
	for (int i = 0; i < CLIENTS; i++)
		close(fds[i]);
	perch_listener_close(ls);
	assert_int_equal(lu_stop(&l), 0);
}

/*
 * A paused listener can be closed: the resumes after it (the retry time, a
 * socket's close) leave it alone and nothing is accepted on it. Its memory
 * goes with its close, after the paused list was emptied (./dev san runs
 * this under ASan).
 */
static void a_listener_closed_while_paused_is_forgotten(void **state)
{
	struct lu_loop l;
	struct acceptor a = { .n = 0 };
	struct perch_listener *ls, *other;
	assert_int_equal(lu_start(&l, NULL), 0);
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, count_accept, &a, &other), 0);
	settle(&l);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	leave_fds_free(1);
	assert_int_equal(test_listen(l.loop, NULL, count_accept, &a, &ls), 0);
	assert_int_equal(lu_connect_fd(fd, perch_listener_port(ls)), 0);
	wait_for_a_pause(&l);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved_nofile), 0);
	perch_listener_close(ls);
	/* The retry time passes and the other listener's socket closes: resumes that skip the closed one. */
	usleep(2 * PERCH__ACCEPT_RETRY_MS * 1000);
	perch_listener_close(other);
	usleep(2 * PERCH__ACCEPT_RETRY_MS * 1000);
	assert_int_equal(perch__load_u32(&a.n), 0);
	close(fd);
	assert_int_equal(lu_stop(&l), 0);
}

static void bad_arguments_return_einval(void **state)
{
	struct perch_loop *loop;
	struct perch_listener *ls;
	assert_int_equal(perch_loop_new(NULL, NULL), -EINVAL);
	struct perch_loop_opts not_pow2 = { .buf_count = 3 };
	assert_int_equal(perch_loop_new(&not_pow2, &loop), -EINVAL);
	struct perch_loop_opts huge_buf = { .buf_size = 2u << 20 };
	assert_int_equal(perch_loop_new(&huge_buf, &loop), -EINVAL);
	assert_int_equal(perch_loop_run(NULL), -EINVAL);
	assert_int_equal(perch_loop_run_once(NULL, 0), -EINVAL);
	assert_int_equal(perch_loop_stop(NULL), -EINVAL);
	assert_int_equal(perch_loop_post(NULL, noop_fn, NULL), -EINVAL);
	perch_loop_free(NULL);
	assert_int_equal(perch_listener_port(NULL), -EINVAL);
	assert_int_equal(perch_listener_close(NULL), -EINVAL);

	assert_int_equal(perch_loop_new(NULL, &loop), 0);
	assert_int_equal(perch_loop_post(loop, NULL, NULL), -EINVAL);
	assert_int_equal(perch_listen(loop, NULL, 0, NULL, noop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen(loop, "localhost", 0, NULL, noop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen(loop, "127.0.0.1", 65536, NULL, noop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen(loop, "127.0.0.1", -1, NULL, noop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, NULL, NULL, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, NULL, noop_accept, NULL, NULL), -EINVAL);
	struct perch_conn_opts inverted = { .pause_bytes = 1000, .resume_bytes = 1000 };
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, &inverted, noop_accept, NULL, &ls), -EINVAL);
	struct perch_conn_opts bad_mode = { .recv_mode = 7 };
	assert_int_equal(perch_connect(loop, "127.0.0.1", 80, &bad_mode, noop_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect(NULL, "127.0.0.1", 80, NULL, noop_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect(loop, "127.0.0.1", 0, NULL, noop_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect(loop, "::1", 80, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(perch_connect(loop, "not-an-address", 80, NULL, noop_connected, NULL), -EINVAL);
	perch_loop_free(loop);
}

/* Makes io_uring_setup fail with EPERM in this process, as a seccomp profile would. Before any thread. */
static int refuse_io_uring(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = 4, .filter = f };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
		return -errno;
	return 0;
}

/* Runs fn in a child whose stderr goes to `buf`; returns the child's exit status. */
static int in_child_capturing_stderr(int (*fn)(void), char *buf, size_t cap)
{
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(pipefd[1], 2);
		_exit(fn());
	}
	close(pipefd[1]);
	memset(buf, 0, cap);
	size_t got = 0;
	ssize_t r;
	while (got < cap - 1 && (r = read(pipefd[0], buf + got, cap - 1 - got)) > 0)
		got += (size_t)r;
	close(pipefd[0]);
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* Asked for explicitly, a refused io_uring fails perch_loop_new, with one line naming the cause. */
static int new_uring_loop_under_seccomp(void)
{
	struct perch_loop_opts uring = { .backend = PERCH_BACKEND_URING };
	struct perch_loop *loop = NULL;
	if (refuse_io_uring() != 0)
		return 3;
	return perch_loop_new(&uring, &loop) == -EPERM && loop == NULL ? 0 : 1;
}

static void io_uring_refused_fails_an_explicit_uring_loop_with_one_clear_line(void **state)
{
	char buf[512];
	assert_int_equal(in_child_capturing_stderr(new_uring_loop_under_seccomp, buf, sizeof(buf)), 0);
	assert_non_null(strstr(buf, "perch: io_uring refused: io_uring_queue_init: not permitted"));
	assert_null(strstr(buf, "using epoll"));
	assert_int_equal(count_lines(buf), 1);
}

/* The default backend with io_uring refused: epoll, and one line saying why. */
static int new_default_loop_under_seccomp(void)
{
	struct perch_loop *loop = NULL;
	unsetenv("PERCH_BACKEND");
	if (refuse_io_uring() != 0)
		return 3;
	if (perch_loop_new(NULL, &loop) != 0)
		return 1;
	int rc = strcmp(perch_loop_backend_name(loop), "epoll") == 0 ? 0 : 2;
	perch_loop_free(loop);
	return rc;
}

static void io_uring_refused_falls_back_to_epoll_with_one_clear_line(void **state)
{
	char buf[512];
	assert_int_equal(in_child_capturing_stderr(new_default_loop_under_seccomp, buf, sizeof(buf)), 0);
	assert_non_null(strstr(buf, "perch: io_uring refused: io_uring_queue_init: not permitted"));
	assert_non_null(strstr(buf, "; using epoll"));
	assert_int_equal(count_lines(buf), 1);
}

static void backend_option_and_environment_pick_the_backend(void **state)
{
	struct perch_loop *loop;
	const char *env = getenv("PERCH_BACKEND");
	struct perch_loop_opts epoll = { .backend = PERCH_BACKEND_EPOLL };
	assert_int_equal(perch_loop_new(&epoll, &loop), 0);
	assert_string_equal(perch_loop_backend_name(loop), "epoll");
	perch_loop_free(loop);
	/* The environment decides the default only (unset here when io_uring is refused: epoll). */
	assert_int_equal(perch_loop_new(NULL, &loop), 0);
	assert_string_equal(perch_loop_backend_name(loop),
			    env && strcmp(env, "uring") == 0 ? "io_uring" : "epoll");
	perch_loop_free(loop);
	struct perch_loop_opts bad = { .backend = 9 };
	assert_int_equal(perch_loop_new(&bad, &loop), -EINVAL);
	assert_null(perch_loop_backend_name(NULL));
	setenv("PERCH_BACKEND", "kqueue", 1);
	assert_int_equal(perch_loop_new(NULL, &loop), -EINVAL);
	assert_int_equal(perch_loop_new(&epoll, &loop), 0); /* an explicit choice ignores it */
	perch_loop_free(loop);
	if (env)
		setenv("PERCH_BACKEND", env, 1);
	else
		unsetenv("PERCH_BACKEND");
}

/*
 * Built three times (Makefile.am): LU_BACKEND "uring" and "epoll" run
 * every test on that backend (through PERCH_BACKEND, which the default
 * option follows); LU_NO_URING refuses io_uring in the whole process
 * (seccomp) and runs them all on what the default falls back to.
 */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(echo_reads_and_flushes_on_the_loop_thread_and_from_a_second_thread),
		cmocka_unit_test(echo_with_singleshot_recv),
		cmocka_unit_test(ten_thousand_connections_open_and_close_without_leaking_fds),
		cmocka_unit_test(connects_beyond_the_submission_queue_all_complete),
		cmocka_unit_test(burst_of_2mib_then_fin_is_read_completely_before_eof),
		cmocka_unit_test(stalled_reader_pauses_multishot_recv_and_resuming_delivers_everything_in_order),
		cmocka_unit_test(stalled_reader_pauses_singleshot_recv_and_resuming_delivers_everything_in_order),
		cmocka_unit_test(a_paused_multishot_recv_takes_no_more_bytes_until_consumed),
		cmocka_unit_test(a_paused_singleshot_recv_takes_no_more_bytes_until_consumed),
		cmocka_unit_test(a_quiet_connection_reuses_a_few_warm_buffers_not_the_whole_ring),
		cmocka_unit_test(a_waiting_short_tail_leaves_its_receive_buffer_and_reads_on_whole),
		cmocka_unit_test(a_close_with_nothing_in_flight_closes_the_fd_at_once),
		cmocka_unit_test(a_connection_waiting_for_a_receive_buffer_still_hears_its_peer_end),
		cmocka_unit_test(a_peer_sending_a_few_bytes_a_segment_holds_a_bounded_number_of_buffers),
		cmocka_unit_test(a_receive_with_bytes_waiting_stops_at_the_pause),
		cmocka_unit_test(a_pause_above_2_gib_keeps_one_multishot_receiving),
		cmocka_unit_test(a_quiet_loop_gives_back_the_pages_of_the_buffers_a_burst_used),
		cmocka_unit_test(a_connection_waiting_for_a_buffer_receives_more_than_its_pause_part_by_part),
		cmocka_unit_test(a_closed_listener_stops_listening_without_the_loops_free),
		cmocka_unit_test(a_burst_holding_more_buffers_than_the_ring_has_grows_it),
		cmocka_unit_test(a_ring_grown_by_a_burst_shrinks_back_once_quiet),
		cmocka_unit_test(parked_connection_is_served_when_the_one_before_it_only_gets_a_fin),
		cmocka_unit_test(parked_connection_is_served_when_the_one_before_it_stays_idle),
		cmocka_unit_test(a_loop_freed_off_its_thread_with_a_connection_parked_lets_it_go),
		cmocka_unit_test(fin_arriving_after_a_local_close_is_not_delivered),
		cmocka_unit_test(flush_of_8mib_in_2048_buffers_to_a_slow_reader_arrives_whole_and_in_order),
		cmocka_unit_test(close_during_a_stuck_send_fails_the_flush_once_and_returns_every_reference),
		cmocka_unit_test(a_referenced_8mib_write_reaches_a_slow_reader_whole_and_is_released_once),
		cmocka_unit_test(close_during_a_stuck_referenced_send_releases_the_memory_once),
		cmocka_unit_test(loop_stats_are_read_on_the_loop_thread_only),
		cmocka_unit_test(a_peer_writing_after_a_zerocopy_close_is_reset_and_the_memory_released),
		cmocka_unit_test(a_chain_with_a_forwarded_segment_is_sent_plain_to_the_end),
		cmocka_unit_test(a_zerocopy_8mib_write_reaches_a_slow_reader_whole_and_is_released_after_its_notifications),
		cmocka_unit_test(a_write_sent_zero_copy_send_after_send_is_released_after_the_last_notification),
		cmocka_unit_test(close_during_a_stuck_zerocopy_send_releases_the_memory_after_its_notifications),
		cmocka_unit_test(a_loop_freed_before_the_kernel_let_go_of_a_zerocopy_write_releases_it_once),
		cmocka_unit_test(flush_of_8mib_in_one_buffer_reaches_a_slow_reader_whole_and_in_order),
		cmocka_unit_test(close_during_a_stuck_one_buffer_send_fails_the_flush_once),
		cmocka_unit_test(staging_on_the_loop_thread_reuses_what_sends_gave_back_and_the_pool_is_bounded),
		cmocka_unit_test(staging_dropped_off_the_loop_thread_is_freed_not_pooled),
		cmocka_unit_test(staging_on_the_loop_thread_gives_the_room_asked_and_a_big_write_its_own_buffer),
		cmocka_unit_test(forwarded_bytes_cross_loops_and_outlive_their_connection),
		cmocka_unit_test(shutdown_from_another_thread_sends_the_end_after_the_flushed_bytes),
		cmocka_unit_test(shutdown_on_the_loop_thread_sends_the_end_after_the_flushed_bytes),
		cmocka_unit_test(close_ends_the_peers_stream_after_its_bytes),
#ifndef LU_UNIX
		/* TCP itself (addresses, resets, SYNs, TCP_NODELAY, ports), or nothing of the transport: once, over TCP. */
		/* A ring sure to run short: multishot recvs (io_uring receives a Unix socket single-shot, which may not). */
		cmocka_unit_test(exhausted_buffer_ring_still_serves_every_connection),
		cmocka_unit_test(a_ring_that_grows_while_buffers_come_and_go_loses_nothing),
		cmocka_unit_test(echo_over_ipv6),
		cmocka_unit_test(a_connection_waiting_for_a_receive_buffer_still_hears_its_peer_reset),
		cmocka_unit_test(write_of_1mib_then_rst_surfaces_the_error_after_the_delivered_bytes),
		cmocka_unit_test(a_reset_waiting_behind_a_parked_recv_still_surfaces_after_the_bytes),
		cmocka_unit_test(posts_from_two_threads_run_once_each_in_posting_order),
		cmocka_unit_test(connect_to_a_closed_port_reports_the_error_once),
		cmocka_unit_test(a_connects_slot_holds_nothing_for_the_sockets_after_it),
		cmocka_unit_test(nagle_option_decides_tcp_nodelay_of_accepted_and_connected_conns),
		cmocka_unit_test(a_connect_that_gets_no_answer_times_out_once_and_its_socket_is_closed),
		cmocka_unit_test(a_shorter_connect_timeout_behind_a_longer_one_fires_first),
		cmocka_unit_test(a_connect_answered_before_its_timeout_stays_connected_after_it),
		cmocka_unit_test(a_timed_connect_waiting_when_the_loop_is_freed_is_canceled),
		cmocka_unit_test(a_connect_posted_to_a_loop_being_freed_is_canceled),
		cmocka_unit_test(a_connect_timeout_above_the_maximum_is_refused),
		cmocka_unit_test(run_once_from_inside_a_callback_is_refused_with_ebusy),
		cmocka_unit_test(run_once_off_the_owning_thread_is_refused_with_eexist),
		cmocka_unit_test(abort_from_another_thread_resets_the_peer),
		cmocka_unit_test(abort_on_the_loop_thread_resets_the_peer),
		cmocka_unit_test_teardown(accepting_pauses_when_fds_run_out_and_resumes_when_one_is_freed,
					  restore_nofile),
		cmocka_unit_test_teardown(a_listener_closed_while_paused_is_forgotten, restore_nofile),
		cmocka_unit_test(bad_arguments_return_einval),
		cmocka_unit_test(backend_option_and_environment_pick_the_backend),
		cmocka_unit_test(io_uring_refused_fails_an_explicit_uring_loop_with_one_clear_line),
		cmocka_unit_test(io_uring_refused_falls_back_to_epoll_with_one_clear_line),
#endif
	};
#ifdef LU_NO_URING
	unsetenv("PERCH_BACKEND");
	if (refuse_io_uring() != 0) {
		fprintf(stderr, "test_loop: cannot install the seccomp filter\n");
		return 1;
	}
	const char *group = "loop (io_uring refused: fallback)";
#else
	setenv("PERCH_BACKEND", LU_BACKEND, 1);
#ifdef LU_UNIX
	const char *group = "loop (" LU_BACKEND ", Unix sockets)";
#else
	const char *group = "loop (" LU_BACKEND ")";
#endif
#endif
	/* A plain peer writing to a socket perch reset gets EPIPE, and the test says so, not SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
