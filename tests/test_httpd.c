/* tests/test_httpd.c: examples/httpd in-process on port 0: exact framing, pipelining, slow clients, bad and oversized requests, large bodies, keep-alive and close. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cmocka_prelude.h"
#include "httpd.h"
#include "server_util.h"

SU_FIXTURES(httpd_start, httpd_stop)

/* The Date value of a response head, for building the exact bytes expected. */
static void date_of(const char *head, char *date, size_t cap)
{
	const char *d = strstr(head, "\r\nDate: ");
	assert_non_null(d);
	d += 8;
	size_t n = strcspn(d, "\r");
	assert_true(n < cap);
	memcpy(date, d, n);
	date[n] = '\0';
}

/* Reads one response and asserts it is exactly 200 with this type and body (and `extra` headers). */
static void expect_ok(int fd, const char *ctype, const char *body, const char *extra)
{
	char buf[1024], date[64], want[1024];
	int status;
	size_t off;
	size_t n = su_http_response(fd, buf, sizeof(buf), &status, &off);
	assert_true(n > 0);
	date_of(buf, date, sizeof(date));
	snprintf(want, sizeof(want),
		 "HTTP/1.1 200 OK\r\nServer: perch\r\nDate: %s\r\nContent-Type: %s\r\n"
		 "Content-Length: %zu\r\n%s\r\n%s",
		 date, ctype, strlen(body), extra, body);
	assert_string_equal(buf, want);
}

/* Reads one response and asserts its status; the server must close the connection after it. */
static void expect_error_then_close(int fd, int want_status)
{
	char buf[1024];
	int status;
	size_t off;
	assert_true(su_http_response(fd, buf, sizeof(buf), &status, &off) > 0);
	assert_int_equal(status, want_status);
	assert_non_null(strstr(buf, "\r\nConnection: close\r\n"));
	assert_true(su_peer_closed(fd));
}

static const char GET_PLAIN[] = "GET /plaintext HTTP/1.1\r\nHost: t\r\n\r\n";
static const char GET_JSON[] = "GET /json HTTP/1.1\r\nHost: t\r\n\r\n";
static const char HELLO[] = "Hello, World!";
static const char JSON[] = "{\"message\":\"Hello, World!\"}";

static void plaintext_and_json_are_framed_exactly(void **state)
{
	int fd = su_connect_to(state);
	assert_true(su_send_str(fd, GET_PLAIN));
	expect_ok(fd, "text/plain", HELLO, "");
	assert_true(su_send_str(fd, GET_JSON));
	expect_ok(fd, "application/json", JSON, "");
	close(fd);
}

static void sixteen_pipelined_requests_in_one_write_are_answered_in_order(void **state)
{
	int fd = su_connect_to(state);
	char batch[2048] = "";
	for (int i = 0; i < 16; i++)
		strcat(batch, i % 2 ? GET_JSON : GET_PLAIN);
	assert_true(su_send_str(fd, batch));
	for (int i = 0; i < 16; i++)
		expect_ok(fd, i % 2 ? "application/json" : "text/plain", i % 2 ? JSON : HELLO, "");
	close(fd);
}

/* Each byte in its own segment: the request head and body span 60-odd segments. */
static void request_sent_byte_by_byte_is_answered(void **state)
{
	int fd = su_connect_to(state);
	const char req[] = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello";
	for (size_t i = 0; i < sizeof(req) - 1; i++) {
		assert_true(su_send(fd, req + i, 1));
		usleep(500);
	}
	expect_ok(fd, "application/octet-stream", "hello", "");
	/* The connection is still good for the next one. */
	assert_true(su_send_str(fd, GET_PLAIN));
	expect_ok(fd, "text/plain", HELLO, "");
	close(fd);
}

static void malformed_request_gets_400_then_close(void **state)
{
	int fd = su_connect_to(state);
	assert_true(su_send_str(fd, "GET /plaintext HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n"));
	expect_error_then_close(fd, 400);
	close(fd);
	fd = su_connect_to(state);
	assert_true(su_send_str(fd, "\x01\x02garbage\r\n\r\n"));
	expect_error_then_close(fd, 400);
	close(fd);
}

