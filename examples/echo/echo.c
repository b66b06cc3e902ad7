/* examples/echo/echo.c: the echo server: each read's segments are written back, then flushed once. */
#include "echo.h"

/* Copies every received byte to the writer: the pipe writer stages into its own buffers. */
static int echo_data(void *state, void *app, const struct perch_read_result *r,
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

static const struct serve_proto echo_proto = { .on_data = echo_data };

int echo_start(const struct serve_opts *o, struct serve **out)
{
	return serve_start(o, &echo_proto, NULL, out);
}

void echo_stop(struct serve *s)
{
	serve_stop(s);
}
