/* tests/test_sock_opts.c: a connection's options record: shared with its listener or the loop's defaults, outliving its listener, refused memory cleanly; on io_uring and on epoll. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "loop_util.h"
#include "both_backends.h"

/*
 * Fault injection and counting by size: the program links with
 * -Wl,--wrap=malloc, and a record is the one allocation of its size on
 * these paths (the conn's block is larger; the connect's fields are a
 * calloc). Armed, the next malloc of that size fails.
 */
void *__real_malloc(size_t size);
static uint32_t records_made;
static uint32_t record_fails;

void *__wrap_malloc(size_t size)
{
	if (size == sizeof(struct perch__sock_opts)) {
		if (__atomic_exchange_n(&record_fails, 0, __ATOMIC_SEQ_CST))
			return NULL;
		__atomic_fetch_add(&records_made, 1, __ATOMIC_SEQ_CST);
	}
	return __real_malloc(size);
}

static enum perch_backend backend;

static struct perch_loop_opts loop_opts(void)
{
	return (struct perch_loop_opts){ .backend = backend };
}

static void never_accepted(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	(void)l, (void)c, (void)arg;
	fail_msg("no connection was expected");
}

static void never_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	(void)loop, (void)c, (void)result, (void)arg;
	fail_msg("no connect was expected to report");
}

static void a_loop_without_memory_for_its_default_options_is_refused(void **state)
{
	struct perch_loop_opts o = loop_opts();
	struct perch_loop *loop = NULL;
	int fds = lu_count_fds();
	record_fails = 1;
	assert_int_equal(perch_loop_new(&o, &loop), -ENOMEM);
	assert_null(loop);
	assert_int_equal(lu_count_fds(), fds);
	assert_int_equal(perch_loop_new(&o, &loop), 0);
	perch_loop_free(loop);
}

static void a_listen_without_memory_for_its_options_returns_enomem_and_closes_its_socket(void **state)
{
	struct perch_loop_opts o = loop_opts();
	struct perch_loop *loop;
	assert_int_equal(perch_loop_new(&o, &loop), 0);
	struct perch_conn_opts copts = { .pause_bytes = 64 * 1024 };
	struct perch_listener *ls = NULL;
	int fds = lu_count_fds();
	record_fails = 1;
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, &copts, never_accepted, NULL, &ls), -ENOMEM);
	assert_null(ls);
	assert_int_equal(lu_count_fds(), fds);
	perch_loop_free(loop);
}

static void a_connect_with_options_of_its_own_without_memory_returns_enomem(void **state)
{
	struct perch_loop_opts o = loop_opts();
	struct perch_loop *loop;
	assert_int_equal(perch_loop_new(&o, &loop), 0);
	struct perch_conn_opts copts = { .pause_bytes = 64 * 1024 };
	int fds = lu_count_fds();
	record_fails = 1;
	assert_int_equal(perch_connect(loop, "127.0.0.1", 9, &copts, never_connected, NULL), -ENOMEM);
	assert_int_equal(lu_count_fds(), fds);
	perch_loop_free(loop);
}

/* Connections that connect with the defaults share the loop's record; one with options of its own makes one. */
static void only_a_connect_with_options_of_its_own_makes_a_record(void **state)
{
	struct lu_loop l;
	struct perch_loop_opts o = loop_opts();
	assert_int_equal(lu_start(&l, &o), 0);
	int port;
	int lfd = lu_plain_listener(8, &port);
	assert_true(lfd >= 0);
	struct perch_conn_opts same = { .nagle = true, .recv_mode = PERCH_RECV_SINGLESHOT };
	struct perch_conn_opts own = { .pause_bytes = 64 * 1024 };
	uint32_t before = __atomic_load_n(&records_made, __ATOMIC_SEQ_CST);
	struct perch_conn *a = lu_connect(&l, "127.0.0.1", port, NULL);
	struct perch_conn *b = lu_connect(&l, "127.0.0.1", port, &same);
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(__atomic_load_n(&records_made, __ATOMIC_SEQ_CST), before);
	struct perch__sock *sa = perch__conn_sock(a), *sb = perch__conn_sock(b);
	assert_ptr_equal(sa->opts, sb->opts);
	struct perch_conn *c = lu_connect(&l, "127.0.0.1", port, &own);
	assert_non_null(c);
	assert_int_equal(__atomic_load_n(&records_made, __ATOMIC_SEQ_CST), before + 1);
	assert_int_equal(perch__conn_sock(c)->opts->pause_bytes, own.pause_bytes);
	assert_true(perch__conn_sock(c)->opts != sa->opts);
	perch_conn_release(a);
	perch_conn_release(b);
	perch_conn_release(c);
	assert_int_equal(lu_stop(&l), 0);
	close(lfd);
}

