/* tests/test_resp_parse.c: the RESP2 parser (multibulk, inline, splits, pipelining, malformed input, limits) and each command's reply. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_prelude.h"

#include "../examples/resp/resp_parse.h"
#include "../examples/resp/resp_store.h"

static const char ECHO_MB[] = "*2\r\n$4\r\nECHO\r\n$5\r\nhello\r\n";
static const char SET_MB[] = "*3\r\n$3\r\nSET\r\n$5\r\nkey:1\r\n$3\r\nxyz\r\n";

/* A resp_cmd is large (its argv and scratch): tests keep one on the heap. */
static struct resp_cmd *new_cmd(void)
{
	struct resp_cmd *c = malloc(sizeof(*c));
	assert_non_null(c);
	return c;
}

static bool arg_is(struct resp_arg a, const char *lit)
{
	return a.len == strlen(lit) && memcmp(a.p, lit, a.len) == 0;
}

static int parse(const char *s, struct resp_cmd *c)
{
	return resp_parse(s, strlen(s), NULL, c);
}

static void multibulk_command_parses_whole(void **state)
{
	struct resp_cmd *c = new_cmd();
	assert_int_equal(parse(ECHO_MB, c), RESP_COMPLETE);
	assert_int_equal(c->argc, 2);
	assert_true(arg_is(c->argv[0], "ECHO"));
	assert_true(arg_is(c->argv[1], "hello"));
	assert_int_equal(c->consumed, strlen(ECHO_MB));
	free(c);
}

static void bulk_strings_are_binary_safe(void **state)
{
	static const char s[] = "*2\r\n$4\r\nECHO\r\n$6\r\na\r\n\0b$\r\n";
	struct resp_cmd *c = new_cmd();
	assert_int_equal(resp_parse(s, sizeof(s) - 1, NULL, c), RESP_COMPLETE);
	assert_int_equal(c->argv[1].len, 6);
	assert_memory_equal(c->argv[1].p, "a\r\n\0b$", 6);
	free(c);
}

/* Every prefix needs more; the whole completes with the same length. */
static void check_every_split(const char *s)
{
	struct resp_cmd *c = new_cmd();
	size_t n = strlen(s);
	for (size_t k = 0; k < n; k++)
		if (resp_parse(s, k, NULL, c) != RESP_NEED_MORE)
			fail_msg("prefix %zu of %s did not need more", k, s);
	assert_int_equal(resp_parse(s, n, NULL, c), RESP_COMPLETE);
	assert_int_equal(c->consumed, n);
	free(c);
}

static void every_split_point_needs_more_until_complete(void **state)
{
	check_every_split(ECHO_MB);
	check_every_split(SET_MB);
	check_every_split("*1\r\n$0\r\n\r\n");
	check_every_split("PING\r\n");
	check_every_split("set \"a b\" 'c'\n");
}

static void pipelined_commands_parse_back_to_back(void **state)
{
	enum { N = 300 };
	const char *kinds[] = { ECHO_MB, SET_MB, "PING\r\n", "get key:1\n" };
	const size_t argcs[] = { 2, 3, 1, 2 };
	size_t cap = N * sizeof(SET_MB), len = 0;
	char *buf = malloc(cap);
	assert_non_null(buf);
	for (int i = 0; i < N; i++) {
		memcpy(buf + len, kinds[i % 4], strlen(kinds[i % 4]));
		len += strlen(kinds[i % 4]);
	}
	struct resp_cmd *c = new_cmd();
	size_t off = 0;
	int count = 0;
	while (off < len) {
		assert_int_equal(resp_parse(buf + off, len - off, NULL, c), RESP_COMPLETE);
		assert_int_equal(c->argc, argcs[count % 4]);
		off += c->consumed;
		count++;
	}
	assert_int_equal(count, N);
	free(c);
	free(buf);
}

