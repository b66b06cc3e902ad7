/* tests/fuzz/fuzz_resp_parse.c: libFuzzer harness: the RESP parser fed in fuzzer-chosen chunks must see what it sees fed whole. */
#include <stdbool.h>
#include <string.h>

#include "../../examples/resp/resp_parse.h"
#include "fuzz_split.h"

/* The command's arguments by content (an argument may lie in the input or in cmd->scratch). */
static void log_command(struct fuzz_log *l, const char *base, size_t avail, const struct resp_cmd *c)
{
	if (c->consumed == 0 || c->consumed > avail || c->argc > RESP_MAX_ARGS)
		abort();
	fuzz_log_num(l, c->consumed);
	fuzz_log_num(l, c->argc);
	for (size_t i = 0; i < c->argc; i++) {
		const char *p = c->argv[i].p;
		size_t n = c->argv[i].len;
		bool in_input = n && p >= base && p + n <= base + c->consumed;
		bool in_scratch = n && p >= c->scratch && p + n <= c->scratch + sizeof(c->scratch);
		if (n && !in_input && !in_scratch)
			abort(); /* an argument outside both */
		fuzz_log_num(l, n);
		fuzz_log_put(l, p, n);
	}
}

/* One parse from an exact copy (fuzz_parse_fn): an error ends the stream. */
static long parse_at(const struct fuzz_input *in, size_t pos, size_t avail, const void *lim, struct fuzz_log *l)
{
	static struct resp_cmd c;
	char *copy = fuzz_exact_copy(in->data + pos, avail - pos);
	int rc = resp_parse(copy, avail - pos, lim, &c);
	long next = 0;
	if (rc == RESP_COMPLETE) {
		fuzz_log_num(l, 1);
		log_command(l, copy, avail - pos, &c);
		next = (long)c.consumed;
	} else if (rc == RESP_ERROR) {
		if (!c.error)
			abort();
		fuzz_log_num(l, 2);
		fuzz_log_put(l, c.error, strlen(c.error));
		next = -1;
	} else if (rc != RESP_NEED_MORE) {
		abort();
	}
	free(copy);
	return next;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in;
	fuzz_input_split(&in, data, size, 2);
	/* Knobs: small limits reach the "too big" paths with small inputs; 0 keeps the defaults. */
	struct resp_limits lim = {
		.max_bulk = in.knobs[0] & 0x80 ? (size_t)(in.knobs[0] & 0x7f) : 0,
		.max_args = in.knobs[0] & 0x7f ? (size_t)(in.knobs[0] & 0x7f) : 0,
		.max_inline = in.knobs[1] ? (size_t)in.knobs[1] * 2 : 0,
	};
	fuzz_whole_equals_split(&in, parse_at, &lim);
	return 0;
}
