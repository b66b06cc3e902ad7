/* tests/test_addr.c: a connection's and a listener's addresses, their text for logs, and the read-only fd, on io_uring and on epoll. */
#include "config.h"

#include "cmocka_prelude.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/un.h>

#include "both_backends.h"
#include "fake_transport.h"
#include "loop_util.h"

static enum perch_backend backend;

/* A listener on `name` (a Unix name, or NULL: 127.0.0.1 port 0), a perch connect to it, and the accepted end. */
struct ends {
	struct lu_loop l;
	struct perch_listener *ls;
	struct lu_catcher k;
	struct perch_conn *client;
};

static void ends_open(struct ends *e, const char *name)
{
	memset(e, 0, sizeof(*e));
	sem_init(&e->k.got, 0, 0);
	struct perch_loop_opts o = { .backend = backend };
	assert_int_equal(lu_start(&e->l, &o), 0);
	struct lu_connect k = { .c = NULL };
	sem_init(&k.done, 0, 0);
	if (name) {
		assert_int_equal(perch_listen_unix(e->l.loop, name, NULL, NULL, lu_catch_accept, &e->k, &e->ls), 0);
		assert_int_equal(perch_connect_unix(e->l.loop, name, NULL, lu_connected, &k), 0);
	} else {
		assert_int_equal(perch_listen(e->l.loop, "127.0.0.1", 0, NULL, lu_catch_accept, &e->k, &e->ls), 0);
		assert_int_equal(perch_connect(e->l.loop, "127.0.0.1", perch_listener_port(e->ls), NULL, lu_connected, &k),
				 0);
	}
	assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(k.result, 0);
	e->client = k.c;
	sem_destroy(&k.done);
	assert_int_equal(lu_sem_wait(&e->k.got, LU_TIMEOUT_MS), 0);
}

static void ends_close(struct ends *e)
{
	perch_conn_release(e->client);
	perch_conn_release(e->k.c);
	assert_int_equal(perch_listener_close(e->ls), 0);
	assert_int_equal(lu_stop(&e->l), 0);
	sem_destroy(&e->k.got);
}

/* An address as perch_addr_format writes it. */
static const char *text(const struct sockaddr_storage *ss, socklen_t len)
{
	static char buf[PERCH_ADDR_FORMAT_MAX];
	assert_true(perch_addr_format((const struct sockaddr *)ss, len, buf, sizeof(buf)) > 0);
	return buf;
}

static void a_tcp_connections_addresses_name_both_ends_and_the_listeners_port(void **state)
{
	struct ends e;
	ends_open(&e, NULL);
	struct sockaddr_storage lst, srv_local, srv_peer, cli_local, cli_peer;
	socklen_t len;
	assert_int_equal(perch_listener_addr(e.ls, &lst, &len), 0);
	char want[64];
	snprintf(want, sizeof(want), "127.0.0.1:%d", perch_listener_port(e.ls));
	assert_string_equal(text(&lst, len), want);
	assert_int_equal(perch_conn_local_addr(e.k.c, &srv_local, &len), 0);
	assert_string_equal(text(&srv_local, len), want); /* the accepted end: the listener's port */
	assert_int_equal(perch_conn_peer_addr(e.client, &cli_peer, &len), 0);
	assert_string_equal(text(&cli_peer, len), want);
	/* The client's own port, seen from both sides. */
	assert_int_equal(perch_conn_local_addr(e.client, &cli_local, &len), 0);
	char client_text[PERCH_ADDR_FORMAT_MAX];
	snprintf(client_text, sizeof(client_text), "%s", text(&cli_local, len));
	assert_int_equal(perch_conn_peer_addr(e.k.c, &srv_peer, &len), 0);
	assert_string_equal(text(&srv_peer, len), client_text);
	assert_string_not_equal(client_text, want);
	ends_close(&e);
}

static void a_unix_connections_addresses_name_the_path_and_an_unnamed_client(void **state)
{
	char dir[] = "/tmp/perch-addr-XXXXXX", path[64];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/a.sock", dir);
	char want[80];
	snprintf(want, sizeof(want), "unix:%s", path);
	struct ends e;
	ends_open(&e, path);
	struct sockaddr_storage ss;
	socklen_t len;
	assert_int_equal(perch_listener_addr(e.ls, &ss, &len), 0);
	assert_string_equal(text(&ss, len), want);
	assert_int_equal(perch_conn_local_addr(e.k.c, &ss, &len), 0);
	assert_string_equal(text(&ss, len), want);
	assert_int_equal(perch_conn_peer_addr(e.client, &ss, &len), 0);
	assert_string_equal(text(&ss, len), want);
	/* The client never bound: no name, from either side. */
	assert_int_equal(perch_conn_local_addr(e.client, &ss, &len), 0);
	assert_string_equal(text(&ss, len), "unix:");
	assert_int_equal(perch_conn_peer_addr(e.k.c, &ss, &len), 0);
	assert_string_equal(text(&ss, len), "unix:");
	ends_close(&e);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(rmdir(dir), 0);
}

