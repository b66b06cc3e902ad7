/* tests/test_timer.c: perch_timer, one behaviour per test, each run on io_uring and on epoll. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <perch.h>

#include "backend.h" /* the loop's stats: timer_walk_steps */
#include "loop_internal.h" /* perch__timer_arm_at: a due time, as a connect arms its deadline */
#include "both_backends.h"

static enum perch_backend backend;

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static struct perch_loop *new_loop(void)
{
	struct perch_loop_opts o = { .backend = backend };
	struct perch_loop *loop = NULL;
	assert_int_equal(perch_loop_new(&o, &loop), 0);
	return loop;
}

/* Runs turns on this thread for `ms` (each at most 10 ms), or until *stop is set. */
static void run_for(struct perch_loop *loop, int ms, const int *stop)
{
	double end = mono_ms() + ms;
	while (mono_ms() < end && !(stop && *stop))
		assert_true(perch_loop_run_once(loop, 10) >= 0);
}

/* What a fired timer records: how many times, when, and in what order among others. */
struct firing {
	int count;
	double at_ms[8];
	int order[8];
	int *next_order;             /* shared by the timers of one test */
	int id;
	pthread_t thread;
	sem_t *fired;                /* posted after recording, when set */
};

static void record(struct perch_timer *t, void *arg)
{
	struct firing *f = arg;
	if (f->count < 8) {
		f->at_ms[f->count] = mono_ms();
		f->order[f->count] = f->next_order ? (*f->next_order)++ : 0;
	}
	f->thread = pthread_self();
	f->count++;
}

static void a_timer_fires_once_after_its_time_and_never_before(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t;
	struct firing f = { 0 };
	assert_int_equal(perch_timer_init(&t, loop, record, &f), 0);
	assert_false(perch_timer_is_armed(&t));
	double start = mono_ms();
	assert_int_equal(perch_timer_start(&t, 50), 0);
	assert_true(perch_timer_is_armed(&t));
	run_for(loop, 2000, &f.count);
	assert_int_equal(f.count, 1);
	assert_true(f.at_ms[0] - start >= 50.0);
	assert_false(perch_timer_is_armed(&t));
	run_for(loop, 100, NULL);
	assert_int_equal(f.count, 1);
	perch_loop_free(loop);
}

/* A helper thread wakes the loop after 2 s: only a turn that ignores the timer would wait that long. */
static void *wake_after_2s(void *arg)
{
	usleep(2000 * 1000);
	perch_loop_stop(arg);
	return NULL;
}

static void a_turn_with_no_limit_sleeps_only_until_the_soonest_timer(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t;
	struct firing f = { 0 };
	perch_timer_init(&t, loop, record, &f);
	assert_int_equal(perch_loop_run_once(loop, 0), 0); /* this thread owns the loop */
	pthread_t waker;
	assert_int_equal(pthread_create(&waker, NULL, wake_after_2s, loop), 0);
	double start = mono_ms();
	assert_int_equal(perch_timer_start(&t, 30), 0);
	for (int turns = 0; f.count == 0 && turns < 10; turns++)
		assert_true(perch_loop_run_once(loop, -1) >= 0);
	double took = mono_ms() - start;
	assert_int_equal(f.count, 1);
	assert_true(took >= 30.0);
	assert_true(took < 1000.0);
	pthread_join(waker, NULL);
	perch_loop_free(loop);
}

static void timers_fire_by_due_time_and_same_durations_in_start_order(void **state)
{
	struct perch_loop *loop = new_loop();
	static const unsigned ms[] = { 60, 20, 40, 40, 0 };
	struct perch_timer t[5];
	struct firing f[5];
	int next = 0, done = 0;
	for (int i = 0; i < 5; i++) {
		f[i] = (struct firing){ .next_order = &next, .id = i };
		perch_timer_init(&t[i], loop, record, &f[i]);
		assert_int_equal(perch_timer_start(&t[i], ms[i]), 0);
	}
	double end = mono_ms() + 2000;
	while (!done && mono_ms() < end) {
		assert_true(perch_loop_run_once(loop, 10) >= 0);
		done = f[0].count > 0;
	}
	static const int want_order[] = { 4, 1, 2, 3, 0 }; /* by timer: when it fired among the five */
	for (int i = 0; i < 5; i++) {
		assert_int_equal(f[i].count, 1);
		assert_int_equal(f[i].order[0], want_order[i]);
	}
	perch_loop_free(loop);
}

