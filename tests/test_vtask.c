/* tests/test_vtask.c: the value task: versions, one continuation, inline completion, blocking wait. */
#include "config.h"

#include <pthread.h>
#include <unistd.h>

#include "cmocka_prelude.h"

#include <perch/vtask.h>

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

static void registered_continuation_runs_once_on_complete(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	assert_int_equal(perch_vtask_init(&vt), 0);
	struct perch_vtask_handle h = { &vt, perch_vtask_ready(&vt) };
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, count_run, &t), PERCH_PENDING);
	assert_int_equal(t.runs, 0);
	assert_int_equal(perch_vtask_complete(&vt, 42), 0);
	assert_int_equal(t.runs, 1);
	assert_int_equal(t.result, 42);
	assert_int_equal(perch_vtask_complete(&vt, 7), -EALREADY);
	assert_int_equal(t.runs, 1);
	int64_t r = 0;
	assert_int_equal(perch_vtask_result(h, &r), 0);
	assert_int_equal(r, 42);
}

static void registration_after_completion_goes_on_inline(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	perch_vtask_init(&vt);
	struct perch_vtask_handle h = { &vt, perch_vtask_ready(&vt) };
	assert_int_equal(perch_vtask_complete(&vt, -5), 0);
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
	perch_vtask_init(&vt);
	struct perch_vtask_handle h = { &vt, perch_vtask_ready(&vt) };
	assert_int_equal(perch_vtask_on_complete(h, count_run, &a), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, count_run, &b), -EBUSY);
	perch_vtask_complete(&vt, 1);
	assert_int_equal(a.runs, 1);
	assert_int_equal(b.runs, 0);
}

static void stale_token_is_refused(void **state)
{
	struct perch_vtask vt;
	struct tally t = { 0, 0 };
	perch_vtask_init(&vt);
	struct perch_vtask_handle old = { &vt, perch_vtask_ready(&vt) };
	perch_vtask_complete(&vt, 1);
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

static void bad_arguments_return_einval(void **state)
{
	struct perch_vtask vt;
	perch_vtask_init(&vt);
	struct perch_vtask_handle none = { NULL, 0 };
	struct perch_vtask_handle h = { &vt, perch_vtask_ready(&vt) };
	int64_t r;
	assert_int_equal(perch_vtask_init(NULL), -EINVAL);
	assert_int_equal(perch_vtask_complete(NULL, 0), -EINVAL);
	assert_int_equal(perch_vtask_status(none), -EINVAL);
	assert_int_equal(perch_vtask_result(none, &r), -EINVAL);
	assert_int_equal(perch_vtask_on_complete(none, count_run, NULL), -EINVAL);
	assert_int_equal(perch_vtask_on_complete(h, NULL, NULL), -EINVAL);
	assert_int_equal(perch_vtask_wait(none, 0, &r), -EINVAL);
	perch_vtask_complete(&vt, 3);
	assert_int_equal(perch_vtask_result(h, NULL), -EINVAL);
}

static void *complete_later(void *arg)
{
	usleep(20 * 1000);
	perch_vtask_complete(arg, 99);
	return NULL;
}

static void blocking_wait_returns_the_result(void **state)
{
	struct perch_vtask vt;
	pthread_t th;
	perch_vtask_init(&vt);
	struct perch_vtask_handle h = { &vt, perch_vtask_ready(&vt) };
	assert_int_equal(pthread_create(&th, NULL, complete_later, &vt), 0);
	int64_t r = 0;
	assert_int_equal(perch_vtask_wait(h, 10000, &r), 0);
	assert_int_equal(r, 99);
	pthread_join(th, NULL);
}

static void blocking_wait_times_out(void **state)
{
	struct perch_vtask vt;
	perch_vtask_init(&vt);
	struct perch_vtask_handle h = { &vt, perch_vtask_ready(&vt) };
	int64_t r = 12345;
	assert_int_equal(perch_vtask_wait(h, 30, &r), -ETIMEDOUT);
	assert_int_equal(r, 12345);
	assert_int_equal(perch_vtask_wait(h, 0, &r), -ETIMEDOUT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(registered_continuation_runs_once_on_complete),
		cmocka_unit_test(registration_after_completion_goes_on_inline),
		cmocka_unit_test(second_registration_is_refused),
		cmocka_unit_test(stale_token_is_refused),
		cmocka_unit_test(bad_arguments_return_einval),
		cmocka_unit_test(blocking_wait_returns_the_result),
		cmocka_unit_test(blocking_wait_times_out),
	};
	return cmocka_run_group_tests_name("vtask", tests, NULL, NULL);
}
