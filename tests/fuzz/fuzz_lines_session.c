/*
 * tests/fuzz/fuzz_lines_session.c: libFuzzer harness: the line protocol's session (examples/lines) over two
 * in-memory pipes, its requests written, split and flushed at fuzzer-chosen points under fuzzer-chosen pause
 * thresholds, its replies read a fuzzer-chosen few bytes at a time, must reply what it replies to the whole
 * input written at once.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <perch.h>

#include "../../examples/lines/lines.h"
#include "fuzz_split.h"

/* How a run writes and reads. */
struct plan {
	struct perch_pipe_opts req, rep; /* the request pipe (the server reads), the reply pipe */
	size_t piece;                    /* bytes a write; a chunk's pieces are flushed together */
	size_t take;                     /* bytes the client consumes of each reply read */
};

struct rig {
	struct perch_pipe_reader *req_r, *rep_r;
	struct perch_pipe_writer *req_w, *rep_w;
	int ended;                       /* on_end calls: exactly one a session */
	bool rep_done;                   /* the reply stream completed */
	struct fuzz_log replies;
};

static void on_end(void *arg)
{
	((struct rig *)arg)->ended++;
}

/* Reads what replies are there, consuming at most p->take bytes a read. Returns the bytes taken. */
static size_t drain(struct rig *g, const struct plan *p)
{
	size_t total = 0;
	struct perch_read_result res;
	int rc;
	while (!g->rep_done && (rc = perch_pipe_try_read(g->rep_r, &res)) == 0) {
		size_t n = res.len < p->take ? res.len : p->take, at = 0;
		for (const struct perch_seg *s = res.first; s && at < n; s = s->next) {
			size_t off = s == res.first ? res.first_off : 0;
			size_t k = s->len - off < n - at ? s->len - off : n - at;
			fuzz_log_put(&g->replies, s->data + off, k);
			at += k;
		}
		bool all = n == res.len;
		if (all && res.completed)
			g->rep_done = true;
		if (perch_pipe_advance_to(g->rep_r, n, n) != 0)
			abort();
		total += n;
		if (n == 0 && !g->rep_done)
			break; /* an empty, unfinished result: nothing more now */
	}
	return total;
}

/* Waits for a flush (or the writer's end) by reading replies; a wait nothing can end is a finding. */
static void wait_flush(struct rig *g, const struct plan *p, struct perch_vtask_handle h)
{
	while (perch_vtask_status(h) == PERCH_PENDING)
		if (drain(g, p) == 0 && perch_vtask_status(h) == PERCH_PENDING)
			abort(); /* a stall: the server waits for the client, the client for the server */
}

/* Writes data in pieces, flushing once. Returns false once the server has ended. */
static bool send_chunk(struct rig *g, const struct plan *p, const uint8_t *data, size_t n)
{
	for (size_t at = 0; at < n; at += p->piece) {
		size_t k = n - at < p->piece ? n - at : p->piece;
		int rc = perch_pipe_write(g->req_w, data + at, k);
		if (rc == -EPIPE)
			return false;
		if (rc != 0)
			abort();
	}
	struct perch_vtask_handle h;
	int rc = perch_pipe_flush(g->req_w, &h);
	if (rc == PERCH_PENDING)
		wait_flush(g, p, h);
	else if (rc == -EPIPE)
		return false;
	else if (rc != 0)
		abort();
	drain(g, p);
	return true;
}

/* One session over the whole input; its replies land in g->replies. */
static void run(struct rig *g, const struct fuzz_input *in, bool whole, const struct plan *p)
{
	memset(g, 0, sizeof(*g));
	if (perch_pipe_new(&p->req, &g->req_r, &g->req_w) != 0 || perch_pipe_new(&p->rep, &g->rep_r, &g->rep_w) != 0 ||
	    lines_serve(g->req_r, g->rep_w, on_end, g) != 0)
		abort();
	size_t from = 0;
	for (size_t k = whole ? in->nchunks - 1 : 0; k < in->nchunks; k++) {
		if (!send_chunk(g, p, in->data + from, in->ends[k] - from))
			break;
		from = in->ends[k];
	}
	perch_pipe_writer_complete(g->req_w); /* the client's FIN */
	while (!g->rep_done)
		if (drain(g, p) == 0 && !g->rep_done)
			abort(); /* the session never finished its replies */
	if (g->ended != 1)
		abort();
	perch_pipe_writer_free(g->req_w);
	perch_pipe_reader_free(g->rep_r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in;
	fuzz_input_split(&in, data, size, 6);
	const uint8_t *k = in.knobs;
	/* The server holds back a partial line of up to LINES_MAX bytes: the request pipe must pause above it. */
	size_t req_pause = LINES_MAX + 2 + (size_t)k[0] * 8, rep_pause = 1 + (size_t)k[2];
	struct plan fuzzed = {
		.req = { .pause_bytes = req_pause, .resume_bytes = k[1] % req_pause },
		.rep = { .pause_bytes = rep_pause, .resume_bytes = k[3] % rep_pause },
		.piece = 1 + (size_t)k[4],
		.take = 1 + (size_t)k[5],
	};
	struct plan at_once = { .piece = SIZE_MAX, .take = SIZE_MAX };
	static struct rig a, b;
	run(&a, &in, true, &at_once);
	run(&b, &in, false, &fuzzed);
	fuzz_log_same(&a.replies, &b.replies);
	return 0;
}