/*
 * Twelve durations (more than the loop keeps a list each for) three times
 * over, started in a scrambled order and all due before one turn runs
 * them: they run by due time, and each duration's three in start order.
 */
static void timers_of_many_durations_due_in_one_turn_run_in_due_order(void **state)
{
	enum { DURATIONS = 12, EACH = 3, N = DURATIONS * EACH };
	struct perch_loop *loop = new_loop();
	struct perch_timer t[N];
	struct firing f[N];
	int next = 0;
	for (int k = 0; k < N; k++) {
		int i = (k * 7) % N; /* 7 is prime to 36: every timer once, durations interleaved */
		f[i] = (struct firing){ .next_order = &next, .id = i };
		perch_timer_init(&t[i], loop, record, &f[i]);
		assert_int_equal(perch_timer_start(&t[i], 10u * (unsigned)(1 + i % DURATIONS)), 0);
	}
	usleep((10 * DURATIONS + 30) * 1000);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	/* Expected rank: by duration, then by start order within it (k = i * 31 mod 36 undoes the scramble). */
	for (int i = 0; i < N; i++) {
		assert_int_equal(f[i].count, 1);
		int earlier = 0;
		for (int j = 0; j < N; j++) {
			int dj = j % DURATIONS, di = i % DURATIONS;
			if (dj < di || (dj == di && (j * 31) % N < (i * 31) % N))
				earlier++;
		}
		assert_int_equal(f[i].order[0], earlier);
	}
	perch_loop_free(loop);
}

/*
 * The proxy's mix: an idle timeout per session and a shorter connect
 * timeout per new client. Each duration has its list, so no start walks
 * past a timer to find its place (one list for all walked past every
 * idle timeout for each connect timeout).
 */
static void a_start_among_many_timers_of_another_duration_walks_past_none(void **state)
{
	enum { IDLE = 1000 };
	struct perch_loop *loop = new_loop();
	struct perch_timer *idle = calloc(IDLE, sizeof(*idle)), connect;
	struct firing f = { 0 };
	assert_non_null(idle);
	for (int i = 0; i < IDLE; i++) {
		perch_timer_init(&idle[i], loop, record, &f);
		assert_int_equal(perch_timer_start(&idle[i], 60000), 0);
	}
	perch_timer_init(&connect, loop, record, &f);
	for (int i = 0; i < 100; i++) {
		assert_int_equal(perch_timer_start(&connect, 5000), 0);
		assert_int_equal(perch_timer_start(&idle[(i * 37) % IDLE], 60000), 0);
		assert_int_equal(perch_timer_stop(&connect), 0);
	}
	assert_int_equal(loop->stats.timer_walk_steps, 0);
	perch_loop_free(loop); /* unbinds the armed ones */
	free(idle);
	assert_int_equal(f.count, 0);
}

static void a_stopped_timer_does_not_fire_and_stopping_twice_is_harmless(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t, never_started;
	struct firing f = { 0 };
	perch_timer_init(&t, loop, record, &f);
	perch_timer_init(&never_started, loop, record, &f);
	assert_int_equal(perch_timer_start(&t, 20), 0);
	assert_int_equal(perch_timer_stop(&t), 0);
	assert_false(perch_timer_is_armed(&t));
	assert_int_equal(perch_timer_stop(&t), 0);
	assert_int_equal(perch_timer_stop(&never_started), 0);
	run_for(loop, 80, NULL);
	assert_int_equal(f.count, 0);
	perch_loop_free(loop);
}

static void starting_an_armed_timer_again_replaces_its_time(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t;
	struct firing f = { 0 };
	perch_timer_init(&t, loop, record, &f);
	double start = mono_ms();
	assert_int_equal(perch_timer_start(&t, 20), 0);
	assert_int_equal(perch_timer_start(&t, 120), 0);
	run_for(loop, 2000, &f.count);
	assert_int_equal(f.count, 1);
	assert_true(f.at_ms[0] - start >= 120.0);
	run_for(loop, 50, NULL);
	assert_int_equal(f.count, 1); /* once: the first start left nothing behind */
	perch_loop_free(loop);
}