static void an_abstract_listeners_address_is_written_with_an_at(void **state)
{
	char name[64], want[80];
	snprintf(name, sizeof(name), "@perch-addr-%d", (int)getpid());
	snprintf(want, sizeof(want), "unix:%s", name);
	struct ends e;
	ends_open(&e, name);
	struct sockaddr_storage ss;
	socklen_t len;
	assert_int_equal(perch_listener_addr(e.ls, &ss, &len), 0);
	assert_string_equal(text(&ss, len), want);
	assert_int_equal(perch_conn_peer_addr(e.client, &ss, &len), 0);
	assert_string_equal(text(&ss, len), want);
	ends_close(&e);
}

/* The formatter alone: IPv6, bytes an abstract name may hold, room, and what it refuses. */
static void the_formatter_writes_each_family_and_refuses_what_it_cannot(void **state)
{
	char buf[PERCH_ADDR_FORMAT_MAX];
	struct sockaddr_in6 in6 = { .sin6_family = AF_INET6, .sin6_port = htons(8080), .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	assert_int_equal(perch_addr_format((struct sockaddr *)&in6, sizeof(in6), buf, sizeof(buf)), 10);
	assert_string_equal(buf, "[::1]:8080");
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	memcpy(un.sun_path, "\0a\x01\\", 4);
	socklen_t unlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 4);
	assert_true(perch_addr_format((struct sockaddr *)&un, unlen, buf, sizeof(buf)) > 0);
	assert_string_equal(buf, "unix:@a\\x01\\x5c");
	/* Too small: -ENOSPC and the buffer untouched; exactly the room (with its NUL): written. */
	memset(buf, 'z', sizeof(buf));
	assert_int_equal(perch_addr_format((struct sockaddr *)&in6, sizeof(in6), buf, 10), -ENOSPC);
	assert_int_equal(buf[0], 'z');
	assert_int_equal(perch_addr_format((struct sockaddr *)&in6, sizeof(in6), buf, 11), 10);
	/* The longest: an abstract name of 107 bytes none printable. */
	memset(un.sun_path + 1, 0x01, sizeof(un.sun_path) - 1);
	assert_int_equal(perch_addr_format((struct sockaddr *)&un, sizeof(un), buf, sizeof(buf)),
			 6 + 4 * (int)(sizeof(un.sun_path) - 1));
	/* A 108-byte path fills sun_path; the kernel gives its length as 111 (a NUL past it). */
	struct sockaddr_storage full = { .ss_family = AF_UNIX };
	memset(((struct sockaddr_un *)&full)->sun_path, 'p', sizeof(un.sun_path));
	assert_int_equal(perch_addr_format((struct sockaddr *)&full, (socklen_t)(sizeof(un) + 1), buf, sizeof(buf)),
			 5 + (int)sizeof(un.sun_path));
	assert_int_equal(perch_addr_format((struct sockaddr *)&full, (socklen_t)sizeof(full) + 1, buf, sizeof(buf)),
			 -EINVAL);
	struct sockaddr other = { .sa_family = AF_APPLETALK };
	assert_int_equal(perch_addr_format(&other, sizeof(other), buf, sizeof(buf)), -EAFNOSUPPORT);
	assert_int_equal(perch_addr_format((struct sockaddr *)&in6, sizeof(in6) - 1, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(perch_addr_format(NULL, sizeof(in6), buf, sizeof(buf)), -EINVAL);
	assert_int_equal(perch_addr_format((struct sockaddr *)&in6, sizeof(in6), NULL, 0), -EINVAL);
}

/* The fd is the connection's socket: an option set through it is the socket's. */
static void the_fd_is_the_connections_socket_for_its_options(void **state)
{
	struct ends e;
	ends_open(&e, NULL);
	int fd = perch_conn_fd(e.k.c);
	assert_true(fd >= 0);
	struct sockaddr_storage via_fd, via_conn;
	socklen_t a = sizeof(via_fd), b;
	assert_int_equal(getsockname(fd, (struct sockaddr *)&via_fd, &a), 0);
	assert_int_equal(perch_conn_local_addr(e.k.c, &via_conn, &b), 0);
	assert_int_equal(a, b);
	assert_memory_equal(&via_fd, &via_conn, a);
	int on = 1, got = 0;
	socklen_t glen = sizeof(got);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)), 0);
	assert_int_equal(getsockopt(perch_conn_fd(e.k.c), SOL_SOCKET, SO_KEEPALIVE, &got, &glen), 0);
	assert_int_equal(got, 1);
	assert_int_not_equal(perch_conn_fd(e.client), fd);
	ends_close(&e);
}