static void inline_commands_split_as_redis_does(void **state)
{
	struct resp_cmd *c = new_cmd();
	assert_int_equal(parse("  set   k\tv  \r\n", c), RESP_COMPLETE);
	assert_int_equal(c->argc, 3);
	assert_true(arg_is(c->argv[0], "set"));
	assert_true(arg_is(c->argv[2], "v"));
	assert_int_equal(parse("set \"a b\" 'it\\'s'\n", c), RESP_COMPLETE);
	assert_int_equal(c->argc, 3);
	assert_true(arg_is(c->argv[1], "a b"));
	assert_true(arg_is(c->argv[2], "it's"));
	assert_int_equal(parse("echo \"\\x41\\n\\t\\q\\\"\"\n", c), RESP_COMPLETE);
	assert_true(arg_is(c->argv[1], "A\n\tq\""));
	assert_int_equal(parse("echo ab\"c d\"\n", c), RESP_COMPLETE); /* a quote opens mid-word */
	assert_int_equal(c->argc, 2);
	assert_true(arg_is(c->argv[1], "abc d"));
	assert_int_equal(parse("echo \"\"\n", c), RESP_COMPLETE);
	assert_int_equal(c->argv[1].len, 0);
	free(c);
}

static void empty_commands_complete_with_no_arguments(void **state)
{
	struct resp_cmd *c = new_cmd();
	const char *empties[] = { "\r\n", "\n", "   \r\n", "*0\r\n", "*-1\r\n" };
	for (size_t i = 0; i < 5; i++) {
		assert_int_equal(parse(empties[i], c), RESP_COMPLETE);
		assert_int_equal(c->argc, 0);
		assert_int_equal(c->consumed, strlen(empties[i]));
	}
	free(c);
}

struct bad_case {
	const char *in;
	const char *error;
};

static void malformed_input_gets_redis_error_text(void **state)
{
	static const struct bad_case cases[] = {
		{ "*x\r\n", "Protocol error: invalid multibulk length" },
		{ "*+1\r\n", "Protocol error: invalid multibulk length" },
		{ "*01\r\n", "Protocol error: invalid multibulk length" },
		{ "*\r\n", "Protocol error: invalid multibulk length" },
		{ "*1\n$1\r\na\r\n", "Protocol error: invalid multibulk length" }, /* CR without LF */
		{ "*2\r\n:1\r\n", "Protocol error: expected '$', got ':'" },
		{ "*1\r\n$-2\r\n", "Protocol error: invalid bulk length" },
		{ "*1\r\n$-1\r\n", "Protocol error: invalid bulk length" },
		{ "*1\r\n$1a\r\n", "Protocol error: invalid bulk length" },
		{ "*1\r\n$3\r\nabcXY", "Protocol error: bulk string not followed by CRLF" },
		{ "set \"a\n", "Protocol error: unbalanced quotes in request" },
		{ "set 'a\n", "Protocol error: unbalanced quotes in request" },
		{ "set \"a\"b\n", "Protocol error: unbalanced quotes in request" },
	};
	struct resp_cmd *c = new_cmd();
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int r = parse(cases[i].in, c);
		if (r != RESP_ERROR || strcmp(c->error, cases[i].error) != 0)
			fail_msg("case %zu: result %d error %s, want %s", i, r, c->error ? c->error : "-",
				 cases[i].error);
	}
	free(c);
}

static void limits_refuse_long_arrays_bulks_and_lines(void **state)
{
	struct resp_cmd *c = new_cmd();
	struct resp_limits lim = { .max_bulk = 4, .max_args = 2, .max_inline = 16 };
	assert_int_equal(resp_parse("*3\r\n", 4, &lim, c), RESP_ERROR);
	assert_string_equal(c->error, "Protocol error: invalid multibulk length");
	assert_int_equal(resp_parse("*1\r\n$5\r\n", 8, &lim, c), RESP_ERROR);
	assert_string_equal(c->error, "Protocol error: invalid bulk length");
	assert_int_equal(resp_parse("*1\r\n$4\r\nabcd\r\n", 14, &lim, c), RESP_COMPLETE);
	assert_int_equal(resp_parse("a b c\n", 6, &lim, c), RESP_ERROR); /* inline args count too */
	/* A line with no end yet is refused once it is longer than the limit, not before. */
	static const char digits[] = "*11111111111111111111";
	assert_int_equal(resp_parse(digits, 16, &lim, c), RESP_NEED_MORE);
	assert_int_equal(resp_parse(digits, 17, &lim, c), RESP_ERROR);
	assert_string_equal(c->error, "Protocol error: too big mbulk count string");
	assert_int_equal(resp_parse("*1\r\n$1111111111111111", 22, &lim, c), RESP_ERROR);
	assert_string_equal(c->error, "Protocol error: too big bulk count string");
	assert_int_equal(resp_parse("ping aaaaaaaaaaaaaaaaaaaa", 25, &lim, c), RESP_ERROR);
	assert_string_equal(c->error, "Protocol error: too big inline request");
	/* Defaults: an array of RESP_MAX_ARGS is fine, one more is not. */
	assert_int_equal(parse("*1024\r\n", c), RESP_NEED_MORE);
	assert_int_equal(parse("*1025\r\n", c), RESP_ERROR);
	free(c);
}