struct two_accepts {
	struct perch_conn *c[2];
	uint32_t n;
	sem_t got;
};

static void accept_two(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct two_accepts *k = arg;
	k->c[k->n++] = c;
	sem_post(&k->got);
}

struct opts_probe {
	struct perch_loop *loop;
	struct perch_conn *c;
	uint32_t live;
	struct perch__sock_opts seen;
};

static void read_live(void *arg)
{
	struct opts_probe *p = arg;
	p->live = p->loop->live;
}

/*
 * On the loop's thread, where a freed record would have gone to its
 * allocator's cache: blocks of the record's size are taken and filled
 * before the connection's options are read, so one freed under the
 * connection reads as the fill.
 */
static void read_opts_among_fills(void *arg)
{
	struct opts_probe *p = arg;
	void *fill[16];
	for (int i = 0; i < 16; i++) {
		fill[i] = malloc(sizeof(struct perch__sock_opts));
		assert_non_null(fill[i]);
		memset(fill[i], 0xa5, sizeof(struct perch__sock_opts));
	}
	p->seen = *perch__conn_sock(p->c)->opts;
	for (int i = 0; i < 16; i++)
		free(fill[i]);
}

/*
 * Two connections a listener accepts share its record, and keep it after
 * the listener is closed and freed: their options are what it was given.
 */
static void accepted_connections_share_their_listeners_options_and_keep_them_after_it(void **state)
{
	struct lu_loop l;
	struct perch_loop_opts o = loop_opts();
	assert_int_equal(lu_start(&l, &o), 0);
	struct perch_conn_opts copts = { .pause_bytes = 48 * 1024, .resume_bytes = 5000, .zerocopy_min = 12345 };
	struct two_accepts k = { .n = 0 };
	sem_init(&k.got, 0, 0);
	struct perch_listener *ls;
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, &copts, accept_two, &k, &ls), 0);
	int f0 = lu_plain_connect_to(ls);
	assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
	int f1 = lu_plain_connect_to(ls);
	assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
	struct perch__sock_opts *shared = ls->sk.opts;
	assert_ptr_equal(perch__conn_sock(k.c[0])->opts, shared);
	assert_ptr_equal(perch__conn_sock(k.c[1])->opts, shared);
	assert_int_equal(perch_listener_close(ls), 0);
	/* The listener is freed as it leaves the table, once its close completes. */
	struct opts_probe p = { .loop = l.loop, .c = k.c[0] };
	double deadline = lu_now_ms() + LU_TIMEOUT_MS;
	do
		assert_int_equal(lu_on_loop(&l, read_live, &p), 0);
	while (p.live > 2 && lu_now_ms() < deadline);
	assert_int_equal(p.live, 2);
	assert_int_equal(lu_on_loop(&l, read_opts_among_fills, &p), 0);
	assert_int_equal(p.seen.pause_bytes, copts.pause_bytes);
	assert_int_equal(p.seen.resume_bytes, copts.resume_bytes);
	assert_int_equal(p.seen.zerocopy_min, copts.zerocopy_min);
	perch_conn_release(k.c[0]);
	perch_conn_release(k.c[1]);
	close(f0);
	close(f1);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.got);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_loop_without_memory_for_its_default_options_is_refused),
		cmocka_unit_test(a_listen_without_memory_for_its_options_returns_enomem_and_closes_its_socket),
		cmocka_unit_test(a_connect_with_options_of_its_own_without_memory_returns_enomem),
		cmocka_unit_test(only_a_connect_with_options_of_its_own_makes_a_record),
		cmocka_unit_test(accepted_connections_share_their_listeners_options_and_keep_them_after_it),
	};
	return RUN_ON_BOTH_BACKENDS("sock_opts", tests, backend);
}
