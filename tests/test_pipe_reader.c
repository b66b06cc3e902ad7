/* tests/test_pipe_reader.c: the pipe reader parked on a connection: served, parked, re-parked, refused, canceled, completed. */
#include "config.h"

#include "pipe_fixture.h"

static void read_with_bytes_queued_is_served_without_readying_the_task(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h = { NULL, 0 };
	fake_recv(conn_of(state), "hello");
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 5);
	assert_memory_equal(res.first->data + res.first_off, "hello", 5);
	assert_null(h.task);
	/* on_parking never ran: no version was readied. */
	assert_int_equal(perch__vtask_version(&r->vt), 0);
	assert_int_equal(perch_pipe_advance_to(r, 5, 5), 0);
}

static void parked_read_completes_its_task_once_and_the_next_read_returns_the_bytes(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct cont_probe p = { 0, -1 };
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, cont_probe_fn, &p), PERCH_PENDING);
	fake_recv(conn_of(state), "ab");
	fake_recv(conn_of(state), "cd");
	assert_int_equal(p.runs, 1);
	assert_int_equal(p.result, 0);
	/* Woken once; the next read returns at once everything that came meanwhile. */
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 4);
	assert_memory_equal(res.first->data + res.first_off, "ab", 2);
	assert_memory_equal(res.first->next->data, "cd", 2);
	assert_int_equal(perch_pipe_advance_to(r, 4, 4), 0);
	assert_int_equal(p.runs, 1);
}

static void second_read_refused_while_one_is_parked_leaves_the_parked_one_to_complete(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle first, second = { NULL, 0 };
	assert_int_equal(perch_pipe_read(r, &res, &first), PERCH_PENDING);
	assert_int_equal(perch_pipe_read(r, &res, &second), -EBUSY);
	assert_int_equal(perch_pipe_try_read(r, &res), -EBUSY);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), -EBUSY);
	assert_null(second.task);
	/* The refused read readied nothing: the parked one's version is still the current one. */
	assert_int_equal(perch_vtask_status(first), PERCH_PENDING);
	fake_recv(conn_of(state), "x");
	int64_t result = -1;
	assert_int_equal(perch_vtask_result(first, &result), 0);
	assert_int_equal(result, 0);
	assert_int_equal(perch_pipe_read(r, &res, &second), 0);
	assert_int_equal(res.len, 1);
	assert_int_equal(perch_pipe_advance_to(r, 1, 1), 0);
}

static void wake_with_nothing_new_parks_the_read_again_without_losing_its_caller(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_conn *c = conn_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct cont_probe p = { 0, -1 };
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, cont_probe_fn, &p), PERCH_PENDING);
	/* A second completion targeting this park, its bytes already served: nothing new. */
	perch__conn_wake_reader(c);
	assert_int_equal(p.runs, 0);
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	assert_true(c->read_waiter == (uintptr_t)&r->listener);
	fake_recv(c, "now");
	assert_int_equal(p.runs, 1);
	assert_int_equal(p.result, 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 3);
	assert_int_equal(perch_pipe_advance_to(r, 3, 3), 0);
}

/* Bytes that land while the re-park holds the claim: the re-park serves them for the caller. */
static uint64_t (*original_reparking)(struct perch_recv_listener *, struct perch_conn *);

static uint64_t reparking_as_bytes_land(struct perch_recv_listener *l, struct perch_conn *c)
{
	fake_recv(c, "mid");
	return original_reparking(l, c);
}

static void bytes_landing_during_the_repark_are_handed_to_the_caller(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_conn *c = conn_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct cont_probe p = { 0, -1 };
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, cont_probe_fn, &p), PERCH_PENDING);
	original_reparking = r->listener.on_parking;
	r->listener.on_parking = reparking_as_bytes_land;
	perch__conn_wake_reader(c);
	r->listener.on_parking = original_reparking;
	/* Served by the re-park, not parked: the caller woke once, its result waiting. */
	assert_int_equal(p.runs, 1);
	assert_int_equal(p.result, 0);
	assert_int_equal(c->read_waiter, PERCH__SLOT_EMPTY);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 3);
	assert_memory_equal(res.first->data, "mid", 3);
	assert_int_equal(perch_pipe_advance_to(r, 3, 3), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
}

static void read_after_examining_everything_waits_and_returns_old_and_new_bytes(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	fake_recv(conn_of(state), "ab");
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 2);
	/* Not enough for a frame: keep the bytes, but don't return them again until more come. */
	assert_int_equal(perch_pipe_advance_to(r, 0, 2), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_try_read(r, &res), -EBUSY);
	fake_recv(conn_of(state), "c");
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 3);
	assert_memory_equal(res.first->data + res.first_off, "ab", 2);
	assert_memory_equal(res.first->next->data, "c", 1);
	/* Consume one byte of the first segment, examine all: nothing new until more comes. */
	assert_int_equal(perch_pipe_advance_to(r, 1, 3), 0);
	assert_int_equal(perch_pipe_try_read(r, &res), -EAGAIN);
	fake_recv(conn_of(state), "d");
	assert_int_equal(perch_pipe_try_read(r, &res), 0);
	assert_int_equal(res.len, 3);
	assert_int_equal(res.first_off, 1);
	assert_int_equal(perch_pipe_advance_to(r, 3, 3), 0);
	assert_int_equal(transport_of(state)->segs_out, 0);
}

