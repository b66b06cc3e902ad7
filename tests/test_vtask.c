/* tests/test_vtask.c: the value task: versions, one continuation, inline completion, stale tokens, blocking wait. */
#include "config.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "cmocka_prelude.h"

#include <perch/vtask.h>

#include "vtask_internal.h"

struct tally {
	int runs;
	int64_t result;
};

static void count_run(void *arg, int64_t result)
{
	struct tally *t = arg;
	t->runs++;
	t->result = result;
}

static struct perch_vtask_handle readied(struct perch_vtask *vt)
{
	perch_vtask_init(vt);
	return (struct perch_vtask_handle){ vt, perch_vtask_ready(vt) };
}

static void registered_continuation_runs_once_on_complete(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	struct perch_vtask_handle h = readied(&vt);
	assert_int_not_equal(h.token, 0);
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, count_run, &t), PERCH_PENDING);
	assert_int_equal(t.runs, 0);
	assert_int_equal(perch_vtask_complete(&vt, h.token, 42), 0);
	assert_int_equal(t.runs, 1);
	assert_int_equal(t.result, 42);
	assert_int_equal(perch_vtask_complete(&vt, h.token, 7), -EALREADY);
	assert_int_equal(t.runs, 1);
	int64_t r = 0;
	assert_int_equal(perch_vtask_result(h, &r), 0);
	assert_int_equal(r, 42);
}

static void registration_after_completion_goes_on_inline(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	struct perch_vtask_handle h = readied(&vt);
	assert_int_equal(perch_vtask_complete(&vt, h.token, -5), 0);
	assert_int_equal(perch_vtask_on_complete(h, count_run, &t), 0);
	assert_int_equal(t.runs, 0);
	int64_t r = 0;
	assert_int_equal(perch_vtask_result(h, &r), 0);
	assert_int_equal(r, -5);
}

static void second_registration_is_refused(void **state)
{
	struct perch_vtask vt;
	struct tally a = { 0, 0 }, b = { 0, 0 };
	struct perch_vtask_handle h = readied(&vt);
	assert_int_equal(perch_vtask_on_complete(h, count_run, &a), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, count_run, &b), -EBUSY);
	perch_vtask_complete(&vt, h.token, 1);
	assert_int_equal(a.runs, 1);
	assert_int_equal(b.runs, 0);
}

static void stale_token_is_refused(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	struct perch_vtask_handle old = readied(&vt);
	perch_vtask_complete(&vt, old.token, 1);
	struct perch_vtask_handle cur = { &vt, perch_vtask_ready(&vt) };
	assert_int_not_equal(old.token, cur.token);
	int64_t r;
	assert_int_equal(perch_vtask_status(old), -ESTALE);
	assert_int_equal(perch_vtask_result(old, &r), -ESTALE);
	assert_int_equal(perch_vtask_on_complete(old, count_run, &t), -ESTALE);
	assert_int_equal(perch_vtask_wait(old, 0, &r), -ESTALE);
	assert_int_equal(perch_vtask_status(cur), PERCH_PENDING);
	assert_int_equal(t.runs, 0);
}

/* A completion for the previous version, arriving late, leaves the new one pending and its result alone. */
static void stale_completion_neither_completes_nor_overwrites_the_new_version(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	struct perch_vtask_handle old = readied(&vt);
	struct perch_vtask_handle cur = { &vt, perch_vtask_ready(&vt) };
	assert_int_equal(perch_vtask_on_complete(cur, count_run, &t), PERCH_PENDING);
	assert_int_equal(perch_vtask_complete(&vt, old.token, 111), -ESTALE);
	assert_int_equal(perch_vtask_status(cur), PERCH_PENDING);
	assert_int_equal(t.runs, 0);
	assert_int_equal(perch_vtask_complete(&vt, cur.token, 222), 0);
	assert_int_equal(perch_vtask_complete(&vt, old.token, 333), -ESTALE);
	int64_t r = 0;
	assert_int_equal(perch_vtask_result(cur, &r), 0);
	assert_int_equal(r, 222);
	assert_int_equal(t.runs, 1);
	assert_int_equal(t.result, 222);
}

