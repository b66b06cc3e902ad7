/* examples/resp/resp_parse.h: RESP2 request parser (arrays of bulk strings, and inline commands) over contiguous bytes. */
#ifndef PERCH_EXAMPLES_RESP_PARSE_H
#define PERCH_EXAMPLES_RESP_PARSE_H

#include <stdbool.h>
#include <stddef.h>

/* Most arguments one command may carry (and the default array limit). */
#define RESP_MAX_ARGS 1024
/* Room for inline arguments that quotes or escapes change; plain ones point into the input. */
#define RESP_INLINE_SCRATCH 4096

enum resp_result {
	RESP_ERROR = -1,     /* cmd->error says why (redis's words); reply "-ERR <error>", then close */
	RESP_NEED_MORE = 0,  /* no whole command yet: call again with more bytes (same start) */
	RESP_COMPLETE = 1,   /* one command, cmd->consumed bytes; argc 0 means nothing to run */
};

/* One argument: a run of bytes in the input (or in cmd->scratch), binary-safe, not NUL-terminated. */
struct resp_arg {
	const char *p;
	size_t len;
};

/* Limits; a zeroed struct (or NULL) means every default. */
struct resp_limits {
	size_t max_bulk;    /* bytes of one bulk string; 0: 512 MiB (redis's proto-max-bulk-len) */
	size_t max_args;    /* array length; 0 or above RESP_MAX_ARGS: RESP_MAX_ARGS */
	size_t max_inline;  /* an inline command line, or a '*'/'$' count line; 0: 64 KiB */
};

struct resp_cmd {
	size_t argc;
	struct resp_arg argv[RESP_MAX_ARGS];
	size_t consumed;       /* bytes of this command, to skip before the next one */
	const char *error;     /* on RESP_ERROR: e.g. "Protocol error: invalid bulk length" */
	char errbuf[64];       /* holds error text that names a byte of the input */
	char scratch[RESP_INLINE_SCRATCH];
};

/*
 * Parses one command from the start of p[0..len). A buffer that starts with
 * '*' is an array of bulk strings ("*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n"), as
 * redis-cli and redis-benchmark send; anything else is an inline command
 * ("PING\r\n", "set k \"a b\"\n") split as redis splits it: spaces, double
 * quotes with \n \r \t \b \a \xHH escapes, single quotes with \'. An empty
 * line, "*0" and "*-1" complete with argc 0. Errors carry redis's own text
 * ("Protocol error: invalid multibulk length", "... expected '$', got 'x'",
 * "... invalid bulk length", "... too big inline request", "... unbalanced
 * quotes in request", ...). Never reads past len, never allocates.
 */
int resp_parse(const char *p, size_t len, const struct resp_limits *lim, struct resp_cmd *cmd);

/*
 * Reads a signed 64-bit decimal the way redis's string2ll does: optional
 * '-', digits, no '+', no spaces, no leading zeros, no "-0", no overflow.
 * Returns true with *out set.
 */
bool resp_parse_ll(const char *s, size_t len, long long *out);

#endif /* PERCH_EXAMPLES_RESP_PARSE_H */
