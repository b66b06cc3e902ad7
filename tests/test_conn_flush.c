/* tests/test_conn_flush.c: the flush arm, one path per test: parked, refused, nothing staged, closed, order. */
#include "config.h"

#include <perch.h>

#include "conn_fixture.h"

static void flush_parks_and_is_delivered_once(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "hello", 5), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	assert_int_equal(f.parkings, 1);
	assert_int_equal(transport_of(state)->sends, 1);
	assert_int_equal(transport_of(state)->sent->len, 5);
	assert_memory_equal(transport_of(state)->sent->data, "hello", 5);
	assert_int_equal(f.deliveries, 0);
	fake_send_done(c, 0);
	assert_int_equal(f.deliveries, 1);
	assert_int_equal(f.last_result, 0);
}

static void flush_with_nothing_staged_leaves_the_earlier_result_readable(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct perch_vtask_handle first, second = { NULL, 0 };
	int64_t r = -1;
	assert_int_equal(perch_conn_write(c, "x", 1), 0);
	assert_int_equal(perch_conn_flush(c, &first), PERCH_PENDING);
	fake_send_done(c, 0);
	/* Nothing staged: done at once, and the earlier task is not readied again. */
	assert_int_equal(perch_conn_flush(c, &second), 0);
	assert_null(second.task);
	assert_int_equal(perch_vtask_result(first, &r), 0);
	assert_int_equal(r, 0);
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), 0);
	assert_int_equal(f.parkings, 0);
}

static void second_flush_refused_while_one_is_parked(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher first = COUNTING_FLUSHER, second = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &first.l), PERCH_PENDING);
	assert_int_equal(perch_conn_try_flush_or_park(c, &second.l), -EBUSY);
	assert_int_equal(second.parkings, 0);
	/* Writing while a flush is in progress is refused, not corrupted. */
	assert_int_equal(perch_conn_write(c, "b", 1), -EBUSY);
	fake_send_done(c, 0);
	assert_int_equal(first.deliveries, 1);
	assert_int_equal(second.deliveries, 0);
	assert_int_equal(transport_of(state)->sends, 1);
}

static void flush_after_peer_fin_leaves_the_kernels_flush_to_complete(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher first = COUNTING_FLUSHER, second = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &first.l), PERCH_PENDING);
	perch__conn_peer_closed(c);
	assert_int_equal(perch_conn_try_flush_or_park(c, &second.l), -EBUSY);
	assert_int_equal(second.parkings, 0);
	fake_send_done(c, 0);
	assert_int_equal(first.deliveries, 1);
	assert_int_equal(first.last_result, 0);
}

static void flush_on_closed_conn_leaves_the_outstanding_send_to_complete(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher first = COUNTING_FLUSHER, second = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &first.l), PERCH_PENDING);
	perch_conn_close(c);
	assert_int_equal(first.deliveries, 1);
	assert_int_equal(first.last_result, -EPIPE);
	/* The kernel still holds the send: its chain is alive until its completion. */
	assert_non_null(transport_of(state)->sent);
	assert_int_equal(perch_conn_write(c, "b", 1), -EPIPE);
	assert_int_equal(perch_conn_try_flush_or_park(c, &second.l), 0);
	assert_int_equal(second.parkings, 0);
	fake_send_done(c, -ECANCELED);
	assert_int_equal(first.deliveries, 1);
	assert_int_equal(second.deliveries, 0);
}

static void flush_of_staged_bytes_on_closed_conn_is_refused_and_drops_them(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "abc", 3), 0);
	perch__conn_failed(c, -ECONNRESET);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), -EPIPE);
	assert_int_equal(f.parkings, 0);
	assert_int_equal(transport_of(state)->sends, 0);
	assert_int_equal(c->staged_len, 0);
	assert_int_equal(c->flush_busy, 0);
}

static void error_fails_the_parked_flush_once(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "abc", 3), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	perch__conn_failed(c, ECONNRESET);
	assert_int_equal(f.deliveries, 1);
	assert_int_equal(f.last_result, -ECONNRESET);
	fake_send_done(c, -ECONNRESET);
	perch_conn_close(c);
	assert_int_equal(f.deliveries, 1);
}

/* Seen from inside on_flush_done: disarmed, listener taken, guard released, in that order before the signal. */
static struct counting_flusher next_flusher = COUNTING_FLUSHER;
static int checks_in_done;

