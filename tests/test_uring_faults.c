/* tests/test_uring_faults.c: an io_uring submit or wait the kernel refuses is retried a bounded number of times, or breaks the loop, which reports it. */
#include "config.h"

#include "cmocka_prelude.h"

#include <liburing.h>
#include <sys/ioctl.h>

#include "loop_util.h"
#include "uring_internal.h" /* a listener's accept as its failure ends it */

/*
 * Fault injection: the program links with -Wl,--wrap for the liburing
 * calls the backend makes, so they come here. Armed with n, the next n
 * calls of the chosen kind fail with `err` (the loop thread reads the arm,
 * the test thread sets it: atomics).
 */
enum kind { SUBMIT, WAIT };
static struct {
	int left, err, kind, fired;
} fault;

static bool fails(enum kind k)
{
	int left = __atomic_load_n(&fault.left, __ATOMIC_ACQUIRE);
	while (left > 0 && fault.kind == (int)k)
		if (__atomic_compare_exchange_n(&fault.left, &left, left - 1, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			__atomic_fetch_add(&fault.fired, 1, __ATOMIC_RELEASE);
			return true;
		}
	return false;
}

int __real_io_uring_submit(struct io_uring *ring);
int __real_io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr);
int __real_io_uring_submit_and_get_events(struct io_uring *ring);
int __real_io_uring_submit_and_wait_timeout(struct io_uring *ring, struct io_uring_cqe **cqe_ptr,
					    unsigned wait_nr, struct __kernel_timespec *ts,
					    sigset_t *sigmask);

/*
 * Set: an older kernel, which refuses a multishot recv's byte limit. Each
 * such SQE not yet submitted gets MSG_WAITALL, which every kernel refuses
 * for a multishot recv (EINVAL) before it takes a buffer, as an older one
 * refuses the limit.
 */
static bool refuse_recv_limits;

static void as_an_older_kernel(struct io_uring *ring)
{
	if (!__atomic_load_n(&refuse_recv_limits, __ATOMIC_ACQUIRE))
		return;
	for (unsigned i = ring->sq.sqe_head; i != ring->sq.sqe_tail; i++) {
		struct io_uring_sqe *sqe = &ring->sq.sqes[i & ring->sq.ring_mask];
		if (sqe->opcode == IORING_OP_RECV && (sqe->ioprio & IORING_RECV_MULTISHOT) && sqe->file_index)
			sqe->msg_flags |= MSG_WAITALL;
	}
}

int __wrap_io_uring_submit(struct io_uring *ring)
{
	as_an_older_kernel(ring);
	return fails(SUBMIT) ? -fault.err : __real_io_uring_submit(ring);
}

int __wrap_io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
	as_an_older_kernel(ring);
	return fails(WAIT) ? -fault.err : __real_io_uring_submit_and_wait(ring, wait_nr);
}

int __wrap_io_uring_submit_and_get_events(struct io_uring *ring)
{
	as_an_older_kernel(ring);
	return fails(WAIT) ? -fault.err : __real_io_uring_submit_and_get_events(ring);
}

int __wrap_io_uring_submit_and_wait_timeout(struct io_uring *ring, struct io_uring_cqe **cqe_ptr,
					    unsigned wait_nr, struct __kernel_timespec *ts,
					    sigset_t *sigmask)
{
	as_an_older_kernel(ring);
	return fails(WAIT) ? -fault.err
			   : __real_io_uring_submit_and_wait_timeout(ring, cqe_ptr, wait_nr, ts, sigmask);
}

static void arm(enum kind k, int n, int err)
{
	fault.kind = (int)k;
	fault.err = err;
	__atomic_store_n(&fault.fired, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&fault.left, n, __ATOMIC_RELEASE);
}

static int fired(void)
{
	return __atomic_load_n(&fault.fired, __ATOMIC_ACQUIRE);
}

static void disarm(void)
{
	__atomic_store_n(&fault.left, 0, __ATOMIC_RELEASE);
}

