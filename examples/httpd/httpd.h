/* examples/httpd/httpd.h: the HTTP/1.1 server: keep-alive, pipelining, /plaintext, /json and POST /echo, over pipes. */
#ifndef PERCH_EXAMPLES_HTTPD_H
#define PERCH_EXAMPLES_HTTPD_H

#include "serve.h"

/*
 * Starts the server with the default limits of struct http_limits (8 KiB
 * of head, 1 MiB of body). Returns 0 with *out, or serve_start's error.
 */
int httpd_start(const struct serve_opts *o, struct serve **out);

/* Stops it and frees everything. NULL is ignored. */
void httpd_stop(struct serve *s);

/*
 * Pipelined requests answered from one read at most: their answers are
 * flushed before the next are parsed, so a read full of tiny requests
 * (256 KiB of them is ~7,000) cannot stage megabytes of answers or hold
 * the loop thread for one connection. No request starts either once the
 * staged answers reach the writer's high-water mark (echoed bodies).
 */
#define HTTPD_MAX_PIPELINED 128

/* For tests and diagnostics: the most requests answered from one read since httpd_start. */
unsigned httpd_largest_batch(void);

#endif /* PERCH_EXAMPLES_HTTPD_H */
