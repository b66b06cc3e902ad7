/* tests/test_listen_out_of_memory.c: a listen (or a first connect) the loop's table has no room for fails cleanly, on io_uring and on epoll. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <perch.h>

#include "backend.h" /* a listener's fd, to check nothing closes it twice */
#include "both_backends.h"
#include "loop_util.h"

/*
 * Fault injection: the program links with -Wl,--wrap=realloc, so every
 * realloc of the test and of the static library comes here. Armed with n,
 * the n-th call from now fails. The loop's connection table grows by
 * realloc, first at the first socket it holds.
 */
void *__real_realloc(void *p, size_t size);
static int realloc_fails_in;

void *__wrap_realloc(void *p, size_t size)
{
	if (realloc_fails_in > 0 && --realloc_fails_in == 0)
		return NULL;
	return __real_realloc(p, size);
}

/*
 * And -Wl,--wrap=calloc: armed with a size, the next calloc of that many
 * bytes in all fails. The loop makes its connects' slot array (8 B a
 * slot) by calloc at its first connect.
 */
void *__real_calloc(size_t n, size_t size);
static size_t calloc_fails_for;

void *__wrap_calloc(size_t n, size_t size)
{
	if (calloc_fails_for && n * size == calloc_fails_for) {
		calloc_fails_for = 0;
		return NULL;
	}
	return __real_calloc(n, size);
}

static enum perch_backend backend;

static struct perch_loop *new_loop(void)
{
	struct perch_loop_opts o = { .backend = backend };
	struct perch_loop *loop = NULL;
	assert_int_equal(perch_loop_new(&o, &loop), 0);
	return loop;
}