/*
 * Three timers of one duration; the first is started again before any
 * turn: it leaves its place at the head for the end, so the other two fire
 * before it.
 */
static void restarting_the_first_of_three_of_a_duration_moves_it_last(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t[3];
	struct firing f[3];
	int next = 0;
	for (int i = 0; i < 3; i++) {
		f[i] = (struct firing){ .next_order = &next, .id = i };
		perch_timer_init(&t[i], loop, record, &f[i]);
		assert_int_equal(perch_timer_start(&t[i], 30), 0);
	}
	assert_int_equal(perch_timer_start(&t[0], 30), 0); /* no turn between: none can have fired */
	run_for(loop, 2000, &f[0].count);
	for (int i = 0; i < 3; i++)
		assert_int_equal(f[i].count, 1);
	assert_int_equal(f[1].order[0], 0);
	assert_int_equal(f[2].order[0], 1);
	assert_int_equal(f[0].order[0], 2);
	perch_loop_free(loop);
}

/*
 * A connect's deadline is armed as a due time, which may come before that
 * of the timer ahead of it on its duration's list (it was reckoned on
 * another thread): arming it there must not leave it behind a later one.
 */
static void a_restart_due_before_the_timer_ahead_of_it_fires_first(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer a, b;
	struct firing fa = { 0 }, fb = { 0 };
	perch_timer_init(&a, loop, record, &fa);
	perch_timer_init(&b, loop, record, &fb);
	assert_int_equal(perch_timer_start(&a, 5000), 0);
	assert_int_equal(perch_timer_start(&b, 5000), 0);
	perch__timer_arm_at(&b, perch__now_ms() + 10, 5000);
	run_for(loop, 2000, &fb.count);
	assert_int_equal(fb.count, 1);
	assert_int_equal(fa.count, 0);
	perch_timer_stop(&a);
	perch_loop_free(loop);
}

/* Restarts itself for 0 ms, five times in all. */
static void restart_for_0_ms(struct perch_timer *t, void *arg)
{
	struct firing *f = arg;
	record(t, arg);
	if (f->count < 5)
		assert_int_equal(perch_timer_start(t, 0), 0);
}

static void a_callback_restarting_its_timer_for_0_ms_fires_it_once_a_turn(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t;
	struct firing f = { 0 };
	perch_timer_init(&t, loop, restart_for_0_ms, &f);
	assert_int_equal(perch_timer_start(&t, 0), 0);
	for (int turn = 1; turn <= 5; turn++) {
		assert_true(perch_loop_run_once(loop, 1000) >= 0);
		assert_int_equal(f.count, turn);
	}
	assert_false(perch_timer_is_armed(&t));
	perch_loop_free(loop);
}

/* The first of two due timers stops the second, which waits in the same expiry, and frees itself. */
struct stopper {
	struct perch_timer *victim;
	int fired;
};

static void stop_the_other_and_free_self(struct perch_timer *t, void *arg)
{
	struct stopper *s = arg;
	s->fired++;
	assert_int_equal(perch_timer_stop(s->victim), 0);
	free(t);
}

static void a_callback_may_stop_another_due_timer_and_free_its_own(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer *first = malloc(sizeof(*first)), second;
	struct firing f = { 0 };
	struct stopper s = { .victim = &second };
	perch_timer_init(first, loop, stop_the_other_and_free_self, &s);
	perch_timer_init(&second, loop, record, &f);
	assert_int_equal(perch_timer_start(first, 10), 0);
	assert_int_equal(perch_timer_start(&second, 10), 0);
	usleep(30 * 1000); /* both are due before the next turn's expiry */
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_int_equal(s.fired, 1);
	assert_false(perch_timer_is_armed(&second));
	run_for(loop, 50, NULL);
	assert_int_equal(f.count, 0);
	perch_loop_free(loop);
}

/* ---- threads ---- */

struct off_thread {
	struct perch_timer *t;
	int start_rc, stop_rc;
};

static void *start_and_stop_here(void *arg)
{
	struct off_thread *o = arg;
	o->start_rc = perch_timer_start(o->t, 10);
	o->stop_rc = perch_timer_stop(o->t);
	return NULL;
}

