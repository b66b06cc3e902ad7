/* tests/test_conn_read.c: the read slot, one path per test: served, parked, refused, marked, closed (or aborted), canceled, EOF. */
#include "config.h"

#include <pthread.h>
#include <sched.h>

#include <perch.h>

#include "conn_fixture.h"
#include "malloc_fails.h"

static void read_with_bytes_queued_is_served_at_once(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	fake_recv(c, "hello");
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_int_equal(res.len, 5);
	assert_memory_equal(res.first->data + res.first_off, "hello", 5);
	assert_false(res.completed);
	assert_int_equal(r.parkings, 0);
	assert_int_equal(r.deliveries, 0);
	assert_int_equal(c->read_waiter, PERCH__SLOT_EMPTY);
}

/*
 * The segment fifo starts with two entries of the connection's own and
 * takes more while more wait: bursts of one to five segments, each read
 * whole, come out in order, and the connection's end frees what it took.
 */
static void bursts_of_segments_come_out_in_order(void **state)
{
	struct perch_conn *c = conn_of(state);
	char sent = 'a', want = 'a';
	for (int round = 0; round < 12; round++) {
		int burst = 1 + round % 5;
		for (int i = 0; i < burst; i++) {
			char one[2] = { sent, 0 };
			fake_recv(c, one);
			sent = sent == 'z' ? 'a' : (char)(sent + 1);
		}
		struct perch_read_result res;
		char got[8];
		assert_int_equal(perch_conn_try_read(c, &res), 0);
		assert_int_equal(res.len, (size_t)burst);
		assert_int_equal(perch_segs_copy(&res, 0, got, res.len), res.len);
		for (int i = 0; i < burst; i++) {
			assert_int_equal(got[i], want);
			want = want == 'z' ? 'a' : (char)(want + 1);
		}
		assert_int_equal(perch_conn_advance(c, res.len, res.len), 0);
	}
}

static void read_parks_and_is_delivered_once(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(r.parkings, 1);
	assert_int_equal(r.deliveries, 0);
	fake_recv(c, "ab");
	assert_int_equal(r.deliveries, 1);
	fake_recv(c, "cd");
	perch__conn_peer_closed(c);
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 4);
	assert_true(res.completed);
}

static void second_read_refused_while_parked_leaves_the_parked_one(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader first = COUNTING_READER, second = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &first.l, &res), PERCH_PENDING);
	assert_int_equal(perch_conn_try_read_or_park(c, &second.l, &res), -EBUSY);
	assert_int_equal(perch_conn_try_read(c, &res), -EBUSY);
	assert_int_equal(second.parkings, 0);
	fake_recv(c, "x");
	assert_int_equal(first.deliveries, 1);
	assert_int_equal(second.deliveries, 0);
	assert_int_equal(second.parkings, 0);
}

static void land_bytes_during_parking(struct perch_conn *c)
{
	fake_recv(c, "late");
}

static void completion_during_on_parking_is_served_synchronously(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	r.during_parking = land_bytes_during_parking;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_int_equal(res.len, 4);
	assert_int_equal(r.parkings, 1);
	assert_int_equal(r.deliveries, 0);
	/* The slot was released: the next read claims it and parks. */
	assert_int_equal(c->read_waiter, PERCH__SLOT_EMPTY);
	assert_int_equal(perch_conn_advance(c, 4, 4), 0);
	r.during_parking = NULL;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	perch_conn_close(c);
	assert_int_equal(r.deliveries, 1);
}

/* An abort ends the read as a close does; the transport is ended with its abort, once. */
static void abort_while_parked_delivers_closed_once_and_ends_the_transport_with_its_abort(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(perch_conn_abort(c), 0);
	assert_int_equal(perch_conn_abort(c), 0);
	assert_int_equal(perch_conn_close(c), 0);
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(t->aborts, 1);
	assert_int_equal(t->closes, 0);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_true(res.closed);
	assert_int_equal(perch_conn_abort(NULL), -EINVAL);
}

