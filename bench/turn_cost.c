/* bench/turn_cost.c: what an io_uring loop's turn costs with its ring's fd registered and with the registration refused, in a process whose file table is shared.
 *
 *   make -C BUILD bench/turn_cost
 *   BUILD/bench/turn_cost [TURNS [ROUNDS]]      (defaults: 200000 turns, 7 rounds)
 *
 * Two io_uring loops on this thread, one whose registration of its ring's
 * fd is refused (the program links with -Wl,--wrap=io_uring_register_ring_fd),
 * and a second thread that only waits, as a server's loop thread and main
 * thread do: the process's file table is then shared, and each fd lookup
 * takes a reference. Each round times TURNS empty turns
 * (perch_loop_run_once(loop, 0): one io_uring_enter each) of either loop,
 * in turn, with CLOCK_MONOTONIC, and the medians per turn are printed.
 *
 * A wall-clock figure on a shared machine: compare the two columns of one run.
 */
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <perch.h>

#include "bench_util.h"

static bool refuse; /* the next loop's first turn has its registration refused */

int __real_io_uring_register_ring_fd(struct io_uring *ring);

int __wrap_io_uring_register_ring_fd(struct io_uring *ring)
{
	return refuse ? -EINVAL : __real_io_uring_register_ring_fd(ring);
}

/* A loop on this thread after its first turn, registered or not as asked; NULL when the backend is not io_uring. */
static struct perch_loop *new_loop(bool refused, uint64_t *registered)
{
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .buf_count = 64 };
	struct perch_loop *loop;
	struct perch_loop_stats st;
	if (perch_loop_new(&o, &loop) != 0)
		return NULL;
	refuse = refused;
	if (perch_loop_run_once(loop, 0) < 0 || perch_loop_stats(loop, &st) != 0) {
		perch_loop_free(loop);
		return NULL;
	}
	refuse = false;
	*registered = st.ring_fd_registered;
	return loop;
}

static double turns_ns(struct perch_loop *loop, long turns)
{
	double t0 = (double)bu_now_ns();
	for (long i = 0; i < turns; i++)
		if (perch_loop_run_once(loop, 0) < 0)
			return -1;
	return ((double)bu_now_ns() - t0) / (double)turns;
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
	uint64_t reg_on = 0, reg_off = 1;
	struct perch_loop *on = new_loop(false, &reg_on), *off = new_loop(true, &reg_off);
	int rc = 0;
	if (!on || !off || reg_off != 0) {
		fprintf(stderr, "turn_cost: no io_uring loop here (or the refusal did not take)\n");
		rc = 1;
		goto out;
	}
	double ns_on[99], ns_off[99];
	for (long r = 0; r < rounds; r++) {
		ns_on[r] = turns_ns(on, turns);
		ns_off[r] = turns_ns(off, turns);
		if (ns_on[r] < 0 || ns_off[r] < 0) {
			fprintf(stderr, "turn_cost: a turn failed\n");
			rc = 1;
			goto out;
		}
	}
	qsort(ns_on, (size_t)rounds, sizeof(double), by_value);
	qsort(ns_off, (size_t)rounds, sizeof(double), by_value);
	printf("empty turns, %ld per round, %ld rounds, medians (ns per turn)\n", turns, rounds);
	printf("  ring fd registered (ring_fd_registered %llu): %8.1f\n", (unsigned long long)reg_on,
	       ns_on[rounds / 2]);
	printf("  registration refused:                 %8.1f\n", ns_off[rounds / 2]);
	printf("  saved per turn:                       %8.1f\n", ns_off[rounds / 2] - ns_on[rounds / 2]);
out:
	perch_loop_free(on);
	perch_loop_free(off);
	return rc;
}
