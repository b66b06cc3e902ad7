/* tests/test_segs.c: the segment helpers, each input cut at every split point (and every pair of them) into segments. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <perch.h>

#include "cmocka_prelude.h"

#define MAX_SEGS 4

/*
 * `text` as a read result of up to three segments cut at a and b (0 <= a
 * <= b <= len: a cut at 0 or at a repeated point makes an empty segment),
 * its first `skip` bytes already consumed (first_off), behind `pad`
 * bytes of junk at the start of each segment and followed by junk, so a
 * helper that reads outside [data, data + len) or past r->len is seen.
 */
struct split {
	struct perch_seg seg[MAX_SEGS];
	uint8_t bytes[MAX_SEGS][128];
	struct perch_read_result r;
};

static void cut(struct split *s, const char *text, size_t a, size_t b, size_t skip)
{
	size_t len = strlen(text), at[] = { 0, a, b, len };
	assert_true(len < 100 && a <= b && b <= len && skip <= a);
	memset(s, 0, sizeof(*s));
	for (int i = 0; i < 3; i++) {
		memset(s->bytes[i], '#', sizeof(s->bytes[i]));
		memcpy(s->bytes[i] + 7, text + at[i], at[i + 1] - at[i]);
		s->seg[i] = (struct perch_seg){ .data = s->bytes[i] + 7, .len = (uint32_t)(at[i + 1] - at[i]),
						.next = i < 2 ? &s->seg[i + 1] : NULL };
	}
	/* A consumed prefix lives in the first segment; a trailing empty segment may follow the last byte. */
	s->r = (struct perch_read_result){ .first = &s->seg[0], .first_off = skip, .len = len - skip };
}

/* Runs check(r, arg, text + skip) for `text` cut at every pair of points, with 0 and 1 byte consumed. */
static void every_split(const char *text, void (*check)(const struct perch_read_result *r, const char *view, void *arg),
			void *arg)
{
	size_t len = strlen(text);
	struct split s;
	for (size_t a = 0; a <= len; a++)
		for (size_t b = a; b <= len; b++)
			for (size_t skip = 0; skip <= 1 && skip <= a; skip++) {
				cut(&s, text, a, b, skip);
				check(&s.r, text + skip, arg);
			}
}

/* ---- the cursor ---- */

static void walk_gathers_the_view(const struct perch_read_result *r, const char *view, void *arg)
{
	struct perch_cursor c;
	char got[128];
	size_t n = 0, run;
	const uint8_t *p;
	perch_cursor_init(&c, r);
	while ((run = perch_cursor_run(&c, &p)) != 0) {
		assert_true(run <= r->len - n);
		memcpy(got + n, p, run);
		n += run;
		assert_int_equal(perch_cursor_advance(&c, run), run);
		assert_int_equal(perch_cursor_pos(&c), n);
	}
	assert_int_equal(n, strlen(view));
	assert_memory_equal(got, view, n);
	assert_int_equal(perch_cursor_advance(&c, 5), 0); /* at the end: nothing more */
}

static void a_cursor_walks_every_byte_once_in_order_whatever_the_cuts(void **state)
{
	every_split("GET / HTTP/1.1\r\n", walk_gathers_the_view, NULL);
	every_split("ab", walk_gathers_the_view, NULL);
	every_split("", walk_gathers_the_view, NULL);
}

static void advance_by_ones(const struct perch_read_result *r, const char *view, void *arg)
{
	struct perch_cursor c;
	const uint8_t *p;
	perch_cursor_init(&c, r);
	for (size_t i = 0; i < strlen(view); i++) {
		assert_true(perch_cursor_run(&c, &p) > 0);
		assert_int_equal(*p, (uint8_t)view[i]);
		assert_int_equal(perch_cursor_advance(&c, 1), 1);
	}
	assert_int_equal(perch_cursor_run(&c, &p), 0);
}

static void a_cursor_advanced_a_byte_at_a_time_sees_each_byte(void **state)
{
	every_split("*3\r\n$3\r\nSET\r\n", advance_by_ones, NULL);
}

/* ---- find ---- */

/* Where a naive search of the view finds `delim` from every start. */
static void find_as_strstr(const struct perch_read_result *r, const char *view, void *arg)
{
	const char *delim = arg;
	size_t len = strlen(view), dlen = strlen(delim);
	for (size_t from = 0; from <= len + 1; from++) {
		const char *hit = from <= len ? strstr(view + from, delim) : NULL;
		size_t want = hit ? (size_t)(hit - view) : PERCH_SEGS_NOT_FOUND;
		assert_int_equal(perch_segs_find(r, from, delim, dlen), want);
	}
}

static void find_agrees_with_a_plain_search_at_every_cut_and_start(void **state)
{
	every_split("GET / HTTP/1.1\r\nHost: x\r\n\r\n", find_as_strstr, "\r\n\r\n");
	every_split("GET / HTTP/1.1\r\nHost: x\r\n\r\n", find_as_strstr, "\r\n");
	every_split("a\r\r\n\r\r\n\r\nb", find_as_strstr, "\r\n\r\n");
	every_split("aaab", find_as_strstr, "aab");
	every_split("line one\nline two\n", find_as_strstr, "\n");
	every_split("no delimiter here", find_as_strstr, "\n");
	every_split("\r\n\r", find_as_strstr, "\r\n\r\n"); /* its start, with too few bytes after */
}