static void start_and_stop_off_the_owning_thread_are_refused_with_eexist(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer idle, armed;
	struct firing f = { 0 }, g = { 0 };
	perch_timer_init(&idle, loop, record, &f);
	perch_timer_init(&armed, loop, record, &g);
	assert_int_equal(perch_timer_start(&armed, 40), 0); /* claims the loop for this thread */
	struct off_thread o = { .t = &idle };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, start_and_stop_here, &o), 0);
	pthread_join(th, NULL);
	assert_int_equal(o.start_rc, -EEXIST);
	assert_int_equal(o.stop_rc, -EEXIST);
	o = (struct off_thread){ .t = &armed };
	assert_int_equal(pthread_create(&th, NULL, start_and_stop_here, &o), 0);
	pthread_join(th, NULL);
	assert_int_equal(o.stop_rc, -EEXIST);
	assert_true(perch_timer_is_armed(&armed)); /* the refused stop left it armed */
	run_for(loop, 2000, &g.count);
	assert_int_equal(g.count, 1);
	assert_int_equal(f.count, 0);
	perch_loop_free(loop);
}

/* Posted to a loop running on its own thread: starts the timer there (the test thread checks the result). */
static int posted_start_rc = 1;

static void start_posted(void *arg)
{
	posted_start_rc = perch_timer_start(arg, 5);
}

static void fired_then_post(struct perch_timer *t, void *arg)
{
	struct firing *f = arg;
	record(t, arg);
	sem_post(f->fired);
}

static void *run_loop(void *arg)
{
	perch_loop_run(arg);
	perch_loop_free(arg);
	return NULL;
}

static void a_timer_started_from_posted_work_fires_on_the_loop_thread(void **state)
{
	struct perch_loop *loop = new_loop();
	sem_t fired;
	sem_init(&fired, 0, 0);
	struct firing f = { .fired = &fired };
	struct perch_timer t;
	perch_timer_init(&t, loop, fired_then_post, &f);
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, run_loop, loop), 0);
	assert_int_equal(perch_loop_post(loop, start_posted, &t), 0);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	int rc;
	while ((rc = sem_timedwait(&fired, &ts)) != 0 && errno == EINTR)
		;
	assert_int_equal(rc, 0);
	assert_int_equal(posted_start_rc, 0);
	assert_true(pthread_equal(f.thread, th));
	perch_loop_stop(loop);
	pthread_join(th, NULL);
	assert_int_equal(f.count, 1);
	sem_destroy(&fired);
}

/* ---- the turn's clock (perch__loop_now_ms: a session's idle restart reads it) ---- */

static void spin_ms(double ms)
{
	double end = mono_ms() + ms;
	while (mono_ms() < end)
		;
}

/* What posted work saw of the turn's clock, and the true time around it. */
struct clock_seen {
	struct perch_loop *loop;
	double first, second;        /* the turn's clock, twice, 5 ms apart */
	double true_after;           /* mono_ms() after the second */
	double posted_at;            /* mono_ms() just before the post */
	int runs;
};

static void read_turn_clock_twice(void *arg)
{
	struct clock_seen *c = arg;
	c->first = perch__loop_now_ms(c->loop);
	spin_ms(5);
	c->second = perch__loop_now_ms(c->loop);
	c->true_after = mono_ms();
	c->runs++;
}

static void never(struct perch_timer *t, void *arg)
{
	(void)t;
	fail_msg("a 10 s timer fired (arg %p)", arg);
}

/* A far timer: each turn reads the clock for its sleep before the wait, and the expiry after it. */
static void arm_far_timer(struct perch_timer *t, struct perch_loop *loop)
{
	perch_timer_init(t, loop, never, NULL);
	assert_int_equal(perch_timer_start(t, 10000), 0);
}

static void a_turn_reads_its_clock_once_and_outside_a_turn_it_is_fresh(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer far;
	arm_far_timer(&far, loop); /* the turn ends with a clock kept: outside a turn it must not serve */
	struct clock_seen c = { .loop = loop };
	assert_int_equal(perch_loop_post(loop, read_turn_clock_twice, &c), 0);
	while (c.runs == 0)
		assert_true(perch_loop_run_once(loop, 10) >= 0);
	assert_true(c.first == c.second); /* one read serves the turn */
	assert_true(c.true_after - c.second >= 5.0);
	double before = perch__loop_now_ms(loop);
	spin_ms(2);
	assert_true(perch__loop_now_ms(loop) - before >= 2.0); /* no turn runs: each call reads */
	perch_timer_stop(&far);
	perch_loop_free(loop);
}

