/* tests/test_mem_pipe.c: the in-memory pipe: zero-copy handover, pause/resume backpressure, completion both ways, stacking. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <perch.h>

#include "cmocka_prelude.h"
#include "pipe_internal.h"

struct ends {
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
};

/* pause 8, resume 4: small enough to count by hand. */
static int setup(void **state)
{
	struct ends *e = calloc(1, sizeof(*e));
	struct perch_pipe_opts o = { .pause_bytes = 8, .resume_bytes = 4 };
	assert_int_equal(perch_pipe_new(&o, &e->r, &e->w), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct ends *e = *state;
	perch_pipe_reader_free(e->r);
	perch_pipe_writer_free(e->w);
	free(e);
	return 0;
}

#define R(state) (((struct ends *)*(state))->r)
#define W(state) (((struct ends *)*(state))->w)

static void flush_below_pause_is_done_and_the_reader_sees_the_writers_buffer(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_get_buffer(W(state), 3, &buf, &len), 0);
	memcpy(buf, "abc", 3);
	assert_int_equal(perch_pipe_advance(W(state), 3), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0);
	assert_int_equal(perch_pipe_read(R(state), &res, &h), 0);
	assert_int_equal(res.len, 3);
	assert_ptr_equal(res.first->data, buf);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0);
}

static void flush_at_pause_waits_until_the_reader_consumes_down_to_resume(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h, rh;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_write(W(state), "0123456789", 10), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), PERCH_PENDING);
	/* Writes are refused while the flush waits; nothing is staged. */
	assert_int_equal(perch_pipe_write(W(state), "x", 1), -EBUSY);
	assert_int_equal(perch_pipe_get_buffer(W(state), 1, &buf, &len), -EBUSY);
	assert_int_equal(perch_pipe_flush(W(state), &rh), -EBUSY);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(res.len, 10);
	/* Consumed to 5 unread, all examined: above resume, still waiting. */
	assert_int_equal(perch_pipe_advance_to(R(state), 5, 10), 0);
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	assert_int_equal(perch_pipe_try_read(R(state), &res), -EAGAIN);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), PERCH_PENDING);
	/* The buffer is one segment: it goes back, and room comes, once all of it is consumed. */
	assert_int_equal(perch_pipe_write(W(state), "y", 1), -EBUSY);
	perch_pipe_cancel_pending_read(R(state));
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_true(res.canceled);
	assert_int_equal(perch_pipe_advance_to(R(state), 5, 5), 0);
	int64_t result = -1;
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, 0);
	assert_int_equal(perch_pipe_write(W(state), "y", 1), 0);
}

static void resume_threshold_is_honoured_across_segments(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h, rh;
	/* Three flushes, three segments of 3: the third crosses pause (9 >= 8). */
	for (int i = 0; i < 2; i++) {
		assert_int_equal(perch_pipe_write(W(state), "abc", 3), 0);
		assert_int_equal(perch_pipe_flush(W(state), &h), 0);
	}
	assert_int_equal(perch_pipe_write(W(state), "abc", 3), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(res.len, 9);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0);   /* 6 unread > 4 */
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0);   /* 3 unread <= 4 */
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0);
}

static void consuming_part_of_a_segment_makes_room_byte_by_byte(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h, rh;
	/* One buffer, one segment of 10: keeping 4 of it unread is at resume, so the flush completes. */
	assert_int_equal(perch_pipe_write(W(state), "0123456789", 10), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 5, 10), 0);    /* 5 unread > 4 */
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	assert_int_equal(perch_pipe_write(W(state), "x", 1), -EBUSY);
	perch_pipe_cancel_pending_read(R(state));
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 1, 5), 0);     /* 4 unread: room */
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_pipe_write(W(state), "x", 1), 0);
}

/* A continuation that frees the end it was waiting on, as a session's end() does. */
static struct perch_pipe_writer *free_me_writer;
static struct perch_pipe_reader *free_me_reader;
static int frees_from_continuation;

static void free_writer_again(void *arg, int64_t result)
{
	frees_from_continuation++;
	perch_pipe_writer_free(free_me_writer);
}

static void free_reader_again(void *arg, int64_t result)
{
	frees_from_continuation++;
	perch_pipe_reader_free(free_me_reader);
}

