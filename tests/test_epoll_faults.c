/* tests/test_epoll_faults.c: an epoll_ctl the kernel refuses has one defined outcome: the connection fails with its errno, once; a listener retries. */
#include "config.h"

#include "cmocka_prelude.h"

#include <sys/epoll.h>

#include "loop_util.h"

/*
 * Fault injection: the program links with -Wl,--wrap=epoll_ctl, so the
 * epoll backend's calls come here. Armed, the next call of `op` whose
 * events have every bit of `has` and none of `lacks` fails with `err`.
 * The loop thread reads the arm, the test thread sets it: atomics.
 */
int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);

static struct {
	int armed, op, err, fired;
	uint32_t has, lacks;
} fault;

int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	if (__atomic_load_n(&fault.armed, __ATOMIC_ACQUIRE) && op == fault.op && ev &&
	    (ev->events & fault.has) == fault.has && (ev->events & fault.lacks) == 0 &&
	    __atomic_exchange_n(&fault.armed, 0, __ATOMIC_ACQ_REL)) {
		__atomic_fetch_add(&fault.fired, 1, __ATOMIC_RELEASE);
		errno = fault.err;
		return -1;
	}
	return __real_epoll_ctl(epfd, op, fd, ev);
}

static void arm(int op, uint32_t has, uint32_t lacks, int err)
{
	fault.op = op;
	fault.has = has;
	fault.lacks = lacks;
	fault.err = err;
	__atomic_store_n(&fault.fired, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&fault.armed, 1, __ATOMIC_RELEASE);
}

static int fired(void)
{
	return __atomic_load_n(&fault.fired, __ATOMIC_ACQUIRE);
}

#define STREAM (256 * 1024)

/* An epoll loop, a plain listening socket, and a perch connection to it with its peer. */
struct fx {
	struct lu_loop l;
	int lfd, peer;
	struct perch_conn *c;
	uint8_t *out, *in;
};

static void fx_open(struct fx *f, const struct perch_loop_opts *lo, const struct perch_conn_opts *co)
{
	memset(f, 0, sizeof(*f));
	struct perch_loop_opts o = lo ? *lo : (struct perch_loop_opts){ 0 };
	o.backend = PERCH_BACKEND_EPOLL;
	assert_int_equal(lu_start(&f->l, &o), 0);
	int port;
	f->lfd = lu_plain_listener(16, &port);
	assert_true(f->lfd >= 0);
	assert_true(f->lfd >= 0);
	f->c = lu_connect(&f->l, "127.0.0.1", port, co);
	assert_non_null(f->c);
	f->peer = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	assert_true(f->peer >= 0);
	f->out = malloc(STREAM);
	f->in = malloc(STREAM);
	lu_fill(f->out, STREAM);
}

static void fx_close(struct fx *f)
{
	assert_int_equal(__atomic_load_n(&fault.armed, __ATOMIC_ACQUIRE), 0);
	perch_conn_release(f->c);
	close(f->peer);
	close(f->lfd);
	assert_int_equal(lu_stop(&f->l), 0);
	free(f->out);
	free(f->in);
}

/* Reads to the error: every byte before it matches the stream, and the error is `err`. */
static size_t read_to_error(struct fx *f, int err)
{
	struct lu_end e = lu_read(f->c, f->in, STREAM);
	assert_false(e.timed_out);
	assert_int_equal(e.error, err);
	assert_memory_equal(f->in, f->out, e.got);
	return e.got;
}

/*
 * The pause's MOD (EPOLLIN off: the reader is behind) is refused: the
 * connection fails with ENOMEM after every byte it took, and its reader
 * sees the error (not a hang, nor more bytes than the loop took).
 */
static void a_refused_pause_fails_the_connection_after_its_bytes(void **state)
{
	struct fx f;
	struct perch_conn_opts co = { .pause_bytes = 16 * 1024 };
	fx_open(&f, NULL, &co);
	arm(EPOLL_CTL_MOD, EPOLLET, EPOLLIN, ENOMEM);
	assert_true(lu_write_all(f.peer, f.out, 64 * 1024));
	for (int i = 0; i < LU_TIMEOUT_MS && !fired(); i++)
		usleep(1000);
	assert_int_equal(fired(), 1);
	size_t got = read_to_error(&f, -ENOMEM);
	assert_true(got >= co.pause_bytes);
	/* The error stays: a later read sees it again, with nothing new. */
	assert_int_equal(lu_read(f.c, NULL, 1).error, -ENOMEM);
	fx_close(&f);
}

