/* tests/test_echo_server.c: examples/echo in-process on port 0 (forwarding, and copying with --copy): round trips, a stream larger than the socket buffers, many clients, two loops, no fd left after stop. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmocka_prelude.h"
#include "echo.h"
#include "server_util.h"

SU_FIXTURES(echo_start, echo_stop)

/* The copying echo (echo --copy), for the tests that must hold for both. */
static int setup_copying(void **state)
{
	return (*state = su_start(echo_copy_start, echo_stop, 1)) ? 0 : -1;
}

static void round_trips_come_back_in_order(void **state)
{
	struct su_server *f = *state;
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	char buf[64];
	for (int i = 0; i < 100; i++) {
		int n = snprintf(buf, sizeof(buf), "message %d", i);
		char back[64];
		assert_true(su_send(fd, buf, (size_t)n));
		assert_true(su_recv_all(fd, back, (size_t)n));
		assert_memory_equal(buf, back, (size_t)n);
	}
	close(fd);
}

/*
 * 8 MiB written by one thread while this one reads: the server's flush
 * backpressure holds it, every byte comes back (forwarded: whole receive
 * buffers lent to the send; copied, with --copy).
 */
static void stream_larger_than_the_socket_buffers_comes_back_whole(void **state)
{
	su_echo_stream(((struct su_server *)*state)->port, 8u << 20);
}

static void copying_echo_streams_every_byte_back_too(void **state)
{
	stream_larger_than_the_socket_buffers_comes_back_whole(state);
}

static void copying_echo_round_trips_come_back_in_order_too(void **state)
{
	round_trips_come_back_in_order(state);
}

static void many_clients_at_once_each_get_their_own_bytes(void **state)
{
	struct su_server *f = *state;
	enum { N = 64 };
	int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = su_connect(f->port);
		assert_true(fds[i] >= 0);
	}
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < N; i++) {
			char b[16];
			snprintf(b, sizeof(b), "c%03d-r%d", i, round);
			assert_true(su_send(fds[i], b, 8));
		}
		for (int i = 0; i < N; i++) {
			char b[16], back[8];
			snprintf(b, sizeof(b), "c%03d-r%d", i, round);
			assert_true(su_recv_all(fds[i], back, 8));
			assert_memory_equal(b, back, 8);
		}
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
}

/* The client half-closes: the server echoes what came before the FIN, then closes its side. */
static void fin_after_bytes_gets_the_bytes_then_a_close(void **state)
{
	struct su_server *f = *state;
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	assert_true(su_send_str(fd, "last words"));
	shutdown(fd, SHUT_WR);
	char back[10];
	assert_true(su_recv_all(fd, back, 10));
	assert_memory_equal(back, "last words", 10);
	assert_true(su_peer_closed(fd));
	close(fd);
}

/* A second server of `threads` loops asked for the first one's port is refused; the first one still serves. */
static void second_server_refused(struct su_server *f, int threads)
{
	struct serve_opts o;
	serve_opts_default(&o);
	o.port = f->port;
	o.threads = threads;
	struct serve *second = NULL;
	assert_int_equal(echo_start(&o, &second), -EADDRINUSE);
	assert_null(second);
	o.host = "localhost";
	assert_int_equal(echo_start(&o, &second), -EINVAL);
	int fd = su_connect(f->port);
	char back[2];
	assert_true(fd >= 0);
	assert_true(su_send(fd, "ok", 2));
	assert_true(su_recv_all(fd, back, 2));
	close(fd);
}

/* A second server asked for the first one's port is refused (one loop each: no SO_REUSEPORT at all). */
static void a_port_another_server_holds_is_refused(void **state)
{
	second_server_refused(*state, 1);
}

/*
 * Two loops each: both servers' listeners set SO_REUSEPORT, which alone
 * would let the second join the first's port and split its clients.
 */
static void a_port_a_two_loop_server_holds_is_refused_to_another_two_loop_server(void **state)
{
	second_server_refused(*state, 2);
}

