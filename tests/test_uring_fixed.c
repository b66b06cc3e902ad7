/* tests/test_uring_fixed.c: io_uring registered files: a connection's socket enters the ring's table at its eighth send, its operations go through it, and its close takes it out. */
#include "config.h"

#include <fcntl.h>
#include <sys/resource.h>

#include "cmocka_prelude.h"

#include "loop_util.h"

enum { SHORT_MS = 200 };

/* Reads up to `n` bytes from `fd` within `ms`; returns how many (-1: the end or an error came first). */
static ssize_t read_within(int fd, char *buf, size_t n, int ms)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, ms) <= 0)
			break;
		ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
		if (r <= 0)
			return got > 0 ? (ssize_t)got : -1;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/* Whether `fd`'s peer ended the stream within `ms` (bytes before the end are dropped). */
static bool ends_within(int fd, int ms)
{
	char b[64];
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, ms) <= 0)
			return false;
		ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN))
			return true;
	}
}

static void send_on(struct perch_conn *c, const char *msg)
{
	assert_int_equal(perch_conn_write(c, msg, strlen(msg)), 0);
	assert_int_equal(lu_flush(c), 0);
}

/* The peer `fd` gets `msg` (and the other, `not`, nothing). */
static void seen_by(int fd, int not, const char *msg)
{
	char b[32] = { 0 };
	assert_int_equal(read_within(fd, b, strlen(msg), LU_TIMEOUT_MS), (ssize_t)strlen(msg));
	assert_string_equal(b, msg);
	if (not >= 0)
		assert_int_equal(read_within(not, b, 1, SHORT_MS), 0);
}

/* `times` sends of `msg`, each seen by the peer before the next. */
static void sends_seen(struct perch_conn *c, int peer, const char *msg, int times)
{
	for (int i = 0; i < times; i++) {
		send_on(c, msg);
		seen_by(peer, -1, msg);
	}
}

struct pair {
	struct perch_conn *c; /* perch's end */
	int peer;             /* the test's */
	struct perch_listener *ls;
};

enum kind { TCP, TCP_SINGLESHOT, UNIX };

/*
 * A TCP connection accepted by the loop (receiving multishot or
 * single-shot; sending referenced writes of zerocopy_min bytes or more
 * zero-copy, 0 for the default), or a Unix socketpair's end adopted by it.
 */
static struct pair pair_open_zc(struct lu_loop *l, enum kind kind, size_t zerocopy_min)
{
	struct pair p = { .peer = -1 };
	if (kind == UNIX) {
		int sv[2];
		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
		struct lu_connect k = { .c = NULL };
		sem_init(&k.done, 0, 0);
		assert_int_equal(perch_conn_adopt(l->loop, sv[0], NULL, lu_connected, &k), 0);
		assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
		assert_int_equal(k.result, 0);
		sem_destroy(&k.done);
		p.c = k.c;
		p.peer = sv[1];
		return p;
	}
	struct lu_catcher k = { 0 };
	sem_init(&k.got, 0, 0);
	struct perch_conn_opts co = { .recv_mode = kind == TCP ? PERCH_RECV_MULTISHOT : PERCH_RECV_SINGLESHOT,
				      .zerocopy_min = zerocopy_min };
	assert_int_equal(perch_listen(l->loop, "127.0.0.1", 0, &co, lu_catch_accept, &k, &p.ls), 0);
	p.peer = lu_plain_connect_to(p.ls);
	assert_true(p.peer >= 0);
	assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
	sem_destroy(&k.got);
	p.c = k.c;
	return p;
}

static struct pair pair_open(struct lu_loop *l, enum kind kind)
{
	return pair_open_zc(l, kind, 0);
}

/* The socket's entry completes on the loop thread after the send's: waits (bounded) for the count. */
static struct perch_loop_stats stats_once_fixed(struct lu_loop *l, uint64_t want)
{
	struct perch_loop_stats st = lu_stats(l);
	for (int i = 0; i < 200 && st.fixed_sockets < want; i++) {
		usleep(10 * 1000);
		st = lu_stats(l);
	}
	return st;
}

