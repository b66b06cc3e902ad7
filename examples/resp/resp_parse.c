/* examples/resp/resp_parse.c: one RESP2 command (multibulk or inline) from contiguous bytes, with redis's limits and error texts. */
#include "resp_parse.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define DEFAULT_MAX_BULK   (512u << 20)
#define DEFAULT_MAX_INLINE (64u << 10)

struct limits {
	size_t max_bulk, max_args, max_inline;
};

static int fail(struct resp_cmd *cmd, const char *why)
{
	cmd->error = why;
	return RESP_ERROR;
}

/* Counts and lengths are read with it too: what it refuses gets the caller's message. */
bool resp_parse_ll(const char *s, size_t len, long long *out)
{
	size_t i = 0;
	bool neg = false;
	unsigned long long v = 0, cap = (unsigned long long)INT64_MAX;
	if (len == 0 || len > 20)
		return false;
	if (s[0] == '-') {
		neg = true;
		cap++;
		if (++i == len)
			return false;
	}
	if (s[i] == '0' && len - i > 1)
		return false;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		/* No division a digit: the product and the sum are checked for wrapping, then the cap. */
		if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (unsigned)(s[i] - '0'), &v) ||
		    v > cap)
			return false;
	}
	if (neg && v == 0 && len > 1)
		return false; /* "-0" */
	*out = neg ? (long long)(0 - v) : (long long)v;
	return true;
}

/*
 * A "<c><number>\r\n" count line at p[pos..): returns 1 with the number and
 * *next, 0 when the CRLF has not arrived, -1 when the line (before its CR)
 * is longer than max_inline (redis's "too big ... count string"), whether
 * or not its CR has arrived: the verdict must not depend on how the bytes
 * were split (a fuzzing finding). Redis looks for the CR; so does this,
 * and the LF must follow it.
 */
static int count_line(const char *p, size_t len, size_t pos, const struct limits *l,
		      long long *num, bool *ok, size_t *next)
{
	const char *cr = memchr(p + pos, '\r', len - pos);
	if ((cr ? (size_t)(cr - p) : len) - pos > l->max_inline)
		return -1;
	if (!cr || (size_t)(cr - p) + 1 >= len)
		return 0;
	size_t e = (size_t)(cr - p);
	*ok = p[e + 1] == '\n' && resp_parse_ll(p + pos + 1, e - pos - 1, num);
	*next = e + 2;
	return 1;
}

static int parse_multibulk(const char *p, size_t len, const struct limits *l, struct resp_cmd *cmd)
{
	long long n;
	bool ok;
	size_t pos = 0;
	int r = count_line(p, len, pos, l, &n, &ok, &pos);
	if (r < 0)
		return fail(cmd, "Protocol error: too big mbulk count string");
	if (r == 0)
		return RESP_NEED_MORE;
	if (!ok || n > (long long)l->max_args)
		return fail(cmd, "Protocol error: invalid multibulk length");
	for (long long i = 0; i < n; i++) {
		if (pos == len)
			return RESP_NEED_MORE;
		if (p[pos] != '$') {
			snprintf(cmd->errbuf, sizeof(cmd->errbuf), "Protocol error: expected '$', got '%c'",
				 p[pos] >= 0x20 && p[pos] < 0x7f ? p[pos] : ' ');
			return fail(cmd, cmd->errbuf);
		}
		long long blen;
		r = count_line(p, len, pos, l, &blen, &ok, &pos);
		if (r < 0)
			return fail(cmd, "Protocol error: too big bulk count string");
		if (r == 0)
			return RESP_NEED_MORE;
		if (!ok || blen < 0 || (unsigned long long)blen > l->max_bulk)
			return fail(cmd, "Protocol error: invalid bulk length");
		if (len - pos < (size_t)blen + 2)
			return RESP_NEED_MORE;
		if (p[pos + (size_t)blen] != '\r' || p[pos + (size_t)blen + 1] != '\n')
			return fail(cmd, "Protocol error: bulk string not followed by CRLF");
		cmd->argv[i] = (struct resp_arg){ p + pos, (size_t)blen };
		pos += (size_t)blen + 2;
	}
	/* "*0" and "*-1" are nothing to run, as in redis. */
	cmd->argc = n > 0 ? (size_t)n : 0;
	cmd->consumed = pos;
	return RESP_COMPLETE;
}

/* ---- inline commands, split as redis's sdssplitargs splits them ---- */

