/* stress/race_forward.c: a forward (perch_conn_forward) races the destination's close: refused or staged, every lent buffer comes back once. */
/*
 * Judged by stress/harness.c: the race fails unless the forward and the
 * close overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS) and its named window (the close landed
 * between the forward and its flush) ran as often; at 200,000 rounds it
 * had ~73k overlaps and ~16.6k rounds in the window. Mutant 76 fails it.
 */
#include "config.h"

#include <stdlib.h>

#include "race_conn.h"

#define LENT_LEN   2000u   /* one received buffer big enough to be lent */
#define COPIED_LEN 10u     /* and one small enough to be copied */

struct forward_state {
	struct fake_transport src_t, dst_t;
	struct perch_conn *src, *dst;
	uint32_t close_returned;       /* set by the closer once perch_conn_close returned */
	bool closed_before_forward;    /* what the forwarder saw just before its call */
	int rc_forward, rc_flush;
	struct perch_vtask_handle flush;
};

static void *forward_create(void)
{
	return calloc(1, sizeof(struct forward_state));
}

static void forward_destroy(void *p)
{
	free(p);
}

static void forward_setup(void *p, uint64_t round)
{
	static char lent[LENT_LEN + 1], copied[COPIED_LEN + 1];
	struct forward_state *s = p;
	if (!lent[0]) {
		memset(lent, 'L', LENT_LEN);
		memset(copied, 'c', COPIED_LEN);
	}
	s->src = race_conn_new(&s->src_t);
	s->dst = race_conn_new(&s->dst_t);
	fake_recv(s->src, lent);
	fake_recv(s->src, copied);
	struct perch_read_result res;
	if (perch_conn_try_read(s->src, &res) != 0 || res.len != LENT_LEN + COPIED_LEN)
		abort();
	s->close_returned = 0;
	s->closed_before_forward = false;
	s->rc_forward = s->rc_flush = 1;
}

static void forward_then_flush(void *p, uint64_t round)
{
	struct forward_state *s = p;
	s->closed_before_forward = perch__load_u32(&s->close_returned) != 0;
	s->rc_forward = perch_conn_forward(s->src, LENT_LEN + COPIED_LEN, LENT_LEN + COPIED_LEN, s->dst);
	if (s->rc_forward == 0)
		s->rc_flush = perch_conn_flush(s->dst, &s->flush);
}

static void dst_closes(void *p, uint64_t round)
{
	struct forward_state *s = p;
	perch_conn_close(s->dst);
	perch__store_u32(&s->close_returned, 1);
}

/* Which way the round went; false (with the reason recorded) when it broke the contract. */
static bool judge_outcome(struct race *r, struct forward_state *s, uint64_t round)
{
	if (s->rc_forward == -EPIPE) {
		race_branch(r, 0);
		/* Refused: nothing was consumed, the result is still the reader's to advance. */
		if (perch_conn_advance(s->src, LENT_LEN + COPIED_LEN, LENT_LEN + COPIED_LEN) != 0) {
			race_fail(r, round, "a refused forward consumed the reader's result");
			return false;
		}
		return true;
	}
	if (s->rc_forward != 0) {
		race_fail(r, round, "forward returned %d", s->rc_forward);
		return false;
	}
	if (s->closed_before_forward) {
		race_fail(r, round, "a forward that began after the close returned was not refused");
		return false;
	}
	if (s->rc_flush == -EPIPE) {
		race_branch(r, 1);
	} else if (s->rc_flush == PERCH_PENDING) {
		race_branch(r, 2);
	} else {
		race_fail(r, round, "the flush after a forward returned %d", s->rc_flush);
		return false;
	}
	return true;
}

static bool judge_forward_vs_close(struct race *r, void *p, uint64_t round)
{
	struct forward_state *s = p;
	bool ok = judge_outcome(r, s, round);
	/* The kernel's send completes (canceled by the close), then both references go. */
	race_conn_end(s->dst);
	race_conn_end(s->src);
	if (s->src_t.segs_out != 0) {
		/* A double release wraps the count below zero: both show here. */
		race_fail(r, round, "%d received buffers not back exactly once", (int)s->src_t.segs_out);
		ok = false;
	}
	return ok;
}

const struct race_def race_forward_vs_close = {
	.name = "forward: a forward races the destination's close",
	.actors = 2, .exhaustive = true, .create = forward_create, .destroy = forward_destroy, .setup = forward_setup,
	.actor = { forward_then_flush, dst_closes }, .judge = judge_forward_vs_close,
	.branch_names = { "refused: the close came first", "staged, then the flush found it closed",
			  "staged and sent, then closed" },
	.window_branch = 2, /* the close landed between the forward's check and its flush */
};