/*
 * Eight sends enter the socket in the table. Then the test puts another
 * socket (a decoy) at the connection's fd number (dup2): what goes
 * through the table still reaches the connection's own socket, what goes
 * by the fd number reaches the decoy. So the third send, and where the
 * socket receives single-shot (re-armed after each receive: a Unix
 * socket always) the receive after the next, say which way they went. The close must take the entry
 * out: the table's reference is then the socket's last, so its peer sees
 * the end.
 */
static void through_the_table(enum kind kind, bool off)
{
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .fixed_files_off = off };
	int fds_before = lu_count_fds();
	assert_int_equal(lu_start(&l, &o), 0);
	struct pair p = pair_open(&l, kind);

	sends_seen(p.c, p.peer, "one", 7);
	assert_int_equal(lu_stats(&l).fixed_sockets, 0); /* seven sends: not in the table */
	sends_seen(p.c, p.peer, "two", 1);
	struct perch_loop_stats st = stats_once_fixed(&l, off ? 0 : 1);
	assert_int_equal(st.fixed_files, off ? 0 : 1);
	assert_int_equal(st.fixed_sockets, off ? 0 : 1);
	assert_int_equal(st.fixed_refused, 0);

	int decoy[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, decoy), 0);
	assert_int_equal(dup2(decoy[0], perch_conn_fd(p.c)), perch_conn_fd(p.c));
	close(decoy[0]); /* perch's close closes the copy at its fd number */

	send_on(p.c, "three");
	if (off)
		seen_by(decoy[1], p.peer, "three");
	else
		seen_by(p.peer, decoy[1], "three");

	/* The receive armed before the decoy came takes "four" from the peer, whichever way it went. */
	uint8_t in[4];
	assert_int_equal(send(p.peer, "four", 4, MSG_NOSIGNAL), 4);
	assert_int_equal(lu_read(p.c, in, 4).got, 4);
	assert_memory_equal(in, "four", 4);
	/* A single-shot's re-arm goes by the fd number without the table: to the decoy. A multishot stays on the socket. */
	(void)send(p.peer, "FIVE", 4, MSG_NOSIGNAL); /* fails once the socket went (off, single-shot): nothing holds it */
	assert_int_equal(send(decoy[1], "five", 4, MSG_NOSIGNAL), 4);
	assert_int_equal(lu_read(p.c, in, 4).got, 4);
	assert_memory_equal(in, off && kind != TCP ? "five" : "FIVE", 4);

	assert_int_equal(perch_conn_close(p.c), 0);
	perch_conn_release(p.c);
	assert_true(ends_within(p.peer, LU_TIMEOUT_MS));
	if (p.ls)
		perch_listener_close(p.ls);
	close(p.peer);
	close(decoy[1]);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(lu_count_fds(), fds_before);
}

static void a_tcp_connections_sends_go_through_the_table_from_its_ninth(void **state)
{
	(void)state;
	through_the_table(TCP, false);
}

static void a_single_shot_tcp_connections_receives_go_through_the_table(void **state)
{
	(void)state;
	through_the_table(TCP_SINGLESHOT, false);
}

static void a_unix_connections_sends_and_receives_go_through_the_table(void **state)
{
	(void)state;
	through_the_table(UNIX, false);
}

static void with_fixed_files_off_they_go_by_the_fd_number(void **state)
{
	(void)state;
	through_the_table(TCP, true);
	through_the_table(TCP_SINGLESHOT, true);
	through_the_table(UNIX, true);
}

/* An io_uring loop started in *l, and a TCP connection on it that entered the table (eight sends). */
static struct pair entered_pair(struct lu_loop *l, size_t zerocopy_min)
{
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	assert_int_equal(lu_start(l, &o), 0);
	struct pair p = pair_open_zc(l, TCP, zerocopy_min);
	sends_seen(p.c, p.peer, "in", 8);
	assert_int_equal(stats_once_fixed(l, 1).fixed_sockets, 1);
	return p;
}

/*
 * An abort resets the connection at its close (SO_LINGER 0): the reset
 * goes only when the close drops the socket's last reference, so only if
 * the table let go of it first.
 */
