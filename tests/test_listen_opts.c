/* tests/test_listen_opts.c: listen options (reuseport off by default, backlog) on io_uring and on epoll. */
#include "config.h"

#include "cmocka_prelude.h"

#include <netinet/tcp.h>
#include <signal.h>
#include <sys/wait.h>

#include "both_backends.h"
#include "loop_util.h"

static enum perch_backend backend;

static void loop_start(struct lu_loop *l)
{
	struct perch_loop_opts o = { .backend = backend };
	assert_int_equal(lu_start(l, &o), 0);
}

/* Counts a listener's accepts and drops each connection. */
static void count_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	perch__faa_u32(arg, 1);
	perch_conn_release(c);
}

/* A plain listening socket on 127.0.0.1:port in a child process: "another process". */
struct holder {
	pid_t pid;
	int port;
	int release_fd;            /* closing it ends the child */
};

static void holder_start(struct holder *h, bool reuseport)
{
	int ready[2], release[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(release), 0);
	h->pid = fork();
	assert_true(h->pid >= 0);
	if (h->pid == 0) {
		close(ready[0]);
		close(release[1]);
		int one = 1, port = -1;
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = { .sin_family = AF_INET };
		socklen_t len = sizeof(a);
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (fd >= 0 && (!reuseport || setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) == 0) &&
		    bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 4) == 0 &&
		    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
			port = ntohs(a.sin_port);
		if (write(ready[1], &port, sizeof(port)) != sizeof(port))
			_exit(1);
		char b;
		while (read(release[0], &b, 1) < 0 && errno == EINTR)
			;
		_exit(0);
	}
	close(ready[1]);
	close(release[0]);
	assert_true(lu_read_all(ready[0], (uint8_t *)&h->port, sizeof(h->port)));
	close(ready[0]);
	assert_true(h->port > 0);
	h->release_fd = release[1];
}

static void holder_stop(struct holder *h)
{
	int status;
	close(h->release_fd);
	assert_int_equal(waitpid(h->pid, &status, 0), h->pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Without reuseport, a second listener on a port a perch listener of this process holds is refused. */
static void a_second_listener_on_a_port_this_process_holds_is_refused_with_eaddrinuse(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	uint32_t accepted = 0;
	struct perch_listener *first, *second = NULL;
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, count_accept, &accepted, &first), 0);
	int port = perch_listener_port(first);
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", port, NULL, count_accept, &accepted, &second),
			 -EADDRINUSE);
	assert_null(second);
	/* Even when the second asks for reuseport: the first did not. */
	struct perch_listen_opts share = { .reuseport = true };
	assert_int_equal(perch_listen_tcp(l.loop, "127.0.0.1", port, &share, NULL, count_accept, &accepted,
					  &second),
			 -EADDRINUSE);
	assert_null(second);
	assert_int_equal(perch_listener_close(first), 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* Without reuseport, a port another process listens on is refused, whether or not that one shares it. */
static void a_listener_on_a_port_another_process_holds_is_refused_with_eaddrinuse(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	uint32_t accepted = 0;
	for (int shared = 0; shared < 2; shared++) {
		struct holder h;
		holder_start(&h, shared);
		struct perch_listener *ls = NULL;
		assert_int_equal(perch_listen(l.loop, "127.0.0.1", h.port, NULL, count_accept, &accepted, &ls),
				 -EADDRINUSE);
		assert_null(ls);
		holder_stop(&h);
	}
	assert_int_equal(lu_stop(&l), 0);
}

/* With reuseport on both, two loops listen on one port and the kernel gives each some of the clients. */
static void two_listeners_with_reuseport_share_a_port_and_both_accept(void **state)
{
	enum { MAX_CLIENTS = 400 };
	struct lu_loop a, b;
	loop_start(&a);
	loop_start(&b);
	uint32_t got_a = 0, got_b = 0;
	struct perch_listen_opts share = { .reuseport = true };
	struct perch_listener *la, *lb;
	assert_int_equal(perch_listen_tcp(a.loop, "127.0.0.1", 0, &share, NULL, count_accept, &got_a, &la), 0);
	int port = perch_listener_port(la);
	assert_int_equal(perch_listen_tcp(b.loop, "127.0.0.1", port, &share, NULL, count_accept, &got_b, &lb), 0);
	assert_int_equal(perch_listener_port(lb), port);
	/* Each connect comes from a new source port, which the kernel hashes to one of the two. */
	int clients = 0;
	while (clients < MAX_CLIENTS && (perch__load_u32(&got_a) == 0 || perch__load_u32(&got_b) == 0)) {
		int fd = lu_plain_connect(port);
		assert_true(fd >= 0);
		clients++;
		for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&got_a) + perch__load_u32(&got_b) <
							     (uint32_t)clients; i++)
			usleep(1000);
		close(fd);
	}
	assert_true(perch__load_u32(&got_a) > 0);
	assert_true(perch__load_u32(&got_b) > 0);
	assert_int_equal(perch__load_u32(&got_a) + perch__load_u32(&got_b), clients);
	assert_int_equal(perch_listener_close(la), 0);
	assert_int_equal(perch_listener_close(lb), 0);
	assert_int_equal(lu_stop(&a), 0);
	assert_int_equal(lu_stop(&b), 0);
}

/* The backlog option reaches listen(2): a listening socket's tcpi_sacked is its accept queue's bound (ss(8)'s Send-Q). */
static void the_backlog_option_reaches_listen(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	uint32_t accepted = 0;
	for (int backlog = 0; backlog <= 7; backlog += 7) {
		struct perch_listen_opts lo = { .backlog = backlog };
		struct perch_listener *ls;
		assert_int_equal(perch_listen_tcp(l.loop, "127.0.0.1", 0, &lo, NULL, count_accept, &accepted, &ls), 0);
		struct tcp_info ti;
		socklen_t len = sizeof(ti);
		assert_int_equal(getsockopt(ls->sk.fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
		assert_int_equal(ti.tcpi_sacked, backlog ? (uint32_t)backlog : SOMAXCONN);
		assert_int_equal(perch_listener_close(ls), 0);
	}
	assert_int_equal(lu_stop(&l), 0);
}

static void a_negative_backlog_is_refused_with_einval(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	struct perch_listen_opts lo = { .backlog = -1 };
	struct perch_listener *ls = NULL;
	uint32_t accepted = 0;
	int fds = lu_count_fds();
	assert_int_equal(perch_listen_tcp(l.loop, "127.0.0.1", 0, &lo, NULL, count_accept, &accepted, &ls),
			 -EINVAL);
	assert_null(ls);
	assert_int_equal(lu_count_fds(), fds);
	assert_int_equal(lu_stop(&l), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_second_listener_on_a_port_this_process_holds_is_refused_with_eaddrinuse),
		cmocka_unit_test(a_listener_on_a_port_another_process_holds_is_refused_with_eaddrinuse),
		cmocka_unit_test(two_listeners_with_reuseport_share_a_port_and_both_accept),
		cmocka_unit_test(the_backlog_option_reaches_listen),
		cmocka_unit_test(a_negative_backlog_is_refused_with_einval),
	};
	signal(SIGPIPE, SIG_IGN);
	return RUN_ON_BOTH_BACKENDS("listen options", tests, backend);
}