/*
 * A send that filled the socket waits for EPOLLOUT; the MOD that asks for
 * it is refused: the flush completes once, with ENOSPC, and the reader
 * sees the connection failed.
 */
static void a_refused_wait_for_room_fails_the_flush_once(void **state)
{
	struct fx f;
	fx_open(&f, NULL, NULL);
	int small = 4096, fd = ((struct perch__sock *)f.c->transport)->fd;
	assert_int_equal(setsockopt(f.peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	arm(EPOLL_CTL_MOD, EPOLLOUT, 0, ENOSPC);
	struct counted_flush cf = { .fl = { counted_flush_parking, counted_flush_done } };
	sem_init(&cf.done, 0, 0);
	assert_int_equal(perch_conn_write(f.c, f.out, STREAM), 0);
	assert_int_equal(perch_conn_try_flush_or_park(f.c, &cf.fl), PERCH_PENDING);
	assert_int_equal(lu_sem_wait(&cf.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(cf.result, -ENOSPC);
	assert_int_equal(fired(), 1);
	read_to_error(&f, -ENOSPC);
	assert_int_equal(perch__load_u32(&cf.deliveries), 1);
	fx_close(&f);
	sem_destroy(&cf.done);
}

/*
 * A yielded turn's MOD (the re-arm that queues the connection behind the
 * others) is refused: the connection fails after the bytes it read.
 */
static void a_refused_yield_fails_the_connection_after_its_bytes(void **state)
{
	struct fx f;
	struct perch_loop_opts lo = { .read_budget = 16 * 1024 };
	fx_open(&f, &lo, NULL);
	arm(EPOLL_CTL_MOD, EPOLLIN | EPOLLET, 0, ENOMEM);
	assert_true(lu_write_all(f.peer, f.out, 128 * 1024));
	size_t got = read_to_error(&f, -ENOMEM);
	assert_true(got >= lo.read_budget);
	assert_int_equal(fired(), 1);
	fx_close(&f);
}

/*
 * The peer half-closed and the reader saw the end; a reply then fills the
 * socket and the wait for room is refused: the flush fails once, and the
 * connection with it (a later write is refused), though its receive had
 * already ended.
 */
static void a_refusal_after_the_peers_fin_still_fails_the_connection(void **state)
{
	struct fx f;
	fx_open(&f, NULL, NULL);
	assert_int_equal(shutdown(f.peer, SHUT_WR), 0);
	struct lu_end e = lu_read(f.c, NULL, 1);
	assert_true(e.completed);
	int small = 4096, fd = ((struct perch__sock *)f.c->transport)->fd;
	assert_int_equal(setsockopt(f.peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	arm(EPOLL_CTL_MOD, EPOLLOUT, 0, ENOSPC);
	assert_int_equal(perch_conn_write(f.c, f.out, STREAM), 0);
	assert_int_equal(lu_flush(f.c), -ENOSPC);
	assert_int_equal(fired(), 1);
	assert_true(perch_conn_is_closed(f.c));
	assert_int_equal(perch_conn_write(f.c, f.out, 1), -EPIPE);
	fx_close(&f);
}

/* A flush made on the loop's thread whose wait for room is refused, and what the listener saw on its return. */
struct flush_on_loop {
	struct fx *f;
	struct counted_flush cf;
	int rc, fired_inside;
	uint32_t delivered_inside;
};

static void flush_on_the_loop(void *arg)
{
	struct flush_on_loop *k = arg;
	assert_int_equal(perch_conn_write(k->f->c, k->f->out, STREAM), 0);
	k->rc = perch_conn_try_flush_or_park(k->f->c, &k->cf.fl);
	k->delivered_inside = perch__load_u32(&k->cf.deliveries);
	k->fired_inside = fired();
}

/*
 * On the loop's thread the send is written inside the flush call; its
 * refused wait for room is reported at the end of the turn, never from
 * inside the caller's flush (whose continuation would run inline).
 */
static void a_refusal_inside_a_flush_on_the_loop_is_reported_after_it_returns(void **state)
{
	struct fx f;
	fx_open(&f, NULL, NULL);
	int small = 4096, fd = ((struct perch__sock *)f.c->transport)->fd;
	assert_int_equal(setsockopt(f.peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	/* Fill the socket first (bytes the peer never checks), so the flush's own send meets EAGAIN. */
	while (send(fd, f.out, 4096, MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
		;
	assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
	struct flush_on_loop k = { .f = &f, .cf = { .fl = { counted_flush_parking, counted_flush_done } } };
	sem_init(&k.cf.done, 0, 0);
	arm(EPOLL_CTL_MOD, EPOLLOUT, 0, ENOSPC);
	assert_int_equal(lu_on_loop(&f.l, flush_on_the_loop, &k), 0);
	assert_int_equal(k.rc, PERCH_PENDING);
	assert_int_equal(k.fired_inside, 1); /* inside the flush: its send met a full socket */
	assert_int_equal(k.delivered_inside, 0);
	assert_int_equal(lu_sem_wait(&k.cf.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(k.cf.result, -ENOSPC);
	assert_int_equal(perch__load_u32(&k.cf.deliveries), 1);
	fx_close(&f);
	sem_destroy(&k.cf.done);
}

/* perch_loop_free off the owner's thread: the paused listener is not resumed onto a closed epoll fd. */
static void a_free_off_the_owners_thread_resumes_no_listener_onto_a_gone_backend(void **state)
{
	lu_free_off_owner_with_a_paused_listener(PERCH_BACKEND_EPOLL, NULL);
}

struct connect_wait {
	int result;
	struct perch_conn *c;
	sem_t done;
};

static void connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct connect_wait *w = arg;
	w->result = result;
	w->c = c;
	sem_post(&w->done);
}

/* The ADD that waits for the handshake (EPOLLOUT) is refused: the connect fails with it. */
static void a_refused_connect_reports_its_errno(void **state)
{
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_EPOLL };
	assert_int_equal(lu_start(&l, &o), 0);
	int port, lfd = lu_plain_listener(16, &port);
	assert_true(lfd >= 0);
	struct connect_wait w = { .result = 1 };
	sem_init(&w.done, 0, 0);
	arm(EPOLL_CTL_ADD, EPOLLOUT, 0, ENOSPC);
	assert_int_equal(perch_connect(l.loop, "127.0.0.1", port, NULL, connected, &w), 0);
	assert_int_equal(lu_sem_wait(&w.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(w.result, -ENOSPC);
	assert_null(w.c);
	assert_int_equal(fired(), 1);
	sem_destroy(&w.done);
	close(lfd);
	assert_int_equal(lu_stop(&l), 0);
}

static void accepted(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	perch_conn_release(c);
	sem_post(arg);
}

/*
 * The listener's ADD is refused: the failure is logged, the listener
 * pauses, and the retry (100 ms later) adds it: a client is accepted.
 */
static void a_refused_listener_is_retried_and_accepts(void **state)
{
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_EPOLL };
	assert_int_equal(lu_start(&l, &o), 0);
	sem_t got;
	sem_init(&got, 0, 0);
	struct perch_listener *ls;
	arm(EPOLL_CTL_ADD, EPOLLIN, EPOLLET, ENOMEM);
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, accepted, &got, &ls), 0);
	int fd = lu_plain_connect(perch_listener_port(ls));
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&got, LU_TIMEOUT_MS), 0);
	assert_int_equal(fired(), 1);
	close(fd);
	perch_listener_close(ls);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&got);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_refused_pause_fails_the_connection_after_its_bytes),
		cmocka_unit_test(a_refused_wait_for_room_fails_the_flush_once),
		cmocka_unit_test(a_refused_yield_fails_the_connection_after_its_bytes),
		cmocka_unit_test(a_refused_connect_reports_its_errno),
		cmocka_unit_test(a_refused_listener_is_retried_and_accepts),
		cmocka_unit_test(a_refusal_after_the_peers_fin_still_fails_the_connection),
		cmocka_unit_test(a_refusal_inside_a_flush_on_the_loop_is_reported_after_it_returns),
		cmocka_unit_test(a_free_off_the_owners_thread_resumes_no_listener_onto_a_gone_backend),
	};
	return cmocka_run_group_tests_name("epoll faults", tests, NULL, NULL);
}