static void an_aborted_connection_in_the_table_resets_its_peer(void **state)
{
	(void)state;
	struct lu_loop l;
	struct pair p = entered_pair(&l, 0);
	assert_int_equal(perch_conn_abort(p.c), 0);
	perch_conn_release(p.c);
	struct pollfd pf = { .fd = p.peer, .events = POLLIN };
	assert_int_equal(poll(&pf, 1, LU_TIMEOUT_MS), 1);
	char b[8];
	assert_int_equal(recv(p.peer, b, sizeof(b), MSG_DONTWAIT), -1);
	assert_int_equal(errno, ECONNRESET);
	perch_listener_close(p.ls);
	close(p.peer);
	assert_int_equal(lu_stop(&l), 0);
}

static void released(void *arg, const void *data, size_t len)
{
	(void)data;
	(void)len;
	perch__faa_u32(arg, 1);
}

/*
 * A zero-copy send goes through the table too: with a decoy at the
 * connection's fd number, one by the fd would land on the decoy (a Unix
 * socket, which refuses zero-copy sends).
 */
static void a_zero_copy_send_goes_through_the_table(void **state)
{
	(void)state;
	enum { BIG = 256 * 1024 };
	struct lu_loop l;
	int fds_before = lu_count_fds();
	struct pair p = entered_pair(&l, 4096);
	bool zc = lu_stats(&l).zerocopy_available;

	int decoy[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, decoy), 0);
	assert_int_equal(dup2(decoy[0], perch_conn_fd(p.c)), perch_conn_fd(p.c));
	close(decoy[0]);

	char *out = malloc(BIG), *in = malloc(BIG);
	assert_non_null(out);
	assert_non_null(in);
	for (size_t i = 0; i < BIG; i++)
		out[i] = (char)(i * 7 + 1);
	uint32_t releases = 0;
	assert_int_equal(perch_conn_write_ref(p.c, out, BIG, released, &releases), 0);
	assert_int_equal(lu_flush(p.c), 0);
	assert_int_equal(read_within(p.peer, in, BIG, LU_TIMEOUT_MS), BIG);
	assert_memory_equal(in, out, BIG);
	assert_int_equal(read_within(decoy[1], in, 1, SHORT_MS), 0);

	struct perch_loop_stats st = lu_stats(&l);
	if (zc)
		assert_true(st.zerocopy_sends >= 1); /* the kernel may take it in parts: each rest goes zero-copy too */
	else
		assert_int_equal(st.zerocopy_sends, 0);
	assert_int_equal(st.zerocopy_refused, 0);
	assert_int_equal(perch_conn_close(p.c), 0);
	perch_conn_release(p.c);
	assert_true(ends_within(p.peer, LU_TIMEOUT_MS));
	for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&releases) == 0; i++)
		usleep(1000);
	assert_int_equal(perch__load_u32(&releases), 1);
	perch_listener_close(p.ls);
	close(p.peer);
	close(decoy[1]);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(lu_count_fds(), fds_before);
	free(out);
	free(in);
}

/* On the loop thread: the connection's eighth send, and its close in the same turn; their results, checked after. */
struct send_and_close {
	struct perch_conn *c;
	int write_rc, flush_rc, close_rc;
};

static void eighth_send_and_close(void *arg)
{
	struct send_and_close *a = arg;
	struct perch_vtask_handle h;
	a->write_rc = perch_conn_write(a->c, "8th", 3);
	a->flush_rc = perch_conn_flush(a->c, &h);
	a->close_rc = perch_conn_close(a->c);
}

/*
 * A close in the turn that asked for the socket's entry, before its
 * completion: the removal is queued behind the entry all the same, so
 * the table lets go of the socket and the peer sees the end.
 */
