/* tests/test_uring_ring_fd.c: perch_loop_run registers its io_uring ring's fd in its thread's table for the run's span, and keeps the plain fd where refused. */
#include "config.h"

#include "cmocka_prelude.h"

#include <liburing.h>

#include "loop_util.h"

/*
 * Fault injection: the program links with -Wl,--wrap=io_uring_register_ring_fd.
 * Armed, the registration is refused.
 */
static bool refuse_registration; /* atomic: armed */

int __real_io_uring_register_ring_fd(struct io_uring *ring);

int __wrap_io_uring_register_ring_fd(struct io_uring *ring)
{
	if (__atomic_load_n(&refuse_registration, __ATOMIC_ACQUIRE))
		return -EINVAL;
	return __real_io_uring_register_ring_fd(ring);
}

static int disarm(void **state)
{
	(void)state;
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

/* A run on this thread: a posted function reads the stats inside it and stops it; the stats after it are read too. */
struct run_seen {
	struct perch_loop *loop;
	struct perch_loop_stats inside;
	int inside_rc;
};

static void look_and_stop(void *arg)
{
	struct run_seen *k = arg;
	k->inside_rc = perch_loop_stats(k->loop, &k->inside);
	perch_loop_stop(k->loop);
}

/* Runs `loop` here until the posted look stops it; returns ring_fd_registered inside, and *after the run's. */
static uint64_t run_here(struct perch_loop *loop, uint64_t *after)
{
	struct run_seen k = { .loop = loop, .inside_rc = 1 };
	assert_int_equal(perch_loop_post(loop, look_and_stop, &k), 0);
	assert_int_equal(perch_loop_run(loop), 0);
	assert_int_equal(k.inside_rc, 0);
	struct perch_loop_stats st;
	assert_int_equal(perch_loop_stats(loop, &st), 0);
	*after = st.ring_fd_registered;
	return k.inside.ring_fd_registered;
}

static void a_run_registers_its_ring_fd(void **state)
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

/* The kernel's table has 16 entries a thread: with all of them this thread's own, a run keeps the plain fd and serves. */
static void a_run_on_a_thread_whose_table_is_full_keeps_the_plain_fd(void **state)
{
	(void)state;
	enum { TABLE = 16 };
	struct io_uring rings[TABLE];
	int held = 0;
	for (; held < TABLE; held++) {
		assert_int_equal(io_uring_queue_init(4, &rings[held], 0), 0);
		if (io_uring_register_ring_fd(&rings[held]) != 1)
			break;
	}
	print_message("this thread holds %d registered rings\n", held);
	assert_int_equal(held, TABLE);
	struct perch_loop *loop = new_uring_loop();
	uint64_t after;
	assert_int_equal(run_here(loop, &after), 0);
	perch_loop_free(loop);
	for (int i = 0; i < held; i++)
		io_uring_queue_exit(&rings[i]);
}

/* Each run registers and lets go before it returns: runs one after another never fill the thread's table. */
static void runs_one_after_another_each_register_and_let_go(void **state)
{
	(void)state;
	uint64_t after;
	struct perch_loop *loop = new_uring_loop();
	for (int i = 0; i < 40; i++) {
		assert_int_equal(run_here(loop, &after), 1);
		assert_int_equal(after, 0);
	}
	perch_loop_free(loop);
	for (int i = 0; i < 20; i++) {
		loop = new_uring_loop();
		assert_int_equal(run_here(loop, &after), 1);
		assert_int_equal(after, 0);
		perch_loop_free(loop);
	}
}

/* The run's thread: runs the loop, says it returned, then lives on until told to end (a pool thread). */
struct pool_thread {
	struct perch_loop *loop;
	int run_rc;
	sem_t returned, end;
};

static void *pool_thread_main(void *arg)
{
	struct pool_thread *p = arg;
	p->run_rc = perch_loop_run(p->loop);
	sem_post(&p->returned);
	while (sem_wait(&p->end) != 0)
		;
	return NULL;
}

/* Accept callback: lets the connection go, and says the listener is in the loop. */
static void accepted_and_dropped(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	(void)ls;
	perch_conn_release(c);
	sem_post(arg);
}

/*
 * A registration kept past the run would hold the ring (and its listener)
 * alive through a free made from another thread while the run's thread
 * lives: the listener would still take connections.
 */
static void a_free_off_the_runs_thread_while_it_lives_closes_the_listener(void **state)
{
	(void)state;
	struct pool_thread p = { .loop = new_uring_loop() };
	sem_init(&p.returned, 0, 0);
	sem_init(&p.end, 0, 0);
	sem_t accepted;
	sem_init(&accepted, 0, 0);
	struct perch_listener *ls;
	assert_int_equal(perch_listen(p.loop, "127.0.0.1", 0, NULL, accepted_and_dropped, &accepted, &ls), 0);
	int port = perch_listener_port(ls);
	assert_true(port > 0);
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, pool_thread_main, &p), 0);
	int fd = lu_plain_connect(port);
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&accepted, LU_TIMEOUT_MS), 0); /* the listener is in the loop, accepting */
	close(fd);
	struct run_seen k = { .loop = p.loop, .inside_rc = 1 };
	assert_int_equal(perch_loop_post(p.loop, look_and_stop, &k), 0); /* the run registered: else nothing is tested */
	assert_int_equal(lu_sem_wait(&p.returned, LU_TIMEOUT_MS), 0);
	assert_int_equal(k.inside_rc, 0);
	assert_int_equal(k.inside.ring_fd_registered, 1);
	assert_int_equal(p.run_rc, 0);
	perch_loop_free(p.loop);
	/* The ring's teardown is the kernel's work after the fd's last close: give it a moment. */
	bool refused = false;
	for (int i = 0; i < 200 && !refused; i++) {
		int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert_true(c >= 0);
		refused = lu_connect_fd(c, port) != 0 && errno == ECONNREFUSED;
		close(c);
		if (!refused)
			usleep(10000);
	}
	sem_post(&p.end);
	assert_int_equal(pthread_join(th, NULL), 0);
	sem_destroy(&p.returned);
	sem_destroy(&p.end);
	sem_destroy(&accepted);
	assert_true(refused);
}

