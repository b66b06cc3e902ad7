/* examples/echo/echo.h: the echo server: every byte a client sends comes back, over pipes. */
#ifndef PERCH_EXAMPLES_ECHO_H
#define PERCH_EXAMPLES_ECHO_H

#include "serve.h"

/* Starts the server (serve_port says where). Returns 0 with *out, or serve_start's error. */
int echo_start(const struct serve_opts *o, struct serve **out);

/* Stops it and frees everything. NULL is ignored. */
void echo_stop(struct serve *s);

#endif /* PERCH_EXAMPLES_ECHO_H */
