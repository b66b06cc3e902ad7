/* pipes/segs.c: a read result's bytes as one run across its segments: a cursor, find, copy, compare, a decimal number. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include <perch/segs.h>

#define DELIM_MAX 64

/* Steps past used-up segments (empty ones included) while bytes remain. */
static void settle(struct perch_cursor *c)
{
	while (c->pos < c->len && c->seg && c->off >= c->seg->len) {
		c->seg = c->seg->next;
		c->off = 0;
	}
}

void perch_cursor_init(struct perch_cursor *c, const struct perch_read_result *r)
{
	*c = (struct perch_cursor){ .seg = r->first, .off = r->first_off, .pos = 0, .len = r->len };
	settle(c);
}

size_t perch_cursor_run(const struct perch_cursor *c, const uint8_t **p)
{
	if (c->pos >= c->len || !c->seg)
		return 0;
	size_t n = c->seg->len - c->off;
	if (n > c->len - c->pos)
		n = c->len - c->pos;
	*p = c->seg->data + c->off;
	return n;
}

size_t perch_cursor_advance(struct perch_cursor *c, size_t n)
{
	size_t moved = 0;
	const uint8_t *p;
	size_t run;
	while (moved < n && (run = perch_cursor_run(c, &p)) != 0) {
		size_t step = run < n - moved ? run : n - moved;
		c->off += step;
		c->pos += step;
		moved += step;
		settle(c);
	}
	return moved;
}

size_t perch_cursor_pos(const struct perch_cursor *c)
{
	return c->pos;
}

/* A cursor at `from`, or false when from is past the end. */
static bool cursor_at(struct perch_cursor *c, const struct perch_read_result *r, size_t from)
{
	perch_cursor_init(c, r);
	return from <= r->len && perch_cursor_advance(c, from) == from;
}

size_t perch_segs_copy(const struct perch_read_result *r, size_t from, void *dst, size_t n)
{
	if (from >= r->len || n == 0)
		return 0;
	if (n > r->len - from)
		n = r->len - from;
	/* Most copies lie inside the first segment: one memcpy, no cursor. */
	const struct perch_seg *first = r->first;
	if (first && r->first_off + from + n <= first->len) {
		memcpy(dst, first->data + r->first_off + from, n);
		return n;
	}
	struct perch_cursor c;
	if (!cursor_at(&c, r, from))
		return 0;
	size_t done = 0, run;
	const uint8_t *p;
	while (done < n && (run = perch_cursor_run(&c, &p)) != 0) {
		size_t k = run < n - done ? run : n - done;
		memcpy((uint8_t *)dst + done, p, k);
		done += k;
		perch_cursor_advance(&c, k);
	}
	return done;
}

bool perch_segs_equal(const struct perch_read_result *r, size_t from, const void *lit, size_t n)
{
	struct perch_cursor c;
	if (!cursor_at(&c, r, from) || r->len - from < n)
		return false;
	size_t done = 0, run;
	const uint8_t *p;
	while (done < n && (run = perch_cursor_run(&c, &p)) != 0) {
		size_t k = run < n - done ? run : n - done;
		if (memcmp(p, (const uint8_t *)lit + done, k) != 0)
			return false;
		done += k;
		perch_cursor_advance(&c, k);
	}
	return done == n;
}

size_t perch_segs_find(const struct perch_read_result *r, size_t from, const void *delim, size_t dlen)
{
	struct perch_cursor c;
	if (dlen == 0 || dlen > DELIM_MAX || !cursor_at(&c, r, from))
		return PERCH_SEGS_NOT_FOUND;
	const uint8_t first = *(const uint8_t *)delim;
	const uint8_t *p;
	size_t run;
	while ((run = perch_cursor_run(&c, &p)) != 0) {
		const uint8_t *hit = memchr(p, first, run);
		if (!hit) {
			perch_cursor_advance(&c, run);
			continue;
		}
		perch_cursor_advance(&c, (size_t)(hit - p));
		size_t at = perch_cursor_pos(&c);
		if (perch_segs_equal(r, at, delim, dlen))
			return at;
		if (r->len - at < dlen)
			return PERCH_SEGS_NOT_FOUND; /* too few bytes left for a whole delimiter */
		perch_cursor_advance(&c, 1);
	}
	return PERCH_SEGS_NOT_FOUND;
}

int perch_segs_parse_u64(const struct perch_read_result *r, size_t from, uint64_t max, uint64_t *value,
			 size_t *end)
{
	struct perch_cursor c;
	if (!r || !value || !end || !cursor_at(&c, r, from))
		return -EINVAL;
	uint64_t v = 0;
	size_t digits = 0, run;
	const uint8_t *p;
	while ((run = perch_cursor_run(&c, &p)) != 0) {
		size_t i = 0;
		for (; i < run && p[i] >= '0' && p[i] <= '9'; i++) {
			unsigned d = (unsigned)(p[i] - '0');
			if (d > max || v > (max - d) / 10)
				return -ERANGE;
			v = v * 10 + d;
			digits++;
		}
		perch_cursor_advance(&c, i);
		if (i < run)
			break; /* a non-digit */
	}
	if (perch_cursor_pos(&c) == r->len)
		return -EAGAIN; /* the digits (or nothing yet) run to the end: more may come */
	if (digits == 0)
		return -EINVAL;
	*value = v;
	*end = perch_cursor_pos(&c);
	return 0;
}
