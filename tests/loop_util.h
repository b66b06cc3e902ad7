/* tests/loop_util.h: a loop on its own thread, an echo server on it, and blocking helpers for the test thread. */
#ifndef PERCH_TESTS_LOOP_UTIL_H
#define PERCH_TESTS_LOOP_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <perch.h>

#include "atomic.h"
#include "loop_internal.h"

#define LU_TIMEOUT_MS 10000        /* every blocking wait in a test is bounded by this */

/* ---- a loop running on its own thread; the thread frees it (the ring is bound to it) ---- */

struct lu_loop {
	struct perch_loop *loop;
	pthread_t th;
	int run_rc;
};

static inline void *lu_loop_main(void *p)
{
	struct lu_loop *l = p;
	l->run_rc = perch_loop_run(l->loop);
	perch_loop_free(l->loop);
	return NULL;
}

/* Returns 0 or perch_loop_new's error. */
static inline int lu_start(struct lu_loop *l, const struct perch_loop_opts *opts)
{
	memset(l, 0, sizeof(*l));
	int rc = perch_loop_new(opts, &l->loop);
	if (rc != 0)
		return rc;
	return pthread_create(&l->th, NULL, lu_loop_main, l) == 0 ? 0 : -EAGAIN;
}

/* Stops the loop and joins its thread, which frees it. */
static inline int lu_stop(struct lu_loop *l)
{
	perch_loop_stop(l->loop);
	pthread_join(l->th, NULL);
	return l->run_rc;
}

static inline int lu_sem_wait(sem_t *s, int ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	while (sem_timedwait(s, &ts) != 0)
		if (errno != EINTR)
			return -errno;
	return 0;
}

/* Runs fn(arg) on the loop thread and waits for it. */
struct lu_call {
	void (*fn)(void *);
	void *arg;
	sem_t done;
};

static inline void lu_call_run(void *p)
{
	struct lu_call *c = p;
	c->fn(c->arg);
	sem_post(&c->done);
}

static inline int lu_on_loop(struct lu_loop *l, void (*fn)(void *), void *arg)
{
	struct lu_call c = { .fn = fn, .arg = arg };
	sem_init(&c.done, 0, 0);
	int rc = perch_loop_post(l->loop, lu_call_run, &c);
	if (rc == 0)
		rc = lu_sem_wait(&c.done, LU_TIMEOUT_MS);
	sem_destroy(&c.done);
	return rc;
}

/* ---- an io_uring test's first step ---- */

/*
 * An io_uring loop made on this thread, to see the kernel takes the ring
 * (and read its probes' stats); NULL after a SKIP line when it refuses:
 * the caller exits 77.
 */
static inline struct perch_loop *lu_uring_probe(void)
{
	struct perch_loop *probe;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	if (perch_loop_new(&o, &probe) == 0)
		return probe;
	printf("SKIP: io_uring is refused here: nothing of this backend to test\n");
	return NULL;
}

/* ---- connect from the test thread ---- */

struct lu_connect {
	struct perch_conn *c;
	int result;
	sem_t done;
};

static inline void lu_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct lu_connect *k = arg;
	k->c = c;
	k->result = result;
	sem_post(&k->done);
}

/* Returns a connected conn (the caller's reference) or NULL. */
static inline struct perch_conn *lu_connect(struct lu_loop *l, const char *host, int port,
					    const struct perch_conn_opts *opts)
{
	struct lu_connect k = { .c = NULL };
	sem_init(&k.done, 0, 0);
	if (perch_connect(l->loop, host, port, opts, lu_connected, &k) != 0 ||
	    lu_sem_wait(&k.done, LU_TIMEOUT_MS) != 0)
		k.c = NULL;
	sem_destroy(&k.done);
	return k.c;
}

/* ---- blocking reads and flushes from a thread that is not the loop's ---- */

/* Waits for the conn's flush. Returns 0 or the flush's error. */
static inline int lu_flush(struct perch_conn *c)
{
	struct perch_vtask_handle h;
	int rc = perch_conn_flush(c, &h);
	if (rc != PERCH_PENDING)
		return rc;
	int64_t res;
	rc = perch_vtask_wait(h, LU_TIMEOUT_MS, &res);
	return rc != 0 ? rc : (int)res;
}

/* What lu_read saw at the end: every byte, then the final state. */
struct lu_end {
	size_t got;
	bool completed;
	int error;
	bool closed;
	bool timed_out;
};