static void find_refuses_an_empty_or_over_long_delimiter(void **state)
{
	struct split s;
	char delim[66];
	memset(delim, 'a', sizeof(delim));
	cut(&s, "aaaa", 2, 2, 0);
	assert_int_equal(perch_segs_find(&s.r, 0, "", 0), PERCH_SEGS_NOT_FOUND);
	assert_int_equal(perch_segs_find(&s.r, 0, delim, 65), PERCH_SEGS_NOT_FOUND);
	assert_int_equal(perch_segs_find(&s.r, 0, delim, 4), 0);
}

/* ---- copy and compare ---- */

static void copy_and_equal_as_memcpy(const struct perch_read_result *r, const char *view, void *arg)
{
	size_t len = strlen(view);
	char got[128];
	for (size_t from = 0; from <= len + 1; from++)
		for (size_t n = 0; n <= len + 1; n++) {
			size_t want = from > len ? 0 : (n < len - from ? n : len - from);
			memset(got, 0, sizeof(got));
			assert_int_equal(perch_segs_copy(r, from, got, n), want);
			assert_memory_equal(got, view + (from > len ? len : from), want);
			assert_int_equal(got[want], 0); /* not a byte more */
			bool same = from <= len && n <= len - from;
			assert_int_equal(perch_segs_equal(r, from, view + (from > len ? len : from), n), same);
			if (same && n > 0) {
				char other[128];
				memcpy(other, view + from, n);
				other[n - 1] ^= 0x20; /* one byte different, the last */
				assert_false(perch_segs_equal(r, from, other, n));
			}
		}
}

static void copy_and_compare_agree_with_the_bytes_at_every_cut_offset_and_length(void **state)
{
	every_split("SET key value\r\n", copy_and_equal_as_memcpy, NULL);
}

/* ---- a decimal number ---- */

struct number_case {
	const char *text;
	size_t from;
	uint64_t max;
	int rc;
	uint64_t value;
	size_t end;
};

static void parse_as_expected(const struct perch_read_result *r, const char *view, void *arg)
{
	const struct number_case *k = arg;
	if (view != k->text)
		return; /* the case's offsets count from the text's start: no consumed prefix */
	uint64_t v = 77;
	size_t end = 99;
	assert_int_equal(perch_segs_parse_u64(r, k->from, k->max, &v, &end), k->rc);
	if (k->rc == 0) {
		assert_int_equal(v, k->value);
		assert_int_equal(end, k->end);
	} else {
		assert_int_equal(v, 77); /* untouched on error */
		assert_int_equal(end, 99);
	}
}

static void a_number_parses_alike_at_every_cut(void **state)
{
	static const struct number_case cases[] = {
		{ "$1234\r\n", 1, UINT64_MAX, 0, 1234, 5 },
		{ "$0\r\n", 1, UINT64_MAX, 0, 0, 2 },
		{ "007x", 0, UINT64_MAX, 0, 7, 3 },
		{ "$1234", 1, UINT64_MAX, -EAGAIN, 0, 0 },         /* digits to the end: more may come */
		{ "$", 1, UINT64_MAX, -EAGAIN, 0, 0 },             /* nothing yet */
		{ "$x1", 1, UINT64_MAX, -EINVAL, 0, 0 },
		{ "$-1\r\n", 1, UINT64_MAX, -EINVAL, 0, 0 },
		{ "$1", 3, UINT64_MAX, -EINVAL, 0, 0 },            /* from past the end */
		{ "18446744073709551615\r", 0, UINT64_MAX, 0, UINT64_MAX, 20 },
		{ "18446744073709551616\r", 0, UINT64_MAX, -ERANGE, 0, 0 },
		{ "4194304\r\n", 0, 4u << 20, 0, 4u << 20, 7 },
		{ "4194305\r\n", 0, 4u << 20, -ERANGE, 0, 0 },
		{ "99999999999999999999999999", 0, 1000, -ERANGE, 0, 0 }, /* found before the end */
		{ "7\r", 0, 5, -ERANGE, 0, 0 },                    /* one digit above max */
		{ "5\r", 0, 5, 0, 5, 1 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		every_split(cases[i].text, parse_as_expected, (void *)&cases[i]);
	struct split s;
	uint64_t v;
	size_t end;
	cut(&s, "12 ", 1, 2, 0);
	assert_int_equal(perch_segs_parse_u64(NULL, 0, 10, &v, &end), -EINVAL);
	assert_int_equal(perch_segs_parse_u64(&s.r, 0, 10, NULL, &end), -EINVAL);
	assert_int_equal(perch_segs_parse_u64(&s.r, 0, 10, &v, NULL), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_cursor_walks_every_byte_once_in_order_whatever_the_cuts),
		cmocka_unit_test(a_cursor_advanced_a_byte_at_a_time_sees_each_byte),
		cmocka_unit_test(find_agrees_with_a_plain_search_at_every_cut_and_start),
		cmocka_unit_test(find_refuses_an_empty_or_over_long_delimiter),
		cmocka_unit_test(copy_and_compare_agree_with_the_bytes_at_every_cut_offset_and_length),
		cmocka_unit_test(a_number_parses_alike_at_every_cut),
	};
	return cmocka_run_group_tests_name("segs", tests, NULL, NULL);
}
