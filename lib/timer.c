/* lib/timer.c: the loop's timers (connect timeouts among them): a list per duration in due order, expired after each turn's completions. */
#include "config.h"

#include <errno.h>
#include <time.h>

#include "loop_internal.h"

double perch__now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

__thread uint64_t perch__thread_clock_epoch;

double perch__loop_clock_read(struct perch_loop *loop)
{
	double now = perch__now_ms();
	if (loop->in_turn) {
		loop->turn_clock_ms = now;
		loop->turn_clock_epoch = perch__thread_clock_epoch;
	}
	return now;
}

void perch__loop_waited(struct perch_loop *loop)
{
	(void)loop; /* any turn on this thread, this loop's or one its callbacks nest this poll in */
	perch__thread_clock_epoch++;
}

_Static_assert(PERCH__TIMER_DURATIONS + 1 <= 32, "a bit per list in timers_held");

/* The bit of `l` in loop->timers_held; the firing list has none. */
static uint32_t held_bit(const struct perch_loop *loop, const struct perch__timer_list *l)
{
	return l == &loop->timers_firing ? 0 : 1u << (l - loop->timers);
}

static inline void list_unlink(struct perch__timer_list *l, struct perch_timer *t)
{
	if (t->prev)
		t->prev->next = t->next;
	else
		l->head = t->next;
	if (t->next)
		t->next->prev = t->prev;
	else
		l->tail = t->prev;
	if (!l->head)
		t->loop->timers_held &= ~held_bit(t->loop, l);
	t->prev = t->next = NULL;
	t->list = NULL;
}

/*
 * Walks from the tail: in a list of one duration a new timer is due last
 * (a connect posted from another thread may arm a little out of order), so
 * it goes in at once. Equal dues keep start order.
 */
static void list_insert_by_due(struct perch_loop *loop, struct perch__timer_list *l,
			       struct perch_timer *t)
{
	if (!l->head)
		loop->timers_held |= held_bit(loop, l);
	struct perch_timer *after = l->tail;
	while (after && after->due_ms > t->due_ms) {
		after = after->prev;
		loop->stats.timer_walk_steps++;
	}
	t->prev = after;
	t->next = after ? after->next : l->head;
	if (t->next)
		t->next->prev = t;
	else
		l->tail = t;
	if (after)
		after->next = t;
	else
		l->head = t;
	t->list = l;
}

static void list_append(struct perch__timer_list *l, struct perch_timer *t)
{
	t->prev = l->tail;
	t->next = NULL;
	if (l->tail)
		l->tail->next = t;
	else
		l->head = t;
	l->tail = t;
	t->list = l;
}

/*
 * The list for timers of `ms`: its own while one of the few is free or
 * already holds that duration, so that a loop mixing an idle timeout and a
 * connect timeout over many connections inserts each in O(1); past that,
 * the shared last list, sorted by a walk.
 */
static struct perch__timer_list *list_for(struct perch_loop *loop, unsigned ms)
{
	const uint32_t own = (1u << PERCH__TIMER_DURATIONS) - 1;
	for (uint32_t held = loop->timers_held & own; held; held &= held - 1) {
		struct perch__timer_list *l = &loop->timers[__builtin_ctz(held)];
		if (l->ms == ms)
			return l;
	}
	uint32_t free_ones = ~loop->timers_held & own;
	if (!free_ones)
		return &loop->timers[PERCH__TIMER_DURATIONS];
	struct perch__timer_list *l = &loop->timers[__builtin_ctz(free_ones)];
	l->ms = ms;
	return l;
}

/* The armed list whose head is due soonest, or NULL when none is armed. */
static struct perch__timer_list *soonest_list(struct perch_loop *loop)
{
	struct perch__timer_list *best = NULL;
	for (uint32_t held = loop->timers_held; held; held &= held - 1) {
		struct perch__timer_list *l = &loop->timers[__builtin_ctz(held)];
		PERCH_ASSERT(l->head); /* a list's bit goes with its last timer */
		if (!best || l->head->due_ms < best->head->due_ms)
			best = l;
	}
	return best;
}

void perch__timer_disarm(struct perch_timer *t)
{
	if (t->list)
		list_unlink(t->list, t);
}

/* Whether `t` is on the own list of timers of `ms` (not the shared one, nor firing). */
static bool on_own_list(const struct perch_timer *t, unsigned ms)
{
	const struct perch__timer_list *l = t->list;
	return l && l->ms == ms && l != &t->loop->timers_firing && l != &t->loop->timers[PERCH__TIMER_DURATIONS];
}