/*
 * Found by tests/fuzz/fuzz_resp_parse: a count line longer than max_inline
 * was refused while it arrived but accepted whole (its CR found), and a
 * line of max_inline bytes was refused while its LF was still missing.
 * Every prefix of a stream now gets the verdict the whole stream gets.
 */
static void a_count_line_is_judged_alike_however_it_arrives(void **state)
{
	struct resp_cmd *c = new_cmd();
	struct resp_limits lim = { .max_inline = 2 };
	static const char long_count[] = "*0001\r\n$1\r\na\r\n";
	for (size_t n = 3; n <= sizeof(long_count) - 1; n++) {
		assert_int_equal(resp_parse(long_count, n, &lim, c), RESP_ERROR);
		assert_string_equal(c->error, "Protocol error: too big mbulk count string");
	}
	static const char short_count[] = "*1\r\n$1\r\na\r\n";
	for (size_t n = 1; n < sizeof(short_count) - 1; n++)
		assert_int_equal(resp_parse(short_count, n, &lim, c), RESP_NEED_MORE);
	assert_int_equal(resp_parse(short_count, sizeof(short_count) - 1, &lim, c), RESP_COMPLETE);
	static const char long_bulk_count[] = "*1\r\n$001\r\na\r\n";
	for (size_t n = 7; n <= sizeof(long_bulk_count) - 1; n++) {
		assert_int_equal(resp_parse(long_bulk_count, n, &lim, c), RESP_ERROR);
		assert_string_equal(c->error, "Protocol error: too big bulk count string");
	}
	free(c);
}

static void escaped_inline_arguments_are_bounded_by_scratch(void **state)
{
	size_t n = RESP_INLINE_SCRATCH + 16;
	char *s = malloc(n + 16);
	assert_non_null(s);
	memcpy(s, "echo \"", 6);
	memset(s + 6, 'a', n);
	memcpy(s + 6 + n, "\"\n", 3);
	struct resp_cmd *c = new_cmd();
	assert_int_equal(parse(s, c), RESP_ERROR);
	assert_string_equal(c->error, "Protocol error: too big inline request");
	s[5] = 'a'; /* unquoted, the same argument points into the input and is fine */
	s[6 + n] = ' ';
	assert_int_equal(parse(s, c), RESP_COMPLETE);
	assert_int_equal(c->argv[1].len, n + 1);
	free(c);
	free(s);
}