static void freeing_an_end_runs_its_waiting_continuation_once_and_a_free_from_there_is_ignored(void **state)
{
	struct ends *e = *state;
	struct perch_vtask_handle h, rh;
	struct perch_read_result res;
	assert_int_equal(perch_pipe_write(e->w, "0123456789", 10), 0);
	assert_int_equal(perch_pipe_flush(e->w, &h), PERCH_PENDING);
	free_me_writer = e->w;
	frees_from_continuation = 0;
	assert_int_equal(perch_vtask_on_complete(h, free_writer_again, NULL), PERCH_PENDING);
	perch_pipe_writer_free(e->w);
	e->w = NULL;
	assert_int_equal(frees_from_continuation, 1);
	/* The bytes flushed before stay readable; then the end of the stream. */
	assert_int_equal(perch_pipe_read(e->r, &res, &rh), 0);
	assert_int_equal(res.len, 10);
	assert_true(res.completed);
	assert_int_equal(perch_pipe_advance_to(e->r, 10, 10), 0);
	/* The reader likewise, with a read parked on an empty, unfinished pipe. */
	struct perch_pipe_reader *r2;
	struct perch_pipe_writer *w2;
	assert_int_equal(perch_pipe_new(NULL, &r2, &w2), 0);
	assert_int_equal(perch_pipe_read(r2, &res, &rh), PERCH_PENDING);
	free_me_reader = r2;
	assert_int_equal(perch_vtask_on_complete(rh, free_reader_again, NULL), PERCH_PENDING);
	perch_pipe_reader_free(r2);
	assert_int_equal(frees_from_continuation, 2);
	assert_int_equal(perch_pipe_write(w2, "x", 1), -EPIPE);
	perch_pipe_writer_free(w2);
}

/* A read continuation that frees both ends of its pipe: the flush delivering to it is still under way. */
static struct ends both_ends;
static int freed_both;

static void free_both_ends(void *arg, int64_t result)
{
	(void)arg;
	(void)result;
	perch_pipe_reader_free(both_ends.r);
	perch_pipe_writer_free(both_ends.w);
	freed_both++;
}

static void no_continuation(void *arg, int64_t result)
{
	(void)arg;
	(void)result;
	fail_msg("a flush whose pipe went inside it called back");
}

/* The flush holds its pipe while it delivers: what the reader's continuation frees outlives it (ASan). */
static void a_flush_outlives_both_ends_freed_by_the_read_it_delivers(void **state)
{
	(void)state;
	struct perch_read_result res;
	assert_int_equal(perch_pipe_new(NULL, &both_ends.r, &both_ends.w), 0);
	freed_both = 0;
	assert_int_equal(perch_pipe_read_or_wait(both_ends.r, &res, free_both_ends, NULL), PERCH_PENDING);
	assert_int_equal(perch_pipe_write(both_ends.w, "hi", 2), 0);
	int rc = perch_pipe_flush_or_wait(both_ends.w, no_continuation, NULL);
	assert_int_equal(freed_both, 1);
	assert_int_equal(rc, -EPIPE);   /* the reader went inside the flush: it says so, as after a reader's complete */
}

static void parked_read_is_completed_by_the_writers_flush(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h, wh;
	assert_int_equal(perch_pipe_read(R(state), &res, &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_write(W(state), "hi", 2), 0);
	assert_int_equal(perch_pipe_flush(W(state), &wh), 0);
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_pipe_read(R(state), &res, &h), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(perch_pipe_advance_to(R(state), 2, 2), 0);
}

static void writer_complete_delivers_its_bytes_then_completed(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(W(state), "tail", 4), 0);
	assert_int_equal(perch_pipe_writer_complete(W(state)), 0);
	assert_int_equal(perch_pipe_writer_complete(W(state)), 0);
	assert_int_equal(perch_pipe_write(W(state), "x", 1), -EINVAL);
	assert_int_equal(perch_pipe_read(R(state), &res, &h), 0);
	assert_int_equal(res.len, 4);
	assert_true(res.completed);
	assert_int_equal(perch_pipe_advance_to(R(state), 4, 4), 0);
	assert_int_equal(perch_pipe_read(R(state), &res, &h), 0);
	assert_true(res.completed);
	assert_int_equal(res.len, 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 0, 0), 0);
}

