/* tests/test_uring_bundle.c: io_uring recv bundles: a stream that queues up arrives whole and in order through completions of several buffers, and recv_bundles_off takes one a completion. */
#include "config.h"

#include <liburing.h>
#include <pthread.h>
#include <sys/utsname.h>

#include "cmocka_prelude.h"

#include "loop_util.h"
#include "uring_internal.h"

enum { BUF_SIZE = 4096, STREAM = 4 << 20 };

/* Whether this kernel hands over bundles on a ring as perch makes it (DEFER_TASKRUN), and is 6.16 or later. */
static bool kernel_has_bundles(void)
{
	struct utsname un;
	unsigned major, minor;
	if (uname(&un) != 0 || sscanf(un.release, "%u.%u", &major, &minor) != 2 ||
	    (major == 6 && minor < 16) || major < 6)
		return false;
	struct io_uring ring;
	struct io_uring_params p = { .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN };
	if (io_uring_queue_init_params(8, &ring, &p) != 0)
		return false;
	io_uring_queue_exit(&ring);
	return (p.features & IORING_FEAT_RECVSEND_BUNDLE) != 0;
}

struct writer {
	int fd;
	const uint8_t *p;
	size_t n;
	bool ok;
};

/* Writes the whole stream, then half-closes: the reader sees its end. */
static void *write_stream(void *arg)
{
	struct writer *w = arg;
	w->ok = lu_write_all(w->fd, w->p, w->n) && shutdown(w->fd, SHUT_WR) == 0;
	return NULL;
}

/*
 * A loop with 4 KiB buffers accepts one connection; a thread writes
 * STREAM bytes into it at once, and the test thread reads them only once
 * a quarter of them had time to queue (the connection pauses at
 * pause_bytes meanwhile, so the kernel holds the rest): every read then
 * finds many buffers' worth waiting. Returns the loop's stats after every
 * byte came back in order, and the end after them.
 */
static struct perch_loop_stats stream_through(bool bundles_off)
{
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .buf_size = BUF_SIZE, .buf_count = 512,
				     .recv_bundles_off = bundles_off };
	assert_int_equal(lu_start(&l, &o), 0);
	struct lu_catcher k = { 0 };
	sem_init(&k.got, 0, 0);
	struct perch_listener *ls;
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, lu_catch_accept, &k, &ls), 0);
	int fd = lu_plain_connect_to(ls);
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
	struct perch_conn *c = k.c;

	uint8_t *out = malloc(STREAM), *in = malloc(STREAM);
	assert_non_null(out);
	assert_non_null(in);
	lu_fill(out, STREAM);
	struct writer w = { .fd = fd, .p = out, .n = STREAM };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, write_stream, &w), 0);
	usleep(50 * 1000);
	struct lu_end e = lu_read_to_end(c, in, STREAM);
	pthread_join(th, NULL);
	assert_true(w.ok);
	assert_int_equal(e.got, STREAM);
	assert_true(e.completed);
	assert_memory_equal(in, out, STREAM);
	struct perch_loop_stats st = lu_stats(&l);

	perch_conn_release(c);
	perch_listener_close(ls);
	close(fd);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.got);
	free(out);
	free(in);
	return st;
}

static void a_stream_that_queues_up_arrives_whole_in_bundles(void **state)
{
	(void)state;
	struct perch_loop_stats st = stream_through(false);
	if (!kernel_has_bundles()) {
		assert_int_equal(st.recv_bundles, 0);
		assert_int_equal(st.bundle_bufs, 0);
		return;
	}
	assert_int_equal(st.recv_bundles, 1);
	/* Far more than chance: most of the stream waited in the kernel when it was read. */
	assert_true(st.bundle_bufs >= STREAM / BUF_SIZE / 4);
}

static void with_recv_bundles_off_each_completion_takes_one_buffer(void **state)
{
	(void)state;
	struct perch_loop_stats st = stream_through(true);
	assert_int_equal(st.recv_bundles, 0);
	assert_int_equal(st.bundle_bufs, 0);
}

int main(void)
{
	struct perch_loop *probe = lu_uring_probe();
	if (!probe)
		return 77;
	perch_loop_free(probe);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_stream_that_queues_up_arrives_whole_in_bundles),
		cmocka_unit_test(with_recv_bundles_off_each_completion_takes_one_buffer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