/* After a close (its FIN on the way) an abort changes nothing. */
static void abort_after_close_changes_nothing(void **state)
{
	struct fake_transport *t = transport_of(state);
	assert_int_equal(perch_conn_close(conn_of(state)), 0);
	assert_int_equal(perch_conn_abort(conn_of(state)), 0);
	assert_int_equal(t->closes, 1);
	assert_int_equal(t->aborts, 0);
}

/* A transport with no abort of its own (an in-memory pipe's) is closed. */
static void abort_on_a_transport_without_one_closes_it(void **state)
{
	struct perch__transport_ops ops = fake_ops;
	ops.abort = NULL;
	struct fake_transport t = { 0 };
	struct perch_conn *c = perch__conn_new(&ops, &t);
	assert_non_null(c);
	assert_int_equal(perch_conn_abort(c), 0);
	assert_int_equal(t.closes, 1);
	assert_true(perch_conn_is_closed(c));
	perch_conn_release(c);
	assert_int_equal(t.destroyed, 1);
}

static void close_while_parked_delivers_closed_once(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(perch_conn_close(c), 0);
	assert_int_equal(perch_conn_close(c), 0);
	fake_recv(c, "after");
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(transport_of(state)->closes, 1);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_true(res.closed);
	/* Later reads never park on a closed connection. */
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_true(res.closed);
	assert_int_equal(r.parkings, 1);
}

static void cancel_wakes_the_parked_read_canceled(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(perch_conn_cancel_read(c), 0);
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_true(res.canceled);
	assert_int_equal(res.len, 0);
	/* The cancel is reported once: the next read parks. */
	assert_int_equal(perch_conn_advance(c, 0, 0), 0);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	fake_recv(c, "z");
	assert_int_equal(r.deliveries, 2);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_false(res.canceled);
	assert_int_equal(res.len, 1);
}

static void cancel_with_nothing_parked_marks_the_next_read(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_cancel_read(c), 0);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_true(res.canceled);
	assert_int_equal(r.parkings, 0);
}

static void eof_comes_after_every_queued_byte(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	fake_recv(c, "one");
	fake_recv(c, "two");
	perch__conn_peer_closed(c);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_int_equal(res.len, 6);
	assert_true(res.completed);
	assert_int_equal(res.first->len, 3);
	assert_memory_equal(res.first->next->data, "two", 3);
	assert_int_equal(perch_conn_advance(c, 4, 6), 0);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(res.first_off, 1);
	assert_int_equal(perch_conn_advance(c, 2, 2), 0);
	assert_int_equal(transport_of(state)->segs_out, 0);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	assert_int_equal(res.len, 0);
	assert_true(res.completed);
	assert_int_equal(r.parkings, 0);
}

static void error_is_reported_with_the_bytes_before_it(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	fake_recv(c, "data");
	perch__conn_failed(c, ECONNRESET);
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 4);
	assert_int_equal(res.error, -ECONNRESET);
	assert_true(perch_conn_is_closed(c));
}

static void examined_to_the_end_parks_the_next_read(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	fake_recv(c, "GET /");
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), 0);
	/* Nothing consumed, everything examined: wait for more instead of spinning. */
	assert_int_equal(perch_conn_advance(c, 0, res.len), 0);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	fake_recv(c, " HTTP");
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 10);
	/* Examined may not move back before the earlier position. */
	assert_int_equal(perch_conn_advance(c, 0, 3), -EINVAL);
	assert_int_equal(perch_conn_advance(c, 10, 10), 0);
}

static void advance_misuse_is_refused(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct perch_read_result res;
	assert_int_equal(perch_conn_advance(c, 0, 0), -EINVAL); /* no read yet */
	struct counting_reader r = COUNTING_READER;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(perch_conn_advance(c, 0, 0), -EBUSY); /* a read is parked */
	fake_recv(c, "abc");
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(perch_conn_advance(c, 2, 1), -EINVAL); /* consumed past examined */
	assert_int_equal(perch_conn_advance(c, 0, 4), -EINVAL); /* past the result */
	assert_int_equal(perch_conn_advance(c, 1, 1), 0);
	assert_int_equal(perch_conn_advance(c, 1, 1), -EINVAL); /* twice for one read */
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(perch_conn_advance(c, 2, 2), 0);
	assert_int_equal(perch_conn_try_read(c, &res), -EAGAIN);
}