/* Two loops on this thread: A's posted function turns B, whose posted function tries to run A again. */
struct nested {
	struct perch_loop *a, *b;
	int run_rc, run_once_rc, b_turn_rc;
};

static void b_tries_a(void *arg)
{
	struct nested *n = arg;
	n->run_rc = perch_loop_run(n->a);
	n->run_once_rc = perch_loop_run_once(n->a, 0);
}

static void a_turns_b(void *arg)
{
	struct nested *n = arg;
	if (perch_loop_post(n->b, b_tries_a, n) == 0)
		n->b_turn_rc = perch_loop_run_once(n->b, 0);
	perch_loop_stop(n->a);
}

/*
 * A's run, reached again through B's turn inside A's own: refused. Let
 * through, its registration would replace the outer run's in liburing's
 * ring, and the outer entry would outlive the run.
 */
static void a_run_inside_its_own_turn_through_another_loop_is_refused(void **state)
{
	(void)state;
	struct nested n = { .a = new_uring_loop(), .b = new_uring_loop(), .run_rc = 1, .run_once_rc = 1 };
	assert_int_equal(perch_loop_post(n.a, a_turns_b, &n), 0);
	assert_int_equal(perch_loop_run(n.a), 0);
	assert_true(n.b_turn_rc >= 1);
	assert_int_equal(n.run_rc, -EBUSY);
	assert_int_equal(n.run_once_rc, -EBUSY);
	perch_loop_free(n.b);
	perch_loop_free(n.a);
	/* No entry was left behind: this thread's 16 are all free. */
	struct io_uring rings[16];
	int held = 0;
	for (; held < 16; held++) {
		assert_int_equal(io_uring_queue_init(4, &rings[held], 0), 0);
		if (io_uring_register_ring_fd(&rings[held]) != 1) {
			io_uring_queue_exit(&rings[held]);
			break;
		}
	}
	for (int i = 0; i < held; i++)
		io_uring_queue_exit(&rings[i]);
	assert_int_equal(held, 16);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(a_run_registers_its_ring_fd, disarm),
		cmocka_unit_test_teardown(a_refused_registration_keeps_the_plain_fd, disarm),
		cmocka_unit_test_teardown(a_run_on_a_thread_whose_table_is_full_keeps_the_plain_fd, disarm),
		cmocka_unit_test_teardown(runs_one_after_another_each_register_and_let_go, disarm),
		cmocka_unit_test_teardown(a_free_off_the_runs_thread_while_it_lives_closes_the_listener, disarm),
		cmocka_unit_test_teardown(a_run_inside_its_own_turn_through_another_loop_is_refused, disarm),
	};
	return cmocka_run_group_tests_name("io_uring registered ring fd", tests, NULL, NULL);
}