/* The check binds as perch_listen does: "::" is IPv6 only, so an IPv4 listener on the port does not hold it. */
static void an_ipv4_listener_does_not_hold_the_port_for_ipv6(void **state)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 4), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	struct serve_opts o;
	serve_opts_default(&o);
	o.host = "::";
	o.port = ntohs(a.sin_port);
	struct serve *v6 = NULL;
	assert_int_equal(echo_start(&o, &v6), 0);
	echo_stop(v6);
	o.host = "localhost"; /* numeric addresses only */
	assert_int_equal(echo_start(&o, &v6), -EINVAL);
	o.host = "127.0.0.1";
	o.port = 65536;
	assert_int_equal(echo_start(&o, &v6), -EINVAL);
	close(fd);
}

/* Clients left connected when the server stops are closed by the stop (teardown checks the fds). */
static void stop_closes_clients_still_connected(void **state)
{
	struct su_server *f = *state;
	int fd = su_connect(f->port);
	assert_true(fd >= 0);
	assert_true(su_send_str(fd, "x"));
	char c;
	assert_true(su_recv_all(fd, &c, 1));
	echo_stop(f->srv);
	f->srv = NULL; /* teardown's stop ignores NULL */
	assert_true(su_peer_closed(fd));
	close(fd);
}

/* A client that sends without reading: the server's flush waits on it when the stop comes. */
static void stop_with_a_flush_waiting_on_a_client_that_does_not_read(void **state)
{
	struct su_server *f = *state;
	int fd = su_connect_rcvbuf(f->port, 4096);
	assert_true(fd >= 0);
	size_t chunk = 64u << 10, sent = 0;
	uint8_t *out = calloc(1, chunk);
	struct timeval tv = { .tv_usec = 300 * 1000 };
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	/* Sends until both directions are full and the send times out (64 MiB at most). */
	while (sent < (64u << 20) && su_send(fd, out, chunk))
		sent += chunk;
	assert_true(sent < (64u << 20));
	echo_stop(f->srv);
	f->srv = NULL;
	close(fd);
	free(out);
}

/* Never a byte: idle from its accept, so closed one idle timeout later (SU_IDLE_MS here). */
static void a_client_that_never_sends_is_closed_after_the_idle_timeout(void **state)
{
	double start = su_now_ms(); /* before the connect, so before the accept that starts the idle time */
	int fd = su_connect_to(state);
	su_closed_after_idle(fd, start);
	close(fd);
}

/* The echo answers every byte: a stream that keeps flowing is never idle, however long it runs. */
static void a_stream_longer_than_the_idle_timeout_is_not_cut(void **state)
{
	int fd = su_connect_to(state);
	double end = su_now_ms() + 1.5 * SU_IDLE_LONG_MS;
	char out[256], in[256];
	for (int i = 0; su_now_ms() < end; i++) {
		memset(out, 'a' + i % 26, sizeof(out));
		assert_true(su_send(fd, out, sizeof(out)));
		assert_true(su_recv_all(fd, in, sizeof(in)));
		assert_memory_equal(in, out, sizeof(in));
		usleep(20 * 1000);
	}
	close(fd);
}

/* serve_parse_args: --idle-timeout MS, 0 for never, the default without it; nonsense is refused. */
static void the_idle_timeout_option_is_parsed_and_bad_values_refused(void **state)
{
	struct serve_opts o;
	char *none[] = { "echo", NULL };
	assert_int_equal(serve_parse_args(1, none, "echo", &o), 0);
	assert_int_equal(o.idle_timeout_ms, SERVE_IDLE_TIMEOUT_MS);
	char *set[] = { "echo", "--idle-timeout", "250", NULL };
	assert_int_equal(serve_parse_args(3, set, "echo", &o), 0);
	assert_int_equal(o.idle_timeout_ms, 250);
	char *never[] = { "echo", "--idle-timeout", "0", NULL };
	assert_int_equal(serve_parse_args(3, never, "echo", &o), 0);
	assert_int_equal(o.idle_timeout_ms, 0);
	static const char *bad[] = { "-1", "abc", "10ms", "", "86400001", "+5", " 5", "0x10" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *argv[] = { "echo", "--idle-timeout", (char *)bad[i], NULL };
		assert_int_equal(serve_parse_args(3, argv, "echo", &o), -1);
	}
	serve_opts_default(&o);
	o.idle_timeout_ms = PERCH_TIMER_MAX_MS + 1;
	struct serve *srv = NULL;
	assert_int_equal(echo_start(&o, &srv), -EINVAL);
	assert_null(srv);
}

