/* tests/fuzz/fuzz_http_parse.c: libFuzzer harness: the HTTP parser fed in fuzzer-chosen chunks must see what it sees fed whole. */
#include <stdbool.h>
#include <string.h>

#include "../../examples/httpd/http_parse.h"
#include "fuzz_split.h"

/* The request's fields, spans as offsets from the message's start (they must lie inside it). */
static void log_request(struct fuzz_log *l, const char *base, const struct http_request *q)
{
	const struct http_span *spans[2 + 2 * HTTP_MAX_HEADERS + 1];
	size_t n = 0;
	spans[n++] = &q->method;
	spans[n++] = &q->target;
	for (unsigned i = 0; i < q->nheaders; i++) {
		spans[n++] = &q->headers[i].name;
		spans[n++] = &q->headers[i].value;
	}
	spans[n++] = &q->body;
	if (q->nheaders > HTTP_MAX_HEADERS || q->head_len + q->content_length != q->consumed)
		abort();
	for (size_t i = 0; i < n; i++) {
		size_t off = spans[i]->len ? (size_t)(spans[i]->p - base) : 0;
		if (spans[i]->len && (spans[i]->p < base || off + spans[i]->len > q->consumed))
			abort(); /* a span outside its message */
		fuzz_log_num(l, off);
		fuzz_log_num(l, spans[i]->len);
	}
	fuzz_log_num(l, (uint64_t)q->minor);
	fuzz_log_num(l, q->nheaders);
	fuzz_log_num(l, q->content_length);
	fuzz_log_num(l, q->keep_alive);
	fuzz_log_num(l, q->head_len);
	fuzz_log_num(l, q->consumed);
}

/* One parse from an exact copy (fuzz_parse_fn): a request that closes the connection ends the stream. */
static long parse_at(const struct fuzz_input *in, size_t pos, size_t avail, const void *lim, struct fuzz_log *l)
{
	static struct http_request q;
	char *c = fuzz_exact_copy(in->data + pos, avail - pos);
	int rc = http_parse_request(c, avail - pos, lim, &q);
	long next = 0;
	if (rc == HTTP_COMPLETE) {
		if (q.consumed == 0 || q.consumed > avail - pos)
			abort();
		fuzz_log_num(l, 1);
		log_request(l, c, &q);
		next = q.keep_alive ? (long)q.consumed : -1;
	} else if (rc == HTTP_ERROR) {
		if (!q.reason || (q.status != 400 && q.status != 413 && q.status != 431 && q.status != 501 &&
				  q.status != 505))
			abort();
		fuzz_log_num(l, 2);
		fuzz_log_num(l, (uint64_t)q.status);
		fuzz_log_put(l, q.reason, strlen(q.reason));
		next = -1;
	} else if (rc != HTTP_NEED_MORE) {
		abort();
	}
	free(c);
	return next;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in;
	fuzz_input_split(&in, data, size, 2);
	/* Knobs: small limits reach the 431 and 413 paths with small inputs; 0 keeps the defaults. */
	struct http_limits lim = {
		.max_head = in.knobs[0] ? (size_t)in.knobs[0] * 4 : 0,
		.max_body = in.knobs[1] & 0x80 ? (size_t)(in.knobs[1] & 0x7f) : 0,
		.max_headers = in.knobs[1] & 0x7f ? (in.knobs[1] & 0x7f) % (HTTP_MAX_HEADERS + 8) : 0,
	};
	fuzz_whole_equals_split(&in, parse_at, &lim);
	return 0;
}