static void check_order_then_flush_again(struct counting_flusher *f, struct perch_conn *c)
{
	assert_int_equal(c->flush_armed, 0);
	assert_null(c->flush_listener);
	assert_int_equal(c->flush_busy, 0);
	checks_in_done++;
	f->during_done = NULL;
	assert_int_equal(perch_conn_write(c, "next", 4), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &next_flusher.l), PERCH_PENDING);
	/* Re-flushing with the same listener stores a new cookie; this delivery keeps its own. */
	assert_int_equal(f->last_cookie, 1);
}

static void flush_completion_disarms_takes_listener_releases_guard_then_signals(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher f = COUNTING_FLUSHER;
	f.during_done = check_order_then_flush_again;
	checks_in_done = 0;
	assert_int_equal(perch_conn_write(c, "first", 5), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	fake_send_done(c, 0);
	assert_int_equal(checks_in_done, 1);
	assert_int_equal(f.deliveries, 1);
	/* The flush made from inside the signal is its own, signalled by its own send. */
	assert_int_equal(next_flusher.parkings, 1);
	assert_int_equal(next_flusher.deliveries, 0);
	assert_int_equal(transport_of(state)->sent->len, 4);
	fake_send_done(c, 0);
	assert_int_equal(next_flusher.deliveries, 1);
	assert_int_equal(f.deliveries, 1);
}

/* The same listener parked twice in a row: each delivery hands back its own park's cookie. */
static void flush_delivery_carries_its_own_parks_cookie(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	fake_send_done(c, 0);
	assert_int_equal(f.last_cookie, 1);
	assert_int_equal(perch_conn_write(c, "b", 1), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	perch_conn_close(c);
	assert_int_equal(f.last_cookie, 2);
	assert_int_equal(f.last_result, -EPIPE);
}

static void (*real_self_flush_done)(struct perch_flush_listener *, struct perch_conn *, uint64_t, int);
static int flush_in_the_gap_rc;
static uint32_t first_flush_runs;

static void count_first_flush(void *arg, int64_t result)
{
	first_flush_runs++;
	assert_int_equal(result, 0);
}

/* The guard is released and the signal not yet made: another thread flushes again. */
static void flush_again_before_the_signal(struct perch_flush_listener *l, struct perch_conn *c,
					  uint64_t cookie, int result)
{
	struct perch_vtask_handle second = { NULL, 0 };
	l->on_flush_done = real_self_flush_done;
	assert_int_equal(perch_conn_write(c, "b", 1), 0);
	flush_in_the_gap_rc = perch_conn_flush(c, &second);
	real_self_flush_done(l, c, cookie, result);
}

static void own_flush_while_the_last_ones_completion_is_signalled_is_refused(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct perch_vtask_handle h;
	first_flush_runs = 0;
	real_self_flush_done = perch__conn_self_flusher.on_flush_done;
	perch__conn_self_flusher.on_flush_done = flush_again_before_the_signal;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_flush(c, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_on_complete(h, count_first_flush, NULL), PERCH_PENDING);
	fake_send_done(c, 0);
	assert_int_equal(flush_in_the_gap_rc, -EBUSY);
	assert_int_equal(first_flush_runs, 1);
	/* The byte written in the gap goes with the next flush. */
	assert_int_equal(perch_conn_flush(c, &h), PERCH_PENDING);
	assert_int_equal(transport_of(state)->sent->len, 1);
	fake_send_done(c, 0);
	assert_int_equal(perch_vtask_status(h), 0);
}

static uint64_t (*real_self_flush_parking)(struct perch_flush_listener *, struct perch_conn *);

static uint64_t close_while_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	uint64_t token = real_self_flush_parking(l, c);
	perch_conn_close(c);
	return token;
}

static void own_flush_closed_while_arming_leaves_later_flushes_refused_as_closed(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct perch_vtask_handle h = { NULL, 0 };
	real_self_flush_parking = perch__conn_self_flusher.on_parking;
	perch__conn_self_flusher.on_parking = close_while_parking;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_flush(c, &h), -EPIPE);
	perch__conn_self_flusher.on_parking = real_self_flush_parking;
	/* The version that park readied was ended: a later flush is refused as closed, not as busy. */
	assert_int_equal(perch_conn_flush(c, &h), 0);
	assert_int_equal(perch_conn_write(c, "b", 1), -EPIPE);
}

/* The read side releases the user's one reference when it sees the close, as a server does. */
static uint64_t releasing_reader_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	return 1;
}

static void releasing_reader_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	perch_conn_release(c);
}