/* A good request pipelined ahead of a bad one is answered first. */
static void request_before_a_malformed_one_is_still_answered(void **state)
{
	int fd = su_connect_to(state);
	char batch[256];
	snprintf(batch, sizeof(batch), "%sGET / HTTP/1.1\r\nHost t\r\n\r\n", GET_PLAIN);
	assert_true(su_send_str(fd, batch));
	expect_ok(fd, "text/plain", HELLO, "");
	expect_error_then_close(fd, 400);
	close(fd);
}

static void oversized_headers_get_431_then_close(void **state)
{
	int fd = su_connect_to(state);
	size_t n = 9000;
	char *req = malloc(n + 64);
	int k = snprintf(req, n + 64, "GET /plaintext HTTP/1.1\r\nHost: t\r\nX-Big: ");
	memset(req + k, 'a', n);
	strcpy(req + k + n, "\r\n\r\n");
	assert_true(su_send_str(fd, req));
	expect_error_then_close(fd, 431);
	free(req);
	close(fd);
}

/*
 * Headers past the limit, the client still sending when the server
 * answers: it reads the 431, sends 256 KiB more of the same header (after
 * the server ended the session, so they meet a closed socket unless it
 * lingers), then its end, and reads the end of the stream, not a reset.
 */
static void a_431_reaches_a_client_still_sending_and_then_the_end(void **state)
{
	int fd = su_connect_to(state);
	enum { FIRST = 32 * 1024, MORE = 256 * 1024 };
	char *req = malloc(FIRST + MORE);
	int k = snprintf(req, FIRST, "GET /plaintext HTTP/1.1\r\nHost: t\r\nX-Big: ");
	memset(req + k, 'a', FIRST + MORE - (size_t)k);
	assert_true(su_send(fd, req, FIRST));
	char buf[1024];
	int status;
	size_t off;
	assert_true(su_http_response(fd, buf, sizeof(buf), &status, &off) > 0);
	assert_int_equal(status, 431);
	assert_true(su_send(fd, req + FIRST, MORE)); /* no reset cut it short */
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	assert_int_equal(r, 0); /* the end, not -ECONNRESET */
	free(req);
	close(fd);
}

static void unsupported_framing_and_version_get_501_and_505(void **state)
{
	int fd = su_connect_to(state);
	assert_true(su_send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
	expect_error_then_close(fd, 501);
	close(fd);
	fd = su_connect_to(state);
	assert_true(su_send_str(fd, "GET / HTTP/2.0\r\nHost: t\r\n\r\n"));
	expect_error_then_close(fd, 505);
	close(fd);
}

/* 512 KiB across many segments comes back byte for byte, and the connection goes on. */
static void body_of_512_kib_arrives_whole(void **state)
{
	int fd = su_connect_to(state);
	size_t body = 512u << 10;
	char head[128];
	int h = snprintf(head, sizeof(head), "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", body);
	size_t total = (size_t)h + body;
	char *req = malloc(total);
	memcpy(req, head, (size_t)h);
	for (size_t i = 0; i < body; i++)
		req[h + i] = (char)('a' + (i * 7 + i / 4099) % 26);
	struct su_sender s;
	su_send_async(&s, fd, req, total);
	size_t cap = body + 1024, off = 0;
	char *resp = malloc(cap);
	int status;
	size_t n = su_http_response(fd, resp, cap, &status, &off);
	assert_true(su_send_join(&s));
	assert_int_equal(status, 200);
	assert_int_equal(n - off, body);
	assert_memory_equal(resp + off, req + h, body);
	assert_true(su_send_str(fd, GET_JSON));
	expect_ok(fd, "application/json", JSON, "");
	free(req);
	free(resp);
	close(fd);
}

/* "Expect: 100-continue": the interim answer comes once the head is in, the final one after the body. */
static void expect_100_continue_is_answered_before_the_body(void **state)
{
	int fd = su_connect_to(state);
	static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
	char got[sizeof(cont)] = "";
	assert_true(su_send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
				    "Content-Length: 4\r\n\r\n"));
	assert_true(su_recv_all(fd, got, sizeof(cont) - 1));
	assert_string_equal(got, cont);
	assert_true(su_send_str(fd, "body"));
	expect_ok(fd, "application/octet-stream", "body", "");
	close(fd);
}

