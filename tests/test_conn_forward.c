/* tests/test_conn_forward.c: perch_conn_forward: whole received buffers lent to a send, the rest copied, a refusal loses nothing. */
#include "config.h"

#include <perch.h>

#include "conn_fixture.h"
#include "malloc_fails.h"

/* Byte i of a segment tagged `tag`: every forwarded byte can be checked against where it came from. */
static uint8_t pattern(uint8_t tag, size_t i)
{
	return (uint8_t)(tag * 31u + i * 7u);
}

/* Queues one received segment of `n` pattern bytes on `c`, as a backend would; returns it. */
static struct perch_seg *recv_pattern(struct perch_conn *c, size_t n, uint8_t tag)
{
	struct fake_transport *t = c->transport;
	struct perch_seg *seg = calloc(1, sizeof(*seg) + n);
	seg->data = (uint8_t *)(seg + 1);
	for (size_t i = 0; i < n; i++)
		seg->data[i] = pattern(tag, i);
	seg->len = (uint32_t)n;
	seg->owner = t;
	perch__faa_u32(&t->segs_out, 1);
	assert_int_equal(perch__conn_recv_arrived(c, seg), 0);
	return seg;
}

/* One run of expected bytes: `len` bytes of segment `tag`, from byte `off`. */
struct run {
	uint8_t tag;
	size_t off, len;
};

/* The chain `t` was last sent holds exactly these runs, in order. */
static void assert_sent(struct fake_transport *t, const struct run *runs, size_t nruns)
{
	struct perch__txbuf *b = t->sent;
	size_t at = 0;
	for (size_t r = 0; r < nruns; r++) {
		for (size_t i = 0; i < runs[r].len; i++) {
			while (b && at == b->len) {
				b = b->next;
				at = 0;
			}
			assert_non_null(b);
			assert_int_equal(b->bytes[at], pattern(runs[r].tag, runs[r].off + i));
			at++;
		}
	}
	assert_true(b == NULL || (at == b->len && b->next == NULL));
}

static size_t read_now(struct perch_conn *c)
{
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	return res.len;
}

static void flush_now(struct perch_conn *c, struct perch_vtask_handle *h)
{
	assert_int_equal(perch_conn_flush(c, h), PERCH_PENDING);
}

static void forward_lends_whole_buffers_and_copies_the_rest(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_seg *a = recv_pattern(c, 2000, 1);
	recv_pattern(c, 10, 2);
	recv_pattern(c, 3000, 3);
	assert_int_equal(read_now(c), 5010);
	/* A whole (lent), B whole but small (copied, released now), C's first 1000 (copied, C stays). */
	assert_int_equal(perch_conn_forward(c, 3010, 3010, c), 0);
	assert_int_equal(t->segs_out, 2);
	struct perch_vtask_handle h;
	flush_now(c, &h);
	assert_ptr_equal(t->sent->bytes, a->data); /* the received buffer itself, no copy */
	assert_int_equal(t->sent->len, 2000);
	assert_int_equal(t->sent->next->len, 1010); /* both copies in one staging buffer */
	static const struct run runs[] = { { 1, 0, 2000 }, { 2, 0, 10 }, { 3, 0, 1000 } };
	assert_sent(t, runs, 3);
	fake_send_done(c, 0);
	assert_int_equal(t->segs_out, 1); /* A is back; C is still the reader's */
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read(c, &res), 0);
	assert_int_equal(res.len, 2000);
	assert_int_equal(res.first->data[res.first_off], pattern(3, 1000));
	assert_int_equal(perch_conn_advance(c, 2000, 2000), 0);
	assert_int_equal(t->segs_out, 0);
}

static void forward_lends_a_partly_consumed_buffer_from_where_the_reader_stopped(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	struct perch_seg *a = recv_pattern(c, 4000, 4);
	assert_int_equal(read_now(c), 4000);
	assert_int_equal(perch_conn_advance(c, 500, 500), 0);
	assert_int_equal(read_now(c), 3500);
	assert_int_equal(perch_conn_forward(c, 3500, 3500, c), 0);
	struct perch_vtask_handle h;
	flush_now(c, &h);
	assert_ptr_equal(t->sent->bytes, a->data + 500);
	static const struct run runs[] = { { 4, 500, 3500 } };
	assert_sent(t, runs, 1);
	assert_int_equal(t->segs_out, 1);
	fake_send_done(c, 0);
	assert_int_equal(t->segs_out, 0);
}