static int hex_val(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Appends one byte to the scratch area; false when it is full. */
static bool scratch_put(struct resp_cmd *cmd, size_t *used, char c)
{
	if (*used == sizeof(cmd->scratch))
		return false;
	cmd->scratch[(*used)++] = c;
	return true;
}

/*
 * One double-quoted segment starting after its opening quote at s[*i]; the
 * unescaped bytes go to scratch. Returns 1, 0 for unbalanced quotes, -1 when
 * scratch is full.
 */
static int dquoted(const char *s, size_t n, size_t *i, struct resp_cmd *cmd, size_t *used)
{
	static const char from[] = "nrtba", to[] = "\n\r\t\b\a";
	for (;;) {
		if (*i >= n)
			return 0;
		char c = s[*i], out = c;
		if (c == '"') {
			(*i)++;
			/* The closing quote must end the argument (redis: "foo"bar is an error). */
			return *i >= n || is_space(s[*i]) ? 1 : 0;
		}
		if (c == '\\' && *i + 3 < n && s[*i + 1] == 'x' && hex_val(s[*i + 2]) >= 0 &&
		    hex_val(s[*i + 3]) >= 0) {
			out = (char)(hex_val(s[*i + 2]) * 16 + hex_val(s[*i + 3]));
			*i += 3;
		} else if (c == '\\' && *i + 1 < n) {
			const char *e = strchr(from, s[*i + 1]);
			out = e && s[*i + 1] ? to[e - from] : s[*i + 1];
			(*i)++;
		}
		if (!scratch_put(cmd, used, out))
			return -1;
		(*i)++;
	}
}

/* One single-quoted segment: only \' is an escape. Returns as dquoted. */
static int squoted(const char *s, size_t n, size_t *i, struct resp_cmd *cmd, size_t *used)
{
	for (;;) {
		if (*i >= n)
			return 0;
		char c = s[*i];
		if (c == '\'') {
			(*i)++;
			return *i >= n || is_space(s[*i]) ? 1 : 0;
		}
		if (c == '\\' && *i + 1 < n && s[*i + 1] == '\'') {
			c = '\'';
			(*i)++;
		}
		if (!scratch_put(cmd, used, c))
			return -1;
		(*i)++;
	}
}

/*
 * One argument starting at s[*i] (not a space). A plain one points into the
 * input; one with a quote anywhere is rebuilt in scratch, since a quote
 * opens a quoted segment even mid-word, as in redis.
 */
static int inline_arg(const char *s, size_t n, size_t *i, struct resp_cmd *cmd, size_t *used,
		      struct resp_arg *arg)
{
	size_t start = *i, j = *i;
	while (j < n && !is_space(s[j]) && s[j] != '"' && s[j] != '\'')
		j++;
	if (j == n || is_space(s[j])) {
		*arg = (struct resp_arg){ s + start, j - start };
		*i = j;
		return 1;
	}
	size_t from = *used;
	for (j = start; j < n && !is_space(s[j]);) {
		int r = 1;
		if (s[j] == '"' || s[j] == '\'') {
			j++;
			r = s[j - 1] == '"' ? dquoted(s, n, &j, cmd, used) : squoted(s, n, &j, cmd, used);
		} else if (!scratch_put(cmd, used, s[j++])) {
			r = -1;
		}
		if (r <= 0)
			return r;
	}
	*arg = (struct resp_arg){ cmd->scratch + from, *used - from };
	*i = j;
	return 1;
}

static int parse_inline(const char *p, size_t len, const struct limits *l, struct resp_cmd *cmd)
{
	const char *lf = memchr(p, '\n', len);
	if (!lf)
		return len > l->max_inline ? fail(cmd, "Protocol error: too big inline request") : RESP_NEED_MORE;
	size_t n = (size_t)(lf - p), i = 0, used = 0;
	if (n > l->max_inline)
		return fail(cmd, "Protocol error: too big inline request");
	cmd->consumed = n + 1;
	if (n && p[n - 1] == '\r')
		n--;
	cmd->argc = 0;
	for (;;) {
		while (i < n && is_space(p[i]))
			i++;
		if (i == n)
			return RESP_COMPLETE;
		if (cmd->argc == l->max_args)
			return fail(cmd, "Protocol error: invalid multibulk length");
		int r = inline_arg(p, n, &i, cmd, &used, &cmd->argv[cmd->argc]);
		if (r == 0)
			return fail(cmd, "Protocol error: unbalanced quotes in request");
		if (r < 0)
			return fail(cmd, "Protocol error: too big inline request");
		cmd->argc++;
	}
}

int resp_parse(const char *p, size_t len, const struct resp_limits *lim, struct resp_cmd *cmd)
{
	struct limits l = {
		.max_bulk = lim && lim->max_bulk ? lim->max_bulk : DEFAULT_MAX_BULK,
		.max_args = lim && lim->max_args && lim->max_args <= RESP_MAX_ARGS ? lim->max_args
										     : RESP_MAX_ARGS,
		.max_inline = lim && lim->max_inline ? lim->max_inline : DEFAULT_MAX_INLINE,
	};
	cmd->argc = 0;
	cmd->consumed = 0;
	cmd->error = NULL;
	if (len == 0)
		return RESP_NEED_MORE;
	return p[0] == '*' ? parse_multibulk(p, len, &l, cmd) : parse_inline(p, len, &l, cmd);
}
