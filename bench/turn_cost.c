/* bench/turn_cost.c: what an io_uring loop's turn costs with its ring's fd registered and with the registration refused, in a process whose file table is shared.
 *
 *   make -C BUILD bench/turn_cost
 *   BUILD/bench/turn_cost [TURNS [ROUNDS]]      (defaults: 200000 turns, 7 rounds)
 *
 * An io_uring loop on this thread, and a second thread that only waits, as
 * a server's loop thread and main thread do: the process's file table is
 * then shared, and each fd lookup takes a reference. Each round runs the
 * loop twice with perch_loop_run for TURNS turns, a timer restarted at 0 ms
 * from its own callback making each turn one io_uring_enter that does not
 * wait: once as it is (the run registers the ring's fd), once with the
 * registration refused (the program links with
 * -Wl,--wrap=io_uring_register_ring_fd). CLOCK_MONOTONIC around each run;
 * the medians per turn are printed.
 *
 * A wall-clock figure on a shared machine: compare the two columns of one run.
 */
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <perch.h>

#include "bench_util.h"

static bool refuse; /* the run about to start has its registration refused */

int __real_io_uring_register_ring_fd(struct io_uring *ring);

int __wrap_io_uring_register_ring_fd(struct io_uring *ring)
{
	return refuse ? -EINVAL : __real_io_uring_register_ring_fd(ring);
}

/* A run's turns: the timer's callback counts them, and restarts it or stops the loop. */
struct turns {
	struct perch_timer t;
	struct perch_loop *loop;
	long left;
	uint64_t registered; /* perch_loop_stats' word, read in the run */
	int rc;
};

static void turned(struct perch_timer *t, void *arg)
{
	struct turns *k = arg;
	if (--k->left > 0) {
		k->rc = perch_timer_start(t, 0);
		if (k->rc == 0)
			return;
	}
	struct perch_loop_stats st;
	if (perch_loop_stats(k->loop, &st) == 0)
		k->registered = st.ring_fd_registered;
	perch_loop_stop(k->loop);
}

/* ns per turn of a run of `turns`, registered or refused; -1 on a failure. */
static double run_ns(struct perch_loop *loop, long turns, bool refused, uint64_t *registered)
{
	struct turns k = { .loop = loop, .left = turns };
	if (perch_timer_init(&k.t, loop, turned, &k) != 0 || perch_timer_start(&k.t, 0) != 0)
		return -1;
	refuse = refused;
	uint64_t t0 = bu_now_ns();
	int rc = perch_loop_run(loop);
	double ns = (double)(bu_now_ns() - t0) / (double)turns;
	refuse = false;
	*registered = k.registered;
	return rc == 0 && k.rc == 0 && k.left == 0 ? ns : -1;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long turns = argc > 1 ? atol(argv[1]) : 200000, rounds = argc > 2 ? atol(argv[2]) : 7;
	if (turns < 1 || rounds < 1 || rounds > 99) {
		fprintf(stderr, "usage: turn_cost [TURNS [ROUNDS]] (TURNS at least 1, ROUNDS 1 to 99)\n");
		return 2;
	}
	if (bu_second_thread() != 0) {
		fprintf(stderr, "turn_cost: no second thread\n");
		return 1;
	}
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .buf_count = 64 };
	struct perch_loop *loop;
	if (perch_loop_new(&o, &loop) != 0 || strcmp(perch_loop_backend_name(loop), "io_uring") != 0) {
		fprintf(stderr, "turn_cost: no io_uring loop here\n");
		return 1;
	}
	double ns_on[99], ns_off[99];
	uint64_t reg_on = 0, reg_off = 1;
	int rc = 0;
	for (long r = 0; r < rounds; r++) {
		ns_on[r] = run_ns(loop, turns, false, &reg_on);
		ns_off[r] = run_ns(loop, turns, true, &reg_off);
		if (ns_on[r] < 0 || ns_off[r] < 0 || reg_off != 0) {
			fprintf(stderr, "turn_cost: a run failed (or the refusal did not take)\n");
			rc = 1;
			goto out;
		}
	}
	qsort(ns_on, (size_t)rounds, sizeof(double), by_value);
	qsort(ns_off, (size_t)rounds, sizeof(double), by_value);
	printf("turns that do not wait, %ld per run, %ld rounds, medians (ns per turn)\n", turns, rounds);
	printf("  ring fd registered (ring_fd_registered %llu): %8.1f\n", (unsigned long long)reg_on,
	       ns_on[rounds / 2]);
	printf("  registration refused:                 %8.1f\n", ns_off[rounds / 2]);
	printf("  saved per turn:                       %8.1f\n", ns_off[rounds / 2] - ns_on[rounds / 2]);
out:
	perch_loop_free(loop);
	return rc;
}
