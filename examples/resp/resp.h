/* examples/resp/resp.h: the RESP2 server (PING, ECHO, SET, GET, DEL, INCR), one key space shared by every loop, over pipes. */
#ifndef PERCH_EXAMPLES_RESP_H
#define PERCH_EXAMPLES_RESP_H

#include "serve.h"

/* Starts the server with an empty store. Returns 0 with *out, -ENOMEM, or serve_start's error. */
int resp_start(const struct serve_opts *o, struct serve **out);

/* Stops it and frees the store. NULL is ignored. */
void resp_stop(struct serve *s);

#endif /* PERCH_EXAMPLES_RESP_H */
