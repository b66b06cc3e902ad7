/* perch/timer.h: one-shot timers whose callback runs on a loop's thread, after its turn's completions. */
#ifndef PERCH_TIMER_H
#define PERCH_TIMER_H

#include <stdbool.h>

#include <perch/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct perch_loop;
struct perch_timer;

/*
 * Runs once per start, on the loop thread, when the timer is due. It may
 * start, stop or free any timer (this one included: nothing touches it
 * after the call) and use any connection; it must not block.
 */
typedef void (*perch_timer_fn)(struct perch_timer *t, void *arg);

/* The longest timer: a day (perch_timer_start refuses more with -EINVAL). */
#define PERCH_TIMER_MAX_MS (24u * 60 * 60 * 1000)

/*
 * A timer: embedded in what it times (a session, a request), no memory of
 * its own. Fields are private: use the calls below. While it is armed the
 * loop links it, so its memory must stay until it fires, is stopped, or
 * perch_loop_free returns (which disarms it and unbinds it from the loop:
 * later calls on it return -EINVAL). A timer not armed at the free still
 * names the freed loop: do not start or stop it again before
 * perch_timer_init binds it to a live loop.
 */
struct perch_timer {
	struct perch_loop *loop;
	perch_timer_fn fn;
	void *arg;
	double due_ms;               /* CLOCK_MONOTONIC, milliseconds */
	struct perch_timer *prev, *next;
	void *list;                  /* the loop's list it is on; NULL when not armed */
};

/*
 * Binds a timer to `loop`, with the callback it will run; it starts
 * disarmed. Any thread; touches no loop state. Never on an armed timer
 * (stop it first): it would stay linked in the loop, and perch cannot tell
 * an armed timer from uninitialised memory to refuse it. Returns 0 or
 * -EINVAL (a NULL argument).
 */
PERCH_API int perch_timer_init(struct perch_timer *t, struct perch_loop *loop, perch_timer_fn fn,
			       void *arg);

/*
 * Arms the timer to run its callback once, `ms` milliseconds from now (0:
 * after the current or next turn's completions), replacing the time it was
 * armed for, if any. Timers of the same duration run in the order they
 * were started. A turn sleeps at most until the soonest timer; the callback runs
 * after that turn's completions, so it is never early and, on a busy loop,
 * may be late by a turn.
 *
 * On the loop's thread only: inside its callbacks, or on the thread that
 * runs it between turns. Like perch_loop_run_once, the first thread to
 * touch a loop that never ran claims it. Returns 0, -EINVAL (NULL, not
 * initialised or unbound by perch_loop_free, ms above PERCH_TIMER_MAX_MS),
 * -EEXIST (another thread owns the loop), or -ECANCELED (the loop is being
 * freed: it would never fire).
 * A refused start leaves the timer as it was.
 */
PERCH_API int perch_timer_start(struct perch_timer *t, unsigned ms);

/*
 * Disarms the timer: its callback will not run for the start it had. A
 * disarmed timer is left alone. Same thread rule as perch_timer_start;
 * works while the loop is being freed. Returns 0, -EINVAL, or -EEXIST.
 */
PERCH_API int perch_timer_stop(struct perch_timer *t);

/* Whether the timer is armed (started, and neither fired nor stopped). Loop thread. */
PERCH_API bool perch_timer_is_armed(const struct perch_timer *t);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_TIMER_H */