#define BURST 16 /* connects started in one turn: four times the SQ */

struct burst {
	struct perch_loop *loop;
	int port;
	uint32_t answered, ok;
	int results[BURST];
	sem_t all;
};

static void burst_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct burst *b = arg;
	uint32_t i = perch__faa_u32(&b->answered, 1);
	if (i < BURST)
		b->results[i] = result;
	if (c) {
		perch__faa_u32(&b->ok, 1);
		perch_conn_release(c);
	}
	if (i + 1 == BURST)
		sem_post(&b->all);
}

/* Runs in one turn: each connect takes an SQE, so the SQ fills and sqe_get must submit. */
static void start_burst(void *arg)
{
	struct burst *b = arg;
	for (int i = 0; i < BURST; i++)
		assert_int_equal(perch_connect(b->loop, "127.0.0.1", b->port, NULL, burst_connected, b), 0);
}

static void start_loop(struct lu_loop *l)
{
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .sq_entries = 4 };
	assert_int_equal(lu_start(l, &o), 0);
	assert_string_equal(perch_loop_backend_name(l->loop), "io_uring");
}

/* Waits for the loop thread to end on its own (it frees the loop): its run's result. */
static int joined(struct lu_loop *l)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += LU_TIMEOUT_MS / 1000;
	assert_int_equal(pthread_timedjoin_np(l->th, NULL, &ts), 0);
	return l->run_rc;
}

/* A loop on io_uring with a small SQ, and a plain listener for a burst of connects to it: its fd. */
static int burst_open(struct lu_loop *l, struct burst *b)
{
	start_loop(l);
	memset(b, 0, sizeof(*b));
	b->loop = l->loop;
	int lfd = lu_plain_listener(BURST * 2, &b->port);
	assert_true(lfd >= 0);
	sem_init(&b->all, 0, 0);
	return lfd;
}

static void burst_close(struct burst *b, int lfd)
{
	sem_destroy(&b->all);
	close(lfd);
}

/* A full SQ whose submit is refused for now (EAGAIN) three times: retried, every connect goes through. */
static void a_submit_refused_for_now_is_retried(void **state)
{
	struct lu_loop l;
	struct burst b;
	int lfd = burst_open(&l, &b);
	arm(SUBMIT, 3, EAGAIN);
	assert_int_equal(lu_on_loop(&l, start_burst, &b), 0);
	assert_int_equal(lu_sem_wait(&b.all, LU_TIMEOUT_MS), 0);
	assert_int_equal(fired(), 3);
	assert_int_equal(perch__load_u32(&b.ok), BURST);
	assert_int_equal(lu_stop(&l), 0);
	burst_close(&b, lfd);
}

/*
 * A full SQ whose submit is refused for good (EBADF): the ring is broken,
 * the run returns the errno, and the loop's free answers every connect
 * once (canceled: none was ever submitted).
 */
static void a_submit_refused_for_good_breaks_the_loop_which_reports_it(void **state)
{
	struct lu_loop l;
	struct burst b;
	int lfd = burst_open(&l, &b);
	arm(SUBMIT, 1, EBADF);
	assert_int_equal(perch_loop_post(l.loop, start_burst, &b), 0);
	assert_int_equal(joined(&l), -EBADF);
	assert_int_equal(fired(), 1);
	assert_int_equal(perch__load_u32(&b.answered), BURST);
	assert_int_equal(perch__load_u32(&b.ok), 0);
	for (int i = 0; i < BURST; i++)
		assert_int_equal(b.results[i], -ECANCELED);
	disarm();
	burst_close(&b, lfd);
}

/* Posted: the loop's next wait fails with EBADF, a ring broken for good. */
static void arm_wait_ebadf(void *arg)
{
	arm(WAIT, 1, EBADF);
}

/*
 * A send the broken ring never took: a connection's flush, made in the
 * turn whose SQ is full and whose submit is refused for good. The run
 * returns the errno; the free delivers the flush once (closed) and
 * settles the send, so its chain and the connection are freed (the
 * ASan build's LeakSanitizer sees any that is not).
 */
