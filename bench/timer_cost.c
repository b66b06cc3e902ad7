/* bench/timer_cost.c: what a timer start costs with many timers armed: one duration, and two mixed (a proxy's idle and connect timeouts).
 *
 *   make -C BUILD bench/timer_cost
 *   BUILD/bench/timer_cost [ARMED [OPS]]      (defaults: 100000 armed, 100000 operations)
 *
 * Arms ARMED timers of 60 s on a loop this thread owns (never run: nothing
 * fires), then times OPS operations of each kind with CLOCK_MONOTONIC and
 * prints nanoseconds per operation:
 *
 *   restart-same:  perch_timer_start of one of the 60 s timers again (an
 *                  idle timeout pushed back by a request);
 *   start-stop-5s: perch_timer_start of a 5 s timer, then perch_timer_stop
 *                  (a connect timeout among idle timeouts).
 *
 * A wall-clock figure on a shared machine: compare runs side by side.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <perch.h>

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void never(struct perch_timer *t, void *arg)
{
}

int main(int argc, char **argv)
{
	long armed = argc > 1 ? atol(argv[1]) : 100000, ops = argc > 2 ? atol(argv[2]) : 100000;
	if (armed < 1 || ops < 1) {
		fprintf(stderr, "usage: timer_cost [ARMED [OPS]] (both at least 1)\n");
		return 2;
	}
	struct perch_loop *loop;
	struct perch_loop_opts lo = { .backend = PERCH_BACKEND_EPOLL };
	if (perch_loop_new(&lo, &loop) != 0)
		return 1;
	struct perch_timer *idle = calloc((size_t)armed, sizeof(*idle)), connect;
	if (!idle)
		return 1;
	for (long i = 0; i < armed; i++) {
		perch_timer_init(&idle[i], loop, never, NULL);
		if (perch_timer_start(&idle[i], 60000) != 0)
			return 1;
	}
	perch_timer_init(&connect, loop, never, NULL);
	double t0 = now_ns();
	for (long i = 0; i < ops; i++)
		perch_timer_start(&idle[i % armed], 60000);
	double t1 = now_ns();
	for (long i = 0; i < ops; i++) {
		perch_timer_start(&connect, 5000);
		perch_timer_stop(&connect);
	}
	double t2 = now_ns();
	printf("armed=%ld restart-same=%.0f ns start-stop-5s=%.0f ns\n", armed, (t1 - t0) / (double)ops,
	       (t2 - t1) / (double)ops);
	for (long i = 0; i < armed; i++)
		perch_timer_stop(&idle[i]);
	perch_loop_free(loop);
	free(idle);
	return 0;
}