struct post_later {
	struct perch_loop *loop;
	struct clock_seen *c;
};

static void *post_after_100_ms(void *arg)
{
	struct post_later *p = arg;
	usleep(100 * 1000);
	p->c->posted_at = mono_ms();
	assert_int_equal(perch_loop_post(p->loop, read_turn_clock_twice, p->c), 0);
	return NULL;
}

/*
 * Work the wait woke for sees the clock read after the wait, not the one
 * the turn read for its sleep. Three times: a thread kept off its CPU for
 * the poster's 100 ms would take the post in its next turn's drain
 * instead, where any clock is fresh.
 */
static void work_after_a_wait_sees_the_clock_after_it(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer far;
	arm_far_timer(&far, loop);
	assert_int_equal(perch_loop_run_once(loop, 0), 0); /* the thread owns the loop before the poster posts */
	for (int i = 0; i < 3; i++) {
		struct clock_seen c = { .loop = loop };
		struct post_later p = { loop, &c };
		pthread_t th;
		assert_int_equal(pthread_create(&th, NULL, post_after_100_ms, &p), 0);
		double end = mono_ms() + 5000;
		while (c.runs == 0 && mono_ms() < end)
			assert_true(perch_loop_run_once(loop, 2000) >= 0);
		pthread_join(th, NULL);
		assert_int_equal(c.runs, 1);
		assert_true(c.first >= c.posted_at);
	}
	perch_timer_stop(&far);
	perch_loop_free(loop);
}

/* A turn's first work (the inbox, before any wait) never sees the clock the last turn kept. */
static void a_turn_never_starts_with_the_last_turns_clock(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer far;
	arm_far_timer(&far, loop);
	assert_true(perch_loop_run_once(loop, 0) >= 0); /* its expiry keeps a clock read after the wait */
	usleep(50 * 1000);
	struct clock_seen c = { .loop = loop, .posted_at = mono_ms() };
	assert_int_equal(perch_loop_post(loop, read_turn_clock_twice, &c), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 1);
	assert_int_equal(c.runs, 1);
	assert_true(c.first >= c.posted_at);
	perch_timer_stop(&far);
	perch_loop_free(loop);
}

struct nested {
	struct perch_loop *outer, *inner;
	struct perch_timer inner_timer;
	double before, started;      /* the outer turn's clock, and the true time, before the inner run */
	double inner_saw;            /* the outer turn's clock as the inner loop's timer callback read it */
	double after;                /* the outer turn's clock after the inner run */
	int runs, inner_runs;
};

static void inner_fired(struct perch_timer *t, void *arg)
{
	struct nested *n = arg;
	n->inner_saw = perch__loop_now_ms(n->outer);
	n->inner_runs++;
}

/* A callback of the outer loop runs the inner loop's turns until its 100 ms timer fires. */
static void run_another_loops_turns(void *arg)
{
	struct nested *n = arg;
	n->before = perch__loop_now_ms(n->outer);
	n->started = mono_ms();
	perch_timer_init(&n->inner_timer, n->inner, inner_fired, n);
	if (perch_timer_start(&n->inner_timer, 100) == 0)
		for (double end = mono_ms() + 2000; n->inner_runs == 0 && mono_ms() < end;)
			perch_loop_run_once(n->inner, 500);
	n->after = perch__loop_now_ms(n->outer);
	n->runs++;
}

/*
 * A callback that runs another loop's turns waited in them: from the
 * inner loop's own callbacks after its wait, and after it, the outer
 * turn's clock is read again.
 */
static void a_turn_reads_its_clock_again_after_another_loops_turn_inside_it(void **state)
{
	struct nested n = { .outer = new_loop(), .inner = new_loop() };
	assert_int_equal(perch_loop_post(n.outer, run_another_loops_turns, &n), 0);
	while (n.runs == 0)
		assert_true(perch_loop_run_once(n.outer, 10) >= 0);
	assert_int_equal(n.inner_runs, 1);
	assert_true(n.inner_saw >= n.started + 100.0);
	assert_true(n.after - n.before >= 100.0);
	perch_loop_free(n.inner);
	perch_loop_free(n.outer);
}

static void never_accepts(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	perch_conn_release(c);
}