static void a_task_never_readied_accepts_no_token(void **state)
{
	struct perch_vtask vt;
	perch_vtask_init(&vt);
	struct perch_vtask_handle zero = { &vt, 0 };
	assert_int_equal(perch_vtask_status(zero), -ESTALE);
	assert_int_equal(perch_vtask_complete(&vt, 0, 1), -ESTALE);
	assert_int_equal(perch_vtask_on_complete(zero, count_run, NULL), -ESTALE);
}

static void bad_arguments_return_einval(void **state)
{
	struct perch_vtask vt;
	struct perch_vtask_handle none = { NULL, 0 };
	struct perch_vtask_handle h = readied(&vt);
	int64_t r;
	assert_int_equal(perch_vtask_init(NULL), -EINVAL);
	assert_int_equal(perch_vtask_ready(NULL), 0);
	assert_int_equal(perch_vtask_complete(NULL, 1, 0), -EINVAL);
	assert_int_equal(perch_vtask_complete(&vt, h.token, (int64_t)INT32_MAX + 1), -ERANGE);
	assert_int_equal(perch_vtask_status(none), -EINVAL);
	assert_int_equal(perch_vtask_result(none, &r), -EINVAL);
	assert_int_equal(perch_vtask_on_complete(none, count_run, NULL), -EINVAL);
	assert_int_equal(perch_vtask_on_complete(h, NULL, NULL), -EINVAL);
	assert_int_equal(perch_vtask_wait(none, 0, &r), -EINVAL);
	perch_vtask_complete(&vt, h.token, 3);
	assert_int_equal(perch_vtask_result(h, NULL), -EINVAL);
}

struct later {
	struct perch_vtask *vt;
	uint32_t token;
	bool ready_instead; /* the owner moves to a new version instead of completing */
};

static void *complete_later(void *arg)
{
	struct later *l = arg;
	usleep(20 * 1000);
	if (l->ready_instead)
		perch_vtask_ready(l->vt);
	else
		perch_vtask_complete(l->vt, l->token, 99);
	return NULL;
}

static void blocking_wait_returns_the_result(void **state)
{
	struct perch_vtask vt;
	pthread_t th;
	struct perch_vtask_handle h = readied(&vt);
	struct later l = { &vt, h.token, false };
	assert_int_equal(pthread_create(&th, NULL, complete_later, &l), 0);
	int64_t r = 0;
	assert_int_equal(perch_vtask_wait(h, 10000, &r), 0);
	assert_int_equal(r, 99);
	pthread_join(th, NULL);
}

static void blocking_wait_on_a_version_readied_over_returns_estale(void **state)
{
	struct perch_vtask vt;
	pthread_t th;
	struct perch_vtask_handle h = readied(&vt);
	struct later l = { &vt, h.token, true };
	assert_int_equal(pthread_create(&th, NULL, complete_later, &l), 0);
	int64_t r = 0;
	assert_int_equal(perch_vtask_wait(h, 10000, &r), -ESTALE);
	pthread_join(th, NULL);
}

struct sleeper {
	struct perch_vtask_handle h;
	int rc;
};

static void *wait_without_timeout(void *arg)
{
	struct sleeper *w = arg;
	w->rc = perch_vtask_wait(w->h, -1, NULL);
	return NULL;
}

/*
 * A waiter asleep on a version the owner readies over is woken (-ESTALE):
 * with no timeout it would sleep for ever. The owner readies once the
 * waiter announced itself in the word and had time to fall asleep.
 */
static void a_sleeping_waiter_is_woken_when_its_version_is_readied_over(void **state)
{
	struct perch_vtask vt;
	pthread_t th;
	struct sleeper w = { readied(&vt), 1 };
	assert_int_equal(pthread_create(&th, NULL, wait_without_timeout, &w), 0);
	for (int i = 0; i < 10000 && !(perch__load_u64(&vt.state) & PERCH__VT_WAITER); i++)
		usleep(1000);
	assert_true(perch__load_u64(&vt.state) & PERCH__VT_WAITER);
	usleep(50 * 1000);
	perch_vtask_ready(&vt);
	struct timespec limit;
	clock_gettime(CLOCK_REALTIME, &limit);
	limit.tv_sec += 10;
	if (pthread_timedjoin_np(th, NULL, &limit) != 0)
		fail_msg("the waiter still sleeps 10 s after its version was readied over");
	assert_int_equal(w.rc, -ESTALE);
}