struct stranded {
	struct perch_conn *c;
	struct burst b;
	struct counted_flush cf;
	int flush_rc, fired_by_flush;
	uint32_t connects;
};

static void flush_behind_a_full_sq(void *arg)
{
	struct stranded *k = arg;
	struct io_uring *ring = &st_of(k->b.loop)->ring;
	while (io_uring_sq_space_left(ring) > 0) { /* connects until the SQ is full */
		assert_int_equal(perch_connect(k->b.loop, "127.0.0.1", k->b.port, NULL, burst_connected, &k->b), 0);
		k->connects++;
	}
	arm(SUBMIT, 1, EBADF);
	assert_int_equal(perch_conn_write(k->c, "x", 1), 0);
	k->flush_rc = perch_conn_try_flush_or_park(k->c, &k->cf.fl);
	k->fired_by_flush = fired();
	perch_conn_release(k->c);
}

static void a_send_the_broken_ring_never_took_is_settled_by_the_free(void **state)
{
	struct lu_loop l;
	start_loop(&l);
	struct stranded k = { .b = { .loop = l.loop }, .cf = { .fl = { counted_flush_parking, counted_flush_done } } };
	int lfd = lu_plain_listener(BURST * 2, &k.b.port);
	assert_true(lfd >= 0);
	sem_init(&k.b.all, 0, 0);
	sem_init(&k.cf.done, 0, 0);
	k.c = lu_connect(&l, "127.0.0.1", k.b.port, NULL);
	assert_non_null(k.c);
	assert_int_equal(perch_loop_post(l.loop, flush_behind_a_full_sq, &k), 0);
	assert_int_equal(joined(&l), -EBADF);
	assert_int_equal(k.flush_rc, PERCH_PENDING);
	assert_int_equal(k.fired_by_flush, 1); /* the send found the SQ full, and its submit refused */
	assert_true(k.connects > 0);
	assert_int_equal(perch__load_u32(&k.b.answered), k.connects);
	assert_int_equal(perch__load_u32(&k.cf.deliveries), 1);
	assert_int_equal(k.cf.result, -EPIPE);
	disarm();
	sem_destroy(&k.cf.done);
	sem_destroy(&k.b.all);
	close(lfd);
}

static void accept_as_ended(struct perch_listener *l)
{
	((struct usock *)perch__sock_be(&l->sk))->flags &= ~F_ACCEPT;
}

/* perch_loop_free off the owner's thread: the paused listener is not resumed onto an exited ring. */
static void a_free_off_the_owners_thread_resumes_no_listener_onto_a_gone_backend(void **state)
{
	lu_free_off_owner_with_a_paused_listener(PERCH_BACKEND_URING, accept_as_ended);
}

/*
 * The turn's wait is refused for good: the run returns the errno (and
 * ends). Armed from the loop's thread: armed from this one, a loop not yet
 * in its first wait would break and be freed before a post could reach it.
 */
static void a_wait_refused_for_good_ends_the_run_with_its_errno(void **state)
{
	struct lu_loop l;
	start_loop(&l);
	assert_int_equal(perch_loop_post(l.loop, arm_wait_ebadf, NULL), 0);
	assert_int_equal(joined(&l), -EBADF);
	assert_int_equal(fired(), 1);
	disarm();
}

/* ---- the ring breaks while a zero-copy write is stuck: the free resets before it releases ---- */

#define ZC_N (8u * 1024 * 1024)

struct zc_broken {
	int rfd;
	uint8_t *out, *want, *in;
	uint32_t releases;
	sem_t released;
	size_t got, changed;
};

/* The caller's memory is its own again: it writes over it at once. */
static void zc_broken_released(void *arg, const void *data, size_t len)
{
	struct zc_broken *z = arg;
	memset(z->out, 0xEE, ZC_N);
	perch__faa_u32(&z->releases, 1);
	sem_post(&z->released);
}

