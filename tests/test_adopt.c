/* tests/test_adopt.c: sockets made elsewhere taken into a loop (connections, listeners) and socket activation, on io_uring and on epoll. */
#include "config.h"

#include "cmocka_prelude.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "both_backends.h"
#include "loop_util.h"

static enum perch_backend backend;

static void loop_start(struct lu_loop *l)
{
	struct perch_loop_opts o = { .backend = backend };
	assert_int_equal(lu_start(l, &o), 0);
}

/* perch_conn_adopt, waited for: the connection (the caller's reference) or NULL, the result in *result. */
static struct perch_conn *adopt(struct lu_loop *l, int fd, int *result)
{
	struct lu_connect k = { .c = NULL, .result = 1 };
	sem_init(&k.done, 0, 0);
	assert_int_equal(perch_conn_adopt(l->loop, fd, NULL, lu_connected, &k), 0);
	assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
	sem_destroy(&k.done);
	*result = k.result;
	return k.c;
}

/*
 * Bytes both ways between an adopted connection and the plain socket at
 * its other end, then the end. The first message is two whole receive
 * buffers: epoll reads again after a full one, which on a blocking fd
 * would block the loop.
 */
static void talk_through(struct perch_conn *c, int peer)
{
	enum { BIG = 2 * 16 * 1024 };
	static uint8_t big[BIG], back[BIG];
	lu_fill(big, BIG);
	assert_true(lu_write_all(peer, big, BIG));
	struct lu_end e = lu_read(c, back, BIG);
	assert_int_equal(e.got, BIG);
	assert_memory_equal(back, big, BIG);
	uint8_t got[8];
	assert_int_equal(perch_conn_write(c, "pong", 4), 0);
	assert_int_equal(lu_flush(c), 0);
	assert_true(lu_read_all(peer, got, 4));
	assert_memory_equal(got, "pong", 4);
	assert_int_equal(shutdown(peer, SHUT_WR), 0);
	e = lu_read_to_end(c, NULL, 0);
	assert_true(e.completed);
}

/* One end of a socketpair (blocking, or made non-blocking by its maker) becomes a connection. */
static void adopt_socketpair_end(int type_flags)
{
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0, sv), 0);
	struct lu_loop l;
	loop_start(&l);
	int result;
	struct perch_conn *c = adopt(&l, sv[0], &result);
	assert_int_equal(result, 0);
	assert_non_null(c);
	if (type_flags & SOCK_NONBLOCK)
		assert_int_equal(fcntl(sv[1], F_SETFL, 0), 0); /* the test's end blocks */
	talk_through(c, sv[1]);
	struct perch_peer_cred cred;
	assert_int_equal(perch_conn_peer_cred(c, &cred), 0);
	assert_int_equal(cred.pid, getpid());
	perch_conn_release(c); /* closes sv[0]: it is perch's */
	char b;
	assert_int_equal(read(sv[1], &b, 1), 0);
	close(sv[1]);
	assert_int_equal(lu_stop(&l), 0);
}

static void an_adopted_socketpair_end_reads_writes_and_ends_as_any_connection(void **state)
{
	adopt_socketpair_end(0);
}

static void an_adopted_non_blocking_socketpair_end_works_the_same(void **state)
{
	adopt_socketpair_end(SOCK_NONBLOCK);
}

/* A TCP connection made by hand (as a parent process would pass one) becomes a connection. */
static void an_adopted_tcp_connection_works_as_a_connected_one(void **state)
{
	int port, lfd = lu_plain_listener(1, &port);
	assert_true(lfd >= 0);
	int fd = lu_plain_connect(port), peer = accept(lfd, NULL, NULL);
	assert_true(fd >= 0 && peer >= 0);
	struct lu_loop l;
	loop_start(&l);
	int result;
	struct perch_conn *c = adopt(&l, fd, &result);
	assert_int_equal(result, 0);
	talk_through(c, peer);
	perch_conn_release(c);
	close(peer);
	close(lfd);
	assert_int_equal(lu_stop(&l), 0);
}

static void adopting_what_is_not_a_socket_is_refused_with_enotsock(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	int p[2];
	assert_int_equal(pipe(p), 0);
	struct perch_listener *ls = NULL;
	assert_int_equal(perch_conn_adopt(l.loop, p[0], NULL, lu_connected, NULL), -ENOTSOCK);
	assert_int_equal(perch_listener_adopt(l.loop, p[0], NULL, lu_drop_conn, NULL, &ls), -ENOTSOCK);
	assert_null(ls);
	assert_true(fcntl(p[0], F_GETFD) >= 0); /* still the caller's, open */
	assert_int_equal(fcntl(p[0], F_GETFL) & O_NONBLOCK, 0); /* untouched */
	close(p[0]);
	close(p[1]);
	assert_int_equal(perch_conn_adopt(l.loop, p[0], NULL, lu_connected, NULL), -EBADF);
	assert_int_equal(lu_stop(&l), 0);
}

