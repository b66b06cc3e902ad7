/* tests/test_uring_gather.c: io_uring sends of several staged buffers: gathered in one sendmsg, and, out of memory for the socket's gather or rare block, sent a buffer at a time (a zero-copy write plain), every byte in order. */
#include "config.h"

#include "cmocka_prelude.h"

#include "loop_util.h"
#include "uring_internal.h"

/*
 * Fault injection: the program links with -Wl,--wrap=malloc. While armed
 * with a size (a gather block's, or the socket's rare block's), every
 * malloc of that size fails (nothing else of the test's path asks for
 * either size).
 */
void *__real_malloc(size_t size);
static size_t fail_size;        /* atomic: armed with this size, or 0 */
static uint32_t refused;        /* atomic: mallocs refused */

void *__wrap_malloc(size_t size)
{
	if (size == __atomic_load_n(&fail_size, __ATOMIC_ACQUIRE)) {
		__atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	return __real_malloc(size);
}

enum { WRITES = 60, WRITE_SIZE = 1000, TOTAL = WRITES * WRITE_SIZE };

/* A connection over a socketpair on an io_uring loop, and the socket at its other end. */
struct fx {
	struct lu_loop l;
	struct perch_conn *c;
	int peer;
};

/* The fixture, its connection adopted with `co` (NULL: the defaults). */
static int setup_with(void **state, const struct perch_conn_opts *co)
{
	struct fx *f = *state = calloc(1, sizeof(*f));
	int sv[2];
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	if (!f || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 || lu_start(&f->l, &o) != 0)
		return -1;
	struct lu_connect k = { .c = NULL, .result = 1 };
	sem_init(&k.done, 0, 0);
	if (perch_conn_adopt(f->l.loop, sv[0], co, lu_connected, &k) != 0 ||
	    lu_sem_wait(&k.done, LU_TIMEOUT_MS) != 0 || k.result != 0)
		return -1;
	sem_destroy(&k.done);
	f->c = k.c;
	f->peer = sv[1];
	return 0;
}

static int setup(void **state)
{
	return setup_with(state, NULL);
}

/* A referenced write of 1 KiB or more asks for a zero-copy send (a Unix socket then refuses it). */
static int setup_zerocopy(void **state)
{
	struct perch_conn_opts co = { .zerocopy_min = 1024 };
	return setup_with(state, &co);
}

static int teardown(void **state)
{
	struct fx *f = *state;
	__atomic_store_n(&fail_size, 0, __ATOMIC_RELEASE);
	perch_conn_release(f->c);
	close(f->peer);
	int rc = lu_stop(&f->l);
	free(f);
	return rc;
}

/*
 * WRITES writes of WRITE_SIZE bytes stage about 15 buffers (4 KiB each),
 * one flush sends them, and the peer reads them whole and in order (they
 * fit the socketpair's buffer: the flush completes before the read).
 */
static void send_staged_buffers(struct fx *f)
{
	static uint8_t out[TOTAL], back[TOTAL];
	lu_fill(out, TOTAL);
	for (int i = 0; i < WRITES; i++)
		assert_int_equal(perch_conn_write(f->c, out + i * WRITE_SIZE, WRITE_SIZE), 0);
	assert_int_equal(lu_flush(f->c), 0);
	assert_true(lu_read_all(f->peer, back, TOTAL));
	assert_memory_equal(back, out, TOTAL);
}

static void several_buffers_leave_in_order_gathered(void **state)
{
	send_staged_buffers(*state);
	send_staged_buffers(*state); /* the second send reuses the socket's gather block */
}

/* Out of memory for `size` at every try: the staged buffers leave one at a time, then gathered again. */
static void sends_a_buffer_at_a_time_without(struct fx *f, size_t size)
{
	__atomic_store_n(&refused, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&fail_size, size, __ATOMIC_RELEASE);
	send_staged_buffers(f);
	assert_true(__atomic_load_n(&refused, __ATOMIC_RELAXED) >= 2); /* a try per buffer sent */
	__atomic_store_n(&fail_size, 0, __ATOMIC_RELEASE);
	send_staged_buffers(f); /* memory again: gathered */
}

static void out_of_memory_for_the_gather_block_sends_a_buffer_at_a_time(void **state)
{
	sends_a_buffer_at_a_time_without(*state, sizeof(struct usend_gather));
}

static void out_of_memory_for_the_rare_block_sends_a_buffer_at_a_time(void **state)
{
	sends_a_buffer_at_a_time_without(*state, sizeof(struct usock_rare));
}

static void count_release(void *arg, const void *data, size_t len)
{
	__atomic_add_fetch((int *)arg, 1, __ATOMIC_RELAXED);
}

/* The zero-copy hold needs the rare block too: without it the write goes as a plain send. */
static void out_of_memory_for_the_rare_block_sends_a_zero_copy_write_plain(void **state)
{
	struct fx *f = *state;
	if (!lu_stats(&f->l).zerocopy_available)
		skip();
	static uint8_t out[8192], back[8192];
	int released = 0;
	lu_fill(out, sizeof(out));
	assert_int_equal(perch_conn_write_ref(f->c, out, sizeof(out), count_release, &released), 0);
	__atomic_store_n(&refused, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&fail_size, sizeof(struct usock_rare), __ATOMIC_RELEASE);
	assert_int_equal(lu_flush(f->c), 0);
	__atomic_store_n(&fail_size, 0, __ATOMIC_RELEASE);
	assert_true(__atomic_load_n(&refused, __ATOMIC_RELAXED) >= 1);
	assert_int_equal(__atomic_load_n(&released, __ATOMIC_RELAXED), 1);
	assert_int_equal(lu_stats(&f->l).zerocopy_sends, 0);
	assert_true(lu_read_all(f->peer, back, sizeof(back)));
	assert_memory_equal(back, out, sizeof(out));
}

int main(void)
{
	struct perch_loop *probe = lu_uring_probe();
	if (!probe)
		return 77;
	perch_loop_free(probe);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(several_buffers_leave_in_order_gathered, setup, teardown),
		cmocka_unit_test_setup_teardown(out_of_memory_for_the_gather_block_sends_a_buffer_at_a_time, setup,
						teardown),
		cmocka_unit_test_setup_teardown(out_of_memory_for_the_rare_block_sends_a_buffer_at_a_time, setup,
						teardown),
		cmocka_unit_test_setup_teardown(out_of_memory_for_the_rare_block_sends_a_zero_copy_write_plain,
						setup_zerocopy, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