/* Copies the unconsumed bytes of `r` (at most `max`) into `dst`; returns how many. */
static inline size_t lu_copy(const struct perch_read_result *r, uint8_t *dst, size_t max)
{
	size_t n = 0, off = r->first_off;
	for (struct perch_seg *s = r->first; s && n < r->len && n < max; s = s->next, off = 0) {
		size_t take = s->len - off;
		if (take > r->len - n)
			take = r->len - n;
		if (take > max - n)
			take = max - n;
		if (dst)
			memcpy(dst + n, s->data + off, take);
		n += take;
	}
	return n;
}

/* Milliseconds on the monotonic clock. */
static inline double lu_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Reads until `want` bytes (or a final state) with blocking waits, for
 * at most LU_TIMEOUT_MS in all (then timed_out): reads that keep
 * returning without progress end too, not only a wait that never wakes.
 * Consumes what it copies. Bytes beyond `want` stay unconsumed.
 */
static inline struct lu_end lu_read(struct perch_conn *c, uint8_t *dst, size_t want)
{
	struct lu_end e = { 0 };
	double deadline = lu_now_ms() + LU_TIMEOUT_MS;
	while (e.got < want) {
		if (lu_now_ms() > deadline) {
			e.timed_out = true;
			return e;
		}
		struct perch_read_result r;
		struct perch_vtask_handle h;
		int rc = perch_conn_read(c, &r, &h);
		if (rc == PERCH_PENDING) {
			int64_t v;
			double left = deadline - lu_now_ms();
			if (perch_vtask_wait(h, left >= 1 ? (int)left : 1, &v) != 0) {
				e.timed_out = true;
				return e;
			}
			rc = perch_conn_try_read(c, &r);
			if (rc == -EAGAIN)
				continue;
		}
		if (rc != 0) {
			e.error = rc;
			return e;
		}
		size_t n = lu_copy(&r, dst ? dst + e.got : NULL, want - e.got);
		rc = perch_conn_advance(c, n, n);
		if (rc != 0) {
			e.error = rc;
			return e;
		}
		e.got += n;
		if (n == r.len && (r.completed || r.error || r.closed)) {
			e.completed = r.completed;
			e.error = r.error;
			e.closed = r.closed;
			return e;
		}
	}
	return e;
}

/* Reads to the end of the stream (FIN, error or close), discarding up to `max` bytes. */
static inline struct lu_end lu_read_to_end(struct perch_conn *c, uint8_t *dst, size_t max)
{
	struct lu_end e = lu_read(c, dst, max);
	if (e.got == max && !e.completed && !e.error && !e.closed && !e.timed_out) {
		struct lu_end tail = lu_read(c, NULL, 1);
		e.completed = tail.completed;
		e.error = tail.error;
		e.closed = tail.closed;
		e.timed_out = tail.timed_out;
		e.got += tail.got;
	}
	return e;
}

/* ---- an echo server on the loop thread: read, write back, flush, read again ---- */

struct lu_echo_stats {
	uint32_t accepted;
	uint32_t ended;
	uint64_t bytes;
};

struct lu_echo {
	struct perch_recv_listener rl;
	struct perch_flush_listener fl;
	struct perch_conn *c;
	struct lu_echo_stats *stats;
};

static inline void lu_echo_pump(struct lu_echo *e);
static inline void lu_echo_flushed_final(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie, int result);

static inline void lu_echo_end(struct lu_echo *e)
{
	perch_conn_release(e->c);
	perch__faa_u32(&e->stats->ended, 1);
	free(e);
}

static inline uint64_t lu_noop_parking_r(struct perch_recv_listener *l, struct perch_conn *c) { return 0; }
static inline uint64_t lu_noop_parking_f(struct perch_flush_listener *l, struct perch_conn *c) { return 0; }

static inline void lu_echo_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	lu_echo_pump((struct lu_echo *)((char *)l - offsetof(struct lu_echo, rl)));
}

static inline void lu_echo_flushed(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie, int result)
{
	struct lu_echo *e = (struct lu_echo *)((char *)l - offsetof(struct lu_echo, fl));
	if (result < 0)
		lu_echo_end(e);
	else
		lu_echo_pump(e);
}