static void adopting_a_listening_socket_as_a_connection_is_refused_with_einval(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	int port, lfd = lu_plain_listener(1, &port);
	assert_int_equal(perch_conn_adopt(l.loop, lfd, NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(fcntl(lfd, F_GETFL) & O_NONBLOCK, 0);
	close(lfd);
	assert_int_equal(lu_stop(&l), 0);
}

/* A stream socket not connected: -ENOTCONN; a datagram socket: -EPROTOTYPE. */
static void adopting_an_unconnected_or_datagram_socket_is_refused(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	int fresh = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(perch_conn_adopt(l.loop, fresh, NULL, lu_connected, NULL), -ENOTCONN);
	int dgram[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, dgram), 0);
	struct perch_listener *ls = NULL;
	assert_int_equal(perch_conn_adopt(l.loop, dgram[0], NULL, lu_connected, NULL), -EPROTOTYPE);
	assert_int_equal(perch_listener_adopt(l.loop, dgram[0], NULL, lu_drop_conn, NULL, &ls), -EPROTOTYPE);
	/* Listening is what a listener needs: a fresh or a connected socket is -EINVAL. */
	assert_int_equal(perch_listener_adopt(l.loop, fresh, NULL, lu_drop_conn, NULL, &ls), -EINVAL);
	assert_null(ls);
	close(fresh);
	close(dgram[0]);
	close(dgram[1]);
	assert_int_equal(lu_stop(&l), 0);
}

static void adopting_with_bad_arguments_is_refused_with_einval(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	struct perch_conn_opts inverted = { .pause_bytes = 10, .resume_bytes = 20 };
	struct perch_listener *ls = NULL;
	assert_int_equal(perch_conn_adopt(NULL, sv[0], NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_conn_adopt(l.loop, -1, NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_conn_adopt(l.loop, sv[0], NULL, NULL, NULL), -EINVAL);
	assert_int_equal(perch_conn_adopt(l.loop, sv[0], &inverted, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_listener_adopt(NULL, sv[0], NULL, lu_drop_conn, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listener_adopt(l.loop, -1, NULL, lu_drop_conn, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listener_adopt(l.loop, sv[0], NULL, NULL, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listener_adopt(l.loop, sv[0], NULL, lu_drop_conn, NULL, NULL), -EINVAL);
	assert_null(ls);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(lu_stop(&l), 0);
}

/* A listening socket made by hand (TCP, then Unix) becomes a listener that accepts; closing it closes the fd. */
static void an_adopted_listening_socket_accepts(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	for (int unix_socket = 0; unix_socket < 2; unix_socket++) {
		int port = 0, lfd;
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		socklen_t alen = 0;
		if (unix_socket) {
			alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
					   snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "perch-adopt-%d", (int)getpid()));
			lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
			assert_int_equal(bind(lfd, (struct sockaddr *)&a, alen), 0);
			assert_int_equal(listen(lfd, 4), 0);
		} else {
			lfd = lu_plain_listener(4, &port);
		}
		struct lu_catcher k = { .c = NULL };
		sem_init(&k.got, 0, 0);
		struct perch_listener *ls;
		assert_int_equal(perch_listener_adopt(l.loop, lfd, NULL, lu_catch_accept, &k, &ls), 0);
		assert_true(fcntl(lfd, F_GETFL) & O_NONBLOCK); /* as sock.h says, on either backend */
		assert_int_equal(perch_listener_port(ls), port);
		int fd = lu_plain_connect_to(ls);
		assert_true(fd >= 0);
		assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
		talk_through(k.c, fd);
		perch_conn_release(k.c);
		close(fd);
		assert_int_equal(perch_listener_close(ls), 0);
		for (int i = 0; i < LU_TIMEOUT_MS && fcntl(lfd, F_GETFD) >= 0; i++)
			usleep(1000); /* the loop closes it */
		assert_int_equal(fcntl(lfd, F_GETFD), -1);
		sem_destroy(&k.got);
	}
	assert_int_equal(lu_stop(&l), 0);
}

/* ---- socket activation ---- */

/* The child's side of the activation test: what a service started with two sockets does. Exit status: 0 or the failed step. */
static int activated_child(int ready_fd)
{
	char **names = NULL;
	if (perch_listen_fds(true, &names) != 2)
		return 10;
	if (!names || strcmp(names[0], "web") != 0 || strcmp(names[1], "admin") != 0 || names[2])
		return 11;
	perch_listen_fds_names_free(names);
	if (getenv("LISTEN_FDS") || getenv("LISTEN_PID") || getenv("LISTEN_FDNAMES"))
		return 12;
	for (int fd = PERCH_LISTEN_FDS_START; fd < PERCH_LISTEN_FDS_START + 2; fd++)
		if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
			return 13;
	struct lu_loop l;
	struct perch_loop_opts o = { .backend = backend };
	if (lu_start(&l, &o) != 0)
		return 14;
	struct lu_echo_stats stats = { 0 };
	struct perch_listener *web, *admin;
	if (perch_listener_adopt(l.loop, PERCH_LISTEN_FDS_START, NULL, lu_echo_accept, &stats, &web) != 0 ||
	    perch_listener_adopt(l.loop, PERCH_LISTEN_FDS_START + 1, NULL, lu_echo_accept, &stats, &admin) != 0)
		return 15;
	char go = 1;
	if (write(ready_fd, &go, 1) != 1)
		return 16;
	/* Serves until both clients have come and gone (bounded). */
	for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&stats.ended) < 2; i++)
		usleep(1000);
	int rc = perch__load_u32(&stats.ended) == 2 ? 0 : 17;
	perch_listener_close(web);
	perch_listener_close(admin);
	lu_stop(&l);
	return rc;
}

/* An echo round trip through the service's listener on `fd`'s address. */
static void echo_through_listener_fd(const struct sockaddr *sa, socklen_t len)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(lu_connect_addr(fd, sa, len), 0);
	uint8_t got[5];
	assert_true(lu_write_all(fd, (const uint8_t *)"hello", 5));
	assert_true(lu_read_all(fd, got, 5));
	assert_memory_equal(got, "hello", 5);
	close(fd);
}

/*
 * As a service manager does (sd_listen_fds(3)): two listening sockets
 * (TCP and Unix) made first, then a child with them as fds 3 and 4 and
 * LISTEN_PID (its own pid), LISTEN_FDS=2, LISTEN_FDNAMES=web:admin. The
 * child finds both, with their names, unsets the variables, adopts them
 * and echoes; this process is the two clients.
 */
static void socket_activation_passes_two_listeners_with_their_names(void **state)
{
	int port, tcp = lu_plain_listener(8, &port);
	struct sockaddr_in tcp_addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	tcp_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	socklen_t unlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				      snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "perch-activation-%d", (int)getpid()));
	int unx = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(unx, (struct sockaddr *)&un, unlen), 0);
	assert_int_equal(listen(unx, 8), 0);
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Moved out of the way first: either may already be 3 or 4. */
		int a = fcntl(tcp, F_DUPFD, 100), b = fcntl(unx, F_DUPFD, 100);
		if (a < 0 || b < 0 || dup2(a, 3) != 3 || dup2(b, 4) != 4)
			_exit(20);
		close(a);
		close(b);
		char pidbuf[16];
		snprintf(pidbuf, sizeof(pidbuf), "%d", (int)getpid());
		setenv("LISTEN_PID", pidbuf, 1);
		setenv("LISTEN_FDS", "2", 1);
		setenv("LISTEN_FDNAMES", "web:admin", 1);
		_exit(activated_child(ready[1]));
	}
	close(ready[1]);
	char go;
	assert_int_equal(read(ready[0], &go, 1), 1);
	close(ready[0]);
	echo_through_listener_fd((struct sockaddr *)&tcp_addr, sizeof(tcp_addr));
	echo_through_listener_fd((struct sockaddr *)&un, unlen);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	close(tcp);
	close(unx);
}