static void reader_complete_fails_the_waiting_flush_and_later_writes_with_epipe(void **state)
{
	struct perch_vtask_handle h;
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(W(state), "0123456789", 10), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_reader_complete(R(state)), 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -EPIPE);
	assert_int_equal(perch_pipe_write(W(state), "x", 1), -EPIPE);
	assert_int_equal(perch_pipe_flush(W(state), &h), -EPIPE);
}

static void cancel_completes_the_waiting_flush_or_marks_the_next(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h, rh;
	int64_t result = 0;
	assert_int_equal(perch_pipe_write(W(state), "0123456789", 10), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), PERCH_PENDING);
	assert_int_equal(perch_pipe_cancel_pending_flush(W(state)), 0);
	assert_int_equal(perch_vtask_result(h, &result), 0);
	assert_int_equal(result, -ECANCELED);
	/* The bytes were flushed all the same: the reader has them. */
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(res.len, 10);
	assert_int_equal(perch_pipe_advance_to(R(state), 10, 10), 0);
	assert_int_equal(perch_pipe_cancel_pending_flush(W(state)), 0);
	assert_int_equal(perch_pipe_write(W(state), "ab", 2), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), -ECANCELED);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0);
	assert_int_equal(perch_pipe_read(R(state), &res, &rh), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(perch_pipe_advance_to(R(state), 2, 2), 0);
}

/* A layer: reads one pipe, upper-cases, writes the next. Both ends on this thread. */
static void layers_stack_through_two_pipes(void **state)
{
	struct perch_pipe_reader *r2;
	struct perch_pipe_writer *w2;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_new(NULL, &r2, &w2), 0);
	assert_int_equal(perch_pipe_write(W(state), "sta", 3), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0);
	assert_int_equal(perch_pipe_write(W(state), "ck", 2), 0);
	assert_int_equal(perch_pipe_writer_complete(W(state)), 0);
	for (;;) {
		assert_int_equal(perch_pipe_read(R(state), &res, &h), 0);
		size_t off = res.first_off;
		for (struct perch_seg *s = res.first; s; s = s->next, off = 0)
			for (size_t i = off; i < s->len; i++) {
				char up = (char)(s->data[i] - 'a' + 'A');
				assert_int_equal(perch_pipe_write(w2, &up, 1), 0);
			}
		assert_int_equal(perch_pipe_advance_to(R(state), res.len, res.len), 0);
		if (res.completed)
			break;
	}
	assert_int_equal(perch_pipe_writer_complete(w2), 0);
	assert_int_equal(perch_pipe_read(r2, &res, &h), 0);
	assert_int_equal(res.len, 5);
	assert_true(res.completed);
	assert_memory_equal(res.first->data, "STACK", 5);
	assert_int_equal(perch_pipe_advance_to(r2, 5, 5), 0);
	perch_pipe_reader_free(r2);
	perch_pipe_writer_free(w2);
}

/*
 * A pipe's buffer forwarded to the next pipe is the same memory at the far
 * end (5000 bytes: a 4 KiB buffer lent, the rest copied); a refused forward
 * leaves the result whole.
 */