static inline void lu_echo_pump(struct lu_echo *e)
{
	for (;;) {
		struct perch_read_result r;
		int rc = perch_conn_try_read_or_park(e->c, &e->rl, &r);
		if (rc == PERCH_PENDING)
			return;
		if (rc != 0) {
			lu_echo_end(e);
			return;
		}
		size_t off = r.first_off, left = r.len;
		for (struct perch_seg *s = r.first; s && left; s = s->next, off = 0) {
			size_t n = s->len - off < left ? s->len - off : left;
			perch_conn_write(e->c, s->data + off, n);
			left -= n;
		}
		perch__faa_u64(&e->stats->bytes, r.len);
		perch_conn_advance(e->c, r.len, r.len);
		if (r.completed || r.error || r.closed) {
			/* Flush what is left, then end; a closed conn refuses it at once. */
			e->fl.on_flush_done = lu_echo_flushed_final;
			if (perch_conn_try_flush_or_park(e->c, &e->fl) == PERCH_PENDING)
				return;
			lu_echo_end(e);
			return;
		}
		if (r.len && perch_conn_try_flush_or_park(e->c, &e->fl) == PERCH_PENDING)
			return; /* lu_echo_flushed pumps again */
	}
}

static inline void lu_echo_flushed_final(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie, int result)
{
	lu_echo_end((struct lu_echo *)((char *)l - offsetof(struct lu_echo, fl)));
}

/* Accept callback: `arg` is a struct lu_echo_stats. */
static inline void lu_echo_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct lu_echo *e = calloc(1, sizeof(*e));
	e->rl.on_parking = lu_noop_parking_r;
	e->rl.on_recv_ready = lu_echo_ready;
	e->fl.on_parking = lu_noop_parking_f;
	e->fl.on_flush_done = lu_echo_flushed;
	e->c = c;
	e->stats = arg;
	perch__faa_u32(&e->stats->accepted, 1);
	lu_echo_pump(e);
}

/* A flush listener that counts its deliveries and posts `done` for each. */
struct counted_flush {
	struct perch_flush_listener fl;
	uint32_t deliveries;
	int result;
	sem_t done;
};

static inline uint64_t counted_flush_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	return 0;
}

static inline void counted_flush_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie, int result)
{
	struct counted_flush *f = (struct counted_flush *)l;
	f->result = result;
	perch__faa_u32(&f->deliveries, 1);
	sem_post(&f->done);
}

/* ---- plain sockets and descriptors ---- */

/*
 * connect(2) to `sa` on a blocking socket. A connect a signal
 * interrupts (EINTR: the handshake goes on in the kernel; a CI run saw one
 * while the SYN waited on a full backlog) is waited out, as POSIX says:
 * until writable, then its SO_ERROR. Returns 0, or -1 with errno set.
 */
static inline int lu_connect_addr(int fd, const struct sockaddr *sa, socklen_t len)
{
	if (connect(fd, sa, len) == 0)
		return 0;
	if (errno != EINTR)
		return -1;
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	int rc;
	while ((rc = poll(&p, 1, LU_TIMEOUT_MS)) < 0 && errno == EINTR)
		;
	if (rc == 0)
		errno = ETIMEDOUT;
	if (rc <= 0)
		return -1;
	int err = 0;
	socklen_t elen = sizeof(err);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
		return -1;
	errno = err;
	return err == 0 ? 0 : -1;
}

/* lu_connect_addr to 127.0.0.1:port. */
static inline int lu_connect_fd(int fd, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return lu_connect_addr(fd, (struct sockaddr *)&a, sizeof(a));
}

/* A blocking client socket connected to where `ls` listens (TCP or Unix: its bound address), or -1. */
static inline int lu_plain_connect_to(const struct perch_listener *ls)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (getsockname(ls->sk.fd, (struct sockaddr *)&ss, &len) != 0)
		return -1;
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || lu_connect_addr(fd, (struct sockaddr *)&ss, len) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* A plain listening socket on 127.0.0.1 (a port the kernel picks, in *port): a peer perch connects to. */
static inline int lu_plain_listener(int backlog, int *port)
{
	*port = 0;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof(a);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, backlog) != 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

/* A blocking client socket connected to 127.0.0.1:port, or -1. */
static inline int lu_plain_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lu_connect_fd(fd, port) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static inline bool lu_write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* One read(2), retried when a signal interrupts it: what read returns otherwise. */
static inline ssize_t lu_read_once(int fd, void *p, size_t n)
{
	ssize_t r;
	while ((r = read(fd, p, n)) < 0 && errno == EINTR)
		;
	return r;
}

static inline bool lu_read_all(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

static inline int lu_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL)
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own */
}

/* A byte of a test stream, at offset i: not periodic in any buffer size. */
static inline uint8_t lu_pattern(size_t i)
{
	return (uint8_t)((i * 2654435761u) >> 13);
}

static inline void lu_fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = lu_pattern(i);
}