/* Sets the three variables (NULL: unset). */
static void set_listen_env(const char *pid, const char *fds, const char *names)
{
	const char *keys[] = { "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES" }, *vals[] = { pid, fds, names };
	for (int i = 0; i < 3; i++) {
		if (vals[i])
			setenv(keys[i], vals[i], 1);
		else
			unsetenv(keys[i]);
	}
}

/* No variables, or another process's (even malformed): no fds (0). Malformed ones of ours: -EINVAL. Names that do not match: -EINVAL. */
static void socket_activation_reads_the_protocol_and_refuses_what_breaks_it(void **state)
{
	char me[16], other[16];
	snprintf(me, sizeof(me), "%d", (int)getpid());
	snprintf(other, sizeof(other), "%d", (int)getpid() + 1);
	char **names = (char **)1;
	set_listen_env(NULL, NULL, NULL);
	assert_int_equal(perch_listen_fds(false, &names), 0);
	assert_null(names);
	set_listen_env(other, "2", NULL);
	assert_int_equal(perch_listen_fds(false, NULL), 0);
	set_listen_env(other, "x", NULL); /* another process's, whatever its count says */
	assert_int_equal(perch_listen_fds(false, NULL), 0);
	set_listen_env(me, "0", NULL);
	assert_int_equal(perch_listen_fds(false, NULL), 0);
	set_listen_env("12x", "2", NULL);
	assert_int_equal(perch_listen_fds(false, NULL), -EINVAL);
	set_listen_env(me, "-1", NULL);
	assert_int_equal(perch_listen_fds(false, NULL), -EINVAL);
	set_listen_env(me, "", NULL);
	assert_int_equal(perch_listen_fds(false, NULL), -EINVAL);
	/* An fd that is not open: fcntl's -EBADF (a far one: 3 may be this process's). */
	char far[16];
	snprintf(far, sizeof(far), "%d", 4000);
	set_listen_env(me, far, NULL);
	assert_int_equal(perch_listen_fds(true, NULL), -EBADF);
	assert_null(getenv("LISTEN_FDS")); /* unset on error too */
	/* One fd passed (3, duplicated there if need be), with names that do not match its count. */
	int saved = fcntl(3, F_DUPFD_CLOEXEC, 100), sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(dup2(sv[0], 3), 3);
	set_listen_env(me, "1", "a:b");
	assert_int_equal(perch_listen_fds(false, &names), -EINVAL);
	set_listen_env(me, "1", NULL);
	assert_int_equal(perch_listen_fds(false, &names), 1);
	assert_string_equal(names[0], "unknown");
	assert_null(names[1]);
	perch_listen_fds_names_free(names);
	set_listen_env(me, "1", "only");
	assert_int_equal(perch_listen_fds(true, &names), 1);
	assert_string_equal(names[0], "only");
	perch_listen_fds_names_free(names);
	assert_null(getenv("LISTEN_PID"));
	if (saved >= 0)
		dup2(saved, 3);
	else
		close(3);
	if (saved >= 0)
		close(saved);
	close(sv[0]);
	close(sv[1]);
}