static void conn_read_completes_its_own_value_task(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_read(c, &res, &h), PERCH_PENDING);
	assert_int_equal(perch_vtask_status(h), PERCH_PENDING);
	fake_recv(c, "hi");
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 2);
	assert_int_equal(perch_conn_advance(c, 2, 2), 0);
	/* Served at once: the earlier task is left as it was. */
	fake_recv(c, "again");
	struct perch_vtask_handle h2 = { NULL, 0 };
	assert_int_equal(perch_conn_read(c, &res, &h2), 0);
	assert_null(h2.task);
	assert_int_equal(perch_vtask_status(h), 0);
	assert_int_equal(perch_conn_advance(c, 5, 5), 0);
	/* A new park readies a new version: the old token is stale. */
	assert_int_equal(perch_conn_read(c, &res, &h2), PERCH_PENDING);
	assert_int_equal(perch_vtask_status(h), -ESTALE);
	perch_conn_close(c);
	assert_int_equal(perch_vtask_status(h2), 0);
}

/* The connection's own tasks are made at the first call that needs them: without memory, nothing moves. */
static void own_tasks_out_of_memory_refuse_the_read_and_the_flush_touching_nothing(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_read_result res;
	struct perch_vtask_handle rh = { NULL, 0 }, fh = { NULL, 0 };
	assert_int_equal(perch_conn_write(c, "out", 3), 0);
	malloc_fails_in = 1;
	assert_int_equal(perch_conn_read(c, &res, &rh), -ENOMEM);
	assert_int_equal(malloc_fails_in, 0);
	assert_int_equal(c->read_waiter, PERCH__SLOT_EMPTY);
	malloc_fails_in = 1;
	assert_int_equal(perch_conn_flush(c, &fh), -ENOMEM);
	assert_int_equal(malloc_fails_in, 0);
	assert_int_equal(c->staged_len, 3);
	assert_int_equal(c->flush_busy, 0);
	assert_int_equal(t->sends, 0);
	assert_null(rh.task);
	assert_null(fh.task);
	/* With memory both go on, the read's bytes and the staged ones intact. */
	assert_int_equal(perch_conn_read(c, &res, &rh), PERCH_PENDING);
	assert_int_equal(perch_conn_flush(c, &fh), PERCH_PENDING);
	assert_int_equal(t->sends, 1);
	fake_recv(c, "in");
	assert_int_equal(perch_vtask_status(rh), 0);
	fake_send_done(c, 0);
	assert_int_equal(perch_vtask_status(fh), 0);
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 2);
}

/* A reader whose delivery blocks until the test lets it go: the reader re-parks meanwhile. */
struct slow_reader {
	struct perch_recv_listener l;
	uint32_t parks;
	uint32_t entered;              /* on_recv_ready is running */
	uint32_t let_go;
	uint64_t cookies[4];
	uint32_t deliveries;
};

static uint64_t slow_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	struct slow_reader *r = (struct slow_reader *)l;
	return ++r->parks * 100; /* the park's own cookie */
}

static void slow_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	struct slow_reader *r = (struct slow_reader *)l;
	uint32_t n = perch__faa_u32(&r->deliveries, 1);
	r->cookies[n & 3] = cookie;
	perch__store_u32(&r->entered, 1);
	while (n == 0 && !perch__load_u32(&r->let_go))
		sched_yield();
}

struct recv_on_thread {
	struct perch_conn *c;
	const char *bytes;
};

static void *recv_on_thread_main(void *arg)
{
	struct recv_on_thread *rt = arg;
	fake_recv(rt->c, rt->bytes);
	return NULL;
}

