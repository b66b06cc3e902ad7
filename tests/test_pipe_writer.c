/* tests/test_pipe_writer.c: the pipe writer over a connection: staging, parked flush, refusals, cancel, complete. */
#include "config.h"

#include "pipe_fixture.h"

static void flush_parks_until_the_kernel_took_every_byte(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	struct cont_probe p = { 0, -1 };
	assert_int_equal(perch_pipe_write(w, "hello", 5), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, cont_probe_fn, &p), PERCH_PENDING);
	assert_int_equal(transport_of(state)->sent->len, 5);
	assert_memory_equal(transport_of(state)->sent->data, "hello", 5);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(p.runs, 1);
	assert_int_equal(p.result, 0);
}

static void get_buffer_and_advance_stage_without_a_copy(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_get_buffer(w, 10, &buf, &len), 0);
	assert_true(len >= 10);
	memcpy(buf, "0123456789", 10);
	assert_int_equal(perch_pipe_advance(w, len + 1), -EINVAL);
	assert_int_equal(perch_pipe_advance(w, 4), 0);
	/* The rest of the same buffer comes next. */
	uint8_t *more;
	assert_int_equal(perch_pipe_get_buffer(w, 0, &more, &len), 0);
	assert_ptr_equal(more, buf + 4);
	more[0] = '!';
	assert_int_equal(perch_pipe_advance(w, 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(transport_of(state)->sent->len, 5);
	assert_memory_equal(transport_of(state)->sent->data, "0123!", 5);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_vtask_status(h), 0);
}

static void flush_with_nothing_staged_is_done_at_once_and_readies_nothing(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h = { NULL, 0 };
	assert_int_equal(perch_pipe_flush(w, &h), 0);
	assert_null(h.task);
	assert_int_equal(perch__vtask_version(&w->vt), 0);
	/* A buffer got and never committed carries nothing either. */
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_get_buffer(w, 100, &buf, &len), 0);
	assert_int_equal(perch_pipe_flush(w, &h), 0);
	assert_int_equal(transport_of(state)->sends, 0);
}

static void flush_with_nothing_staged_leaves_an_earlier_flushs_unread_result_readable(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle first, second = { NULL, 0 };
	int64_t result = -1;
	assert_int_equal(perch_pipe_write(w, "x", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &first), PERCH_PENDING);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_pipe_flush(w, &second), 0);
	assert_null(second.task);
	assert_int_equal(perch_vtask_result(first, &result), 0);
	assert_int_equal(result, 0);
}

static void second_flush_refused_while_one_is_parked_leaves_it_to_complete(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle first, second = { NULL, 0 };
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &first), PERCH_PENDING);
	assert_int_equal(perch_pipe_flush(w, &second), -EBUSY);
	assert_null(second.task);
	assert_int_equal(perch_vtask_status(first), PERCH_PENDING);
	fake_send_done(conn_of(state), 0);
	int64_t result = -1;
	assert_int_equal(perch_vtask_result(first, &result), 0);
	assert_int_equal(result, 0);
}

static void flush_after_the_peer_closed_leaves_the_kernels_flush_to_complete(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle first, second = { NULL, 0 };
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &first), PERCH_PENDING);
	perch__conn_peer_closed(conn_of(state));
	assert_int_equal(perch_pipe_flush(w, &second), -EBUSY);
	assert_int_equal(perch_vtask_status(first), PERCH_PENDING);
	fake_send_done(conn_of(state), 0);
	int64_t result = -1;
	assert_int_equal(perch_vtask_result(first, &result), 0);
	assert_int_equal(result, 0);
}

static void writing_while_a_flush_is_in_progress_is_refused_not_corrupted(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_write(w, "one", 3), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_write(w, "two", 3), -EBUSY);
	assert_int_equal(perch_pipe_get_buffer(w, 1, &buf, &len), -EBUSY);
	assert_int_equal(perch_pipe_advance(w, 1), -EBUSY);
	assert_memory_equal(transport_of(state)->sent->data, "one", 3);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_pipe_write(w, "two", 3), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(transport_of(state)->sent->len, 3);
	assert_memory_equal(transport_of(state)->sent->data, "two", 3);
}