/* serve_parse_args: --recv-buffers N (a power of two up to 32768), --pause-bytes N, --recv-bundles-off and --fixed-files-off reach the options; 0 without them. */
static void the_receive_memory_options_are_parsed_and_bad_values_refused(void **state)
{
	struct serve_opts o;
	char *none[] = { "echo", NULL };
	assert_int_equal(serve_parse_args(1, none, "echo", &o), 0);
	assert_int_equal(o.recv_buffers, 0);
	assert_int_equal(o.pause_bytes, 0);
	assert_false(o.recv_bundles_off);
	assert_false(o.fixed_files_off);
	char *set[] = { "echo", "--recv-buffers", "8192", "--pause-bytes=32768", "--recv-bundles-off", "--fixed-files-off",
			NULL };
	assert_int_equal(serve_parse_args(6, set, "echo", &o), 0);
	assert_int_equal(o.recv_buffers, 8192);
	assert_int_equal(o.pause_bytes, 32768);
	assert_true(o.recv_bundles_off);
	assert_true(o.fixed_files_off);
	static const char *bad_bufs[] = { "0", "3", "1000", "65536", "-2", "4k", "" };
	for (size_t i = 0; i < sizeof(bad_bufs) / sizeof(bad_bufs[0]); i++) {
		char *argv[] = { "echo", "--recv-buffers", (char *)bad_bufs[i], NULL };
		assert_int_equal(serve_parse_args(3, argv, "echo", &o), -1);
	}
	static const char *bad_pause[] = { "0", "-1", "64k", "1073741825", "" };
	for (size_t i = 0; i < sizeof(bad_pause) / sizeof(bad_pause[0]); i++) {
		char *argv[] = { "echo", "--pause-bytes", (char *)bad_pause[i], NULL };
		assert_int_equal(serve_parse_args(3, argv, "echo", &o), -1);
	}
}

/* Runs serve_parse_args with stderr caught in err (cut to size): its return value. */
static int parse_catching_stderr(int argc, char **argv, char *err, size_t size)
{
	struct serve_opts o;
	FILE *f = tmpfile();
	assert_non_null(f);
	fflush(stderr);
	int saved = dup(STDERR_FILENO);
	assert_true(saved >= 0 && dup2(fileno(f), STDERR_FILENO) >= 0);
	int rc = serve_parse_args(argc, argv, "echo", &o);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(f);
	size_t n = fread(err, 1, size - 1, f);
	err[n] = '\0';
	fclose(f);
	return rc;
}

/*
 * An unknown option or a missing value is refused with a message that
 * names it and the program as every other message does ("echo: ..."),
 * not getopt's own, which names argv[0] (a path, when run as one).
 */
static void unknown_options_and_missing_values_are_refused_by_name(void **state)
{
	static const struct {
		const char *arg, *says;
	} cases[] = {
		{ "--bogus", "echo: unknown option '--bogus'\n" },
		{ "--nagle=yes", "echo: unknown option '--nagle=yes'\n" },
		{ "-x", "echo: unknown option '-x'\n" },
		{ "--port", "echo: --port needs a value\n" },
	};
	char err[4096];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *argv[] = { "./build/examples/echo/echo", (char *)cases[i].arg, NULL };
		assert_int_equal(parse_catching_stderr(2, argv, err, sizeof(err)), -1);
		assert_true(strncmp(err, cases[i].says, strlen(cases[i].says)) == 0);
		assert_non_null(strstr(err, "usage: echo"));
	}
}

