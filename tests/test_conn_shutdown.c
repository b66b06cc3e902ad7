/* tests/test_conn_shutdown.c: perch_conn_shutdown: the write side ends after the last flush, once, and reading goes on. */
#include "config.h"

#include <perch.h>

#include "conn_fixture.h"

/* Stages `s`, flushes it and completes the send, as the kernel would. */
static void flush_and_send(struct perch_conn *c, const char *s)
{
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_write(c, s, strlen(s)), 0);
	assert_int_equal(perch_conn_flush(c, &h), PERCH_PENDING);
	fake_send_done(c, 0);
}

static void shutdown_after_the_last_flush_ends_the_write_side(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	flush_and_send(c, "last words");
	assert_int_equal(perch_conn_shutdown(c), 0);
	assert_int_equal(t->shutdowns, 1);
	assert_int_equal(t->sends, 1);
	/* Nothing more can be staged; a flush has nothing to send. */
	assert_int_equal(perch_conn_write(c, "x", 1), -EPIPE);
	assert_int_equal(perch__conn_stage_buffer(c, 16, &buf, &len), -EPIPE);
	assert_int_equal(perch_conn_flush(c, &h), 0);
	assert_int_equal(t->sends, 1);
	assert_false(perch_conn_is_closed(c));
}

/* A buffer lent before the shutdown (the pipe writer's get_buffer): its bytes cannot follow the end. */
static void a_buffer_lent_before_the_shutdown_cannot_be_committed_after_it(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch__conn_stage_buffer(c, 8, &buf, &len), 0);
	assert_int_equal(perch_conn_shutdown(c), 0); /* lent, nothing committed: nothing to send */
	memcpy(buf, "late", 4);
	assert_int_equal(perch__conn_stage_commit(c, 4), -EPIPE);
	assert_int_equal(perch_conn_flush(c, &h), 0);
	assert_int_equal(t->sends, 0);
	assert_int_equal(t->shutdowns, 1);
}

static void shutdown_with_staged_bytes_is_refused_and_loses_nothing(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_write(c, "unsent", 6), 0);
	assert_int_equal(perch_conn_shutdown(c), -EBUSY);
	assert_int_equal(t->shutdowns, 0);
	/* The staged bytes are still there and still go out; then the end may follow. */
	assert_int_equal(perch_conn_flush(c, &h), PERCH_PENDING);
	assert_non_null(t->sent);
	assert_int_equal(t->sent->len, 6);
	assert_memory_equal(t->sent->bytes, "unsent", 6);
	fake_send_done(c, 0);
	assert_int_equal(perch_conn_shutdown(c), 0);
	assert_int_equal(t->shutdowns, 1);
}

static void shutdown_while_a_flush_is_in_progress_is_refused(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_vtask_handle h;
	int64_t result = -1;
	assert_int_equal(perch_conn_write(c, "in flight", 9), 0);
	assert_int_equal(perch_conn_flush(c, &h), PERCH_PENDING);
	/* The kernel still holds the send: an end now could pass its bytes. */
	assert_int_equal(perch_conn_shutdown(c), -EBUSY);
	assert_int_equal(t->shutdowns, 0);
	fake_send_done(c, 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, 0);
	assert_int_equal(perch_conn_shutdown(c), 0);
	assert_int_equal(t->shutdowns, 1);
}

static void shutdown_twice_ends_the_write_side_once(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	assert_int_equal(perch_conn_shutdown(c), 0);
	assert_int_equal(perch_conn_shutdown(c), 0);
	assert_int_equal(t->shutdowns, 1);
}

static void shutdown_after_close_is_epipe(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	assert_int_equal(perch_conn_close(c), 0);
	assert_int_equal(perch_conn_shutdown(c), -EPIPE);
	assert_int_equal(t->shutdowns, 0);
}

/* Half-close is one direction: what the peer sends, and its own end, still reach the reader. */
static void reading_goes_on_after_shutdown(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct perch_read_result r;
	assert_int_equal(perch_conn_shutdown(c), 0);
	fake_recv(c, "the answer");
	perch__conn_peer_closed(c);
	assert_int_equal(perch_conn_try_read(c, &r), 0);
	assert_int_equal(r.len, 10);
	assert_memory_equal(r.first->data + r.first_off, "the answer", 10);
	assert_true(r.completed);
	assert_int_equal(perch_conn_advance(c, r.len, r.len), 0);
}

/* A proxy that ended one side must not lend it more: the source keeps its bytes. */
static void forward_to_a_shut_connection_is_refused_and_consumes_nothing(void **state)
{
	struct perch_conn *src = conn_of(state);
	struct fake_transport dt = { 0 };
	struct perch_conn *dst = perch__conn_new(&fake_ops, &dt);
	struct perch_read_result r;
	assert_non_null(dst);
	assert_int_equal(perch_conn_shutdown(dst), 0);
	fake_recv(src, "for a closed door");
	assert_int_equal(perch_conn_try_read(src, &r), 0);
	assert_int_equal(perch_conn_forward(src, r.len, r.len, dst), -EPIPE);
	assert_int_equal(dt.sends, 0);
	assert_int_equal(perch_conn_try_read(src, &r), 0);
	assert_int_equal(r.len, 17);
	assert_int_equal(perch_conn_advance(src, r.len, r.len), 0);
	perch_conn_release(dst);
	assert_int_equal(dt.destroyed, 1);
}

static void shutdown_without_a_write_side_or_a_conn_is_refused(void **state)
{
	static const struct perch__transport_ops no_shutdown = {
		.send = fake_send,
		.release_seg = fake_release_seg,
	};
	struct fake_transport t = { 0 };
	struct perch_conn *c = perch__conn_new(&no_shutdown, &t);
	assert_non_null(c);
	assert_int_equal(perch_conn_shutdown(NULL), -EINVAL);
	assert_int_equal(perch_conn_shutdown(c), -EOPNOTSUPP);
	/* Refused, the connection writes as before. */
	assert_int_equal(perch_conn_write(c, "ok", 2), 0);
	perch_conn_release(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(shutdown_after_the_last_flush_ends_the_write_side, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			a_buffer_lent_before_the_shutdown_cannot_be_committed_after_it, setup, teardown),
		cmocka_unit_test_setup_teardown(shutdown_with_staged_bytes_is_refused_and_loses_nothing,
						setup, teardown),
		cmocka_unit_test_setup_teardown(shutdown_while_a_flush_is_in_progress_is_refused, setup,
						teardown),
		cmocka_unit_test_setup_teardown(shutdown_twice_ends_the_write_side_once, setup,
						teardown),
		cmocka_unit_test_setup_teardown(shutdown_after_close_is_epipe, setup, teardown),
		cmocka_unit_test_setup_teardown(reading_goes_on_after_shutdown, setup, teardown),
		cmocka_unit_test_setup_teardown(
			forward_to_a_shut_connection_is_refused_and_consumes_nothing, setup, teardown),
		cmocka_unit_test(shutdown_without_a_write_side_or_a_conn_is_refused),
	};
	return cmocka_run_group_tests_name("conn shutdown", tests, NULL, NULL);
}