static void forward_hands_a_pipes_buffers_to_the_next_pipe_without_a_copy(void **state)
{
	struct perch_pipe_reader *r1, *r2, *r3;
	struct perch_pipe_writer *w1, *w2, *w3;
	struct perch_read_result res, far;
	struct perch_vtask_handle h;
	static uint8_t bytes[5000];
	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (uint8_t)(i * 13 + 1);
	assert_int_equal(perch_pipe_new(NULL, &r1, &w1), 0);
	assert_int_equal(perch_pipe_new(NULL, &r2, &w2), 0);
	assert_int_equal(perch_pipe_new(NULL, &r3, &w3), 0);
	assert_int_equal(perch_pipe_write(w1, bytes, sizeof(bytes)), 0);
	assert_int_equal(perch_pipe_flush(w1, &h), 0);
	assert_int_equal(perch_pipe_read(r1, &res, &h), 0);
	assert_int_equal(res.len, sizeof(bytes));
	/* Refused: a completed writer, a pipe whose reader is gone, NULLs. Nothing consumed. */
	assert_int_equal(perch_pipe_writer_complete(w3), 0);
	assert_int_equal(perch_pipe_forward(r1, res.len, res.len, w3), -EINVAL);
	assert_int_equal(perch_pipe_reader_complete(r3), 0);
	assert_int_equal(perch_pipe_forward(NULL, 0, 0, w2), -EINVAL);
	assert_int_equal(perch_pipe_forward(r1, 0, 0, NULL), -EINVAL);
	assert_int_equal(perch_pipe_forward(r1, res.len, res.len + 1, w2), -EINVAL);
	assert_int_equal(perch_pipe_forward(r1, res.len, res.len, w2), 0);
	assert_int_equal(perch_pipe_advance_to(r1, 0, 0), -EINVAL); /* the forward ended the result */
	assert_int_equal(perch_pipe_flush(w2, &h), 0);
	assert_int_equal(perch_pipe_read(r2, &far, &h), 0);
	assert_int_equal(far.len, sizeof(bytes));
	assert_ptr_equal(far.first->data, res.first->data); /* the first pipe's buffer itself */
	size_t at = 0;
	for (struct perch_seg *s = far.first; s; s = s->next) {
		assert_memory_equal(s->data, bytes + at, s->len);
		at += s->len;
	}
	assert_int_equal(at, sizeof(bytes));
	assert_int_equal(perch_pipe_advance_to(r2, far.len, far.len), 0);
	perch_pipe_reader_free(r1);
	perch_pipe_writer_free(w1);
	perch_pipe_reader_free(r2);
	perch_pipe_writer_free(w2);
	perch_pipe_reader_free(r3);
	perch_pipe_writer_free(w3);
}

static void a_forward_into_a_pipe_whose_reader_is_gone_consumes_nothing(void **state)
{
	struct perch_pipe_reader *r2;
	struct perch_pipe_writer *w2;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_new(NULL, &r2, &w2), 0);
	assert_int_equal(perch_pipe_reader_complete(r2), 0);
	assert_int_equal(perch_pipe_write(W(state), "abc", 3), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0);
	assert_int_equal(perch_pipe_read(R(state), &res, &h), 0);
	assert_int_equal(perch_pipe_forward(R(state), 3, 3, w2), -EPIPE);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0); /* the result was still there */
	perch_pipe_reader_free(r2);
	perch_pipe_writer_free(w2);
}

/* The staged count is what was committed since the last flush; the mark is reached at, not past, it. */
static void staged_bytes_are_counted_until_a_flush_and_the_high_water_mark_is_reached_at_it(void **state)
{
	struct perch_vtask_handle h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(perch_pipe_writer_staged(W(state)), 0);
	assert_false(perch_pipe_writer_above_high_water(W(state)));
	assert_int_equal(perch_pipe_writer_set_high_water(W(state), 5), 0);
	assert_int_equal(perch_pipe_write(W(state), "abcd", 4), 0);
	assert_int_equal(perch_pipe_get_buffer(W(state), 8, &buf, &len), 0);
	assert_int_equal(perch_pipe_writer_staged(W(state)), 4); /* lent, not committed */
	assert_false(perch_pipe_writer_above_high_water(W(state)));
	assert_int_equal(perch_pipe_advance(W(state), 1), 0);
	assert_int_equal(perch_pipe_writer_staged(W(state)), 5);
	assert_true(perch_pipe_writer_above_high_water(W(state)));
	assert_int_equal(perch_pipe_flush(W(state), &h), 0); /* 5 of pause 8: done at once */
	assert_int_equal(perch_pipe_writer_staged(W(state)), 0);
	assert_false(perch_pipe_writer_above_high_water(W(state)));
	/* 0 is the default mark again: 64 KiB. */
	assert_int_equal(perch_pipe_writer_set_high_water(W(state), 0), 0);
	assert_int_equal(perch_pipe_write(W(state), "abcdef", 6), 0);
	assert_false(perch_pipe_writer_above_high_water(W(state)));
	assert_int_equal(perch_pipe_writer_set_high_water(NULL, 1), -EINVAL);
	assert_int_equal(perch_pipe_writer_staged(NULL), 0);
	assert_false(perch_pipe_writer_above_high_water(NULL));
	assert_int_equal(perch_conn_staged(NULL), 0);
}