/* A refused --recv-buffers or --pause-bytes says what the value must be, then the usage. */
static void a_bad_receive_memory_value_says_what_it_must_be(void **state)
{
	static const struct {
		const char *opt, *val, *says;
	} cases[] = {
		{ "--recv-buffers", "1000", "echo: bad value '1000' for --recv-buffers (a power of two, 1 to 32768)\n" },
		{ "--pause-bytes", "0", "echo: bad value '0' for --pause-bytes (bytes, 1 to 1073741824)\n" },
		{ "--threads", "0", "echo: bad value '0' for --threads\n" },
	};
	char err[4096];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *argv[] = { "echo", (char *)cases[i].opt, (char *)cases[i].val, NULL };
		assert_int_equal(parse_catching_stderr(3, argv, err, sizeof(err)), -1);
		assert_true(strncmp(err, cases[i].says, strlen(cases[i].says)) == 0);
		assert_non_null(strstr(err, "usage: echo"));
	}
}

/* Round trips to a server listening on the Unix socket `name`. */
static void unix_round_trips(const char *name)
{
	int fd = su_connect_unix(name);
	assert_true(fd >= 0);
	char back[16];
	for (int i = 0; i < 10; i++) {
		assert_true(su_send(fd, "over unix", 9));
		assert_true(su_recv_all(fd, back, 9));
		assert_memory_equal(back, "over unix", 9);
	}
	close(fd);
}

/*
 * --listen unix:PATH: the server echoes over the path; stopped, it leaves
 * its socket file, which the next server on the path replaces (stale);
 * while one runs, a second is refused. Then an abstract name.
 */
static void a_server_on_a_unix_socket_echoes_and_replaces_only_a_stale_file(void **state)
{
	char path[64], abstract[64];
	snprintf(path, sizeof(path), "/tmp/perch-echo-%d.sock", (int)getpid());
	snprintf(abstract, sizeof(abstract), "@perch-echo-%d", (int)getpid());
	unlink(path);
	struct serve_opts o;
	serve_opts_default(&o);
	o.unix_name = path;
	for (int run = 0; run < 2; run++) {
		struct su_server *f = su_start_opts(echo_start, echo_stop, &o);
		assert_non_null(f);
		assert_int_equal(f->port, 0);
		unix_round_trips(path);
		struct serve *second = NULL;
		assert_int_equal(echo_start(&o, &second), -EADDRINUSE);
		assert_int_equal(su_stop(f), 0);
		assert_int_equal(access(path, F_OK), 0); /* left behind: stale for the next run */
	}
	assert_int_equal(unlink(path), 0);
	o.unix_name = abstract;
	struct su_server *f = su_start_opts(echo_start, echo_stop, &o);
	assert_non_null(f);
	unix_round_trips(abstract);
	assert_int_equal(su_stop(f), 0);
	o.threads = 2;
	struct serve *two = NULL;
	assert_int_equal(echo_start(&o, &two), -EINVAL); /* one listener per name: one loop */
}

/* --listen tcp:HOST:PORT and unix:NAME parse; anything else, or --listen with --host/--port, is refused. */
static void the_listen_option_parses_tcp_and_unix_and_refuses_the_rest(void **state)
{
	struct serve_opts o;
	char *tcp[] = { "echo", "--listen", "tcp:127.0.0.1:8080", NULL };
	assert_int_equal(serve_parse_args(3, tcp, "echo", &o), 0);
	assert_string_equal(o.host, "127.0.0.1");
	assert_int_equal(o.port, 8080);
	assert_null(o.unix_name);
	char *v6[] = { "echo", "--listen", "tcp:[::1]:0", NULL };
	assert_int_equal(serve_parse_args(3, v6, "echo", &o), 0);
	assert_string_equal(o.host, "::1");
	assert_int_equal(o.port, 0);
	char *unx[] = { "echo", "--listen", "unix:/run/echo.sock", NULL };
	assert_int_equal(serve_parse_args(3, unx, "echo", &o), 0);
	assert_string_equal(o.unix_name, "/run/echo.sock");
	char *abs[] = { "echo", "--listen=unix:@echo", NULL };
	assert_int_equal(serve_parse_args(2, abs, "echo", &o), 0);
	assert_string_equal(o.unix_name, "@echo");
	char long_name[140] = "unix:/";
	memset(long_name + 6, 'a', 107);
	long_name[6 + 107] = 0; /* a path of 108 bytes */
	char err[4096];
	const char *bad[] = { "127.0.0.1:80", "tcp:127.0.0.1", "tcp:localhost:80", "tcp:127.0.0.1:65536",
			      "tcp:::1:80", "unix:", "unix:@", "udp:127.0.0.1:80", long_name };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *argv[] = { "echo", "--listen", (char *)bad[i], NULL };
		assert_int_equal(parse_catching_stderr(3, argv, err, sizeof(err)), -1);
		assert_non_null(strstr(err, "bad value"));
	}
	char *both[] = { "echo", "--listen", "tcp:127.0.0.1:0", "--port", "8080", NULL };
	assert_int_equal(parse_catching_stderr(5, both, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "not both"));
	char *threads[] = { "echo", "--listen", "unix:/x.sock", "--threads", "2", NULL };
	assert_int_equal(parse_catching_stderr(5, threads, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "one listener"));
}

