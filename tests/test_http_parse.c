/* tests/test_http_parse.c: the HTTP/1.1 request parser (splits, pipelining, malformed input, limits, bodies) and the route responses. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_prelude.h"

#include "../examples/httpd/http_parse.h"

static const char GET_REQ[] = "GET /plaintext HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n";
static const char POST_REQ[] = "POST /json?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello";

static int parse(const char *s, struct http_request *req)
{
	return http_parse_request(s, strlen(s), NULL, req);
}

static bool span_is(struct http_span s, const char *lit)
{
	return s.len == strlen(lit) && memcmp(s.p, lit, s.len) == 0;
}

static void complete_get_fills_every_field(void **state)
{
	struct http_request req;
	assert_int_equal(parse(GET_REQ, &req), HTTP_COMPLETE);
	assert_true(span_is(req.method, "GET"));
	assert_true(span_is(req.target, "/plaintext"));
	assert_int_equal(req.minor, 1);
	assert_int_equal(req.nheaders, 2);
	assert_true(span_is(req.headers[0].name, "Host"));
	assert_true(span_is(req.headers[0].value, "localhost"));
	assert_true(span_is(http_find_header(&req, "accept")->value, "*/*"));
	assert_null(http_find_header(&req, "cookie"));
	assert_int_equal(req.content_length, 0);
	assert_true(req.keep_alive);
	assert_int_equal(req.head_len, strlen(GET_REQ));
	assert_int_equal(req.consumed, strlen(GET_REQ));
}

static void complete_post_has_its_body(void **state)
{
	struct http_request req;
	assert_int_equal(parse(POST_REQ, &req), HTTP_COMPLETE);
	assert_true(span_is(req.method, "POST"));
	assert_true(span_is(req.target, "/json?x=1"));
	assert_int_equal(req.content_length, 5);
	assert_true(span_is(req.body, "hello"));
	assert_int_equal(req.consumed, strlen(POST_REQ));
}

/* Every prefix of a complete request needs more; the whole one completes with the same length. */
static void check_every_split(const char *s)
{
	struct http_request req;
	size_t n = strlen(s);
	for (size_t k = 0; k < n; k++)
		assert_int_equal(http_parse_request(s, k, NULL, &req), HTTP_NEED_MORE);
	assert_int_equal(http_parse_request(s, n, NULL, &req), HTTP_COMPLETE);
	assert_int_equal(req.consumed, n);
}

static void every_split_point_needs_more_until_complete(void **state)
{
	check_every_split(GET_REQ);
	check_every_split(POST_REQ);
	check_every_split("GET / HTTP/1.0\n\n");
	check_every_split("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\n\r\n");
}

/* Feeding byte by byte into a growing buffer, the way a server accumulates: one request at a time. */
static void byte_by_byte_stream_yields_each_request_once(void **state)
{
	char stream[1024];
	int n = snprintf(stream, sizeof(stream), "%s%s%s", GET_REQ, POST_REQ, GET_REQ);
	size_t start = 0, seen = 0;
	for (size_t end = 1; end <= (size_t)n; end++) {
		struct http_request req;
		int r = http_parse_request(stream + start, end - start, NULL, &req);
		assert_int_not_equal(r, HTTP_ERROR);
		if (r == HTTP_COMPLETE) {
			assert_int_equal(start + req.consumed, end);
			start = end;
			seen++;
		}
	}
	assert_int_equal(seen, 3);
	assert_int_equal(start, (size_t)n);
}

static void pipelined_requests_parse_back_to_back(void **state)
{
	enum { N = 200 };
	size_t cap = N * sizeof(POST_REQ), len = 0;
	char *buf = malloc(cap);
	assert_non_null(buf);
	for (int i = 0; i < N; i++) {
		const char *r = i % 3 == 2 ? POST_REQ : GET_REQ;
		memcpy(buf + len, r, strlen(r));
		len += strlen(r);
	}
	size_t off = 0;
	int count = 0, posts = 0;
	while (off < len) {
		struct http_request req;
		assert_int_equal(http_parse_request(buf + off, len - off, NULL, &req), HTTP_COMPLETE);
		posts += req.content_length == 5;
		off += req.consumed;
		count++;
	}
	assert_int_equal(count, N);
	assert_int_equal(posts, N / 3);
	/* A partial last request is NEED_MORE, not an error. */
	struct http_request req;
	assert_int_equal(http_parse_request(buf, 10, NULL, &req), HTTP_NEED_MORE);
	free(buf);
}