/* Once closed the accessors say -EPIPE (the loop closes the fd, whose number is reused). */
static void a_closed_connection_has_no_fd_nor_addresses(void **state)
{
	struct ends e;
	ends_open(&e, NULL);
	assert_int_equal(perch_conn_close(e.k.c), 0);
	struct sockaddr_storage ss;
	socklen_t len;
	assert_int_equal(perch_conn_fd(e.k.c), -EPIPE);
	assert_int_equal(perch_conn_local_addr(e.k.c, &ss, &len), -EPIPE);
	assert_int_equal(perch_conn_peer_addr(e.k.c, &ss, &len), -EPIPE);
	ends_close(&e);
}

static void accessors_refuse_null_and_connections_without_a_socket(void **state)
{
	struct fake_transport t = { .sent = NULL };
	struct perch_conn *c = perch__conn_new(&fake_ops, &t);
	struct sockaddr_storage ss;
	socklen_t len;
	assert_int_equal(perch_conn_fd(c), -ENOTSOCK);
	assert_int_equal(perch_conn_local_addr(c, &ss, &len), -ENOTSOCK);
	assert_int_equal(perch_conn_peer_addr(c, &ss, &len), -ENOTSOCK);
	assert_int_equal(perch_conn_fd(NULL), -EINVAL);
	assert_int_equal(perch_conn_local_addr(NULL, &ss, &len), -EINVAL);
	assert_int_equal(perch_conn_local_addr(c, NULL, &len), -EINVAL);
	assert_int_equal(perch_conn_peer_addr(c, &ss, NULL), -EINVAL);
	assert_int_equal(perch_listener_addr(NULL, &ss, &len), -EINVAL);
	perch_conn_release(c);
}

/*
 * getsockname, as the library calls it, interposed: armed, it first does
 * what a close racing the call may do (the connection closed on another
 * thread, the loop closing its fd, the number taken by another socket)
 * and only then asks the kernel, about whatever the number names now.
 */
static struct {
	struct perch_conn *c;
	int other; /* put at the connection's fd number once the loop closed it */
	bool armed;
} reuse;

int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	if (reuse.armed) {
		reuse.armed = false;
		perch_conn_close(reuse.c);
		for (int i = 0; i < LU_TIMEOUT_MS && fcntl(fd, F_GETFD) >= 0; i++)
			usleep(1000);
		assert_int_equal(dup2(reuse.other, fd), fd);
	}
	return (int)syscall(SYS_getsockname, fd, sa, len);
}

/* An address asked for while a close races it: -EPIPE, never the address of the socket that took its fd number. */
static void an_address_read_while_a_close_races_it_is_never_another_sockets(void **state)
{
	char name[64];
	snprintf(name, sizeof(name), "@perch-addr-race-%d", (int)getpid());
	struct ends e;
	ends_open(&e, name);
	int fd = perch_conn_fd(e.k.c);
	assert_true(fd >= 0);
	/* The socket that takes the number: bound to a name of its own. */
	struct sockaddr_un other = { .sun_family = AF_UNIX };
	int n = snprintf(other.sun_path + 1, sizeof(other.sun_path) - 1, "perch-other-%d", (int)getpid());
	reuse.other = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(reuse.other, (struct sockaddr *)&other,
			      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)), 0);
	reuse.c = e.k.c;
	reuse.armed = true;
	struct sockaddr_storage ss = { .ss_family = AF_UNSPEC };
	socklen_t len = 0;
	assert_int_equal(perch_conn_local_addr(e.k.c, &ss, &len), -EPIPE);
	assert_false(reuse.armed); /* the race was staged */
	assert_int_equal(ss.ss_family, AF_UNSPEC); /* untouched */
	close(fd); /* the other socket's copy at the old number */
	close(reuse.other);
	ends_close(&e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_tcp_connections_addresses_name_both_ends_and_the_listeners_port),
		cmocka_unit_test(a_unix_connections_addresses_name_the_path_and_an_unnamed_client),
		cmocka_unit_test(an_abstract_listeners_address_is_written_with_an_at),
		cmocka_unit_test(the_formatter_writes_each_family_and_refuses_what_it_cannot),
		cmocka_unit_test(the_fd_is_the_connections_socket_for_its_options),
		cmocka_unit_test(a_closed_connection_has_no_fd_nor_addresses),
		cmocka_unit_test(an_address_read_while_a_close_races_it_is_never_another_sockets),
		cmocka_unit_test(accessors_refuse_null_and_connections_without_a_socket),
	};
	signal(SIGPIPE, SIG_IGN);
	return RUN_ON_BOTH_BACKENDS("addresses and the fd", tests, backend);
}