/*
 * --nagle reaches every accepted connection, on every loop (two here,
 * sharing the port: eight connections land on both but for a 1 in 128
 * chance); without it, each has TCP_NODELAY.
 */
static void the_nagle_option_reaches_every_accepted_connection(void **state)
{
	enum { CONNS = 8 };
	char *argv[] = { "echo", "--threads", "2", "--nagle", NULL };
	for (int argc = 3; argc <= 4; argc++) {
		struct serve_opts o;
		assert_int_equal(serve_parse_args(argc, argv, "echo", &o), 0);
		assert_int_equal(o.nagle, argc == 4);
		struct su_server *f = su_start_opts(echo_start, echo_stop, &o);
		assert_non_null(f);
		int fds[CONNS];
		for (int i = 0; i < CONNS; i++) {
			fds[i] = su_connect(f->port);
			assert_true(fds[i] >= 0);
			char back[2];
			assert_true(su_send(fds[i], "hi", 2) && su_recv_all(fds[i], back, 2));
			assert_int_equal(su_nodelay_between(f->port, su_sock_port(fds[i], false)), !o.nagle);
		}
		for (int i = 0; i < CONNS; i++)
			close(fds[i]);
		assert_int_equal(su_stop(f), 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(round_trips_come_back_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(stream_larger_than_the_socket_buffers_comes_back_whole, setup,
						teardown),
		cmocka_unit_test_setup_teardown(copying_echo_streams_every_byte_back_too, setup_copying,
						teardown),
		cmocka_unit_test_setup_teardown(copying_echo_round_trips_come_back_in_order_too,
						setup_copying, teardown),
		cmocka_unit_test_setup_teardown(many_clients_at_once_each_get_their_own_bytes, setup_two_loops,
						teardown),
		cmocka_unit_test_setup_teardown(fin_after_bytes_gets_the_bytes_then_a_close, setup, teardown),
		cmocka_unit_test_setup_teardown(a_port_another_server_holds_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(a_port_a_two_loop_server_holds_is_refused_to_another_two_loop_server,
						setup_two_loops, teardown),
		cmocka_unit_test(an_ipv4_listener_does_not_hold_the_port_for_ipv6),
		cmocka_unit_test_setup_teardown(stop_closes_clients_still_connected, setup, teardown),
		cmocka_unit_test_setup_teardown(stop_with_a_flush_waiting_on_a_client_that_does_not_read, setup,
						teardown),
		cmocka_unit_test_setup_teardown(a_client_that_never_sends_is_closed_after_the_idle_timeout,
						setup_idle, teardown),
		cmocka_unit_test_setup_teardown(a_stream_longer_than_the_idle_timeout_is_not_cut,
						setup_idle_long, teardown),
		cmocka_unit_test(the_idle_timeout_option_is_parsed_and_bad_values_refused),
		cmocka_unit_test(the_receive_memory_options_are_parsed_and_bad_values_refused),
		cmocka_unit_test(a_bad_receive_memory_value_says_what_it_must_be),
		cmocka_unit_test(the_nagle_option_reaches_every_accepted_connection),
		cmocka_unit_test(unknown_options_and_missing_values_are_refused_by_name),
		cmocka_unit_test(a_server_on_a_unix_socket_echoes_and_replaces_only_a_stale_file),
		cmocka_unit_test(the_listen_option_parses_tcp_and_unix_and_refuses_the_rest),
	};
	return cmocka_run_group_tests_name("echo server", tests, NULL, NULL);
}