/* The peer reads, once the memory is released, to the end or the reset, and counts the changed bytes. */
static void *zc_broken_reader(void *arg)
{
	struct zc_broken *z = arg;
	lu_sem_wait(&z->released, LU_TIMEOUT_MS);
	for (ssize_t n;; z->got += (size_t)n)
		if ((n = read(z->rfd, z->in + z->got, ZC_N - z->got)) <= 0 && !(n < 0 && errno == EINTR))
			break;
		else if (n < 0)
			n = 0;
	for (size_t i = 0; i < z->got; i++)
		z->changed += z->in[i] != z->want[i];
	return NULL;
}

/*
 * A stuck 8 MiB zero-copy write whose connection is still live when a
 * refused wait breaks the ring: the loop's free must reset it before it
 * releases the memory, though the ring's requests still hold the socket's
 * file (a close alone would not be its last reference, and the kernel
 * would go on sending the caller's new bytes). Twelve rounds: a close-only
 * reset let changed bytes through in 8 of 20 rounds here, so five missed it
 * one gate run in thirteen (0.6^5); twelve, one in 460.
 */
static void a_ring_broken_under_a_stuck_zerocopy_write_resets_it_before_the_release(void **state)
{
	for (int round = 0; round < 12; round++) {
		struct lu_loop l;
		struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
		assert_int_equal(lu_start(&l, &o), 0);
		int port;
		int lfd = lu_plain_listener(4, &port);
		struct perch_conn_opts co = { .zerocopy_min = 64 * 1024 };
		struct perch_conn *c = lu_connect(&l, "127.0.0.1", port, &co);
		assert_non_null(c);
		struct zc_broken z = { .rfd = accept(lfd, NULL, NULL) };
		assert_true(z.rfd >= 0);
		z.out = malloc(ZC_N);
		z.want = malloc(ZC_N);
		z.in = malloc(ZC_N);
		lu_fill(z.out, ZC_N);
		memcpy(z.want, z.out, ZC_N);
		sem_init(&z.released, 0, 0);
		struct counted_flush cf = { .fl = { counted_flush_parking, counted_flush_done } };
		sem_init(&cf.done, 0, 0);
		assert_int_equal(perch_conn_write_ref(c, z.out, ZC_N, zc_broken_released, &z), 0);
		assert_int_equal(perch_conn_try_flush_or_park(c, &cf.fl), PERCH_PENDING);
		int queued = 0, before = -1;
		for (int i = 0; i < 300 && (queued == 0 || queued != before); i++) {
			before = queued;
			usleep(10 * 1000);
			ioctl(z.rfd, FIONREAD, &queued);
		}
		pthread_t th;
		pthread_create(&th, NULL, zc_broken_reader, &z);
		perch_conn_release(c);
		/*
		 * Armed from the loop's thread: armed from here, the loop (woken by
		 * the reader's progress) could break and be freed before a post
		 * meant to wake it landed, leaving the post unrun.
		 */
		assert_int_equal(perch_loop_post(l.loop, arm_wait_ebadf, NULL), 0);
		assert_int_equal(joined(&l), -EBADF);
		disarm();
		pthread_join(th, NULL);
		print_message("round %d: released %u times; the peer then read %zu bytes, %zu of them changed\n", round,
			      z.releases, z.got, z.changed);
		assert_int_equal(z.releases, 1);
		assert_int_equal(z.changed, 0);
		assert_true(z.got < ZC_N); /* reset: not everything came */
		close(z.rfd);
		close(lfd);
		sem_destroy(&z.released);
		sem_destroy(&cf.done);
		free(z.out);
		free(z.want);
		free(z.in);
	}
}

/*
 * A kernel that refuses the multishot recv's byte limit: the first recv
 * comes back EINVAL having taken nothing, the loop says so in its stats
 * and arms every later one without it; each connection receives every
 * byte, and the limit is not tried again.
 */