/*
 * The close lands while the conn's own flush arms and its wake lets the
 * user's last reference go: the flush's disarm drops the send's, the last
 * one, and nothing may touch the connection after (ASan and valgrind see it).
 */
static void own_flush_closed_while_arming_touches_nothing_after_the_last_reference(void **state)
{
	struct fake_transport t = { 0 };
	struct perch_recv_listener reader = { releasing_reader_parking, releasing_reader_ready };
	struct perch_read_result res;
	struct perch_vtask_handle h = { NULL, 0 };
	struct perch_conn *c = perch__conn_new(&fake_ops, &t);
	assert_non_null(c);
	assert_int_equal(perch_conn_try_read_or_park(c, &reader, &res), PERCH_PENDING);
	real_self_flush_parking = perch__conn_self_flusher.on_parking;
	perch__conn_self_flusher.on_parking = close_while_parking;
	assert_int_equal(perch_conn_write(c, "a", 1), 0);
	assert_int_equal(perch_conn_flush(c, &h), -EPIPE);
	assert_int_equal(t.destroyed, 1);
}

static void large_write_spans_buffers_in_order(void **state)
{
	struct perch_conn *c = conn_of(state);
	static uint8_t big[10000];
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7);
	assert_int_equal(perch_conn_write(c, big, 100), 0);
	assert_int_equal(perch_conn_write(c, big + 100, sizeof(big) - 100), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_flush(c, &h), PERCH_PENDING);
	size_t off = 0;
	for (struct perch__txbuf *b = transport_of(state)->sent; b; b = b->next) {
		assert_memory_equal(b->data, big + off, b->len);
		off += b->len;
	}
	assert_int_equal(off, sizeof(big));
	fake_send_done(c, 0);
	int64_t r = -1;
	assert_int_equal(perch_vtask_wait(h, 0, &r), 0);
	assert_int_equal(r, 0);
}

static void bad_arguments_return_einval(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_flusher f = COUNTING_FLUSHER;
	struct perch_flush_listener half = { counting_flusher_parking, NULL };
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_write(NULL, "a", 1), -EINVAL);
	assert_int_equal(perch_conn_write(c, NULL, 1), -EINVAL);
	assert_int_equal(perch_conn_write(c, NULL, 0), 0);
	assert_int_equal(perch_conn_try_flush_or_park(NULL, &f.l), -EINVAL);
	assert_int_equal(perch_conn_try_flush_or_park(c, NULL), -EINVAL);
	assert_int_equal(perch_conn_try_flush_or_park(c, &half), -EINVAL);
	assert_int_equal(perch_conn_flush(c, NULL), -EINVAL);
	assert_int_equal(perch_conn_flush(NULL, &h), -EINVAL);
	assert_int_equal(c->flush_busy, 0);
}

/* ---- referenced writes: the caller's bytes sent in place, released once ---- */

struct releases {
	int runs;
	const void *data;
	size_t len;
};

static void count_release(void *arg, const void *data, size_t len)
{
	struct releases *k = arg;
	k->runs++;
	k->data = data;
	k->len = len;
}

/* Copied and referenced bytes go out in order; the reference is the caller's memory, released after the send. */
static void a_referenced_write_is_sent_in_place_in_order_and_released_after_the_send(void **state)
{
	struct perch_conn *c = conn_of(state);
	static const char big[] = "the caller's own bytes";
	struct releases k = { 0 };
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write(c, "<", 1), 0);
	assert_int_equal(perch_conn_write_ref(c, big, sizeof(big) - 1, count_release, &k), 0);
	assert_int_equal(perch_conn_write(c, ">", 1), 0);
	assert_int_equal(perch_conn_staged(c), sizeof(big) + 1);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	const struct perch__txbuf *b = transport_of(state)->sent;
	assert_int_equal(b->len, 1);
	assert_memory_equal(b->bytes, "<", 1);
	b = b->next;
	assert_ptr_equal(b->bytes, big); /* not a copy */
	assert_int_equal(b->len, sizeof(big) - 1);
	b = b->next;
	assert_int_equal(b->len, 1);
	assert_memory_equal(b->bytes, ">", 1);
	assert_null(b->next);
	assert_int_equal(k.runs, 0); /* the kernel still reads them */
	fake_send_done(c, (int)sizeof(big) + 1);
	assert_int_equal(k.runs, 1);
	assert_ptr_equal(k.data, big);
	assert_int_equal(k.len, sizeof(big) - 1);
	assert_int_equal(f.deliveries, 1);
}