/* A proxy's case: the source connection is released while the destination's send still holds its buffer. */
static void forwarded_buffers_outlive_the_connection_they_came_from(void **state)
{
	struct perch_conn *dst = conn_of(state);
	struct fake_transport src_t = { 0 };
	struct perch_conn *src = perch__conn_new(&fake_ops, &src_t);
	assert_non_null(src);
	recv_pattern(src, 3000, 5);
	assert_int_equal(read_now(src), 3000);
	assert_int_equal(perch_conn_forward(src, 3000, 3000, dst), 0);
	perch_conn_release(src);
	assert_int_equal(src_t.destroyed, 1);
	assert_int_equal(src_t.segs_out, 1);
	struct perch_vtask_handle h;
	flush_now(dst, &h);
	static const struct run runs[] = { { 5, 0, 3000 } };
	assert_sent(transport_of(state), runs, 1);
	fake_send_done(dst, 0);
	assert_int_equal(src_t.segs_out, 0);
	assert_int_equal(transport_of(state)->segs_out, 0);
}

/* The result is still there and whole after a refusal: this forward succeeds and sends every byte. */
static void forward_the_whole_result(void **state, size_t len, uint8_t tag)
{
	struct perch_conn *c = conn_of(state);
	struct perch_vtask_handle h;
	assert_int_equal(c->staged_len, 0);
	assert_int_equal(perch_conn_forward(c, len, len, c), 0);
	flush_now(c, &h);
	const struct run runs[] = { { tag, 0, len } };
	assert_sent(transport_of(state), runs, 1);
	fake_send_done(c, 0);
	assert_int_equal(transport_of(state)->segs_out, 0);
}

static void a_refused_forward_consumes_nothing_and_stages_nothing(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	assert_int_equal(perch_conn_forward(c, 0, 0, c), -EINVAL); /* no result yet */
	recv_pattern(c, 2000, 6);
	assert_int_equal(read_now(c), 2000);
	assert_int_equal(perch_conn_forward(NULL, 0, 0, c), -EINVAL);
	assert_int_equal(perch_conn_forward(c, 0, 0, NULL), -EINVAL);
	assert_int_equal(perch_conn_forward(c, 10, 5, c), -EINVAL);      /* consumed > examined */
	assert_int_equal(perch_conn_forward(c, 2000, 2001, c), -EINVAL); /* past the result */
	/* A flush in progress on the destination. */
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_write(c, "x", 1), 0);
	flush_now(c, &h);
	assert_int_equal(perch_conn_forward(c, 2000, 2000, c), -EBUSY);
	fake_send_done(c, 0);
	/* A closed destination. */
	struct fake_transport closed_t = { 0 };
	struct perch_conn *closed = perch__conn_new(&fake_ops, &closed_t);
	assert_int_equal(perch_conn_close(closed), 0);
	assert_int_equal(perch_conn_forward(c, 2000, 2000, closed), -EPIPE);
	perch_conn_release(closed);
	assert_int_equal(t->segs_out, 1);
	forward_the_whole_result(state, 2000, 6);
}

static void a_forward_refused_while_a_read_is_parked(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct counting_reader r = COUNTING_READER;
	struct perch_read_result res;
	assert_int_equal(perch_conn_try_read_or_park(c, &r.l, &res), PERCH_PENDING);
	assert_int_equal(perch_conn_forward(c, 0, 0, c), -EBUSY);
	recv_pattern(c, 1500, 7);
	assert_int_equal(r.deliveries, 1);
	assert_int_equal(read_now(c), 1500);
	forward_the_whole_result(state, 1500, 7);
}

/* Out of memory at the lent buffer's record, then at the copy's buffer: each time nothing moved. */
static void a_forward_out_of_memory_consumes_nothing_and_stages_nothing(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	recv_pattern(c, 2000, 8);
	recv_pattern(c, 10, 9);
	assert_int_equal(read_now(c), 2010);
	for (int nth = 1; nth <= 2; nth++) {
		malloc_fails_in = nth;
		assert_int_equal(perch_conn_forward(c, 2010, 2010, c), -ENOMEM);
		assert_int_equal(malloc_fails_in, 0);
		assert_int_equal(c->staged_len, 0);
		assert_null(c->staged_head);
		assert_int_equal(t->segs_out, 2);
	}
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_forward(c, 2010, 2010, c), 0);
	flush_now(c, &h);
	static const struct run runs[] = { { 8, 0, 2000 }, { 9, 0, 10 } };
	assert_sent(t, runs, 2);
	fake_send_done(c, 0);
	assert_int_equal(t->segs_out, 0);
}