static void integers_read_as_redis_reads_them(void **state)
{
	long long v;
	assert_true(resp_parse_ll("0", 1, &v) && v == 0);
	assert_true(resp_parse_ll("-42", 3, &v) && v == -42);
	assert_true(resp_parse_ll("9223372036854775807", 19, &v) && v == INT64_MAX);
	assert_true(resp_parse_ll("-9223372036854775808", 20, &v) && v == INT64_MIN);
	assert_true(resp_parse_ll("922337203685477580", 18, &v) && v == INT64_MAX / 10);
	/*
	 * Past the range by one, and past 64 bits: the last digit of 2^64 wraps
	 * a careless sum to 0, and the last multiplication of 1.9e19 a careless
	 * product to 5.5e17, both within range.
	 */
	const char *bad[] = { "", "-", "-0", "+1", "01", " 1", "1 ", "9223372036854775808",
			      "-9223372036854775809", "18446744073709551616", "19000000000000000000",
			      "99999999999999999999", "1e3" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_false(resp_parse_ll(bad[i], strlen(bad[i]), &v));
}

/* What `stage` staged on a fresh in-memory pipe's writer (it must return 0), compared whole with `want`. */
static void staged_expect(int (*stage)(struct perch_pipe_writer *w, void *arg), void *arg, const char *want)
{
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	assert_int_equal(perch_pipe_new(NULL, &r, &w), 0);
	assert_int_equal(stage(w, arg), 0);
	assert_int_equal(perch_pipe_writer_staged(w), strlen(want));
	assert_int_equal(perch_pipe_writer_complete(w), 0); /* hands the staged bytes to the reader */
	struct perch_read_result res;
	assert_int_equal(perch_pipe_try_read(r, &res), 0);
	assert_true(res.completed);
	assert_int_equal(res.len, strlen(want));
	size_t at = 0;
	for (const struct perch_seg *g = res.first; g && at < res.len; g = g->next) {
		size_t off = g == res.first ? res.first_off : 0;
		assert_memory_equal(g->data + off, want + at, g->len - off);
		at += g->len - off;
	}
	assert_int_equal(at, res.len);
	assert_int_equal(perch_pipe_advance_to(r, res.len, res.len), 0);
	perch_pipe_writer_free(w);
	perch_pipe_reader_free(r);
}

struct exec_args {
	struct resp_store *s;
	struct resp_cmd *c;
};

static int stage_exec(struct perch_pipe_writer *w, void *arg)
{
	struct exec_args *a = arg;
	return resp_execute(a->s, a->c, w);
}

static int stage_error(struct perch_pipe_writer *w, void *msg)
{
	return resp_reply_error(w, msg);
}

/* Parses `in` (one command), runs it, and compares the whole reply. */
static void exec_expect(struct resp_store *s, const char *in, const char *want)
{
	struct exec_args a = { s, new_cmd() };
	assert_int_equal(parse(in, a.c), RESP_COMPLETE);
	staged_expect(stage_exec, &a, want);
	free(a.c);
}

static void each_command_replies_as_redis(void **state)
{
	struct resp_store *s;
	assert_int_equal(resp_store_new(&s), 0);
	exec_expect(s, "PING\r\n", "+PONG\r\n");
	exec_expect(s, "*1\r\n$4\r\nping\r\n", "+PONG\r\n");
	exec_expect(s, "ping hi\r\n", "$2\r\nhi\r\n");
	exec_expect(s, ECHO_MB, "$5\r\nhello\r\n");
	exec_expect(s, SET_MB, "+OK\r\n");
	exec_expect(s, "GET key:1\r\n", "$3\r\nxyz\r\n");
	exec_expect(s, "get nope\r\n", "$-1\r\n");
	exec_expect(s, "Set key:1 \"\"\r\n", "+OK\r\n");
	exec_expect(s, "get key:1\r\n", "$0\r\n\r\n");
	exec_expect(s, "incr n\r\n", ":1\r\n");
	exec_expect(s, "INCR n\r\n", ":2\r\n");
	exec_expect(s, "set n -5\r\n", "+OK\r\n");
	exec_expect(s, "incr n\r\n", ":-4\r\n");
	exec_expect(s, "set n 9223372036854775807\r\n", "+OK\r\n");
	exec_expect(s, "incr n\r\n", "-ERR increment or decrement would overflow\r\n");
	exec_expect(s, "set n 1.5\r\n", "+OK\r\n");
	exec_expect(s, "incr n\r\n", "-ERR value is not an integer or out of range\r\n");
	exec_expect(s, "incr key:1\r\n", "-ERR value is not an integer or out of range\r\n");
	exec_expect(s, "set a 1\r\n", "+OK\r\n");
	exec_expect(s, "del a key:1 missing a\r\n", ":2\r\n");
	exec_expect(s, "get a\r\n", "$-1\r\n");
	exec_expect(s, "CONFIG GET save\r\n", "*0\r\n");
	exec_expect(s, "\r\n", "");
	resp_store_free(s);
}

static void bad_commands_get_redis_errors(void **state)
{
	struct resp_store *s;
	assert_int_equal(resp_store_new(&s), 0);
	exec_expect(s, "get\r\n", "-ERR wrong number of arguments for 'get' command\r\n");
	exec_expect(s, "get a b\r\n", "-ERR wrong number of arguments for 'get' command\r\n");
	exec_expect(s, "ping a b\r\n", "-ERR wrong number of arguments for 'ping' command\r\n");
	exec_expect(s, "del\r\n", "-ERR wrong number of arguments for 'del' command\r\n");
	exec_expect(s, "set k v EX 10\r\n", "-ERR syntax error\r\n");
	exec_expect(s, "flushall\r\n", "-ERR unknown command 'flushall', with args beginning with: \r\n");
	exec_expect(s, "foo \"a\\r\\nb\" c\r\n",
		    "-ERR unknown command 'foo', with args beginning with: 'a  b' 'c' \r\n");
	assert_int_equal(resp_store_count(s), 0);
	staged_expect(stage_error, "Protocol error: invalid bulk length",
		      "-ERR Protocol error: invalid bulk length\r\n");
	staged_expect(stage_error, "a\r\nb", "-ERR a  b\r\n");
	resp_store_free(s);
}

static void store_grows_overwrites_and_deletes(void **state)
{
	struct resp_store *s;
	assert_int_equal(resp_store_new(&s), 0);
	char k[32], v[32];
	for (int i = 0; i < 5000; i++) {
		int kn = sprintf(k, "key:%d", i), vn = sprintf(v, "v%d", i);
		assert_int_equal(resp_store_set(s, k, (size_t)kn, v, (size_t)vn), 0);
	}
	assert_int_equal(resp_store_count(s), 5000);
	assert_int_equal(resp_store_set(s, "key:7", 5, "a much longer value than before", 31), 0);
	assert_int_equal(resp_store_count(s), 5000);
	for (int i = 0; i < 5000; i++) {
		size_t n;
		int kn = sprintf(k, "key:%d", i), vn = sprintf(v, "v%d", i);
		const char *got = resp_store_get(s, k, (size_t)kn, &n);
		assert_non_null(got);
		if (i != 7) {
			assert_int_equal(n, (size_t)vn);
			assert_memory_equal(got, v, n);
		}
		if (i % 2)
			assert_int_equal(resp_store_del(s, k, (size_t)kn), 1);
	}
	assert_int_equal(resp_store_count(s), 2500);
	size_t n;
	assert_null(resp_store_get(s, "key:1", 5, &n));
	assert_int_equal(resp_store_del(s, "key:1", 5), 0);
	/* Keys are binary-safe: a NUL inside is part of the key. */
	assert_int_equal(resp_store_set(s, "a\0b", 3, "x", 1), 0);
	assert_null(resp_store_get(s, "a", 1, &n));
	assert_non_null(resp_store_get(s, "a\0b", 3, &n));
	resp_store_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(multibulk_command_parses_whole),
		cmocka_unit_test(bulk_strings_are_binary_safe),
		cmocka_unit_test(every_split_point_needs_more_until_complete),
		cmocka_unit_test(pipelined_commands_parse_back_to_back),
		cmocka_unit_test(inline_commands_split_as_redis_does),
		cmocka_unit_test(empty_commands_complete_with_no_arguments),
		cmocka_unit_test(malformed_input_gets_redis_error_text),
		cmocka_unit_test(limits_refuse_long_arrays_bulks_and_lines),
		cmocka_unit_test(a_count_line_is_judged_alike_however_it_arrives),
		cmocka_unit_test(escaped_inline_arguments_are_bounded_by_scratch),
		cmocka_unit_test(integers_read_as_redis_reads_them),
		cmocka_unit_test(each_command_replies_as_redis),
		cmocka_unit_test(bad_commands_get_redis_errors),
		cmocka_unit_test(store_grows_overwrites_and_deletes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