void perch__timer_arm_at(struct perch_timer *t, double due_ms, unsigned ms)
{
	struct perch__timer_list *l = t->list;
	/* A restart (an idle timeout pushed back at each request) stays on its list, usually going last. */
	bool same = on_own_list(t, ms);
	if (same && t == l->tail && (!t->prev || t->prev->due_ms <= due_ms)) {
		t->due_ms = due_ms;
		return;
	}
	perch__timer_disarm(t);
	t->due_ms = due_ms;
	list_insert_by_due(t->loop, same ? l : list_for(t->loop, ms), t);
}

bool perch__timers_soonest(const struct perch_loop *loop, double *due_ms)
{
	struct perch__timer_list *l = soonest_list((struct perch_loop *)loop);
	if (!l)
		return false;
	*due_ms = l->head->due_ms;
	return true;
}

/*
 * Runs every timer due now, soonest first across the lists. They move to
 * the firing list first, so a callback that starts a timer again, even for
 * 0 ms, arms it for the next turn instead of looping here; one that stops
 * a timer still waiting on the firing list takes it off there.
 */
void perch__timers_expire(struct perch_loop *loop)
{
	struct perch__timer_list *firing = &loop->timers_firing, *l = soonest_list(loop);
	if (!l)
		return;
	double now = perch__loop_now_ms(loop); /* never ahead of the true time: a timer fires late, not early */
	for (; l && l->head->due_ms <= now; l = soonest_list(loop)) {
		struct perch_timer *t = l->head;
		list_unlink(l, t);
		list_append(firing, t);
	}
	while (firing->head) {
		struct perch_timer *t = firing->head;
		list_unlink(firing, t);
		t->fn(t, t->arg); /* last touch: the callback may free t */
	}
}

static void unbind_list(struct perch__timer_list *l)
{
	while (l->head) {
		struct perch_timer *t = l->head;
		list_unlink(l, t);
		t->loop = NULL;
	}
}

/*
 * perch_loop_free, last: every armed timer is taken off and unbound, so
 * that it reads disarmed and a later call on it is refused (-EINVAL)
 * instead of reaching the freed loop.
 */
void perch__timers_unbind_all(struct perch_loop *loop)
{
	for (int i = 0; i <= PERCH__TIMER_DURATIONS; i++)
		unbind_list(&loop->timers[i]);
	unbind_list(&loop->timers_firing);
}

/* ---- the public calls: on the loop's thread ---- */

int perch_timer_init(struct perch_timer *t, struct perch_loop *loop, perch_timer_fn fn, void *arg)
{
	if (!t || !loop || !fn)
		return -EINVAL;
	*t = (struct perch_timer){ .loop = loop, .fn = fn, .arg = arg };
	return 0;
}

static int on_owning_thread(const struct perch_timer *t)
{
	if (!t || !t->loop || !t->fn)
		return -EINVAL;
	/* Inside the loop's callbacks, where nearly every start comes from: one TLS read. */
	if (perch_loop_is_current(t->loop))
		return 0;
	return perch__loop_claim(t->loop) ? 0 : -EEXIST;
}

/* perch_timer_start's checks: 0 when t may be armed for `ms` now. */
static int may_start(const struct perch_timer *t, unsigned ms)
{
	int rc = on_owning_thread(t);
	if (rc != 0)
		return rc;
	if (ms > PERCH_TIMER_MAX_MS)
		return -EINVAL;
	return t->loop->freeing ? -ECANCELED : 0;
}

int perch_timer_start(struct perch_timer *t, unsigned ms)
{
	int rc = may_start(t, ms);
	if (rc == 0)
		perch__timer_arm_at(t, perch__now_ms() + ms, ms);
	return rc;
}

int perch__timer_restart(struct perch_timer *t, unsigned ms)
{
	int rc = may_start(t, ms);
	if (rc == 0)
		perch__timer_arm_at(t, perch__loop_now_ms(t->loop) + ms, ms);
	return rc;
}

int perch_timer_stop(struct perch_timer *t)
{
	int rc = on_owning_thread(t);
	if (rc == 0)
		perch__timer_disarm(t);
	return rc;
}

bool perch_timer_is_armed(const struct perch_timer *t)
{
	return t && t->list;
}