struct nested_free {
	struct perch_loop *outer, *inner;
	double kept, after;          /* the outer turn's clock before and after the inner loop's free */
	int runs;
};

/* A callback of the outer loop keeps its turn's clock, works 20 ms, then frees the inner loop. */
static void free_another_loop(void *arg)
{
	struct nested_free *n = arg;
	n->kept = perch__loop_now_ms(n->outer);
	spin_ms(20); /* no wait: the outer turn keeps its clock */
	perch_loop_free(n->inner); /* its listener's close keeps the free polling */
	n->after = perch__loop_now_ms(n->outer);
	n->runs++;
}

/* A callback that frees another loop waited in its polls: its own turn reads the clock again. */
static void a_turn_reads_its_clock_again_after_another_loops_free_inside_it(void **state)
{
	struct nested_free n = { .outer = new_loop(), .inner = new_loop() };
	struct perch_listener *ls;
	assert_int_equal(perch_listen(n.inner, "127.0.0.1", 0, NULL, never_accepts, NULL, &ls), 0);
	assert_true(perch_loop_run_once(n.inner, 0) >= 0); /* the listener is in its table */
	assert_int_equal(perch_loop_post(n.outer, free_another_loop, &n), 0);
	while (n.runs == 0)
		assert_true(perch_loop_run_once(n.outer, 10) >= 0);
	assert_true(n.after - n.kept >= 20.0);
	perch_loop_free(n.outer);
}

struct late_start {
	struct perch_loop *loop;
	struct perch_timer *t;
	double started_at;           /* mono_ms() just before perch_timer_start */
};

static void start_after_busy_work(void *arg)
{
	struct late_start *ls = arg;
	(void)perch__loop_now_ms(ls->loop); /* the turn keeps the clock of now */
	spin_ms(50);
	ls->started_at = mono_ms();
	assert_int_equal(perch_timer_start(ls->t, 100), 0);
}

/* perch_timer_start reads the clock itself: late in a long turn, a timer is still never early. */
static void a_timer_started_late_in_a_long_turn_is_never_early(void **state)
{
	struct perch_loop *loop = new_loop();
	struct firing f = { 0 };
	struct perch_timer t;
	perch_timer_init(&t, loop, record, &f);
	struct late_start ls = { loop, &t, 0 };
	assert_int_equal(perch_loop_post(loop, start_after_busy_work, &ls), 0);
	run_for(loop, 2000, &f.count);
	assert_int_equal(f.count, 1);
	assert_true(f.at_ms[0] - ls.started_at >= 100.0);
	perch_loop_free(loop);
}

/* ---- the end of a loop, and bad input ---- */

struct at_free {
	struct perch_timer *t;
	int start_rc;
};

static void start_while_freeing(void *arg)
{
	struct at_free *a = arg;
	a->start_rc = perch_timer_start(a->t, 0);
}

static void timers_never_fire_once_the_loop_is_freed_and_are_unbound_by_it(void **state)
{
	enum { DURATIONS = 12 }; /* more than have a list each: the shared list is unbound too */
	struct perch_loop *loop = new_loop();
	struct perch_timer armed, late, many[DURATIONS];
	struct firing f = { 0 }, g = { 0 }, h = { 0 };
	perch_timer_init(&armed, loop, record, &f);
	perch_timer_init(&late, loop, record, &g);
	for (int i = 0; i < DURATIONS; i++) {
		perch_timer_init(&many[i], loop, record, &h);
		assert_int_equal(perch_timer_start(&many[i], 60000u + (unsigned)i), 0);
	}
	assert_int_equal(perch_timer_start(&armed, 0), 0);
	/* A listener keeps the free polling for its close, where a timer must not run either. */
	struct perch_listener *ls;
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, NULL, never_accepts, NULL, &ls), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_int_equal(f.count, 1);
	assert_int_equal(perch_timer_start(&armed, 0), 0);
	struct at_free a = { .t = &late, .start_rc = 1 };
	assert_int_equal(perch_loop_post(loop, start_while_freeing, &a), 0);
	perch_loop_free(loop); /* runs the posted work, not the timers */
	assert_int_equal(a.start_rc, -ECANCELED);
	assert_int_equal(f.count, 1);
	assert_int_equal(g.count, 0);
	assert_false(perch_timer_is_armed(&late));
	/* The armed one was disarmed and unbound: calls on it are refused, not sent to the freed loop. */
	assert_false(perch_timer_is_armed(&armed));
	assert_int_equal(perch_timer_stop(&armed), -EINVAL);
	assert_int_equal(perch_timer_start(&armed, 10), -EINVAL);
	for (int i = 0; i < DURATIONS; i++) {
		assert_false(perch_timer_is_armed(&many[i]));
		assert_int_equal(perch_timer_stop(&many[i]), -EINVAL);
	}
	assert_int_equal(h.count, 0);
}