static void advance_misuse_returns_einval_and_loses_nothing(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	/* Advance without a read. */
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), -EINVAL);
	fake_recv(conn_of(state), "abcd");
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(perch_pipe_advance_to(r, 3, 2), -EINVAL);   /* consumed > examined */
	assert_int_equal(perch_pipe_advance_to(r, 0, 5), -EINVAL);   /* past the result */
	assert_int_equal(perch_pipe_advance_to(r, 1, 3), 0);
	assert_int_equal(perch_pipe_advance_to(r, 1, 3), -EINVAL);   /* twice */
	fake_recv(conn_of(state), "e");
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 4);                               /* "bcde": nothing lost */
	assert_int_equal(perch_pipe_advance_to(r, 0, 1), -EINVAL);   /* examined moves back */
	assert_int_equal(perch_pipe_advance_to(r, 4, 4), 0);
}

static void cancel_wakes_the_parked_read_canceled_and_marks_the_next_when_none_is_parked(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_cancel_pending_read(r), 0);
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_true(res.canceled);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), 0);
	assert_int_equal(perch_pipe_cancel_pending_read(r), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_true(res.canceled);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_cancel_pending_read(NULL), -EINVAL);
}

static void complete_takes_a_parked_read_back_and_releases_every_buffer(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct cont_probe p = { 0, 1 };
	fake_recv(conn_of(state), "kept");
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(perch_pipe_advance_to(r, 0, 4), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, cont_probe_fn, &p), PERCH_PENDING);
	assert_int_equal(perch_pipe_reader_complete(r), 0);
	assert_int_equal(p.runs, 1);
	assert_int_equal(p.result, -ECANCELED);
	assert_int_equal(transport_of(state)->segs_out, 0);
	assert_int_equal(perch_pipe_reader_complete(r), 0);
	assert_int_equal(p.runs, 1);
	assert_int_equal(perch_pipe_read(r, &res, &h), -EINVAL);
	assert_int_equal(perch_pipe_try_read(r, &res), -EINVAL);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), -EINVAL);
}

static void peer_fin_and_error_come_after_the_bytes(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	fake_recv(conn_of(state), "last");
	perch__conn_peer_closed(conn_of(state));
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 4);
	assert_int_equal(perch_pipe_advance_to(r, 4, 4), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.len, 0);
	assert_true(res.completed);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), 0);
	perch__conn_failed(conn_of(state), -ECONNRESET);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_int_equal(res.error, -ECONNRESET);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), 0);
}

static void close_delivers_the_parked_read_closed(void **state)
{
	struct perch_pipe_reader *r = reader_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_read(r, &res, &h), PERCH_PENDING);
	perch_conn_close(conn_of(state));
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_pipe_read(r, &res, &h), 0);
	assert_true(res.closed);
	assert_int_equal(perch_pipe_advance_to(r, 0, 0), 0);
}

static void bad_arguments_return_einval(void **state)
{
	struct perch_pipe_reader *r = reader_of(state), *none = NULL;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_reader_new(NULL, &none), -EINVAL);
	assert_int_equal(perch_pipe_reader_new(conn_of(state), NULL), -EINVAL);
	assert_int_equal(perch_pipe_read(NULL, &res, &h), -EINVAL);
	assert_int_equal(perch_pipe_read(r, NULL, &h), -EINVAL);
	assert_int_equal(perch_pipe_read(r, &res, NULL), -EINVAL);
	assert_int_equal(perch_pipe_try_read(r, NULL), -EINVAL);
	assert_int_equal(perch_pipe_advance_to(NULL, 0, 0), -EINVAL);
	assert_int_equal(perch_pipe_reader_complete(NULL), -EINVAL);
	perch_pipe_reader_free(NULL);
	assert_null(none);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		PIPE_TEST(read_with_bytes_queued_is_served_without_readying_the_task),
		PIPE_TEST(parked_read_completes_its_task_once_and_the_next_read_returns_the_bytes),
		PIPE_TEST(second_read_refused_while_one_is_parked_leaves_the_parked_one_to_complete),
		PIPE_TEST(wake_with_nothing_new_parks_the_read_again_without_losing_its_caller),
		PIPE_TEST(bytes_landing_during_the_repark_are_handed_to_the_caller),
		PIPE_TEST(read_after_examining_everything_waits_and_returns_old_and_new_bytes),
		PIPE_TEST(advance_misuse_returns_einval_and_loses_nothing),
		PIPE_TEST(cancel_wakes_the_parked_read_canceled_and_marks_the_next_when_none_is_parked),
		PIPE_TEST(complete_takes_a_parked_read_back_and_releases_every_buffer),
		PIPE_TEST(peer_fin_and_error_come_after_the_bytes),
		PIPE_TEST(close_delivers_the_parked_read_closed),
		PIPE_TEST(bad_arguments_return_einval),
	};
	return cmocka_run_group_tests_name("pipe_reader", tests, NULL, NULL);
}