/* A post that re-posts itself `hops` times, then adopts `fd`: run by perch_loop_free's drains. */
struct late_adoption {
	struct perch_loop *loop;
	int hops, fd, post_rc, adopt_rc;
	struct lu_connect k;
};

static void adopt_after_hops(void *arg)
{
	struct late_adoption *a = arg;
	if (a->hops-- > 0)
		a->post_rc = perch_loop_post(a->loop, adopt_after_hops, a);
	else
		a->adopt_rc = perch_conn_adopt(a->loop, a->fd, NULL, lu_connected, &a->k);
}

/*
 * An adoption made by a callback that perch_loop_free's last drains run,
 * a few posts deep: reported once, -ECANCELED, and its fd closed (sock.h),
 * never left in the inbox with the fd open.
 */
static void an_adoption_from_the_frees_last_drain_is_canceled_and_closed(void **state)
{
	int fds = lu_count_fds();
	struct perch_loop_opts o = { .backend = backend };
	struct late_adoption a = { .hops = 3, .adopt_rc = 1, .k = { .c = NULL, .result = 1 } };
	assert_int_equal(perch_loop_new(&o, &a.loop), 0);
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	a.fd = sv[0];
	sem_init(&a.k.done, 0, 0);
	assert_int_equal(perch_loop_post(a.loop, adopt_after_hops, &a), 0);
	perch_loop_free(a.loop);
	assert_int_equal(a.post_rc, 0);
	assert_int_equal(a.adopt_rc, 0);
	assert_int_equal(lu_sem_wait(&a.k.done, 0), 0);
	assert_int_equal(a.k.result, -ECANCELED);
	assert_null(a.k.c);
	close(sv[1]);
	assert_int_equal(lu_count_fds(), fds); /* sv[0] went with the adoption */
	sem_destroy(&a.k.done);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(an_adopted_socketpair_end_reads_writes_and_ends_as_any_connection),
		cmocka_unit_test(an_adopted_non_blocking_socketpair_end_works_the_same),
		cmocka_unit_test(an_adopted_tcp_connection_works_as_a_connected_one),
		cmocka_unit_test(adopting_what_is_not_a_socket_is_refused_with_enotsock),
		cmocka_unit_test(adopting_a_listening_socket_as_a_connection_is_refused_with_einval),
		cmocka_unit_test(adopting_an_unconnected_or_datagram_socket_is_refused),
		cmocka_unit_test(adopting_with_bad_arguments_is_refused_with_einval),
		cmocka_unit_test(an_adopted_listening_socket_accepts),
		cmocka_unit_test(an_adoption_from_the_frees_last_drain_is_canceled_and_closed),
		cmocka_unit_test(socket_activation_passes_two_listeners_with_their_names),
		cmocka_unit_test(socket_activation_reads_the_protocol_and_refuses_what_breaks_it),
	};
	signal(SIGPIPE, SIG_IGN);
	return RUN_ON_BOTH_BACKENDS("adopted sockets", tests, backend);
}
