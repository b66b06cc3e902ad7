/* tests/test_uring_turn_sends.c: io_uring sends: the flushes of one turn wait in the submission queue and leave together in the next io_uring_enter, one send per connection. */
#include "config.h"

#include "cmocka_prelude.h"

#include "loop_util.h"
#include "uring_internal.h"

enum { CONNS = 8, MSG = 64 };

/* CONNS connections over socketpairs on an io_uring loop, each with the socket at its other end. */
struct fx {
	struct lu_loop l;
	struct perch_conn *c[CONNS];
	int peer[CONNS];
	struct counted_flush fl[CONNS];
	unsigned queued_before, queued_after; /* SQEs waiting in the ring around the flushes */
	int write_rc[CONNS], flush_rc[CONNS];
};

static int setup(void **state)
{
	struct fx *f = *state = calloc(1, sizeof(*f));
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	if (!f || lu_start(&f->l, &o) != 0)
		return -1;
	for (int i = 0; i < CONNS; i++) {
		int sv[2];
		struct lu_connect k = { .c = NULL, .result = 1 };
		sem_init(&k.done, 0, 0);
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ||
		    perch_conn_adopt(f->l.loop, sv[0], NULL, lu_connected, &k) != 0 ||
		    lu_sem_wait(&k.done, LU_TIMEOUT_MS) != 0 || k.result != 0)
			return -1;
		sem_destroy(&k.done);
		f->c[i] = k.c;
		f->peer[i] = sv[1];
		f->fl[i].fl = (struct perch_flush_listener){ .on_parking = counted_flush_parking,
							     .on_flush_done = counted_flush_done };
		sem_init(&f->fl[i].done, 0, 0);
	}
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	for (int i = 0; i < CONNS; i++) {
		perch_conn_release(f->c[i]);
		close(f->peer[i]);
		sem_destroy(&f->fl[i].done);
	}
	int rc = lu_stop(&f->l);
	free(f);
	return rc;
}

/* On the loop's thread, in one callback: a message staged and flushed on every connection (judged on the test's). */
static void flush_every_conn(void *arg)
{
	struct fx *f = arg;
	struct io_uring *ring = &st_of(f->l.loop)->ring;
	static const uint8_t msg[MSG] = "one turn, one io_uring_enter";
	f->queued_before = io_uring_sq_ready(ring);
	for (int i = 0; i < CONNS; i++) {
		f->write_rc[i] = perch_conn_write(f->c[i], msg, MSG);
		f->flush_rc[i] = perch_conn_try_flush_or_park(f->c[i], &f->fl[i].fl);
	}
	f->queued_after = io_uring_sq_ready(ring);
}

/*
 * Every flush of the callback became a send waiting in the submission
 * queue, none entered on its own: the turn's next io_uring_enter submits
 * them all. Each flush then completes, and every peer reads its message.
 */
static void the_flushes_of_one_turn_leave_in_one_enter(void **state)
{
	struct fx *f = *state;
	assert_int_equal(lu_on_loop(&f->l, flush_every_conn, f), 0);
	assert_int_equal(f->queued_after - f->queued_before, CONNS);
	for (int i = 0; i < CONNS; i++) {
		assert_int_equal(f->write_rc[i], 0);
		assert_int_equal(f->flush_rc[i], PERCH_PENDING);
		assert_int_equal(lu_sem_wait(&f->fl[i].done, LU_TIMEOUT_MS), 0);
		assert_int_equal(f->fl[i].result, 0);
		uint8_t got[MSG];
		assert_true(lu_read_all(f->peer[i], got, MSG));
		assert_memory_equal(got, "one turn, one io_uring_enter", sizeof("one turn, one io_uring_enter"));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(the_flushes_of_one_turn_leave_in_one_enter, setup, teardown),
	};
	struct perch_loop *probe = NULL;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	if (perch_loop_new(&o, &probe) != 0) {
		printf("test_uring_turn_sends: skipped: io_uring is refused here\n");
		return 77;
	}
	perch_loop_free(probe);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