static void a_close_before_the_entry_completed_still_takes_it_out(void **state)
{
	(void)state;
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	int fds_before = lu_count_fds();
	assert_int_equal(lu_start(&l, &o), 0);
	struct pair p = pair_open(&l, TCP);
	sends_seen(p.c, p.peer, "in", 7);
	struct send_and_close a = { .c = p.c };
	assert_int_equal(lu_on_loop(&l, eighth_send_and_close, &a), 0);
	assert_int_equal(a.write_rc, 0);
	assert_int_equal(a.flush_rc, PERCH_PENDING);
	assert_int_equal(a.close_rc, 0);
	perch_conn_release(p.c);
	assert_true(ends_within(p.peer, LU_TIMEOUT_MS));
	struct perch_loop_stats st = stats_once_fixed(&l, 1);
	assert_int_equal(st.fixed_sockets, 1);
	assert_int_equal(st.fixed_refused, 0);
	perch_listener_close(p.ls);
	close(p.peer);
	assert_int_equal(lu_stop(&l), 0);
	assert_int_equal(lu_count_fds(), fds_before);
}

/*
 * The table covers the fds the soft RLIMIT_NOFILE allowed when the loop
 * was made: a socket given a higher fd (the limit raised since) is not
 * entered, and works as before.
 */
static void a_socket_past_the_table_keeps_its_plain_fd(void **state)
{
	(void)state;
	struct rlimit rl;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rlim_t low = 64;
	assert_true(rl.rlim_max >= low + 128); /* the fds past the table need room under the hard limit */
	if (rl.rlim_cur < low + 128)
		rl.rlim_cur = low + 128; /* raised for the rest of this test, as a server raises it after making its loops */
	struct rlimit lowered = { .rlim_cur = low, .rlim_max = rl.rlim_max };
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &lowered), 0);
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	int rc = lu_start(&l, &o);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	assert_int_equal(rc, 0);

	/* Every fd below the table's end taken: the pair's sockets come past it. */
	int fill[80], nfill = 0;
	for (int fd; nfill < 80 && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) {
		fill[nfill++] = fd;
		if (fd >= (int)low)
			break;
	}
	close(fill[--nfill]);
	struct pair p = pair_open(&l, UNIX);
	assert_true(perch_conn_fd(p.c) >= (int)low);
	sends_seen(p.c, p.peer, "past", 10);
	struct perch_loop_stats st = lu_stats(&l);
	assert_int_equal(st.fixed_files, 1);
	assert_int_equal(st.fixed_sockets, 0);
	assert_int_equal(st.fixed_refused, 0);
	assert_int_equal(perch_conn_close(p.c), 0);
	perch_conn_release(p.c);
	assert_true(ends_within(p.peer, LU_TIMEOUT_MS));
	close(p.peer);
	while (nfill > 0)
		close(fill[--nfill]);
	assert_int_equal(lu_stop(&l), 0);
}

/* epoll has no table: its counters stay 0, and sends work as ever. */
static void on_epoll_nothing_is_entered(void **state)
{
	(void)state;
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_EPOLL };
	assert_int_equal(lu_start(&l, &o), 0);
	struct pair p = pair_open(&l, TCP);
	sends_seen(p.c, p.peer, "e", 3);
	struct perch_loop_stats st = lu_stats(&l);
	assert_int_equal(st.fixed_files, 0);
	assert_int_equal(st.fixed_sockets, 0);
	perch_conn_release(p.c);
	perch_listener_close(p.ls);
	close(p.peer);
	assert_int_equal(lu_stop(&l), 0);
}

int main(void)
{
	struct perch_loop *probe = lu_uring_probe();
	if (!probe)
		return 77;
	struct perch_loop_stats st;
	perch_loop_stats(probe, &st);
	perch_loop_free(probe);
	if (!st.fixed_files) {
		printf("SKIP: this kernel has no registered file table for perch (Linux 6.13+)\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_tcp_connections_sends_go_through_the_table_from_its_ninth),
		cmocka_unit_test(a_single_shot_tcp_connections_receives_go_through_the_table),
		cmocka_unit_test(a_unix_connections_sends_and_receives_go_through_the_table),
		cmocka_unit_test(with_fixed_files_off_they_go_by_the_fd_number),
		cmocka_unit_test(an_aborted_connection_in_the_table_resets_its_peer),
		cmocka_unit_test(a_zero_copy_send_goes_through_the_table),
		cmocka_unit_test(a_close_before_the_entry_completed_still_takes_it_out),
		cmocka_unit_test(a_socket_past_the_table_keeps_its_plain_fd),
		cmocka_unit_test(on_epoll_nothing_is_entered),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