/* ---- an echo round trip, and a connection caught at its accept ---- */

#ifdef cmocka_unit_test /* its asserts: the race suite includes this file without cmocka */
/*
 * Through an echo: `n` pattern bytes written and flushed from this thread
 * in chunks (each flush awaited), all read back in order. Drops the
 * caller's reference to c.
 */
static inline void lu_echo_through(struct perch_conn *c, size_t n)
{
	enum { CHUNK = 10000 };
	assert_non_null(c);
	uint8_t *out = malloc(n), *in = malloc(n);
	lu_fill(out, n);
	for (size_t off = 0; off < n; off += CHUNK) {
		size_t k = n - off < CHUNK ? n - off : CHUNK;
		assert_int_equal(perch_conn_write(c, out + off, k), 0);
		assert_int_equal(lu_flush(c), 0);
	}
	struct lu_end e = lu_read(c, in, n);
	assert_false(e.timed_out);
	assert_int_equal(e.got, n);
	assert_memory_equal(in, out, n);
	perch_conn_release(c);
	free(out);
	free(in);
}
#endif

/* A listener's accept callback that hands its (last) accepted conn to the test thread: `arg` is one. */
struct lu_catcher {
	struct perch_conn *c;
	sem_t got;
};

static inline void lu_catch_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct lu_catcher *k = arg;
	/* Atomic: a test may read the last one while the loop accepts the next (no sem between them). */
	__atomic_store_n(&k->c, c, __ATOMIC_RELEASE);
	sem_post(&k->got);
}

/* ---- a loop freed off its owner's thread, a paused listener behind another socket ---- */

/* cmocka's asserts: only for the test programs (the race suite includes this header without cmocka). */
#ifdef cmocka_unit_test

/* perch_loop_stats, read on the loop's thread (a posted function). */
struct lu_stats_call {
	struct perch_loop *loop;
	struct perch_loop_stats st;
	int rc;
};

static inline void lu_stats_read(void *arg)
{
	struct lu_stats_call *p = arg;
	p->rc = perch_loop_stats(p->loop, &p->st);
}

static inline struct perch_loop_stats lu_stats(struct lu_loop *l)
{
	struct lu_stats_call p = { .loop = l->loop, .rc = 1 };
	assert_int_equal(lu_on_loop(l, lu_stats_read, &p), 0);
	assert_int_equal(p.rc, 0);
	return p.st;
}

struct lu_paused_free {
	struct perch_loop *loop;
	struct perch_listener *first, *paused;
	void (*as_ended)(struct perch_listener *); /* the backend's accept as a failure ends it */
	int run_rc;
};

static inline void lu_drop_conn(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	perch_conn_release(c);
}

/* On the loop: two listeners, the second (the higher slot) paused as if out of fds; then a stop. */
static inline void lu_paused_setup(void *arg)
{
	struct lu_paused_free *p = arg;
	assert_int_equal(perch_listen(p->loop, "127.0.0.1", 0, NULL, lu_drop_conn, NULL, &p->first), 0);
	assert_int_equal(perch_listen(p->loop, "127.0.0.1", 0, NULL, lu_drop_conn, NULL, &p->paused), 0);
	if (p->as_ended)
		p->as_ended(p->paused);
	perch__loop_accepted(&p->paused->sk, -EMFILE);
	assert_true(perch__lx(&p->paused->sk)->accept_paused);
	assert_true(p->paused->sk.slot > p->first->sk.slot);
	perch_loop_stop(p->loop);
}

static inline void *lu_paused_run(void *arg)
{
	struct lu_paused_free *p = arg;
	assert_int_equal(perch_loop_post(p->loop, lu_paused_setup, p), 0);
	p->run_rc = perch_loop_run(p->loop);
	return NULL;
}

/*
 * The loop runs on a thread of its own, then this thread frees it: the
 * free cannot drive the backend, whose destroy finalizes both listeners.
 * Finalizing the first resumes the paused one, which must not start an
 * accept on the backend already gone (a crash on both backends once).
 */
static inline void lu_free_off_owner_with_a_paused_listener(enum perch_backend backend,
							    void (*as_ended)(struct perch_listener *))
{
	struct perch_loop_opts o = { .backend = backend };
	struct lu_paused_free p = { .as_ended = as_ended };
	assert_int_equal(perch_loop_new(&o, &p.loop), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, lu_paused_run, &p), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(p.run_rc, 0);
	perch_loop_free(p.loop);
}
#endif /* cmocka_unit_test */

#endif /* PERCH_TESTS_LOOP_UTIL_H */