static void body_above_the_limit_gets_413_then_close(void **state)
{
	int fd = su_connect_to(state);
	assert_true(su_send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\nxx"));
	expect_error_then_close(fd, 413);
	close(fd);
}

static void keep_alive_serves_many_requests_on_one_connection(void **state)
{
	int fd = su_connect_to(state);
	for (int i = 0; i < 200; i++) {
		assert_true(su_send_str(fd, i % 2 ? GET_JSON : GET_PLAIN));
		expect_ok(fd, i % 2 ? "application/json" : "text/plain", i % 2 ? JSON : HELLO, "");
	}
	close(fd);
}

static void connection_close_is_answered_then_closed(void **state)
{
	int fd = su_connect_to(state);
	/* The request after the closing one is never answered. */
	assert_true(su_send_str(fd, "GET /plaintext HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
				    "GET /json HTTP/1.1\r\nHost: t\r\n\r\n"));
	expect_ok(fd, "text/plain", HELLO, "Connection: close\r\n");
	assert_true(su_peer_closed(fd));
	close(fd);
}

static void http_1_0_closes_unless_it_asks_for_keep_alive(void **state)
{
	int fd = su_connect_to(state);
	assert_true(su_send_str(fd, "GET /plaintext HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
	expect_ok(fd, "text/plain", HELLO, "Connection: keep-alive\r\n");
	assert_true(su_send_str(fd, "GET /json HTTP/1.0\r\n\r\n"));
	expect_ok(fd, "application/json", JSON, "Connection: close\r\n");
	assert_true(su_peer_closed(fd));
	close(fd);
}

/* n copies of GET_PLAIN, back to back (free it). */
static char *pipelined_gets(size_t n, size_t *len)
{
	size_t one = sizeof(GET_PLAIN) - 1;
	char *req = malloc(one * n);
	assert_non_null(req);
	for (size_t i = 0; i < n; i++)
		memcpy(req + one * i, GET_PLAIN, one);
	*len = one * n;
	return req;
}

/* Sends n GET_PLAIN requests in one stream from a helper thread; free the buffer after su_send_join. */
static char *send_pipelined_async(struct su_sender *s, int fd, size_t n)
{
	size_t len;
	char *req = pipelined_gets(n, &len);
	su_send_async(s, fd, req, len);
	return req;
}

/* Reads n answers to GET_PLAIN, in order. */
static void expect_plain_answers(int fd, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char buf[512];
		int status;
		size_t off;
		assert_true(su_http_response(fd, buf, sizeof(buf), &status, &off) > 0);
		assert_int_equal(status, 200);
		assert_string_equal(buf + off, HELLO);
	}
}

/*
 * A client with an 8 KiB receive buffer pipelines 5,000 requests (650 KB of
 * answers) before reading any: the server's flush waits, it stops reading,
 * and nothing is lost.
 */
static void client_that_does_not_read_is_held_back_and_loses_nothing(void **state)
{
	int fd = su_connect_rcvbuf(((struct su_server *)*state)->port, 8192);
	assert_true(fd >= 0);
	enum { N = 5000 };
	struct su_sender s;
	char *req = send_pipelined_async(&s, fd, N);
	usleep(200 * 1000); /* let the answers pile up against a socket nobody reads */
	expect_plain_answers(fd, N);
	assert_true(su_send_join(&s));
	free(req);
	close(fd);
}

/*
 * 1,000 requests in one write reach the server in one or a few reads: it
 * answers at most HTTPD_MAX_PIPELINED of a read before flushing, and the
 * rest of the read is answered after, none lost, in order.
 */
static void a_read_of_many_pipelined_requests_is_answered_a_bounded_batch_at_a_time(void **state)
{
	int fd = su_connect_to(state);
	size_t len;
	char *req = pipelined_gets(1000, &len);
	assert_true(su_send(fd, req, len));
	expect_plain_answers(fd, 1000);
	unsigned largest = httpd_largest_batch();
	print_message("largest batch of one read: %u requests\n", largest);
	assert_true(largest >= 1 && largest <= HTTPD_MAX_PIPELINED);
	free(req);
	close(fd);
}

/* A FIN right behind pipelined requests waits until the last of them is answered. */
static void a_fin_behind_more_requests_than_a_batch_waits_for_their_answers(void **state)
{
	int fd = su_connect_to(state);
	size_t len;
	char *req = pipelined_gets(1000, &len);
	assert_true(su_send(fd, req, len));
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	expect_plain_answers(fd, 1000);
	assert_true(su_peer_closed(fd));
	free(req);
	close(fd);
}

static void two_loops_share_the_port(void **state)
{
	int fds[16];
	for (int i = 0; i < 16; i++)
		fds[i] = su_connect_to(state);
	for (int i = 0; i < 16; i++)
		assert_true(su_send_str(fds[i], GET_PLAIN));
	for (int i = 0; i < 16; i++) {
		expect_ok(fds[i], "text/plain", HELLO, "");
		close(fds[i]);
	}
}

/* ---- the idle timeout (SU_IDLE_MS on these tests' server) ---- */

static void an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(void **state)
{
	int fd = su_connect_to(state);
	usleep(SU_IDLE_MS / 2 * 1000); /* then the time runs from the answer, not from the accept */
	double asked = su_now_ms(); /* the server cannot answer, and start its idle time, before this */
	assert_true(su_send_str(fd, GET_PLAIN));
	expect_ok(fd, "text/plain", HELLO, "");
	su_closed_after_idle(fd, asked);
	close(fd);
}

/* Slowloris: a header a byte every 50 ms never completes a request, so it never makes progress. */
static void a_request_trickled_slower_than_the_idle_timeout_is_closed_unanswered(void **state)
{
	static const char req[] = "GET /plaintext HTTP/1.1\r\nHost: x\r\nUser-Agent: slow\r\n\r\n";
	double start = su_now_ms(); /* before the connect, so before the accept that starts the idle time */
	int fd = su_connect_to(state);
	size_t sent = 0;
	while (sent < sizeof(req) - 1 && su_send(fd, req + sent, 1)) {
		sent++;
		usleep(50 * 1000);
	}
	double took = su_now_ms() - start;
	assert_true(sent < sizeof(req) - 1); /* cut off before the header ended */
	assert_true(took >= SU_IDLE_MS);
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	assert_true(r == 0 || (r < 0 && errno == ECONNRESET)); /* closed, not answered */
	close(fd);
}

static void requests_spaced_under_the_idle_timeout_keep_the_connection_open(void **state)
{
	int fd = su_connect_to(state);
	for (int i = 0; i < 15; i++) { /* 15 x 100 ms: past the (long) idle timeout in all */
		assert_true(su_send_str(fd, GET_PLAIN));
		expect_ok(fd, "text/plain", HELLO, "");
		usleep(100 * 1000);
	}
	close(fd);
}

/* It sends requests but never reads: once the answers fill its socket, nothing progresses. */
/* Waits (bounded) until this process holds exactly `want` fds; true if it came to that. */
static bool fds_come_to(int want, double wait_ms)
{
	for (double t0 = su_now_ms(); su_now_ms() - t0 < wait_ms; usleep(10 * 1000))
		if (lu_count_fds() == want)
			return true;
	return false;
}

static void a_client_that_never_reads_is_closed_after_the_idle_timeout(void **state)
{
	int fds = lu_count_fds();
	int fd = su_connect_rcvbuf(((struct su_server *)*state)->port, 8192);
	assert_true(fd >= 0);
	enum { N = 100000 }; /* ~13 MB of answers: more than the sockets' buffers hold */
	struct su_sender s;
	char *req = send_pipelined_async(&s, fd, N);
	/*
	 * Read only once the server closed its end: a read before that lets
	 * its flushes complete, and a slow build (TSan) would then be served
	 * every answer. Bounded; the sender is ended either way.
	 */
	usleep(SU_IDLE_MS * 1000);
	bool closed = fds_come_to(fds + 1, 100 * SU_IDLE_MS); /* the server's end gone, ours left */
	if (!closed)
		shutdown(fd, SHUT_RDWR);
	su_send_join(&s);
	assert_true(closed);
	/* Whatever was answered is there to read; then the stream ends (a reset: our requests were unread). */
	char buf[4096];
	size_t got = 0;
	ssize_t r;
	while ((r = recv(fd, buf, sizeof(buf), 0)) > 0 || (r < 0 && errno == EINTR))
		got += r > 0 ? (size_t)r : 0;
	assert_true(r == 0 || errno == ECONNRESET);
	assert_true(got < N * (strlen(HELLO) + 100)); /* not every answer: it was cut off */
	free(req);
	close(fd);
}

/* Makes room for `n` more fds under RLIMIT_NOFILE if the hard limit allows; false if it does not. */
static bool room_for_fds(int n)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return false;
	rlim_t want = (rlim_t)(lu_count_fds() + n + 64);
	if (rl.rlim_cur >= want)
		return true;
	rl.rlim_cur = want;
	if (rl.rlim_max < want)
		rl.rlim_max = want; /* root may raise the hard limit too */
	return setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

/* A server on one loop of SMALL_POOL receive buffers: a few hundred clients are three pools' worth. */
enum { SMALL_POOL = 64 };

static int setup_small_pool(void **state)
{
	struct serve_opts o;
	serve_opts_default(&o);
	o.recv_buffers = SMALL_POOL;
	return (*state = su_start_opts(httpd_start, httpd_stop, &o)) ? 0 : -1;
}

/*
 * Three times the loop's receive buffers of clients each send the
 * start of a request and go quiet. None may keep a receive buffer for its
 * few bytes, or the loop could receive for nobody: a normal client is
 * still served, and once they close the server notices (its fds come back).
 */
static void partial_requests_of_three_pools_of_clients_pin_no_receive_buffer(void **state)
{
	enum { N = 3 * SMALL_POOL };
	assert_true(room_for_fds(2 * N + 2));
	int fds = lu_count_fds();
	int *partial = malloc(N * sizeof(*partial));
	for (int i = 0; i < N; i++) {
		partial[i] = su_connect_to(state);
		assert_true(su_send_str(partial[i], "GET /plaintext HTTP/1.1\r\nHost: x\r\n"));
	}
	/* Each accepted (our end and the server's), and a moment for their bytes to be received. */
	assert_true(fds_come_to(fds + 2 * N, 10000));
	usleep(200 * 1000);
	int fd = su_connect_to(state);
	assert_true(su_send_str(fd, GET_PLAIN));
	expect_ok(fd, "text/plain", HELLO, "");
	for (int i = 0; i < N; i++)
		close(partial[i]);
	free(partial);
	assert_true(fds_come_to(fds + 2, 10000)); /* the normal client, both ends */
	assert_true(su_send_str(fd, GET_JSON));
	expect_ok(fd, "application/json", JSON, "");
	close(fd);
	assert_true(fds_come_to(fds, 10000)); /* and its end too, once answered and gone */
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(plaintext_and_json_are_framed_exactly),
		T(sixteen_pipelined_requests_in_one_write_are_answered_in_order),
		T(request_sent_byte_by_byte_is_answered),
		T(malformed_request_gets_400_then_close),
		T(request_before_a_malformed_one_is_still_answered),
		T(oversized_headers_get_431_then_close),
		T(a_431_reaches_a_client_still_sending_and_then_the_end),
		T(unsupported_framing_and_version_get_501_and_505),
		T(body_of_512_kib_arrives_whole),
		T(expect_100_continue_is_answered_before_the_body),
		T(body_above_the_limit_gets_413_then_close),
		T(keep_alive_serves_many_requests_on_one_connection),
		T(connection_close_is_answered_then_closed),
		T(http_1_0_closes_unless_it_asks_for_keep_alive),
		T(client_that_does_not_read_is_held_back_and_loses_nothing),
		T(a_read_of_many_pipelined_requests_is_answered_a_bounded_batch_at_a_time),
		T(a_fin_behind_more_requests_than_a_batch_waits_for_their_answers),
		cmocka_unit_test_setup_teardown(partial_requests_of_three_pools_of_clients_pin_no_receive_buffer,
						setup_small_pool, teardown),
		cmocka_unit_test_setup_teardown(two_loops_share_the_port, setup_two_loops, teardown),
		cmocka_unit_test_setup_teardown(an_idle_keep_alive_connection_is_closed_after_the_idle_timeout,
						setup_idle, teardown),
		cmocka_unit_test_setup_teardown(a_request_trickled_slower_than_the_idle_timeout_is_closed_unanswered,
						setup_idle, teardown),
		cmocka_unit_test_setup_teardown(requests_spaced_under_the_idle_timeout_keep_the_connection_open,
						setup_idle_long, teardown),
		cmocka_unit_test_setup_teardown(a_client_that_never_reads_is_closed_after_the_idle_timeout,
						setup_idle, teardown),
	};
#undef T
	return cmocka_run_group_tests_name("httpd", tests, NULL, NULL);
}