struct bad_case {
	const char *req;
	size_t len;  /* sizeof the literal: one case holds a NUL */
	int status;
};

#define BAD(lit, status) { lit, sizeof(lit) - 1, status }

static void malformed_requests_get_their_status(void **state)
{
	static const struct bad_case cases[] = {
		BAD("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),          /* two spaces */
		BAD("GET /\r\nHost: a\r\n\r\n", 400),                    /* HTTP/0.9 shape */
		BAD("G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),           /* not a token */
		BAD(" GET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),          /* leading space */
		BAD("GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400),          /* trailing space */
		BAD("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400),        /* space in target */
		BAD("GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400),       /* control in target */
		BAD("GET / HTTP/1\r\nHost: a\r\n\r\n", 400),
		BAD("GET / http/1.1\r\nHost: a\r\n\r\n", 400),
		BAD("GET / HTTP/1.10\r\nHost: a\r\n\r\n", 400),
		BAD("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
		BAD("GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505),
		BAD("GET / HTTP/1.1\rX\r\nHost: a\r\n\r\n", 400),         /* bare CR */
		BAD("GET / HTTP/1.1\r\nHost a\r\n\r\n", 400),             /* no colon */
		BAD("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),           /* space before colon */
		BAD("GET / HTTP/1.1\r\n: a\r\nHost: a\r\n\r\n", 400),     /* empty name */
		BAD("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400), /* obs-fold */
		BAD("GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n", 400),
		BAD("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", 400),
		BAD("GET / HTTP/1.1\r\n\r\n", 400),                       /* no Host */
		BAD("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1,\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 2\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
		BAD("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct http_request req;
		int r = http_parse_request(cases[i].req, cases[i].len, NULL, &req);
		if (r != HTTP_ERROR || req.status != cases[i].status)
			fail_msg("case %zu (%s): result %d status %d, want status %d", i, cases[i].req, r,
				 req.status, cases[i].status);
		assert_non_null(req.reason);
	}
}

/* A folded line is refused as folding, not as a bad name: the reason is what an operator reads. */
static void obs_fold_is_named_in_the_reason(void **state)
{
	struct http_request req;
	assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\n\tfolded\r\n\r\n", &req), HTTP_ERROR);
	assert_int_equal(req.status, 400);
	assert_non_null(strstr(req.reason, "folding"));
}

static void agreeing_content_lengths_are_one_value(void **state)
{
	struct http_request req;
	assert_int_equal(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n"
			       "content-length:3\r\n\r\nabc", &req), HTTP_COMPLETE);
	assert_int_equal(req.content_length, 3);
	assert_true(span_is(req.body, "abc"));
}

static void persistence_follows_version_and_connection(void **state)
{
	struct http_request req;
	assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n", &req), HTTP_COMPLETE);
	assert_true(req.keep_alive);
	assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n", &req), HTTP_COMPLETE);
	assert_false(req.keep_alive);
	assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n", &req),
			 HTTP_COMPLETE);
	assert_false(req.keep_alive);
	assert_int_equal(parse("GET / HTTP/1.0\r\n\r\n", &req), HTTP_COMPLETE);
	assert_int_equal(req.minor, 0);
	assert_false(req.keep_alive);
	assert_int_equal(parse("GET / HTTP/1.0\r\nConnection: upgrade, Keep-Alive\r\n\r\n", &req), HTTP_COMPLETE);
	assert_true(req.keep_alive);
	assert_int_equal(parse("GET / HTTP/1.5\r\nHost: a\r\n\r\n", &req), HTTP_COMPLETE);
	assert_int_equal(req.minor, 1);
}

static void lf_only_lines_and_leading_blank_lines_are_accepted(void **state)
{
	struct http_request req;
	const char *s = "\r\n\nGET /x HTTP/1.1\nHost: a\nX:  spaced value \t\n\n";
	assert_int_equal(parse(s, &req), HTTP_COMPLETE);
	assert_true(span_is(req.target, "/x"));
	assert_true(span_is(http_find_header(&req, "x")->value, "spaced value"));
	assert_int_equal(req.consumed, strlen(s));
}

/* Builds "GET / HTTP/1.1\r\nHost: a\r\n" + filler headers to exactly `total` bytes with the blank line. */
static char *head_of_size(size_t total)
{
	char *s = malloc(total + 1);
	assert_non_null(s);
	size_t n = (size_t)sprintf(s, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
	memset(s + n, 'v', total - n - 4);
	memcpy(s + total - 4, "\r\n\r\n", 5);
	return s;
}

static void head_size_limit_is_431_even_before_the_head_ends(void **state)
{
	struct http_request req;
	char *at = head_of_size(8192), *over = head_of_size(8193);
	assert_int_equal(http_parse_request(at, 8192, NULL, &req), HTTP_COMPLETE);
	assert_int_equal(http_parse_request(over, 8193, NULL, &req), HTTP_ERROR);
	assert_int_equal(req.status, 431);
	/* A slow client that never ends its head is refused once the limit's worth has arrived. */
	assert_int_equal(http_parse_request(over, 8191, NULL, &req), HTTP_NEED_MORE);
	assert_int_equal(http_parse_request(over, 8192, NULL, &req), HTTP_ERROR);
	assert_int_equal(req.status, 431);
	struct http_limits small = { .max_head = 64 };
	assert_int_equal(http_parse_request(at, 100, &small, &req), HTTP_ERROR);
	assert_int_equal(req.status, 431);
	free(at);
	free(over);
}

static void too_many_headers_is_431(void **state)
{
	char buf[4096];
	size_t n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nHost: a\r\n");
	for (int i = 0; i < HTTP_MAX_HEADERS; i++)
		n += (size_t)sprintf(buf + n, "X-%d: v\r\n", i);
	n += (size_t)sprintf(buf + n, "\r\n");
	struct http_request req;
	assert_int_equal(http_parse_request(buf, n, NULL, &req), HTTP_ERROR);
	assert_int_equal(req.status, 431);
	struct http_limits lim = { .max_headers = 4 };
	assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", &req), HTTP_COMPLETE);
	assert_int_equal(http_parse_request(buf, n, &lim, &req), HTTP_ERROR);
	assert_int_equal(req.status, 431);
}

static void large_body_completes_only_when_whole(void **state)
{
	size_t body = 1u << 20;
	char head[128];
	size_t h = (size_t)sprintf(head, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %zu\r\n\r\n", body);
	char *buf = malloc(h + body + sizeof(GET_REQ));
	assert_non_null(buf);
	memcpy(buf, head, h);
	memset(buf + h, 'b', body);
	memcpy(buf + h + body, GET_REQ, sizeof(GET_REQ) - 1);
	struct http_request req;
	for (size_t k = h; k < h + body; k += 4093)
		assert_int_equal(http_parse_request(buf, k, NULL, &req), HTTP_NEED_MORE);
	assert_int_equal(http_parse_request(buf, h + body - 1, NULL, &req), HTTP_NEED_MORE);
	assert_int_equal(http_parse_request(buf, h + body + sizeof(GET_REQ) - 1, NULL, &req), HTTP_COMPLETE);
	assert_int_equal(req.consumed, h + body);
	assert_int_equal(req.body.len, body);
	/* The request after the body parses from where the first one ended. */
	assert_int_equal(http_parse_request(buf + req.consumed, sizeof(GET_REQ) - 1, NULL, &req), HTTP_COMPLETE);
	/* One byte over the body limit is refused from the head alone. */
	h = (size_t)sprintf(head, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %zu\r\n\r\n", body + 1);
	assert_int_equal(http_parse_request(head, h, NULL, &req), HTTP_ERROR);
	assert_int_equal(req.status, 413);
	free(buf);
}

static void date_is_imf_fixdate_and_cached_per_second(void **state)
{
	struct http_date d = { 0 };
	assert_string_equal(http_date_update(&d, 784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
	d.text[0] = 'X'; /* same second: the cached text is returned as it is */
	assert_string_equal(http_date_update(&d, 784111777), "Xun, 06 Nov 1994 08:49:37 GMT");
	assert_string_equal(http_date_update(&d, 1767225599), "Wed, 31 Dec 2025 23:59:59 GMT");
}

#define DATE "Sun, 06 Nov 1994 08:49:37 GMT"

static void respond_to(const char *reqs, const char *want)
{
	struct http_request req;
	char out[512];
	assert_int_equal(parse(reqs, &req), HTTP_COMPLETE);
	size_t n = http_respond(&req, DATE, out, sizeof(out));
	assert_int_not_equal(n, 0);
	out[n] = '\0';
	assert_string_equal(out, want);
}

static void routes_answer_with_exact_bytes(void **state)
{
	respond_to(GET_REQ, "HTTP/1.1 200 OK\r\nServer: perch\r\nDate: " DATE "\r\nContent-Type: text/plain\r\n"
			    "Content-Length: 13\r\n\r\nHello, World!");
	respond_to("GET /json HTTP/1.1\r\nHost: a\r\n\r\n",
		   "HTTP/1.1 200 OK\r\nServer: perch\r\nDate: " DATE "\r\nContent-Type: application/json\r\n"
		   "Content-Length: 27\r\n\r\n{\"message\":\"Hello, World!\"}");
	respond_to("HEAD /plaintext HTTP/1.1\r\nHost: a\r\n\r\n",
		   "HTTP/1.1 200 OK\r\nServer: perch\r\nDate: " DATE "\r\nContent-Type: text/plain\r\n"
		   "Content-Length: 13\r\n\r\n");
	respond_to("GET /nope HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		   "HTTP/1.1 404 Not Found\r\nServer: perch\r\nDate: " DATE "\r\nContent-Type: text/plain\r\n"
		   "Content-Length: 10\r\nConnection: keep-alive\r\n\r\nNot Found\n");
	respond_to("DELETE / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
		   "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nServer: perch\r\nDate: " DATE
		   "\r\nContent-Type: text/plain\r\nContent-Length: 19\r\nConnection: close\r\n\r\n"
		   "Method Not Allowed\n");
}

static void error_responses_close_and_small_buffers_are_refused(void **state)
{
	char out[512];
	size_t n = http_respond_error(431, DATE, out, sizeof(out));
	assert_int_not_equal(n, 0);
	out[n] = '\0';
	assert_string_equal(out, "HTTP/1.1 431 Request Header Fields Too Large\r\nServer: perch\r\nDate: " DATE
			    "\r\nContent-Type: text/plain\r\nContent-Length: 32\r\nConnection: close\r\n\r\n"
			    "Request Header Fields Too Large\n");
	struct http_request req;
	assert_int_equal(parse(GET_REQ, &req), HTTP_COMPLETE);
	size_t full = http_respond(&req, DATE, out, sizeof(out));
	assert_int_equal(http_respond(&req, DATE, out, full - 1), 0);
	assert_int_equal(http_respond(&req, DATE, out, full), full);
	assert_int_equal(http_respond_error(400, DATE, out, 10), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(complete_get_fills_every_field),
		cmocka_unit_test(complete_post_has_its_body),
		cmocka_unit_test(every_split_point_needs_more_until_complete),
		cmocka_unit_test(byte_by_byte_stream_yields_each_request_once),
		cmocka_unit_test(pipelined_requests_parse_back_to_back),
		cmocka_unit_test(malformed_requests_get_their_status),
		cmocka_unit_test(obs_fold_is_named_in_the_reason),
		cmocka_unit_test(agreeing_content_lengths_are_one_value),
		cmocka_unit_test(persistence_follows_version_and_connection),
		cmocka_unit_test(lf_only_lines_and_leading_blank_lines_are_accepted),
		cmocka_unit_test(head_size_limit_is_431_even_before_the_head_ends),
		cmocka_unit_test(too_many_headers_is_431),
		cmocka_unit_test(large_body_completes_only_when_whole),
		cmocka_unit_test(date_is_imf_fixdate_and_cached_per_second),
		cmocka_unit_test(routes_answer_with_exact_bytes),
		cmocka_unit_test(error_responses_close_and_small_buffers_are_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