static void close_fails_the_parked_flush_and_later_writes(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	perch_conn_close(conn_of(state));
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -EPIPE);
	assert_int_equal(perch_pipe_write(w, "b", 1), -EPIPE);
}

/* What a proxy does when its source completed: the end goes on once the last flush is done. */
static void shutdown_after_the_writers_last_flush_refuses_later_writes(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_write(w, "bye", 3), 0);
	assert_int_equal(perch_conn_shutdown(conn_of(state)), -EBUSY); /* staged, not yet flushed */
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(perch_conn_shutdown(conn_of(state)), -EBUSY); /* the kernel holds it */
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_conn_shutdown(conn_of(state)), 0);
	assert_int_equal(transport_of(state)->shutdowns, 1);
	assert_int_equal(perch_pipe_write(w, "more", 4), -EPIPE);
	assert_int_equal(perch_pipe_get_buffer(w, 8, &buf, &len), -EPIPE);
	assert_int_equal(perch_pipe_flush(w, &h), 0); /* nothing staged */
	assert_int_equal(transport_of(state)->sends, 1);
}

static void an_advance_after_the_shutdown_is_refused_and_nothing_is_sent(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_get_buffer(w, 8, &buf, &len), 0);
	assert_int_equal(perch_conn_shutdown(conn_of(state)), 0);
	memcpy(buf, "late", 4);
	assert_int_equal(perch_pipe_advance(w, 4), -EPIPE);
	assert_int_equal(perch_pipe_flush(w, &h), 0);
	assert_int_equal(transport_of(state)->sends, 0);
}

static void send_error_fails_the_parked_flush(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	perch__conn_failed(conn_of(state), -ECONNRESET);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -ECONNRESET);
}

static void cancel_completes_the_parked_flush_or_marks_the_next_and_loses_nothing(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_cancel_pending_flush(w), 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -ECANCELED);
	/* The kernel's completion comes later and changes nothing. */
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -ECANCELED);
	/* None waiting: the next flush is canceled, its bytes kept for the one after. */
	assert_int_equal(perch_pipe_cancel_pending_flush(w), 0);
	assert_int_equal(perch_pipe_write(w, "bc", 2), 0);
	assert_int_equal(perch_pipe_flush(w, &h), -ECANCELED);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(transport_of(state)->sent->len, 2);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_pipe_cancel_pending_flush(NULL), -EINVAL);
}

/*
 * A cancel on another thread marks first, then takes its mark back to
 * complete the flush it found waiting. A second flush made in between is
 * refused (-EBUSY) and must leave that mark alone.
 */
static void a_flush_refused_while_one_waits_leaves_a_cancels_mark_to_the_waiting_one(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h, second = { NULL, 0 };
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	perch__store_u32(&w->cancel, 1);        /* the cancel's mark, not yet taken back */
	assert_int_equal(perch_pipe_flush(w, &second), -EBUSY);
	assert_null(second.task);
	assert_int_equal(perch__load_u32(&w->cancel), 1);
	/* The cancel goes on: the waiting flush is the one canceled, and no mark is left. */
	assert_int_equal(perch_pipe_cancel_pending_flush(w), 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -ECANCELED);
	assert_int_equal(perch__load_u32(&w->cancel), 0);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_pipe_write(w, "b", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(perch_vtask_status(h), 0);
}

static void a_writer_freed_after_a_cancel_outlives_the_kernels_flush(void **state)
{
	struct pipe_fixture *f = *state;
	struct perch_vtask_handle h;
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(f->w, "held", 4), 0);
	assert_int_equal(perch_pipe_flush(f->w, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_cancel_pending_flush(f->w), 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -ECANCELED);
	/* The caller's task is complete, so it frees the writer; the kernel still holds the send. */
	perch_pipe_writer_free(f->w);
	f->w = NULL;
	/* Its completion signals the armed writer, which goes only now (ASan would see otherwise). */
	fake_send_done(conn_of(state), 0);
	assert_null(transport_of(state)->sent);
}

static void advance_commits_only_what_the_last_buffer_lent(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_advance(w, 1), -EINVAL);            /* no buffer yet */
	assert_int_equal(perch_pipe_get_buffer(w, 8, &buf, &len), 0);
	memcpy(buf, "abc", 3);
	assert_int_equal(perch_pipe_advance(w, 3), 0);
	assert_int_equal(perch_pipe_advance(w, len - 3 + 1), -EINVAL);  /* past what it lent */
	assert_int_equal(perch_pipe_write(w, "def", 3), 0);
	assert_int_equal(perch_pipe_advance(w, 1), -EINVAL);            /* the write took its place */
	assert_int_equal(conn_of(state)->staged_len, 6);
}