/* Dropped unsent (a flush after the close), the reference is released once; bad calls stage nothing. */
static void a_referenced_write_dropped_unsent_is_released_once_and_bad_calls_stage_nothing(void **state)
{
	struct perch_conn *c = conn_of(state);
	static const char big[] = "abc";
	struct releases k = { 0 };
	struct counting_flusher f = COUNTING_FLUSHER;
	assert_int_equal(perch_conn_write_ref(NULL, big, 3, count_release, &k), -EINVAL);
	assert_int_equal(perch_conn_write_ref(c, NULL, 3, count_release, &k), -EINVAL);
	assert_int_equal(perch_conn_write_ref(c, big, 0, count_release, &k), -EINVAL);
	assert_int_equal(perch_conn_write_ref(c, big, 3, NULL, &k), -EINVAL);
	assert_int_equal(perch_conn_write_ref(c, big, (size_t)UINT32_MAX + 1, count_release, &k), -EINVAL);
	assert_int_equal(perch_conn_staged(c), 0);
	assert_int_equal(perch_conn_write_ref(c, big, 3, count_release, &k), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), PERCH_PENDING);
	assert_int_equal(perch_conn_write_ref(c, big, 3, count_release, &k), -EBUSY); /* a flush is out */
	fake_send_done(c, 3);
	assert_int_equal(k.runs, 1);
	assert_int_equal(perch_conn_write_ref(c, big, 3, count_release, &k), 0);
	assert_int_equal(perch_conn_close(c), 0);
	assert_int_equal(perch_conn_try_flush_or_park(c, &f.l), -EPIPE);
	assert_int_equal(k.runs, 2); /* the second, dropped unsent */
	assert_int_equal(perch_conn_write_ref(c, big, 3, count_release, &k), -EPIPE);
	assert_int_equal(k.runs, 2);
}

/*
 * The connection's own flusher is one for every connection: a test that
 * swaps its calls gets them back after, even when it failed midway.
 */
static struct perch_flush_listener own_flusher_calls;

static int put_back_own_flusher(void **state)
{
	perch__conn_self_flusher = own_flusher_calls;
	return 0;
}

static int teardown_putting_back_own_flusher(void **state)
{
	put_back_own_flusher(state);
	return teardown(state);
}

int main(void)
{
	own_flusher_calls = perch__conn_self_flusher;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(flush_parks_and_is_delivered_once, setup, teardown),
		cmocka_unit_test_setup_teardown(a_referenced_write_is_sent_in_place_in_order_and_released_after_the_send,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_referenced_write_dropped_unsent_is_released_once_and_bad_calls_stage_nothing,
						setup, teardown),
		cmocka_unit_test_setup_teardown(flush_with_nothing_staged_leaves_the_earlier_result_readable, setup, teardown),
		cmocka_unit_test_setup_teardown(second_flush_refused_while_one_is_parked, setup, teardown),
		cmocka_unit_test_setup_teardown(flush_after_peer_fin_leaves_the_kernels_flush_to_complete, setup, teardown),
		cmocka_unit_test_setup_teardown(flush_on_closed_conn_leaves_the_outstanding_send_to_complete, setup, teardown),
		cmocka_unit_test_setup_teardown(flush_of_staged_bytes_on_closed_conn_is_refused_and_drops_them, setup, teardown),
		cmocka_unit_test_setup_teardown(error_fails_the_parked_flush_once, setup, teardown),
		cmocka_unit_test_setup_teardown(flush_completion_disarms_takes_listener_releases_guard_then_signals, setup, teardown),
		cmocka_unit_test_setup_teardown(flush_delivery_carries_its_own_parks_cookie, setup, teardown),
		cmocka_unit_test_setup_teardown(own_flush_while_the_last_ones_completion_is_signalled_is_refused, setup, teardown_putting_back_own_flusher),
		cmocka_unit_test_setup_teardown(own_flush_closed_while_arming_leaves_later_flushes_refused_as_closed, setup, teardown_putting_back_own_flusher),
		cmocka_unit_test_teardown(own_flush_closed_while_arming_touches_nothing_after_the_last_reference,
					  put_back_own_flusher),
		cmocka_unit_test_setup_teardown(large_write_spans_buffers_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_arguments_return_einval, setup, teardown),
	};
	return cmocka_run_group_tests_name("conn_flush", tests, NULL, NULL);
}