struct calls {
	int runs;
	int64_t result;
};

static void count_call(void *arg, int64_t result)
{
	struct calls *k = arg;
	k->runs++;
	k->result = result;
}

/* One call reads or registers: a result at once, else the continuation once (0, or -ECANCELED), never inside. */
static void read_or_wait_reads_at_once_or_calls_back_once(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct calls k = { 0 };
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, NULL, &k), -EINVAL);
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, count_call, &k), PERCH_PENDING);
	assert_int_equal(k.runs, 0);
	assert_int_equal(perch_pipe_write(W(state), "ab", 2), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0); /* the flush completes the read: its continuation runs here */
	assert_int_equal(k.runs, 1);
	assert_int_equal(k.result, 0);
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, count_call, &k), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(k.runs, 1); /* a result at once: no continuation */
	assert_int_equal(perch_pipe_advance_to(R(state), 2, 2), 0);
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, count_call, &k), PERCH_PENDING);
	assert_int_equal(perch_pipe_reader_complete(R(state)), 0);
	assert_int_equal(k.runs, 2);
	assert_int_equal(k.result, -ECANCELED);
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, count_call, &k), -EINVAL); /* completed */
}

/*
 * A version readied for a read that was served as it parked was never
 * published: read_or_wait then registers its continuation after the park.
 */
static void read_or_wait_after_an_unpublished_version_calls_back_once(void **state)
{
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct calls k = { 0 };
	uint32_t unpublished = perch_vtask_ready(&R(state)->vt);
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, count_call, &k), PERCH_PENDING);
	assert_int_not_equal(R(state)->parked_token, unpublished);
	assert_int_equal(perch_pipe_write(W(state), "ab", 2), 0);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0);
	assert_int_equal(k.runs, 1);
	assert_int_equal(k.result, 0);
	assert_int_equal(perch_pipe_read_or_wait(R(state), &res, count_call, &k), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(perch_pipe_advance_to(R(state), 2, 2), 0);
	assert_int_equal(k.runs, 1);
}

/* Below the pause a flush is done at once; at it, the continuation runs once the reader made room. */
static void flush_or_wait_is_done_at_once_or_calls_back_once(void **state)
{
	struct perch_read_result res;
	struct calls k = { 0 };
	assert_int_equal(perch_pipe_flush_or_wait(W(state), NULL, &k), -EINVAL);
	assert_int_equal(perch_pipe_write(W(state), "abc", 3), 0);
	assert_int_equal(perch_pipe_flush_or_wait(W(state), count_call, &k), 0); /* 3 of pause 8 */
	assert_int_equal(perch_pipe_write(W(state), "defgh", 5), 0);
	assert_int_equal(perch_pipe_flush_or_wait(W(state), count_call, &k), PERCH_PENDING); /* 8 unread */
	assert_int_equal(k.runs, 0);
	assert_int_equal(perch_pipe_try_read(R(state), &res), 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 4, 4), 0); /* down to resume, 4 */
	assert_int_equal(k.runs, 1);
	assert_int_equal(k.result, 0);
	assert_int_equal(perch_pipe_write(W(state), "ijklm", 5), 0);
	assert_int_equal(perch_pipe_flush_or_wait(W(state), count_call, &k), PERCH_PENDING); /* 9 unread */
	assert_int_equal(perch_pipe_reader_complete(R(state)), 0);
	assert_int_equal(k.runs, 2);
	assert_int_equal(k.result, -EPIPE);
	assert_int_equal(perch_pipe_write(W(state), "n", 1), -EPIPE);
	assert_int_equal(perch_pipe_flush_or_wait(W(state), count_call, &k), -EPIPE); /* the reader is gone: refused now */
	assert_int_equal(k.runs, 2);
}

struct ref_release {
	int runs;
	const void *data;
};

static void note_ref_release(void *arg, const void *data, size_t len)
{
	struct ref_release *k = arg;
	k->runs++;
	k->data = data;
}