static void write_after_complete_returns_einval(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_write(w, "dropped", 7), 0);
	assert_int_equal(perch_pipe_writer_complete(w), 0);
	assert_int_equal(perch_pipe_writer_complete(w), 0);
	assert_int_equal(perch_pipe_write(w, "x", 1), -EINVAL);
	assert_int_equal(perch_pipe_get_buffer(w, 1, &buf, &len), -EINVAL);
	assert_int_equal(perch_pipe_advance(w, 0), -EINVAL);
	assert_int_equal(perch_pipe_flush(w, &h), -EINVAL);
	assert_int_equal(conn_of(state)->staged_len, 0);
	assert_int_equal(transport_of(state)->sends, 0);
}

static void bad_arguments_return_einval(void **state)
{
	struct perch_pipe_writer *w = writer_of(state), *none = NULL;
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_writer_new(NULL, &none), -EINVAL);
	assert_int_equal(perch_pipe_writer_new(conn_of(state), NULL), -EINVAL);
	assert_int_equal(perch_pipe_write(w, NULL, 1), -EINVAL);
	assert_int_equal(perch_pipe_write(w, NULL, 0), 0);
	assert_int_equal(perch_pipe_get_buffer(w, 1, NULL, &len), -EINVAL);
	assert_int_equal(perch_pipe_get_buffer(w, 1, &buf, NULL), -EINVAL);
	assert_int_equal(perch_pipe_get_buffer(w, (size_t)UINT32_MAX + 1, &buf, &len), -EINVAL);
	assert_int_equal(perch_pipe_flush(w, NULL), -EINVAL);
	assert_int_equal(perch_pipe_flush(NULL, &h), -EINVAL);
	assert_int_equal(perch_pipe_writer_complete(NULL), -EINVAL);
	perch_pipe_writer_free(NULL);
	assert_null(none);
}

/* ---- a cancel or a second flush against a flush's completion (from the second independent review) ---- */

static struct perch_pipe_writer *hooked_writer;
static struct perch__transport_ops hooked_ops;

/* Off the loop, the flusher is slow to return: the kernel takes the send, then a cancel comes. */
static void send_then_complete_then_cancel(struct perch_conn *c, struct perch__txbuf *chain)
{
	fake_send(c, chain);
	fake_send_done(c, 0);
	assert_int_equal(perch_pipe_cancel_pending_flush(hooked_writer), 0);
}

static void a_cancel_after_the_kernel_took_the_flush_is_kept_for_the_next_flush(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_conn *c = conn_of(state);
	const struct perch__transport_ops *saved = c->ops;
	struct perch_vtask_handle h;
	int64_t result = 1;
	hooked_ops = fake_ops;
	hooked_ops.send = send_then_complete_then_cancel;
	hooked_writer = w;
	c->ops = &hooked_ops;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	c->ops = saved;
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, 0);
	/* The flush took the mark after its park, found itself complete, and put the mark back. */
	assert_int_equal(perch_pipe_write(w, "b", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), -ECANCELED);
}

static void (*real_flush_done)(struct perch_flush_listener *, struct perch_conn *, uint64_t, int);
static int flush_in_the_gap_rc;