static void a_kernel_refusing_the_recv_byte_limit_gets_receives_without_it(void **state)
{
	enum { CONNS = 3, N = 256 * 1024 };
	struct lu_loop l;
	start_loop(&l);
	__atomic_store_n(&refuse_recv_limits, true, __ATOMIC_RELEASE);
	struct lu_catcher k = { .c = NULL };
	sem_init(&k.got, 0, 0);
	struct perch_listener *ls;
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, lu_catch_accept, &k, &ls), 0);
	uint8_t *sent = malloc(N), *got = malloc(N);
	lu_fill(sent, N);
	for (int i = 0; i < CONNS; i++) {
		int fd = lu_plain_connect_to(ls);
		assert_true(fd >= 0);
		assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
		assert_true(lu_write_all(fd, sent, N));
		assert_int_equal(shutdown(fd, SHUT_WR), 0);
		memset(got, 0, N);
		struct lu_end e = lu_read_to_end(k.c, got, N);
		assert_true(e.completed);
		assert_int_equal(e.got, N);
		assert_memory_equal(got, sent, N);
		perch_conn_release(k.c);
		close(fd);
	}
	assert_int_equal(lu_stats(&l).recv_limit_refused, 1);
	__atomic_store_n(&refuse_recv_limits, false, __ATOMIC_RELEASE);
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
	free(sent);
	free(got);
	sem_destroy(&k.got);
}

/*
 * Once limited receives worked on a loop, the kernel knows the limit: an
 * EINVAL on a later limited multishot (here the wrappers make its re-arm
 * one every kernel refuses, once the first reached its limit) is the
 * connection's own error, reported to its reader, not a refusal to work
 * around.
 */
static void an_einval_after_the_limit_worked_is_the_connections_error(void **state)
{
	enum { PAUSE = 64 * 1024, FIRST = 16 * 1024, MORE = 4 * PAUSE };
	struct lu_loop l;
	start_loop(&l);
	struct lu_catcher k = { .c = NULL };
	sem_init(&k.got, 0, 0);
	struct perch_conn_opts copts = { .pause_bytes = PAUSE };
	struct perch_listener *ls;
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, &copts, lu_catch_accept, &k, &ls), 0);
	int fd = lu_plain_connect_to(ls);
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
	uint8_t *sent = malloc(MORE), *got = malloc(MORE);
	lu_fill(sent, MORE);
	assert_true(lu_write_all(fd, sent, FIRST));
	struct lu_end e = lu_read(k.c, got, FIRST);
	assert_int_equal(e.got, FIRST);
	__atomic_store_n(&refuse_recv_limits, true, __ATOMIC_RELEASE);
	assert_true(lu_write_all(fd, sent, MORE));
	e = lu_read_to_end(k.c, got, MORE);
	__atomic_store_n(&refuse_recv_limits, false, __ATOMIC_RELEASE);
	print_message("after %zu more bytes: error %d\n", e.got, e.error);
	assert_int_equal(e.error, -EINVAL);
	assert_true(e.got < MORE);
	assert_int_equal(lu_stats(&l).recv_limit_refused, 0);
	perch_conn_release(k.c);
	close(fd);
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
	free(sent);
	free(got);
	sem_destroy(&k.got);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_submit_refused_for_now_is_retried),
		cmocka_unit_test(a_submit_refused_for_good_breaks_the_loop_which_reports_it),
		cmocka_unit_test(a_wait_refused_for_good_ends_the_run_with_its_errno),
		cmocka_unit_test(a_send_the_broken_ring_never_took_is_settled_by_the_free),
		cmocka_unit_test(a_free_off_the_owners_thread_resumes_no_listener_onto_a_gone_backend),
		cmocka_unit_test(a_ring_broken_under_a_stuck_zerocopy_write_resets_it_before_the_release),
		cmocka_unit_test(a_kernel_refusing_the_recv_byte_limit_gets_receives_without_it),
		cmocka_unit_test(an_einval_after_the_limit_worked_is_the_connections_error),
	};
	return cmocka_run_group_tests_name("io_uring faults", tests, NULL, NULL);
}
