/* lib/timer.c: the loop's timers (connect timeouts among them): a list kept in due order, expired after each turn's completions. */
#include "config.h"

#include <errno.h>
#include <time.h>

#include "backend.h"

double perch__now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void list_unlink(struct perch__timer_list *l, struct perch_timer *t)
{
	if (t->prev)
		t->prev->next = t->next;
	else
		l->head = t->next;
	if (t->next)
		t->next->prev = t->prev;
	else
		l->tail = t->prev;
	t->prev = t->next = NULL;
	t->list = NULL;
}

/*
 * Walks from the tail: most timers of a loop share a duration, so a new one
 * is usually due last and goes in at once. Equal dues keep start order.
 */
static void list_insert_by_due(struct perch__timer_list *l, struct perch_timer *t)
{
	struct perch_timer *after = l->tail;
	while (after && after->due_ms > t->due_ms)
		after = after->prev;
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

void perch__timer_disarm(struct perch_timer *t)
{
	if (t->list)
		list_unlink(t->list, t);
}

void perch__timer_arm_at(struct perch_timer *t, double due_ms)
{
	perch__timer_disarm(t);
	t->due_ms = due_ms;
	list_insert_by_due(&t->loop->timers, t);
}

bool perch__timers_soonest(const struct perch_loop *loop, double *due_ms)
{
	if (!loop->timers.head)
		return false;
	*due_ms = loop->timers.head->due_ms;
	return true;
}

/*
 * Runs every timer due now. They move to the firing list first, so a
 * callback that starts a timer again, even for 0 ms, arms it for the next
 * turn instead of looping here; one that stops a timer still waiting on
 * the firing list takes it off there.
 */
void perch__timers_expire(struct perch_loop *loop)
{
	struct perch__timer_list *armed = &loop->timers, *firing = &loop->timers_firing;
	if (!armed->head)
		return;
	double now = perch__now_ms();
	while (armed->head && armed->head->due_ms <= now) {
		struct perch_timer *t = armed->head;
		list_unlink(armed, t);
		t->list = firing;
		t->prev = firing->tail;
		if (firing->tail)
			firing->tail->next = t;
		else
			firing->head = t;
		firing->tail = t;
	}
	while (firing->head) {
		struct perch_timer *t = firing->head;
		list_unlink(firing, t);
		t->fn(t, t->arg); /* last touch: the callback may free t */
	}
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
	return perch__loop_claim(t->loop) ? 0 : -EEXIST;
}

int perch_timer_start(struct perch_timer *t, unsigned ms)
{
	int rc = on_owning_thread(t);
	if (rc != 0)
		return rc;
	if (ms > PERCH_TIMER_MAX_MS)
		return -EINVAL;
	if (t->loop->freeing)
		return -ECANCELED;
	perch__timer_arm_at(t, perch__now_ms() + ms);
	return 0;
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