/* The conn let its guard go and is about to signal: the writer's thread flushes again. */
static void flush_again_before_the_signal(struct perch_flush_listener *l, struct perch_conn *c,
					  uint64_t cookie, int result)
{
	struct perch_vtask_handle second = { NULL, 0 };
	l->on_flush_done = real_flush_done;
	assert_int_equal(perch_pipe_write(hooked_writer, "b", 1), 0);
	flush_in_the_gap_rc = perch_pipe_flush(hooked_writer, &second);
	real_flush_done(l, c, cookie, result);
}

static void a_flush_while_the_last_ones_completion_is_signalled_is_refused(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h;
	struct cont_probe p = { 0, -1 };
	hooked_writer = w;
	real_flush_done = w->listener.on_flush_done;
	w->listener.on_flush_done = flush_again_before_the_signal;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, cont_probe_fn, &p), PERCH_PENDING);
	fake_send_done(conn_of(state), 0);
	assert_int_equal(flush_in_the_gap_rc, -EBUSY);
	assert_int_equal(p.runs, 1);
	assert_int_equal(p.result, 0);
	/* The byte written in the gap waits for the next flush. */
	assert_int_equal(perch_pipe_flush(w, &h), PERCH_PENDING);
	assert_int_equal(transport_of(state)->sent->len, 1);
	fake_send_done(conn_of(state), 0);
}

static uint64_t (*real_flush_parking)(struct perch_flush_listener *, struct perch_conn *);

static uint64_t close_while_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	uint64_t token = real_flush_parking(l, c);
	perch_conn_close(c);
	return token;
}

static void a_cancel_after_a_close_while_arming_goes_to_the_next_flush(void **state)
{
	struct perch_pipe_writer *w = writer_of(state);
	struct perch_vtask_handle h = { NULL, 0 };
	real_flush_parking = w->listener.on_parking;
	w->listener.on_parking = close_while_parking;
	assert_int_equal(perch_pipe_write(w, "a", 1), 0);
	assert_int_equal(perch_pipe_flush(w, &h), -EPIPE);
	w->listener.on_parking = real_flush_parking;
	/* The version that park readied is nobody's: the cancel marks the next flush instead. */
	assert_int_equal(perch_pipe_cancel_pending_flush(w), 0);
	assert_int_equal(perch_pipe_flush(w, &h), -ECANCELED);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		PIPE_TEST(flush_parks_until_the_kernel_took_every_byte),
		PIPE_TEST(get_buffer_and_advance_stage_without_a_copy),
		PIPE_TEST(flush_with_nothing_staged_is_done_at_once_and_readies_nothing),
		PIPE_TEST(flush_with_nothing_staged_leaves_an_earlier_flushs_unread_result_readable),
		PIPE_TEST(second_flush_refused_while_one_is_parked_leaves_it_to_complete),
		PIPE_TEST(flush_after_the_peer_closed_leaves_the_kernels_flush_to_complete),
		PIPE_TEST(writing_while_a_flush_is_in_progress_is_refused_not_corrupted),
		PIPE_TEST(close_fails_the_parked_flush_and_later_writes),
		PIPE_TEST(shutdown_after_the_writers_last_flush_refuses_later_writes),
		PIPE_TEST(an_advance_after_the_shutdown_is_refused_and_nothing_is_sent),
		PIPE_TEST(send_error_fails_the_parked_flush),
		PIPE_TEST(cancel_completes_the_parked_flush_or_marks_the_next_and_loses_nothing),
		PIPE_TEST(a_flush_refused_while_one_waits_leaves_a_cancels_mark_to_the_waiting_one),
		PIPE_TEST(a_writer_freed_after_a_cancel_outlives_the_kernels_flush),
		PIPE_TEST(advance_commits_only_what_the_last_buffer_lent),
		PIPE_TEST(write_after_complete_returns_einval),
		PIPE_TEST(bad_arguments_return_einval),
		PIPE_TEST(a_cancel_after_the_kernel_took_the_flush_is_kept_for_the_next_flush),
		PIPE_TEST(a_flush_while_the_last_ones_completion_is_signalled_is_refused),
		PIPE_TEST(a_cancel_after_a_close_while_arming_goes_to_the_next_flush),
	};
	return cmocka_run_group_tests_name("pipe_writer", tests, NULL, NULL);
}