/* In memory the reader reads the caller's bytes where they are; the release runs once it consumed them all. */
static void a_referenced_write_is_read_in_place_and_released_once_consumed(void **state)
{
	static const char big[] = "abcdef";
	struct ref_release k = { 0 };
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write_ref(W(state), big, 6, NULL, &k), -EINVAL);
	assert_int_equal(perch_pipe_write_ref(W(state), big, 6, note_ref_release, &k), 0);
	assert_int_equal(perch_pipe_writer_staged(W(state)), 6);
	assert_int_equal(perch_pipe_flush(W(state), &h), 0); /* 6 of pause 8 */
	assert_int_equal(perch_pipe_try_read(R(state), &res), 0);
	assert_int_equal(res.len, 6);
	assert_ptr_equal(res.first->data + res.first_off, big);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0);
	assert_int_equal(k.runs, 0); /* half of it still unread */
	assert_int_equal(perch_pipe_try_read(R(state), &res), 0);
	assert_int_equal(perch_pipe_advance_to(R(state), 3, 3), 0);
	assert_int_equal(k.runs, 1);
	assert_ptr_equal(k.data, big);
}

static void bad_options_and_arguments_return_einval(void **state)
{
	struct perch_pipe_reader *r = NULL;
	struct perch_pipe_writer *w = NULL;
	struct perch_pipe_opts o = { .pause_bytes = 8, .resume_bytes = 8 };
	assert_int_equal(perch_pipe_new(&o, &r, &w), -EINVAL);
	assert_int_equal(perch_pipe_new(NULL, NULL, &w), -EINVAL);
	assert_int_equal(perch_pipe_new(NULL, &r, NULL), -EINVAL);
	assert_null(r);
	assert_null(w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(flush_below_pause_is_done_and_the_reader_sees_the_writers_buffer, setup, teardown),
		cmocka_unit_test_setup_teardown(flush_at_pause_waits_until_the_reader_consumes_down_to_resume, setup, teardown),
		cmocka_unit_test_setup_teardown(resume_threshold_is_honoured_across_segments, setup, teardown),
		cmocka_unit_test_setup_teardown(consuming_part_of_a_segment_makes_room_byte_by_byte, setup, teardown),
		cmocka_unit_test_setup_teardown(freeing_an_end_runs_its_waiting_continuation_once_and_a_free_from_there_is_ignored, setup, teardown),
		cmocka_unit_test_setup_teardown(parked_read_is_completed_by_the_writers_flush, setup, teardown),
		cmocka_unit_test_setup_teardown(writer_complete_delivers_its_bytes_then_completed, setup, teardown),
		cmocka_unit_test_setup_teardown(reader_complete_fails_the_waiting_flush_and_later_writes_with_epipe, setup, teardown),
		cmocka_unit_test_setup_teardown(cancel_completes_the_waiting_flush_or_marks_the_next, setup, teardown),
		cmocka_unit_test_setup_teardown(layers_stack_through_two_pipes, setup, teardown),
		cmocka_unit_test(forward_hands_a_pipes_buffers_to_the_next_pipe_without_a_copy),
		cmocka_unit_test_setup_teardown(a_forward_into_a_pipe_whose_reader_is_gone_consumes_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(staged_bytes_are_counted_until_a_flush_and_the_high_water_mark_is_reached_at_it,
						setup, teardown),
		cmocka_unit_test_setup_teardown(read_or_wait_reads_at_once_or_calls_back_once, setup, teardown),
		cmocka_unit_test_setup_teardown(read_or_wait_after_an_unpublished_version_calls_back_once, setup,
						teardown),
		cmocka_unit_test_setup_teardown(flush_or_wait_is_done_at_once_or_calls_back_once, setup, teardown),
		cmocka_unit_test_setup_teardown(a_referenced_write_is_read_in_place_and_released_once_consumed, setup,
						teardown),
		cmocka_unit_test_setup_teardown(bad_options_and_arguments_return_einval, setup, teardown),
		cmocka_unit_test(a_flush_outlives_both_ends_freed_by_the_read_it_delivers),
	};
	return cmocka_run_group_tests_name("mem_pipe", tests, NULL, NULL);
}