static void never_called(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	(void)l, (void)c, (void)arg;
	fail_msg("no connection was expected");
}

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* Whether a plain connect to 127.0.0.1:port is accepted by the kernel (a listening socket is there). */
static bool something_listens_on(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/*
 * A perch_listen made inside one of the loop's turns (posted), the
 * fail_at-th realloc of its table's growth failed (0: none fails).
 */
struct listen_call {
	struct perch_loop *loop;
	struct perch_listener *l;
	int rc, fail_at, unspent; /* unspent: fail_at's count left (0 once the failure happened) */
	bool ran;
};

static void listen_on_the_loop(void *arg)
{
	struct listen_call *call = arg;
	realloc_fails_in = call->fail_at;
	call->rc = perch_listen(call->loop, "127.0.0.1", 0, NULL, never_called, NULL, &call->l);
	call->unspent = realloc_fails_in;
	realloc_fails_in = 0;
	call->ran = true;
}

/*
 * Inside one of the loop's turns (a posted function here) the listener
 * goes into the table at once, so no room there is the call's error:
 * -ENOMEM, *out untouched, no fd left open. The next listen, with memory,
 * works.
 */
static void a_listen_inside_a_turn_without_room_returns_enomem(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	int fds = open_fds();
	struct listen_call call = { .loop = loop, .fail_at = 1 };
	assert_int_equal(perch_loop_post(loop, listen_on_the_loop, &call), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_int_equal(call.rc, -ENOMEM);
	assert_null(call.l);
	assert_int_equal(open_fds(), fds);

	call.fail_at = 0;
	assert_int_equal(perch_loop_post(loop, listen_on_the_loop, &call), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_int_equal(call.rc, 0);
	assert_non_null(call.l);
	assert_true(something_listens_on(perch_listener_port(call.l)));
	assert_int_equal(perch_listener_close(call.l), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	perch_loop_free(loop);
}

/*
 * The table grows its arrays one realloc at a time (the slots, their
 * generations, the free list, the park list's links): whichever fails,
 * the listen is -ENOMEM and the table stays as it was, and the next
 * listen, with memory, grows it whole and works.
 */
static void a_table_growth_failing_at_any_of_its_arrays_leaves_the_table_whole(void **state)
{
	(void)state;
	for (int at = 1; at <= 4; at++) {
		struct perch_loop *loop = new_loop();
		struct listen_call call = { .loop = loop, .fail_at = at };
		assert_int_equal(perch_loop_post(loop, listen_on_the_loop, &call), 0);
		assert_true(perch_loop_run_once(loop, 0) >= 0);
		assert_int_equal(call.unspent, 0); /* the at-th realloc came, in the table's growth */
		assert_int_equal(call.rc, -ENOMEM);
		assert_int_equal(loop->cap, 0);
		call.fail_at = 0;
		assert_int_equal(perch_loop_post(loop, listen_on_the_loop, &call), 0);
		assert_true(perch_loop_run_once(loop, 0) >= 0);
		assert_int_equal(call.rc, 0);
		assert_true(loop->cap > 0 && loop->park_next != NULL);
		assert_true(something_listens_on(perch_listener_port(call.l)));
		assert_int_equal(perch_listener_close(call.l), 0);
		assert_true(perch_loop_run_once(loop, 0) >= 0);
		perch_loop_free(loop);
	}
}

struct connect_seen {
	struct perch_conn *c;
	int result, calls;
};

static void connect_seen(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct connect_seen *k = arg;
	k->c = c;
	k->result = result;
	k->calls++;
}

/*
 * The loop's first connect makes its connects' slot array. Without the
 * memory for it the connect is reported -ENOMEM, its socket closed, and
 * the next connect, with memory, makes it and connects.
 */
static void a_first_connect_without_memory_for_the_slot_array_reports_enomem(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	struct listen_call call = { .loop = loop };
	assert_int_equal(perch_loop_post(loop, listen_on_the_loop, &call), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_int_equal(call.rc, 0);
	assert_true(loop->cap > 0 && loop->connecting == NULL);
	int port, lfd = lu_plain_listener(8, &port);
	assert_true(lfd >= 0);
	int fds = open_fds();
	struct connect_seen k = { .result = 1 };
	calloc_fails_for = loop->cap * sizeof(*loop->connecting);
	assert_int_equal(perch_connect(loop, "127.0.0.1", port, NULL, connect_seen, &k), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0); /* the posted connect starts here */
	assert_int_equal(calloc_fails_for, 0);
	assert_int_equal(k.calls, 1);
	assert_int_equal(k.result, -ENOMEM);
	assert_null(k.c);
	assert_null(loop->connecting);
	assert_int_equal(open_fds(), fds);
	k = (struct connect_seen){ .result = 1 };
	assert_int_equal(perch_connect(loop, "127.0.0.1", port, NULL, connect_seen, &k), 0);
	for (int i = 0; i < 1000 && k.calls == 0; i++)
		assert_true(perch_loop_run_once(loop, 10) >= 0);
	assert_int_equal(k.calls, 1);
	assert_int_equal(k.result, 0);
	assert_non_null(loop->connecting);
	perch_conn_release(k.c);
	assert_int_equal(perch_listener_close(call.l), 0);
	for (int i = 0; i < 10; i++)
		assert_true(perch_loop_run_once(loop, 0) >= 0);
	perch_loop_free(loop);
	close(lfd);
}

/*
 * A listen made outside the loop's turns, so queued for the next one,
 * whose insert there finds no room. Returns the fd it had (closed now).
 */
static int listen_dropped_at_the_next_turn(struct perch_loop *loop, struct perch_listener **l)
{
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, NULL, never_called, NULL, l), 0);
	assert_non_null(*l);
	int fd = (*l)->sk.fd, port = perch_listener_port(*l);
	assert_true(fd >= 0 && port > 0);
	realloc_fails_in = 1;
	assert_true(perch_loop_run_once(loop, 0) >= 0); /* the queued insert runs here */
	assert_int_equal(realloc_fails_in, 0);
	assert_false(something_listens_on(port));
	assert_int_equal(perch_listener_port(*l), port);
	return fd;
}

/*
 * Outside the loop's turns (another thread, or the loop's own between
 * turns) perch_listen returns before the loop inserts the listener, with
 * *out set. When the insert then fails, the socket is closed (nothing
 * would accept on it) and the listener stays the caller's until
 * perch_listener_close, which frees it (ASan: no use after free, no leak)
 * and closes nothing more: the fd number it had, taken again by the test,
 * stays open.
 */
static void a_queued_listen_without_room_stays_the_callers_to_close(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	int fds = open_fds();
	struct perch_listener *l = NULL;
	int had = listen_dropped_at_the_next_turn(loop, &l);
	int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* the lowest free number: often `had` itself */
	assert_true(null_fd >= 0);
	if (null_fd != had) {
		assert_int_equal(dup2(null_fd, had), had);
		close(null_fd);
	}
	assert_int_equal(perch_listener_close(l), 0);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_true(fcntl(had, F_GETFD) >= 0);
	close(had);
	assert_int_equal(open_fds(), fds);
	perch_loop_free(loop);
}

/*
 * A listener dropped for want of room and never closed is freed with its
 * loop: what this proves is LeakSanitizer's (the ASan build), as the fd
 * was closed at the drop.
 */
static void a_dropped_listener_never_closed_is_freed_with_the_loop(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	struct perch_listener *l = NULL;
	listen_dropped_at_the_next_turn(loop, &l);
	perch_loop_free(loop);
}

/*
 * A listen queued before the loop is freed is run by the free's own drain,
 * which drops it (nothing would close it after): its socket is closed and
 * the free frees it (LeakSanitizer, the ASan build, for the struct).
 */
static void a_listen_queued_before_the_loops_free_is_freed_with_it(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	int fds = open_fds();
	struct perch_listener *l = NULL;
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, NULL, never_called, NULL, &l), 0);
	int port = perch_listener_port(l);
	assert_int_equal(open_fds(), fds + 1);
	perch_loop_free(loop);
	assert_false(something_listens_on(port));
}

/* Posts the listen from inside a turn: it runs in the loop's next drain. */
static void post_the_listen(void *arg)
{
	struct listen_call *call = arg;
	assert_int_equal(perch_loop_post(call->loop, listen_on_the_loop, call), 0);
}

/*
 * A listen made inside perch_loop_free's last turn (a post the free's first
 * drain made runs in its last one, after every socket was closed) would
 * be left listening with nothing to close it: it is refused, -ECANCELED,
 * as a connect there is, with nothing left open.
 */
static void a_listen_inside_the_loops_free_is_refused_with_ecanceled(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	struct listen_call call = { .loop = loop };
	assert_int_equal(perch_loop_post(loop, post_the_listen, &call), 0);
	int fds = open_fds();
	perch_loop_free(loop);
	assert_true(call.ran);
	assert_int_equal(call.rc, -ECANCELED);
	assert_null(call.l);
	assert_true(open_fds() < fds); /* the loop's own fds went, and no listener's stayed */
}

static void close_listener(void *arg)
{
	perch_listener_close(*(struct perch_listener **)arg);
}

/*
 * A listener closed inside a turn before its queued insert has run (the
 * close was posted first, the listen queued after it): the close leaves
 * the freeing to the insert, which finds it closing and frees it without
 * listening (ASan: no use after free).
 */
static void a_listener_closed_before_its_queued_insert_is_freed_by_it(void **state)
{
	(void)state;
	struct perch_loop *loop = new_loop();
	int fds = open_fds();
	struct perch_listener *l = NULL;
	assert_int_equal(perch_loop_post(loop, close_listener, &l), 0);
	assert_int_equal(perch_listen(loop, "127.0.0.1", 0, NULL, never_called, NULL, &l), 0);
	int port = perch_listener_port(l);
	assert_true(perch_loop_run_once(loop, 0) >= 0);
	assert_false(something_listens_on(port));
	assert_int_equal(open_fds(), fds);
	perch_loop_free(loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_listen_inside_a_turn_without_room_returns_enomem),
		cmocka_unit_test(a_table_growth_failing_at_any_of_its_arrays_leaves_the_table_whole),
		cmocka_unit_test(a_first_connect_without_memory_for_the_slot_array_reports_enomem),
		cmocka_unit_test(a_queued_listen_without_room_stays_the_callers_to_close),
		cmocka_unit_test(a_dropped_listener_never_closed_is_freed_with_the_loop),
		cmocka_unit_test(a_listen_queued_before_the_loops_free_is_freed_with_it),
		cmocka_unit_test(a_listen_inside_the_loops_free_is_refused_with_ecanceled),
		cmocka_unit_test(a_listener_closed_before_its_queued_insert_is_freed_by_it),
	};
	return RUN_ON_BOTH_BACKENDS("listen out of memory", tests, backend);
}
