/* tests/test_resp_server.c: examples/resp in-process on port 0: each command, pipelining, inline commands, split commands, protocol errors, one store for two loops. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_prelude.h"
#include "resp.h"
#include "server_util.h"

SU_FIXTURES(resp_start, resp_stop)

/* Sends `req` and asserts the reply is exactly `want`. */
static void expect(int fd, const char *req, const char *want)
{
	size_t n = strlen(want);
	char *got = calloc(1, n + 1);
	if (req)
		assert_true(su_send_str(fd, req));
	assert_true(su_recv_all(fd, got, n));
	assert_string_equal(got, want);
	free(got);
}

static void each_command_gets_redis_reply(void **state)
{
	int fd = su_connect_to(state);
	expect(fd, "*1\r\n$4\r\nPING\r\n", "+PONG\r\n");
	expect(fd, "*2\r\n$4\r\nECHO\r\n$5\r\nhello\r\n", "$5\r\nhello\r\n");
	expect(fd, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nabc\r\n", "+OK\r\n");
	expect(fd, "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "$3\r\nabc\r\n");
	expect(fd, "*2\r\n$3\r\nGET\r\n$7\r\nmissing\r\n", "$-1\r\n");
	expect(fd, "*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n", ":1\r\n");
	expect(fd, "*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n", ":2\r\n");
	expect(fd, "*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n", "-ERR value is not an integer or out of range\r\n");
	expect(fd, "*3\r\n$3\r\nDEL\r\n$1\r\nk\r\n$1\r\nx\r\n", ":1\r\n");
	expect(fd, "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "$-1\r\n");
	close(fd);
}

static void inline_commands_are_understood(void **state)
{
	int fd = su_connect_to(state);
	expect(fd, "PING\r\n", "+PONG\r\n");
	expect(fd, "set greeting \"a b\"\n", "+OK\r\n");
	expect(fd, "get greeting\r\n", "$3\r\na b\r\n");
	close(fd);
}

/* 100 commands in one write: 100 replies, in order. */
static void pipelined_commands_are_answered_in_order(void **state)
{
	int fd = su_connect_to(state);
	char *batch = calloc(1, 100 * 64), *want = calloc(1, 100 * 32);
	for (int i = 0; i < 100; i++) {
		char key[16];
		int k = snprintf(key, sizeof(key), "key%d", i);
		sprintf(batch + strlen(batch), "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", k, key, k, key);
		strcat(want, "+OK\r\n");
	}
	expect(fd, batch, want);
	batch[0] = want[0] = '\0';
	for (int i = 0; i < 100; i++) {
		char key[16];
		int k = snprintf(key, sizeof(key), "key%d", i);
		sprintf(batch + strlen(batch), "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", k, key);
		sprintf(want + strlen(want), "$%d\r\n%s\r\n", k, key);
	}
	expect(fd, batch, want);
	free(batch);
	free(want);
	close(fd);
}

/*
 * 1,000 PINGs in one write reach the server in one or a few reads: it
 * answers at most RESP_MAX_PIPELINED of a read before flushing, and the
 * rest after, none lost, in order.
 */
static void a_read_of_many_pipelined_commands_is_answered_a_bounded_batch_at_a_time(void **state)
{
	enum { N = 1000 };
	int fd = su_connect_to(state);
	char *batch = malloc(N * 6 + 1), *want = malloc(N * 7 + 1);
	assert_non_null(batch);
	assert_non_null(want);
	for (int i = 0; i < N; i++) {
		memcpy(batch + 6 * i, "PING\r\n", 6);
		memcpy(want + 7 * i, "+PONG\r\n", 7);
	}
	batch[N * 6] = want[N * 7] = '\0';
	expect(fd, batch, want);
	size_t cmds, bytes;
	resp_largest_batch(&cmds, &bytes);
	print_message("largest batch of one read: %zu commands, %zu reply bytes\n", cmds, bytes);
	assert_true(cmds >= 1 && cmds <= RESP_MAX_PIPELINED);
	free(batch);
	free(want);
	close(fd);
}

/* GETs of a 1 MiB value, pipelined: each read stages replies up to the bound and one reply past it, not all of them. */
static void pipelined_gets_of_a_large_value_stage_a_bounded_reply(void **state)
{
	enum { VAL = 1 << 20, GETS = 8 };
	int fd = su_connect_to(state);
	char *set = malloc(VAL + 64), *val = malloc(VAL), *got = malloc(VAL + 64);
	assert_non_null(set);
	assert_non_null(val);
	assert_non_null(got);
	for (size_t i = 0; i < VAL; i++)
		val[i] = (char)('a' + i % 26);
	int h = sprintf(set, "*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n", VAL);
	memcpy(set + h, val, VAL);
	memcpy(set + h + VAL, "\r\n", 2);
	assert_true(su_send(fd, set, (size_t)h + VAL + 2));
	expect(fd, NULL, "+OK\r\n");
	char gets[GETS * 32] = "";
	for (int i = 0; i < GETS; i++)
		strcat(gets, "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
	assert_true(su_send_str(fd, gets));
	char head[32];
	int hl = sprintf(head, "$%d\r\n", VAL);
	for (int i = 0; i < GETS; i++) {
		assert_true(su_recv_all(fd, got, (size_t)hl + VAL + 2));
		assert_memory_equal(got, head, (size_t)hl);
		assert_memory_equal(got + hl, val, VAL);
		assert_memory_equal(got + hl + VAL, "\r\n", 2);
	}
	size_t cmds, bytes;
	resp_largest_batch(&cmds, &bytes);
	print_message("largest batch of one read: %zu commands, %zu reply bytes\n", cmds, bytes);
	assert_true(bytes <= PERCH_PIPE_HIGH_WATER_DEFAULT + (size_t)hl + VAL + 2);
	free(set);
	free(val);
	free(got);
	close(fd);
}

/* This process's resident memory in KiB (VmRSS), or -1. */
/* SET big to `len` bytes of 'v' over fd, and its +OK. */
static void set_big(int fd, int len)
{
	char *set = malloc((size_t)len + 64);
	assert_non_null(set);
	int h = sprintf(set, "*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n", len);
	memset(set + h, 'v', (size_t)len);
	memcpy(set + h + len, "\r\n", 2);
	assert_true(su_send(fd, set, (size_t)h + len + 2));
	free(set);
	expect(fd, NULL, "+OK\r\n");
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[128];
	long kib = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

/*
 * 256 pipelined GETs of a 4 MiB value (1 GiB of replies), never read:
 * the server stages the replies up to its writer's high-water mark, waits
 * for a flush the client never lets complete, and parses no further, so
 * its memory grows by the value, its one staged copy and the request
 * bytes, not by the replies (an unbounded builder: 1 GiB). It still
 * serves others meanwhile.
 */
static void pipelined_gets_of_a_large_value_never_read_cost_bounded_memory(void **state)
{
	enum { VAL = 4 << 20, GETS = 256, SAMPLES = 50 };
	long before = rss_kib(), peak = before;
	assert_true(before > 0);
	int fd = su_connect_to(state);
	set_big(fd, VAL);
	static const char get[] = "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n";
	char *gets = malloc(GETS * (sizeof(get) - 1) + 1);
	assert_non_null(gets);
	gets[0] = '\0';
	for (int i = 0; i < GETS; i++)
		strcat(gets, get);
	assert_true(su_send_str(fd, gets));
	free(gets);
	for (int i = 0; i < SAMPLES; i++) { /* half a second: an unbounded builder is past the bound in tens of ms */
		usleep(10 * 1000);
		long now = rss_kib();
		peak = now > peak ? now : peak;
	}
	print_message("resident memory: %ld KiB before, %ld KiB at most after the GETs\n", before, peak);
	assert_true(peak - before < 64 * 1024);
	int other = su_connect_to(state);
	expect(other, "PING\r\n", "+PONG\r\n");
	close(other);
	close(fd);
}

struct stop_call {
	struct su_server *s;
	struct perch_server_report rep;
};

static void *stop_main(void *p)
{
	struct stop_call *sc = p;
	serve_report_to(sc->s->srv, &sc->rep);
	sc->s->stop(sc->s->srv);
	return NULL;
}

/* True when the next read is a clean end of stream (not a reset). */
static bool reads_eof(int fd)
{
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	return r == 0;
}

/*
 * SIGTERM's stop begins while a 4 MiB GET answer waits for a slow
 * reader: once the reader took it, the session is between commands and
 * ends (a FIN, counted finished), instead of waiting for the deadline's
 * reset.
 */
static void a_stop_while_a_long_answer_is_flushed_ends_after_it(void **state)
{
	enum { VAL = 4 << 20 };
	struct su_server *s = su_start(resp_start, resp_stop, 1);
	assert_non_null(s);
	int fd = su_connect_rcvbuf(s->port, 4096), idle = su_connect(s->port);
	assert_true(fd >= 0 && idle >= 0);
	expect(idle, "PING\r\n", "+PONG\r\n");
	set_big(fd, VAL);
	char *buf = malloc(VAL + 64);
	assert_non_null(buf);
	assert_true(su_send_str(fd, "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n"));
	assert_true(su_recv_all(fd, buf, 1)); /* the answer is on its way: its flush waits for us */
	struct stop_call sc = { .s = s };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, stop_main, &sc), 0);
	assert_true(reads_eof(idle)); /* the stop began */
	int h = sprintf(buf, "$%d\r\n", VAL);
	assert_true(su_recv_all(fd, buf + 1, (size_t)h + VAL + 2 - 1));
	assert_memory_equal(buf + h + VAL, "\r\n", 2);
	assert_true(reads_eof(fd));
	pthread_join(th, NULL);
	assert_int_equal(sc.rep.open_at_stop, 2);
	assert_int_equal(sc.rep.finished, 2);
	assert_int_equal(sc.rep.aborted, 0);
	close(fd);
	close(idle);
	free(buf);
	free(s);
}

static void command_sent_byte_by_byte_is_answered(void **state)
{
	int fd = su_connect_to(state);
	const char req[] = "*3\r\n$3\r\nSET\r\n$4\r\nslow\r\n$6\r\nclient\r\n*2\r\n$3\r\nGET\r\n$4\r\nslow\r\n";
	for (size_t i = 0; i < sizeof(req) - 1; i++) {
		assert_true(su_send(fd, req + i, 1));
		usleep(300);
	}
	expect(fd, NULL, "+OK\r\n$6\r\nclient\r\n");
	close(fd);
}

/* A 1 MiB value spans many segments on the way in and comes back whole. */
static void large_value_round_trips(void **state)
{
	int fd = su_connect_to(state);
	size_t n = 1u << 20;
	char *val = malloc(n + 1);
	for (size_t i = 0; i < n; i++)
		val[i] = (char)('A' + i % 23);
	val[n] = '\0';
	char head[64];
	snprintf(head, sizeof(head), "*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%zu\r\n", n);
	assert_true(su_send_str(fd, head));
	assert_true(su_send(fd, val, n));
	expect(fd, "\r\n", "+OK\r\n");
	assert_true(su_send_str(fd, "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n"));
	char *got = malloc(n + 32);
	int h = snprintf(head, sizeof(head), "$%zu\r\n", n);
	assert_true(su_recv_all(fd, got, (size_t)h + n + 2));
	assert_memory_equal(got, head, (size_t)h);
	assert_memory_equal(got + h, val, n);
	assert_memory_equal(got + h + n, "\r\n", 2);
	free(got);
	free(val);
	close(fd);
}

static void protocol_error_is_answered_then_closed(void **state)
{
	int fd = su_connect_to(state);
	/* The command before the bad one is still run. */
	expect(fd, "PING\r\n*1\r\n$x\r\n", "+PONG\r\n-ERR Protocol error: invalid bulk length\r\n");
	assert_true(su_peer_closed(fd));
	close(fd);
	fd = su_connect_to(state);
	expect(fd, "set k \"unbalanced\r\n", "-ERR Protocol error: unbalanced quotes in request\r\n");
	assert_true(su_peer_closed(fd));
	close(fd);
}

static void unknown_command_is_an_error_and_the_connection_goes_on(void **state)
{
	int fd = su_connect_to(state);
	expect(fd, "FLY away\r\n", "-ERR unknown command 'FLY', with args beginning with: 'away' \r\n");
	expect(fd, "PING\r\n", "+PONG\r\n");
	close(fd);
}

/* Two loops, one key space: what one connection sets, any other reads, and INCR never loses a count. */
static void two_loops_share_one_store(void **state)
{
	enum { N = 8, ROUNDS = 50 };
	int fds[N];
	for (int i = 0; i < N; i++)
		fds[i] = su_connect_to(state);
	for (int r = 0; r < ROUNDS; r++)
		for (int i = 0; i < N; i++)
			assert_true(su_send_str(fds[i], "*2\r\n$4\r\nINCR\r\n$7\r\ncounter\r\n"));
	for (int i = 0; i < N; i++)
		for (int r = 0; r < ROUNDS; r++) {
			char c;
			do
				assert_true(su_recv_all(fds[i], &c, 1));
			while (c != '\n');
		}
	expect(fds[0], "GET counter\r\n", "$3\r\n400\r\n");
	for (int i = 0; i < N; i++)
		close(fds[i]);
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(each_command_gets_redis_reply),
		T(inline_commands_are_understood),
		T(pipelined_commands_are_answered_in_order),
		T(a_read_of_many_pipelined_commands_is_answered_a_bounded_batch_at_a_time),
		T(pipelined_gets_of_a_large_value_stage_a_bounded_reply),
		T(pipelined_gets_of_a_large_value_never_read_cost_bounded_memory),
		T(command_sent_byte_by_byte_is_answered),
		T(large_value_round_trips),
		T(protocol_error_is_answered_then_closed),
		T(unknown_command_is_an_error_and_the_connection_goes_on),
		cmocka_unit_test_setup_teardown(two_loops_share_one_store, setup_two_loops, teardown),
		cmocka_unit_test(a_stop_while_a_long_answer_is_flushed_ends_after_it),
	};
#undef T
	return cmocka_run_group_tests_name("resp server", tests, NULL, NULL);
}
