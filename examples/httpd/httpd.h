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

#endif /* PERCH_EXAMPLES_HTTPD_H */