/* Staged and never sent: a flush after a close drops them, and the teardown's destroy drops the rest. */
static void dropped_forwarded_bytes_give_their_buffers_back(void **state)
{
	struct perch_conn *c = conn_of(state);
	struct fake_transport *t = transport_of(state);
	recv_pattern(c, 3000, 10);
	assert_int_equal(read_now(c), 3000);
	assert_int_equal(perch_conn_forward(c, 3000, 3000, c), 0);
	assert_int_equal(perch_conn_close(c), 0);
	struct perch_vtask_handle h;
	assert_int_equal(perch_conn_flush(c, &h), -EPIPE);
	assert_int_equal(t->segs_out, 0);
}

static void released_with_forwarded_bytes_staged_gives_them_back(void **state)
{
	struct perch_conn *c = conn_of(state);
	recv_pattern(c, 3000, 11);
	assert_int_equal(read_now(c), 3000);
	assert_int_equal(perch_conn_forward(c, 3000, 3000, c), 0);
	/* The teardown releases c: its destroy drops the staged chain, and segs_out must reach 0. */
}

/* ---- a transport that pools staging buffers: a lent buffer is never pooled ---- */

struct pooled_transport {
	struct fake_transport t;        /* first: the fake ops read the transport as this */
	struct perch__txbuf *pool;
	uint32_t puts, lent_puts;
};

static struct perch__txbuf *pool_get(struct perch_conn *c)
{
	struct pooled_transport *p = c->transport;
	struct perch__txbuf *b = p->pool;
	if (b)
		p->pool = b->next;
	return b;
}

static bool pool_put(struct perch_conn *c, struct perch__txbuf *b)
{
	struct pooled_transport *p = c->transport;
	p->puts++;
	if (b->bytes != b->data) {
		p->lent_puts++;
		return false; /* refused, so the core frees it as it would have */
	}
	b->next = p->pool;
	p->pool = b;
	return true;
}

static const struct perch__transport_ops pooled_ops = {
	.send = fake_send, .release_seg = fake_release_seg, .close = fake_close,
	.destroy = fake_destroy, .txbuf_get = pool_get, .txbuf_put = pool_put,
};

/* A lent buffer of exactly the pool's size looks like a pooled one: it must go back to its segment's owner. */
static void a_lent_buffer_goes_back_to_its_owner_not_to_the_pool(void **state)
{
	struct pooled_transport p = { 0 };
	struct perch_conn *c = perch__conn_new(&pooled_ops, &p);
	assert_non_null(c);
	recv_pattern(c, PERCH__TXBUF_CAP, 12);
	recv_pattern(c, 100, 13);
	assert_int_equal(read_now(c), PERCH__TXBUF_CAP + 100);
	assert_int_equal(perch_conn_forward(c, PERCH__TXBUF_CAP + 100, PERCH__TXBUF_CAP + 100, c), 0);
	struct perch_vtask_handle h;
	flush_now(c, &h);
	static const struct run runs[] = { { 12, 0, PERCH__TXBUF_CAP }, { 13, 0, 100 } };
	assert_sent(&p.t, runs, 2);
	fake_send_done(c, 0);
	assert_int_equal(p.lent_puts, 0);
	assert_int_equal(p.puts, 1);       /* the copy's buffer */
	assert_int_equal(p.t.segs_out, 0); /* the lent one went back to its owner */
	perch_conn_release(c);
	perch__conn_free_chain(p.pool);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(forward_lends_whole_buffers_and_copies_the_rest, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			forward_lends_a_partly_consumed_buffer_from_where_the_reader_stopped, setup,
			teardown),
		cmocka_unit_test_setup_teardown(forwarded_buffers_outlive_the_connection_they_came_from,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_refused_forward_consumes_nothing_and_stages_nothing,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_forward_refused_while_a_read_is_parked, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			a_forward_out_of_memory_consumes_nothing_and_stages_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(dropped_forwarded_bytes_give_their_buffers_back, setup,
						teardown),
		cmocka_unit_test_setup_teardown(released_with_forwarded_bytes_staged_gives_them_back,
						setup, teardown),
		cmocka_unit_test(a_lent_buffer_goes_back_to_its_owner_not_to_the_pool),
	};
	return cmocka_run_group_tests_name("conn forward", tests, NULL, NULL);
}
