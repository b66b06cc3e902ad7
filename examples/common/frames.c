/* examples/common/frames.c: contiguous messages out of zero-copy segments, copying only across segment boundaries. */
#include "frames.h"

#include <stdlib.h>
#include <string.h>

/* A buffer that grew for one large message is given back once it is done: idle connections stay small. */
#define FRAME_BUF_KEEP (64u << 10)

static bool buf_append(struct frame_buf *b, const char *p, size_t n)
{
	if (b->cap - b->len < n) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap - b->len < n)
			cap *= 2;
		char *q = realloc(b->p, cap);
		if (!q)
			return false;
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	return true;
}

/* Copies the rest of the result, from the cursor, into acc. */
static bool buf_append_rest(struct frame_buf *b, struct perch_cursor c)
{
	const uint8_t *p;
	size_t n;
	while ((n = perch_cursor_run(&c, &p)) != 0) {
		if (!buf_append(b, (const char *)p, n))
			return false;
		perch_cursor_advance(&c, n);
	}
	return true;
}

static void buf_drop(struct frame_buf *b, size_t n)
{
	memmove(b->p, b->p + n, b->len - n);
	b->len -= n;
	if (b->len == 0 && b->cap > FRAME_BUF_KEEP)
		frame_buf_free(b);
}

/*
 * Parses what acc holds. acc's byte 0 is at result offset *base (negative
 * when it holds bytes of earlier reads). Returns where direct parsing goes
 * on in the result (acc emptied), or -1 while acc still needs more bytes
 * (or stop was set).
 */
static ssize_t parse_acc(struct frame_buf *acc, ssize_t *base, frame_fn fn, void *arg, bool *stop)
{
	for (;;) {
		/* A yield here would leave consumed bytes unanswered (fn's contract forbids it): stop instead. */
		ssize_t n = fn(arg, acc->p, acc->len);
		if (n < 0)
			*stop = true;
		if (n <= 0)
			return -1;
		buf_drop(acc, (size_t)n);
		*base += n;
		/* The rest starts inside this result: parse it in place, not from the copy. */
		if (*base >= 0) {
			acc->len = 0;
			if (acc->cap > FRAME_BUF_KEEP)
				frame_buf_free(acc);
			return *base;
		}
	}
}

/*
 * Appends the rest of the result from the cursor (result offset `base` of
 * acc's byte 0) and parses the copy. Returns as parse_acc; every byte of the
 * result is then consumed or copied.
 */
static ssize_t copy_and_parse(struct frame_buf *acc, struct perch_cursor c, ssize_t base, frame_fn fn,
			      void *arg, bool *stop)
{
	if (!buf_append_rest(acc, c)) {
		*stop = true;
		return -1;
	}
	return parse_acc(acc, &base, fn, arg, stop);
}

size_t frames_each(struct frame_buf *acc, const struct perch_read_result *r, frame_fn fn, void *arg,
		   enum frames_end *end)
{
	struct perch_cursor c;
	size_t pos = 0;
	bool stop = false;
	*end = FRAMES_ALL;
	perch_cursor_init(&c, r);
	if (acc->len) {
		/* A message begun in an earlier read: everything new goes after it. */
		ssize_t at = copy_and_parse(acc, c, -(ssize_t)acc->len, fn, arg, &stop);
		if (at < 0)
			goto copied;
		pos = (size_t)at;
	}
	while (pos < r->len) {
		const uint8_t *p = NULL;
		perch_cursor_advance(&c, pos - perch_cursor_pos(&c));
		size_t n = perch_cursor_run(&c, &p);
		ssize_t m = fn(arg, (const char *)p, n);
		if (m > 0) {
			pos += (size_t)m;
			continue;
		}
		if (m == FRAMES_YIELD) {
			*end = FRAMES_YIELDED;
			break;
		}
		if (m < 0) {
			*end = FRAMES_STOPPED;
			break;
		}
		if (pos + n == r->len)
			break; /* the partial message ends the result: it waits in its segment */
		/* It spans segments: copy it and the rest of the result, parse the copy. */
		ssize_t at = copy_and_parse(acc, c, (ssize_t)pos, fn, arg, &stop);
		if (at < 0)
			goto copied;
		pos = (size_t)at;
	}
	return pos;
copied:
	/* Every byte is answered or in acc: all of it is consumed. */
	if (stop)
		*end = FRAMES_STOPPED;
	return r->len;
}

void frame_buf_free(struct frame_buf *acc)
{
	free(acc->p);
	*acc = (struct frame_buf){ 0 };
}