static void blocking_wait_times_out(void **state)
{
	struct perch_vtask vt;
	struct perch_vtask_handle h = readied(&vt);
	int64_t r = 12345;
	assert_int_equal(perch_vtask_wait(h, 30, &r), -ETIMEDOUT);
	assert_int_equal(r, 12345);
	assert_int_equal(perch_vtask_wait(h, 0, &r), -ETIMEDOUT);
	/* A completion after the waiter announced itself still completes normally. */
	assert_int_equal(perch_vtask_complete(&vt, h.token, 5), 0);
	assert_int_equal(perch_vtask_wait(h, 0, &r), 0);
	assert_int_equal(r, 5);
}

/*
 * A park readies its task with the continuation registered at once only
 * over a word no one else may touch: completed, or never readied. Over a
 * version still pending it is an ordinary ready, and the continuation
 * registered for the old version is left as it was.
 */
static void a_ready_registers_only_over_a_task_its_owner_alone_moves(void **state)
{
	struct perch_vtask vt;
	struct tally first = { 0, 0 }, second = { 0, 0 };
	bool registered = false;
	perch_vtask_init(&vt);
	struct perch_vtask_handle h = { &vt, perch__vtask_ready_registered(&vt, count_run, &first, &registered) };
	assert_true(registered); /* never readied */
	assert_int_equal(perch_vtask_on_complete(h, count_run, &second), -EBUSY);
	struct perch_vtask_handle next = { &vt, perch__vtask_ready_registered(&vt, count_run, &second, &registered) };
	assert_false(registered); /* h still pending: readied over, not registered */
	assert_int_equal(perch_vtask_complete(&vt, h.token, 1), -ESTALE);
	assert_int_equal(first.runs, 0);
	assert_int_equal(perch_vtask_status(next), PERCH_PENDING);
	assert_int_equal(perch_vtask_complete(&vt, next.token, 2), 0);
	assert_int_equal(second.runs, 0); /* nothing was registered on it */
	/* Completed: the next version is readied with the continuation registered. */
	h = (struct perch_vtask_handle){ &vt, perch__vtask_ready_registered(&vt, count_run, &second, &registered) };
	assert_true(registered);
	assert_int_equal(perch_vtask_complete(&vt, next.token, 3), -ESTALE);
	assert_int_equal(perch_vtask_complete(&vt, h.token, 4), 0);
	assert_int_equal(second.runs, 1);
	assert_int_equal(second.result, 4);
}

/* A version readied registered and never published is retired: complete, its continuation never run. */
static void a_retired_version_completes_without_its_continuation(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	bool registered = false;
	perch_vtask_init(&vt);
	struct perch_vtask_handle h = { &vt, perch__vtask_ready_registered(&vt, count_run, &t, &registered) };
	assert_true(registered);
	perch__vtask_retire(&vt, h.token);
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_vtask_complete(&vt, h.token, 1), -EALREADY);
	assert_int_equal(t.runs, 0);
	/* A retire after a later ready leaves the later version alone. */
	struct perch_vtask_handle later = { &vt, perch_vtask_ready(&vt) };
	perch__vtask_retire(&vt, h.token);
	assert_int_equal(perch_vtask_status(later), PERCH_PENDING);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(registered_continuation_runs_once_on_complete),
		cmocka_unit_test(registration_after_completion_goes_on_inline),
		cmocka_unit_test(a_ready_registers_only_over_a_task_its_owner_alone_moves),
		cmocka_unit_test(a_retired_version_completes_without_its_continuation),
		cmocka_unit_test(second_registration_is_refused),
		cmocka_unit_test(stale_token_is_refused),
		cmocka_unit_test(stale_completion_neither_completes_nor_overwrites_the_new_version),
		cmocka_unit_test(a_task_never_readied_accepts_no_token),
		cmocka_unit_test(bad_arguments_return_einval),
		cmocka_unit_test(blocking_wait_returns_the_result),
		cmocka_unit_test(blocking_wait_on_a_version_readied_over_returns_estale),
		cmocka_unit_test(a_sleeping_waiter_is_woken_when_its_version_is_readied_over),
		cmocka_unit_test(blocking_wait_times_out),
	};
	return cmocka_run_group_tests_name("vtask", tests, NULL, NULL);
}
