/*
 * tests/fuzz/fuzz_resp_session.c: libFuzzer harness: RESP commands through examples/common/frames.c over two
 * in-memory pipes, the way examples/resp answers a read (a bounded batch, then a flush, the rest read again at
 * once), with fuzzer-chosen write pieces, flush points, thresholds, batch bound and reply reads: the replies must
 * equal those of the whole input written at once and answered without a bound.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <perch.h>

#include "../../examples/common/frames.h"
#include "../../examples/resp/resp_parse.h"
#include "../../examples/resp/resp_store.h"
#include "fuzz_split.h"

struct plan {
	struct perch_pipe_opts req, rep;
	size_t piece, take, batch;       /* bytes a write, bytes consumed a reply read, commands a read */
};

struct rig {
	const struct plan *p;
	struct perch_pipe_reader *req_r, *rep_r;
	struct perch_pipe_writer *req_w, *rep_w;
	struct perch_vtask_handle req_flush, rep_flush;
	bool req_waiting, rep_waiting, server_done, rep_done;
	struct resp_store *store;
	struct frame_buf acc;
	struct resp_cmd cmd;
	size_t answered;
	struct fuzz_log replies;
};

static const struct resp_limits limits = { .max_bulk = 1024 };

/* resp.c's frame callback, with the batch bound a knob. */
static ssize_t frame(void *arg, const char *p, size_t len)
{
	struct rig *g = arg;
	if (g->answered == g->p->batch)
		return FRAMES_YIELD;
	int rc = resp_parse(p, len, &limits, &g->cmd);
	if (rc == RESP_NEED_MORE)
		return 0;
	if (rc == RESP_ERROR) {
		resp_reply_error(g->rep_w, g->cmd.error);
		return -1;
	}
	if (resp_execute(g->store, &g->cmd, g->rep_w) != 0)
		abort();
	g->answered++;
	return (ssize_t)g->cmd.consumed;
}

static bool pending(struct perch_vtask_handle h)
{
	return perch_vtask_status(h) == PERCH_PENDING;
}

/* serve.c's pump, one read: answer, advance, flush. Returns whether anything happened. */
static bool server_step(struct rig *g)
{
	struct perch_read_result res;
	if (g->server_done || (g->rep_waiting && pending(g->rep_flush)))
		return false;
	g->rep_waiting = false;
	if (perch_pipe_try_read(g->req_r, &res) != 0)
		return false;
	enum frames_end end;
	g->answered = 0;
	size_t consumed = frames_each(&g->acc, &res, frame, g, &end);
	if (perch_pipe_advance_to(g->req_r, consumed, end == FRAMES_YIELDED ? consumed : res.len) != 0)
		abort();
	bool last = end == FRAMES_STOPPED || (res.completed && end != FRAMES_YIELDED);
	int rc = perch_pipe_flush(g->rep_w, &g->rep_flush);
	if (rc == PERCH_PENDING)
		g->rep_waiting = true;
	else if (rc != 0)
		abort();
	if (last) {
		g->server_done = true;
		perch_pipe_writer_complete(g->rep_w);
		perch_pipe_reader_free(g->req_r); /* the client's flushes now fail with -EPIPE */
		g->req_r = NULL;
	}
	return true;
}

/* Reads the replies there are, consuming at most take bytes a read. Returns whether any came. */
static bool client_step(struct rig *g)
{
	struct perch_read_result res;
	bool any = false;
	while (!g->rep_done && perch_pipe_try_read(g->rep_r, &res) == 0) {
		size_t n = res.len < g->p->take ? res.len : g->p->take, at = 0;
		for (const struct perch_seg *s = res.first; s && at < n; s = s->next) {
			size_t off = s == res.first ? res.first_off : 0;
			size_t k = s->len - off < n - at ? s->len - off : n - at;
			fuzz_log_put(&g->replies, s->data + off, k);
			at += k;
		}
		if (n == res.len && res.completed)
			g->rep_done = true;
		if (perch_pipe_advance_to(g->rep_r, n, n) != 0)
			abort();
		any = true;
		if (n == 0)
			break;
	}
	return any;
}

/* Runs both sides until neither can move; a client flush still waiting then is a stall. */
static void settle(struct rig *g)
{
	for (;;) {
		bool served = server_step(g), read = client_step(g);
		if (!served && !read)
			break;
	}
	if (g->req_waiting && pending(g->req_flush) && !g->server_done)
		abort();
}

static void send_chunk(struct rig *g, const uint8_t *data, size_t n)
{
	for (size_t at = 0; at < n && !g->server_done; at += g->p->piece) {
		size_t k = n - at < g->p->piece ? n - at : g->p->piece;
		if (perch_pipe_write(g->req_w, data + at, k) != 0)
			abort();
	}
	if (g->server_done)
		return;
	int rc = perch_pipe_flush(g->req_w, &g->req_flush);
	g->req_waiting = rc == PERCH_PENDING;
	if (rc != 0 && rc != PERCH_PENDING)
		abort();
	settle(g);
}

static void run(struct rig *g, const struct fuzz_input *in, bool whole, const struct plan *p)
{
	memset(g, 0, sizeof(*g));
	g->p = p;
	if (perch_pipe_new(&p->req, &g->req_r, &g->req_w) != 0 || perch_pipe_new(&p->rep, &g->rep_r, &g->rep_w) != 0 ||
	    resp_store_new(&g->store) != 0)
		abort();
	size_t from = 0;
	for (size_t k = whole ? in->nchunks - 1 : 0; k < in->nchunks && !g->server_done; k++) {
		send_chunk(g, in->data + from, in->ends[k] - from);
		from = in->ends[k];
	}
	perch_pipe_writer_complete(g->req_w); /* the client's FIN */
	settle(g);
	if (!g->server_done || !g->rep_done)
		abort(); /* the session never finished */
	perch_pipe_writer_free(g->req_w);
	perch_pipe_writer_free(g->rep_w);
	perch_pipe_reader_free(g->rep_r);
	resp_store_free(g->store);
	frame_buf_free(&g->acc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in;
	fuzz_input_split(&in, data, size, 6);
	const uint8_t *k = in.knobs;
	/* A partial command may stay unconsumed in one segment, up to a whole input (-max_len 4096). */
	size_t req_pause = 4097 + (size_t)k[0] * 16, rep_pause = 1 + (size_t)k[2];
	struct plan fuzzed = {
		.req = { .pause_bytes = req_pause, .resume_bytes = k[1] % req_pause },
		.rep = { .pause_bytes = rep_pause, .resume_bytes = k[3] % rep_pause },
		.piece = 1 + (size_t)k[4],
		.take = 1 + (size_t)k[5] % 64,
		.batch = 1 + (size_t)(k[5] >> 6) * 2,
	};
	struct plan at_once = { .req = { .pause_bytes = SIZE_MAX / 2 }, .rep = { .pause_bytes = SIZE_MAX / 2 },
				.piece = SIZE_MAX, .take = SIZE_MAX, .batch = SIZE_MAX };
	static struct rig a, b;
	run(&a, &in, true, &at_once);
	run(&b, &in, false, &fuzzed);
	fuzz_log_same(&a.replies, &b.replies);
	return 0;
}
