/* examples/echo/echo.h: the echo server: every byte a client sends comes back, over pipes. */
#ifndef PERCH_EXAMPLES_ECHO_H
#define PERCH_EXAMPLES_ECHO_H

#include "serve.h"

/*
 * Starts the server (serve_port says where): received bytes are forwarded
 * to the writer, whole receive buffers lent without a copy. Returns 0 with
 * *out, or serve_start's error.
 */
int echo_start(const struct serve_opts *o, struct serve **out);

/* The same server copying every byte into the writer's own buffers (perch_pipe_write). */
int echo_copy_start(const struct serve_opts *o, struct serve **out);

/* Stops it and frees everything. NULL is ignored. */
void echo_stop(struct serve *s);

#endif /* PERCH_EXAMPLES_ECHO_H */