/* The delivery of park 1, still running when the reader parks again, carries park 1's cookie. */
static void late_delivery_carries_its_own_parks_cookie(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct slow_reader r = { { slow_parking, slow_ready }, 0, 0, 0, { 0 }, 0 };
	struct perch_read_result res;
	pthread_t th;
	struct recv_on_thread rt = { c, "one" };
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(pthread_create(&th, NULL, recv_on_thread_main, &rt), 0);
	while (!perch__load_u32(&r.entered))
		sched_yield();
	/* Park 1's delivery is in its callback; the slot is free again. */
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 3);
	assert_int_equal(perch_conn_advance(c, 3, 3), 0);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	perch__store_u32(&r.let_go, 1);
	pthread_join(th, NULL);
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(r.cookies[0], 100);
	fake_recv(c, "two");
	assert_int_equal(r.deliveries, 2);
	assert_int_equal(r.cookies[1], 200);
}

static void bad_arguments_return_einval(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_recv_listener half = { counting_reader_parking, NULL };
	struct perch_read_result res;
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_try_read_or_park(NULL, &r.l, &res), -EINVAL);
	assert_int_equal(perch_conn_try_read_or_park(c, NULL, &res), -EINVAL);
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, NULL), -EINVAL);
	assert_int_equal(perch_conn_try_read_or_park(c, &half, &res), -EINVAL);
	assert_int_equal(perch_conn_try_read(NULL, &res), -EINVAL);
	assert_int_equal(perch_conn_try_read(c, NULL), -EINVAL);
	assert_int_equal(perch_conn_read(c, NULL, &h), -EINVAL);
	assert_int_equal(perch_conn_read(c, &res, NULL), -EINVAL);
	assert_int_equal(perch_conn_advance(NULL, 0, 0), -EINVAL);
	assert_int_equal(perch_conn_cancel_read(NULL), -EINVAL);
	assert_int_equal(perch_conn_close(NULL), -EINVAL);
	assert_null(perch__conn_new(NULL, NULL));
	perch_conn_release(NULL);
	assert_int_equal(c->read_waiter, PERCH__SLOT_EMPTY);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(read_with_bytes_queued_is_served_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(bursts_of_segments_come_out_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(read_parks_and_is_delivered_once, setup, teardown),
		cmocka_unit_test_setup_teardown(second_read_refused_while_parked_leaves_the_parked_one, setup, teardown),
		cmocka_unit_test_setup_teardown(completion_during_on_parking_is_served_synchronously, setup, teardown),
		cmocka_unit_test_setup_teardown(close_while_parked_delivers_closed_once, setup, teardown),
		cmocka_unit_test_setup_teardown(
			abort_while_parked_delivers_closed_once_and_ends_the_transport_with_its_abort, setup,
			teardown),
		cmocka_unit_test_setup_teardown(abort_after_close_changes_nothing, setup, teardown),
		cmocka_unit_test(abort_on_a_transport_without_one_closes_it),
		cmocka_unit_test_setup_teardown(cancel_wakes_the_parked_read_canceled, setup, teardown),
		cmocka_unit_test_setup_teardown(cancel_with_nothing_parked_marks_the_next_read, setup, teardown),
		cmocka_unit_test_setup_teardown(eof_comes_after_every_queued_byte, setup, teardown),
		cmocka_unit_test_setup_teardown(error_is_reported_with_the_bytes_before_it, setup, teardown),
		cmocka_unit_test_setup_teardown(examined_to_the_end_parks_the_next_read, setup, teardown),
		cmocka_unit_test_setup_teardown(advance_misuse_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(conn_read_completes_its_own_value_task, setup, teardown),
		cmocka_unit_test_setup_teardown(
			own_tasks_out_of_memory_refuse_the_read_and_the_flush_touching_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(late_delivery_carries_its_own_parks_cookie, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_arguments_return_einval, setup, teardown),
	};
	return cmocka_run_group_tests_name("conn_read", tests, NULL, NULL);
}
