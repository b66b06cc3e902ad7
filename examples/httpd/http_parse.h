/* examples/httpd/http_parse.h: HTTP/1.1 request parser over contiguous bytes, and the response writers of the two routes. */
#ifndef PERCH_EXAMPLES_HTTP_PARSE_H
#define PERCH_EXAMPLES_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* Most headers one request may carry; more is a 431. */
#define HTTP_MAX_HEADERS 64

/* What http_parse_request returns. */
enum http_result {
	HTTP_ERROR = -1,     /* req->status and req->reason say why; answer, then close */
	HTTP_NEED_MORE = 0,  /* no full request yet: call again with more bytes (same start) */
	HTTP_COMPLETE = 1,   /* one request, req->consumed bytes long (head and body) */
};

/* A run of bytes inside the caller's buffer (not NUL-terminated). */
struct http_span {
	const char *p;
	size_t len;
};

struct http_header {
	struct http_span name;   /* as sent; compare without case */
	struct http_span value;  /* leading and trailing spaces and tabs removed */
};

/* Limits; a zeroed struct (or NULL) means every default. */
struct http_limits {
	size_t max_head;      /* request line + headers + blank line; 0: 8 KiB; more is a 431 */
	size_t max_body;      /* Content-Length; 0: 1 MiB; more is a 413 */
	unsigned max_headers; /* 0 or above HTTP_MAX_HEADERS: HTTP_MAX_HEADERS; more is a 431 */
};

struct http_request {
	struct http_span method;  /* a token, e.g. "GET" */
	struct http_span target;  /* e.g. "/plaintext?x=1" */
	int minor;                /* HTTP/1.<minor>: 0 or 1 (1.2 and above are answered as 1.1) */
	unsigned nheaders;
	struct http_header headers[HTTP_MAX_HEADERS];
	size_t content_length;    /* 0 without a Content-Length header */
	bool keep_alive;          /* 1.1 unless "Connection: close"; 1.0 only with "keep-alive" */
	size_t head_len;          /* bytes up to and including the blank line */
	struct http_span body;    /* content_length bytes right after the head */
	size_t consumed;          /* head_len + content_length: where the next request starts */
	int status;               /* on HTTP_ERROR: 400, 413, 431, 501 or 505 */
	const char *reason;       /* on HTTP_ERROR: what was wrong, for a log line */
};

/*
 * Parses one request from the start of p[0..len). Returns HTTP_COMPLETE with
 * req filled in (spans point into p), HTTP_NEED_MORE, or HTTP_ERROR with
 * req->status and req->reason. Never reads past len, never allocates.
 *
 * Framing: Content-Length only. A Transfer-Encoding header (chunked
 * included) is refused with 501, and with 400 when Content-Length is there
 * too (a smuggling shape). Content-Length must be digits; several of them,
 * or a list, must all agree (else 400). HTTP/1.1 requires one Host header.
 * Empty lines before the request line are skipped (RFC 9112 2.2); lines may
 * end in LF alone. A head longer than max_head is a 431 as soon as max_head
 * bytes have arrived without its end, so a slow client cannot grow it.
 */
int http_parse_request(const char *p, size_t len, const struct http_limits *lim,
		       struct http_request *req);

/* Finds a header by name (any case); NULL when absent. */
const struct http_header *http_find_header(const struct http_request *req, const char *name);

/* The Date header's value, remade at most once a second. */
struct http_date {
	time_t sec;
	char text[32];  /* "Sun, 06 Nov 1994 08:49:37 GMT", NUL-terminated */
};

/* Refreshes d for time `now` if its second changed; returns d->text. */
const char *http_date_update(struct http_date *d, time_t now);

/*
 * Writes the response to req into out[0..cap): GET or HEAD of "/plaintext"
 * (or "/") gives "Hello, World!" as text/plain, of "/json" gives
 * {"message":"Hello, World!"} as application/json; another target is a 404,
 * another method a 405. Every response carries Server, Date and
 * Content-Length, and a Connection header when it differs from the version's
 * default. Returns the bytes written, or 0 when cap is too small (256 bytes
 * is always enough).
 */
size_t http_respond(const struct http_request *req, const char *date, char *out, size_t cap);

/* Writes the error response for status (400, 413, ...) with "Connection: close". Returns as above. */
size_t http_respond_error(int status, const char *date, char *out, size_t cap);

#endif /* PERCH_EXAMPLES_HTTP_PARSE_H */
