/* examples/echo/echo.c: the echo server: each read's bytes are written back, then flushed once. */
#include "echo.h"

/* Consumes every byte: the session forwards them to the writer, lending whole receive buffers. */
static int echo_forward(void *state, void *app, const struct perch_read_result *r,
			struct perch_pipe_writer *w, size_t *consumed)
{
	*consumed = r->len;
	return 0;
}

/* Copies every received byte to the writer: the pipe writer stages into its own buffers. */
static int echo_copy(void *state, void *app, const struct perch_read_result *r,
		     struct perch_pipe_writer *w, size_t *consumed)
{
	size_t off = r->first_off, left = r->len;
	for (const struct perch_seg *s = r->first; s && left; s = s->next, off = 0) {
		size_t n = s->len - off < left ? s->len - off : left;
		if (perch_pipe_write(w, s->data + off, n) != 0)
			return 1;
		left -= n;
	}
	*consumed = r->len;
	return 0;
}

static const struct serve_proto echo_proto = { .on_data = echo_forward, .forward_consumed = true };
static const struct serve_proto echo_copy_proto = { .on_data = echo_copy };

int echo_start(const struct serve_opts *o, struct serve **out)
{
	return serve_start(o, &echo_proto, NULL, out);
}

int echo_copy_start(const struct serve_opts *o, struct serve **out)
{
	return serve_start(o, &echo_copy_proto, NULL, out);
}

void echo_stop(struct serve *s)
{
	serve_stop(s);
}
