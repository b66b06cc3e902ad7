/* examples/lines/lines.c: a line-based protocol on the pipe adapters, driven by value-task continuations. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "lines.h"

struct session {
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	void (*on_end)(void *arg);
	void *arg;
	bool quitting;
	char line[LINES_MAX];
};

static void read_more(struct session *s);

static void end(struct session *s)
{
	void (*on_end)(void *) = s->on_end;
	void *arg = s->arg;
	perch_pipe_reader_free(s->r);
	perch_pipe_writer_free(s->w);
	free(s);
	on_end(arg);
}

/*
 * Copies the line that starts `off` bytes into the result into s->line (a
 * line may span segments). Returns its length with the newline, 0 when it
 * is not complete yet, -1 when it is too long.
 */
static long take_line(struct session *s, const struct perch_read_result *res, size_t off)
{
	size_t nl = perch_segs_find(res, off, "\n", 1);
	if (nl == PERCH_SEGS_NOT_FOUND)
		return res->len - off > LINES_MAX ? -1 : 0;
	size_t n = nl - off + 1;
	if (n > LINES_MAX)
		return -1;
	perch_segs_copy(res, off, s->line, n);
	return (long)n;
}

static void reply(struct session *s, const char *text, size_t len)
{
	/* Staged, not sent: one flush answers every line of this read. A refused write ends the session. */
	if (perch_pipe_write(s->w, text, len) != 0 || perch_pipe_write(s->w, "\n", 1) != 0)
		s->quitting = true;
}

static void run_command(struct session *s, char *line, size_t len)
{
	if (len >= 5 && memcmp(line, "ECHO ", 5) == 0) {
		reply(s, line + 5, len - 5);
	} else if (len >= 6 && memcmp(line, "UPPER ", 6) == 0) {
		for (size_t i = 6; i < len; i++)
			line[i] = (char)toupper((unsigned char)line[i]);
		reply(s, line + 6, len - 6);
	} else if (len == 4 && memcmp(line, "QUIT", 4) == 0) {
		reply(s, "BYE", 3);
		s->quitting = true;
	} else {
		reply(s, "ERR unknown command", 19);
	}
}

/*
 * Answers every complete line of the result, then consumes those lines and
 * marks the rest examined: a partial line waits for more bytes instead of
 * being handed back at once.
 */
static void handle_lines(struct session *s, const struct perch_read_result *res)
{
	size_t off = 0;
	while (!s->quitting) {
		long n = take_line(s, res, off);
		if (n == 0)
			break;
		if (n < 0) {
			reply(s, "ERR line too long", 17);
			s->quitting = true;
			off = res->len;
			break;
		}
		off += (size_t)n;
		size_t len = (size_t)n - 1;
		if (len > 0 && s->line[len - 1] == '\r')
			len--;
		run_command(s, s->line, len);
	}
	perch_pipe_advance_to(s->r, off, res->len);
}

static void on_flushed(void *arg, int64_t result)
{
	struct session *s = arg;
	if (result < 0 || s->quitting)
		end(s);
	else
		read_more(s);
}

static void on_readable(void *arg, int64_t result)
{
	struct session *s = arg;
	if (result < 0)
		end(s);
	else
		read_more(s);
}

/* Flushes the replies. Returns true when the caller may read on at once. */
static bool flush_replies(struct session *s)
{
	int rc = perch_pipe_flush_or_wait(s->w, on_flushed, s);
	if (rc == PERCH_PENDING)
		return false;   /* on_flushed goes on: the socket's buffer is our backpressure */
	if (rc < 0 || s->quitting) {
		end(s);
		return false;
	}
	return true;
}

/* Reads, answers, flushes, until a read has to wait. */
static void read_more(struct session *s)
{
	for (;;) {
		struct perch_read_result res;
		int rc = perch_pipe_read_or_wait(s->r, &res, on_readable, s);
		if (rc == PERCH_PENDING)
			return;         /* on_readable goes on once bytes come */
		if (rc < 0) {
			end(s);
			return;
		}
		handle_lines(s, &res);
		if (res.completed || res.closed || res.error)
			s->quitting = true;
		if (!flush_replies(s))
			return;
	}
}

int lines_serve(struct perch_pipe_reader *r, struct perch_pipe_writer *w,
		void (*on_end)(void *arg), void *arg)
{
	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->r = r;
	s->w = w;
	s->on_end = on_end;
	s->arg = arg;
	read_more(s);
	return 0;
}
