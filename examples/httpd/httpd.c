/* examples/httpd/httpd.c: HTTP/1.1 over pipes: every pipelined request of a read answered, then one flush. */
#include "httpd.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "frames.h"
#include "http_parse.h"

/* A connection: the copy of a request that spans segments. */
struct httpd_conn {
	struct frame_buf acc;
	bool continued;            /* "100 Continue" sent for the request being read */
};

/* What answering one read needs. */
struct httpd_batch {
	struct httpd_conn *hc;
	struct perch_pipe_writer *w;
	const char *date;
	unsigned answered;         /* requests answered in this read */
};

/* The most requests answered in one read since httpd_start (any loop thread). */
static unsigned largest_batch;

/* Per loop thread: the parsed request (2 KiB of header slots) and the Date cache. */
static __thread struct http_request req;
static __thread struct http_date date;

static const struct http_limits limits = { 0 }; /* 8 KiB head, 1 MiB body */

static bool is_echo(const struct http_request *q)
{
	size_t n = q->target.len;
	const char *qm = memchr(q->target.p, '?', n);
	if (qm)
		n = (size_t)(qm - q->target.p);
	return q->method.len == 4 && memcmp(q->method.p, "POST", 4) == 0 && n == 5 &&
	       memcmp(q->target.p, "/echo", 5) == 0;
}

/* POST /echo: the body back, so a client can check a large body arrived whole. */
static int respond_echo(struct httpd_batch *b, const struct http_request *q)
{
	uint8_t *buf;
	size_t cap;
	if (perch_pipe_get_buffer(b->w, 256, &buf, &cap) != 0)
		return -1;
	const char *conn = !q->keep_alive ? "Connection: close\r\n"
			   : q->minor == 0 ? "Connection: keep-alive\r\n" : "";
	int n = snprintf((char *)buf, cap,
			 "HTTP/1.1 200 OK\r\nServer: perch\r\nDate: %s\r\n"
			 "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\n%s\r\n",
			 b->date, q->body.len, conn);
	if (n < 0 || (size_t)n >= cap || perch_pipe_advance(b->w, (size_t)n) != 0)
		return -1;
	return q->body.len ? perch_pipe_write(b->w, q->body.p, q->body.len) : 0;
}

/* Answers an error (400, 413, 431, 501, 505); the connection then closes. */
static ssize_t respond_error(struct httpd_batch *b, int status)
{
	uint8_t *buf;
	size_t cap;
	if (perch_pipe_get_buffer(b->w, 256, &buf, &cap) == 0) {
		size_t n = http_respond_error(status, b->date, (char *)buf, cap);
		if (n)
			perch_pipe_advance(b->w, n);
	}
	return -1;
}

/*
 * A client that sent "Expect: 100-continue" waits for this before its body
 * (curl does, for a second, above 1 KiB): send it once the head is in and
 * accepted (head_len is set only then).
 */
static void maybe_continue(struct httpd_batch *b, const struct http_request *q)
{
	static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
	const struct http_header *h;
	if (b->hc->continued || !q->head_len || q->minor == 0 || !(h = http_find_header(q, "Expect")) ||
	    h->value.len != 12 || strncasecmp(h->value.p, "100-continue", 12) != 0)
		return;
	b->hc->continued = perch_pipe_write(b->w, cont, sizeof(cont) - 1) == 0;
}

/* One request: parsed, answered; a request without keep-alive is the last. */
static ssize_t httpd_frame(void *arg, const char *p, size_t len)
{
	struct httpd_batch *b = arg;
	/* Before parsing (frames_each's rule): the rest waits for the next read, after this one's flush. */
	if (b->answered == HTTPD_MAX_PIPELINED || perch_pipe_writer_above_high_water(b->w))
		return FRAMES_YIELD;
	int rc = http_parse_request(p, len, &limits, &req);
	if (rc == HTTP_NEED_MORE) {
		maybe_continue(b, &req);
		return 0;
	}
	b->hc->continued = false;
	if (rc == HTTP_ERROR)
		return respond_error(b, req.status);
	if (is_echo(&req)) {
		if (respond_echo(b, &req) != 0)
			return -1;
	} else {
		uint8_t *buf;
		size_t cap, n;
		if (perch_pipe_get_buffer(b->w, 256, &buf, &cap) != 0 ||
		    (n = http_respond(&req, b->date, (char *)buf, cap)) == 0 ||
		    perch_pipe_advance(b->w, n) != 0)
			return -1;
	}
	b->answered++;
	return req.keep_alive ? (ssize_t)req.consumed : -1;
}

static int httpd_data(void *state, void *app, const struct perch_read_result *r,
		      struct perch_pipe_writer *w, size_t *consumed)
{
	struct httpd_conn *hc = state;
	struct httpd_batch b = { hc, w, http_date_update(&date, time(NULL)), 0 };
	enum frames_end end;
	*consumed = frames_each(&hc->acc, r, httpd_frame, &b, &end);
	unsigned seen = __atomic_load_n(&largest_batch, __ATOMIC_RELAXED);
	while (b.answered > seen &&
	       !__atomic_compare_exchange_n(&largest_batch, &seen, b.answered, false, __ATOMIC_RELAXED,
					    __ATOMIC_RELAXED)) {
	}
	return end == FRAMES_STOPPED ? 1 : end == FRAMES_YIELDED ? SERVE_YIELD : 0;
}

unsigned httpd_largest_batch(void)
{
	return __atomic_load_n(&largest_batch, __ATOMIC_RELAXED);
}

static void httpd_fini(void *state)
{
	frame_buf_free(&((struct httpd_conn *)state)->acc);
}

static const struct serve_proto httpd_proto = {
	.state_size = sizeof(struct httpd_conn),
	.on_data = httpd_data,
	.fini = httpd_fini,
	.alpn = "http/1.1",
};

int httpd_start(const struct serve_opts *o, struct serve **out)
{
	__atomic_store_n(&largest_batch, 0, __ATOMIC_RELAXED);
	return serve_start(o, &httpd_proto, NULL, out);
}

void httpd_stop(struct serve *s)
{
	serve_stop(s);
}
