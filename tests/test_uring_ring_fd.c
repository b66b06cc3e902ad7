/* tests/test_uring_ring_fd.c: an io_uring loop registers its ring's fd on its thread, falls back to the plain fd where refused, and drops the registration only from the thread that holds it. */
#include "config.h"

#include "cmocka_prelude.h"

#include <liburing.h>

#include "loop_util.h"

/*
 * Fault injection: the program links with -Wl,--wrap for the ring's setup
 * and the ring fd's registration. Armed, the setup refuses the flag sets
 * with IORING_SETUP_SINGLE_ISSUER, as a kernel before 6.0 does, so the
 * loop gets a ring any thread may use; and the registration is refused.
 */
static bool plain_rings;        /* atomic: armed */
static bool refuse_registration; /* atomic: armed */

int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int __real_io_uring_register_ring_fd(struct io_uring *ring);

int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
	if (__atomic_load_n(&plain_rings, __ATOMIC_ACQUIRE) && (p->flags & IORING_SETUP_SINGLE_ISSUER))
		return -EINVAL;
	return __real_io_uring_queue_init_params(entries, ring, p);
}

int __wrap_io_uring_register_ring_fd(struct io_uring *ring)
{
	if (__atomic_load_n(&refuse_registration, __ATOMIC_ACQUIRE))
		return -EINVAL;
	return __real_io_uring_register_ring_fd(ring);
}

static int disarm(void **state)
{
	(void)state;
	__atomic_store_n(&plain_rings, false, __ATOMIC_RELEASE);
	__atomic_store_n(&refuse_registration, false, __ATOMIC_RELEASE);
	return 0;
}

static struct perch_loop *new_uring_loop(void)
{
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .buf_count = 64 };
	struct perch_loop *loop = NULL;
	assert_int_equal(perch_loop_new(&o, &loop), 0);
	return loop;
}

static void count_run(void *arg)
{
	(*(int *)arg)++;
}

/* On this thread: a posted function runs in one turn (the ring's eventfd read completes through io_uring_enter). */
static void serves_a_post(struct perch_loop *loop)
{
	int ran = 0;
	assert_int_equal(perch_loop_post(loop, count_run, &ran), 0);
	for (int i = 0; i < 100 && !ran; i++)
		assert_true(perch_loop_run_once(loop, 100) >= 0);
	assert_int_equal(ran, 1);
}

static uint64_t registered(struct perch_loop *loop)
{
	struct perch_loop_stats st;
	assert_int_equal(perch_loop_stats(loop, &st), 0);
	return st.ring_fd_registered;
}

/* 64 KiB through an echo server on `l`, from a plain socket. */
static void echoes(struct lu_loop *l)
{
	enum { N = 64 * 1024 };
	struct lu_echo_stats stats = { 0 };
	struct perch_listener *ls;
	assert_int_equal(perch_listen(l->loop, "127.0.0.1", 0, NULL, lu_echo_accept, &stats, &ls), 0);
	int fd = lu_plain_connect_to(ls);
	assert_true(fd >= 0);
	uint8_t *out = malloc(N), *in = malloc(N);
	lu_fill(out, N);
	assert_true(lu_write_all(fd, out, N));
	assert_true(lu_read_all(fd, in, N));
	assert_memory_equal(in, out, N);
	close(fd);
	assert_int_equal(perch_listener_close(ls), 0);
	free(out);
	free(in);
}

static void a_loop_registers_its_ring_fd_at_its_first_turn(void **state)
{
	(void)state;
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	assert_int_equal(lu_start(&l, &o), 0);
	echoes(&l);
	assert_int_equal(lu_stats(&l).ring_fd_registered, 1);
	assert_int_equal(lu_stop(&l), 0);
}

static void a_refused_registration_keeps_the_plain_fd(void **state)
{
	(void)state;
	__atomic_store_n(&refuse_registration, true, __ATOMIC_RELEASE);
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	assert_int_equal(lu_start(&l, &o), 0);
	echoes(&l);
	assert_int_equal(lu_stats(&l).ring_fd_registered, 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* A thread's table has 16 entries: a free on the thread gives its entry back for the next loop. */
static void loops_made_and_freed_one_after_another_each_register(void **state)
{
	(void)state;
	for (int i = 0; i < 40; i++) {
		struct perch_loop *loop = new_uring_loop();
		serves_a_post(loop);
		assert_int_equal(registered(loop), 1);
		perch_loop_free(loop);
	}
}

static void a_thread_with_its_table_full_runs_more_loops_unregistered(void **state)
{
	(void)state;
	enum { LOOPS = 20 };
	struct perch_loop *loops[LOOPS];
	uint64_t n = 0;
	for (int i = 0; i < LOOPS; i++) {
		loops[i] = new_uring_loop();
		serves_a_post(loops[i]);
		n += registered(loops[i]);
	}
	assert_int_equal(n, 16);
	for (int i = 0; i < LOOPS; i++)
		serves_a_post(loops[i]);
	for (int i = 0; i < LOOPS; i++)
		perch_loop_free(loops[i]);
}

/* The other thread's turn: no cmocka assert off the test's thread, what it saw is checked after the join. */
struct their_turn {
	struct perch_loop *loop;
	int ran;
	struct perch_loop_stats st;
	int stats_rc;
};

static void *run_a_turn(void *arg)
{
	struct their_turn *t = arg;
	if (perch_loop_post(t->loop, count_run, &t->ran) == 0)
		for (int i = 0; i < 100 && !t->ran; i++)
			if (perch_loop_run_once(t->loop, 100) < 0)
				break;
	t->stats_rc = perch_loop_stats(t->loop, &t->st);
	return NULL;
}

/*
 * On rings any thread may use (no SINGLE_ISSUER), a loop whose thread has
 * ended, freed from this thread, must not drop this thread's registration
 * at the same index, another loop's.
 */
static void a_free_off_the_loops_thread_keeps_the_freeing_threads_registration(void **state)
{
	(void)state;
	__atomic_store_n(&plain_rings, true, __ATOMIC_RELEASE);
	struct perch_loop *mine = new_uring_loop(), *theirs = new_uring_loop();
	serves_a_post(mine);
	assert_int_equal(registered(mine), 1);
	struct their_turn t = { .loop = theirs };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, run_a_turn, &t), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(t.ran, 1);
	assert_int_equal(t.stats_rc, 0);
	assert_int_equal(t.st.ring_fd_registered, 1);
	perch_loop_free(theirs);
	serves_a_post(mine);
	assert_int_equal(registered(mine), 1);
	perch_loop_free(mine);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(a_loop_registers_its_ring_fd_at_its_first_turn, disarm),
		cmocka_unit_test_teardown(a_refused_registration_keeps_the_plain_fd, disarm),
		cmocka_unit_test_teardown(loops_made_and_freed_one_after_another_each_register, disarm),
		cmocka_unit_test_teardown(a_thread_with_its_table_full_runs_more_loops_unregistered, disarm),
		cmocka_unit_test_teardown(a_free_off_the_loops_thread_keeps_the_freeing_threads_registration, disarm),
	};
	return cmocka_run_group_tests_name("io_uring registered ring fd", tests, NULL, NULL);
}
