/* examples/resp/resp.h: the RESP2 server (PING, ECHO, SET, GET, DEL, INCR), one key space shared by every loop, over pipes. */
#ifndef PERCH_EXAMPLES_RESP_H
#define PERCH_EXAMPLES_RESP_H

#include "serve.h"

/* Starts the server with an empty store. Returns 0 with *out, -ENOMEM, resp_store_new's getrandom error, or serve_start's. */
int resp_start(const struct serve_opts *o, struct serve **out);

/* Stops it and frees the store. NULL is ignored. */
void resp_stop(struct serve *s);

/*
 * One read's work: at most RESP_MAX_PIPELINED commands, and no command
 * starts once the staged replies reach the writer's high-water mark
 * (perch_pipe_writer_above_high_water; a GET of a large value, pipelined,
 * would stage it again and again). The replies are flushed, and the rest
 * of the read is parsed once the flush completed.
 */
#define RESP_MAX_PIPELINED 128

/* For tests and diagnostics: the most commands answered, and reply bytes staged, in one read since resp_start. */
void resp_largest_batch(size_t *commands, size_t *reply_bytes);

#endif /* PERCH_EXAMPLES_RESP_H */