static void bad_arguments_return_einval_and_change_nothing(void **state)
{
	struct perch_loop *loop = new_loop();
	struct perch_timer t, zeroed = { 0 };
	struct firing f = { 0 };
	assert_int_equal(perch_timer_init(NULL, loop, record, &f), -EINVAL);
	assert_int_equal(perch_timer_init(&t, NULL, record, &f), -EINVAL);
	assert_int_equal(perch_timer_init(&t, loop, NULL, &f), -EINVAL);
	assert_int_equal(perch_timer_start(NULL, 1), -EINVAL);
	assert_int_equal(perch_timer_stop(NULL), -EINVAL);
	assert_int_equal(perch_timer_start(&zeroed, 1), -EINVAL);
	assert_int_equal(perch_timer_stop(&zeroed), -EINVAL);
	assert_false(perch_timer_is_armed(NULL));
	assert_int_equal(perch_timer_init(&t, loop, record, &f), 0);
	double start = mono_ms();
	assert_int_equal(perch_timer_start(&t, 40), 0);
	assert_int_equal(perch_timer_start(&t, PERCH_TIMER_MAX_MS + 1), -EINVAL);
	assert_true(perch_timer_is_armed(&t)); /* still armed for its 40 ms */
	run_for(loop, 2000, &f.count);
	assert_int_equal(f.count, 1);
	assert_true(f.at_ms[0] - start >= 40.0);
	assert_true(f.at_ms[0] - start < 1000.0);
	assert_int_equal(perch_timer_start(&t, PERCH_TIMER_MAX_MS), 0);
	assert_int_equal(perch_timer_stop(&t), 0);
	perch_loop_free(loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_timer_fires_once_after_its_time_and_never_before),
		cmocka_unit_test(a_turn_with_no_limit_sleeps_only_until_the_soonest_timer),
		cmocka_unit_test(timers_fire_by_due_time_and_same_durations_in_start_order),
		cmocka_unit_test(timers_of_many_durations_due_in_one_turn_run_in_due_order),
		cmocka_unit_test(a_start_among_many_timers_of_another_duration_walks_past_none),
		cmocka_unit_test(a_stopped_timer_does_not_fire_and_stopping_twice_is_harmless),
		cmocka_unit_test(starting_an_armed_timer_again_replaces_its_time),
		cmocka_unit_test(restarting_the_first_of_three_of_a_duration_moves_it_last),
		cmocka_unit_test(a_restart_due_before_the_timer_ahead_of_it_fires_first),
		cmocka_unit_test(a_callback_restarting_its_timer_for_0_ms_fires_it_once_a_turn),
		cmocka_unit_test(a_callback_may_stop_another_due_timer_and_free_its_own),
		cmocka_unit_test(start_and_stop_off_the_owning_thread_are_refused_with_eexist),
		cmocka_unit_test(a_timer_started_from_posted_work_fires_on_the_loop_thread),
		cmocka_unit_test(a_turn_reads_its_clock_once_and_outside_a_turn_it_is_fresh),
		cmocka_unit_test(work_after_a_wait_sees_the_clock_after_it),
		cmocka_unit_test(a_turn_never_starts_with_the_last_turns_clock),
		cmocka_unit_test(a_turn_reads_its_clock_again_after_another_loops_turn_inside_it),
		cmocka_unit_test(a_turn_reads_its_clock_again_after_another_loops_free_inside_it),
		cmocka_unit_test(a_timer_started_late_in_a_long_turn_is_never_early),
		cmocka_unit_test(timers_never_fire_once_the_loop_is_freed_and_are_unbound_by_it),
		cmocka_unit_test(bad_arguments_return_einval_and_change_nothing),
	};
	return RUN_ON_BOTH_BACKENDS("timer", tests, backend);
}
