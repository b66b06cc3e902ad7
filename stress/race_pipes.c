/* stress/race_pipes.c: races on the pipe adapters: a park against close, and the in-memory pipe's flush against its reader. */
/*
 * Every race here is judged by stress/harness.c: it fails unless its two
 * halves overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS) and every round delivered exactly once.
 *
 * The adapters' listeners are wrapped (pipe_internal.h is visible here):
 * on_parking does a little work first, widening the window a close can
 * land in, and each delivery is counted before the adapter sees it.
 */
#include "config.h"

#include <stdlib.h>

#include "../pipes/pipe_internal.h"
#include "../lib/vtask_internal.h"
#include "race_conn.h"

struct pipe_state {
	struct fake_transport t;
	struct perch_conn *c;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	struct perch_vtask_handle h2;     /* a read parked beside the flush */
	int rc;
	uint32_t deliveries;
	int delivered_by;
	/* the adapter's own callbacks, called by the wrappers */
	uint64_t (*read_parking)(struct perch_recv_listener *, struct perch_conn *);
	void (*read_ready)(struct perch_recv_listener *, struct perch_conn *, uint64_t);
	uint64_t (*flush_parking)(struct perch_flush_listener *, struct perch_conn *);
	void (*flush_done)(struct perch_flush_listener *, struct perch_conn *, uint64_t, int);
};

/* One race runs at a time: the wrappers find their round's state here. */
static struct pipe_state *current;

static uint64_t slow_read_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	race_busy_work();
	return current->read_parking(l, c);
}

static void counted_read_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	perch__faa_u32(&current->deliveries, 1);
	current->delivered_by = race_current_actor();
	current->read_ready(l, c, cookie);
}

static uint64_t slow_flush_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	race_busy_work();
	return current->flush_parking(l, c);
}

static void counted_flush_done(struct perch_flush_listener *l, struct perch_conn *c,
			       uint64_t cookie, int result)
{
	perch__faa_u32(&current->deliveries, 1);
	current->delivered_by = race_current_actor();
	current->flush_done(l, c, cookie, result);
}

static void *pipe_create(void)
{
	current = calloc(1, sizeof(*current));
	return current;
}

static void pipe_destroy(void *p)
{
	free(p);
	current = NULL;
}

static void round_reset(struct pipe_state *s)
{
	s->rc = 0;
	s->deliveries = 0;
	s->delivered_by = -1;
	memset(&s->res, 0, sizeof(s->res));
	s->h = (struct perch_vtask_handle){ NULL, 0 };
}

static void setup_conn_adapters(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	s->c = race_conn_new(&s->t);
	if (perch_pipe_reader_new(s->c, &s->r) != 0 || perch_pipe_writer_new(s->c, &s->w) != 0)
		abort();
	s->read_parking = s->r->listener.on_parking;
	s->read_ready = s->r->listener.on_recv_ready;
	s->r->listener.on_parking = slow_read_parking;
	s->r->listener.on_recv_ready = counted_read_ready;
	s->flush_parking = s->w->listener.on_parking;
	s->flush_done = s->w->listener.on_flush_done;
	s->w->listener.on_parking = slow_flush_parking;
	s->w->listener.on_flush_done = counted_flush_done;
	round_reset(s);
}

static void setup_staged(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_conn_adapters(p, round);
	if (perch_pipe_write(s->w, "x", 1) != 0)
		abort();
}

static void pipe_read(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	s->rc = perch_pipe_read(s->r, &s->res, &s->h);
}

static void pipe_flush(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	s->rc = perch_pipe_flush(s->w, &s->h);
}

static void conn_closes(void *p, uint64_t round)
{
	perch_conn_close(((struct pipe_state *)p)->c);
}

/*
 * The round's connection goes; the kernel's last send completes first, as
 * a backend's would. A broken round's are leaked on purpose: a read whose
 * delivery was lost keeps the reader's free waiting for it.
 */
static void end_round(struct pipe_state *s, bool ok)
{
	if (!ok)
		return;
	if (s->t.sent)
		fake_send_done(s->c, -ECANCELED);
	perch_pipe_reader_free(s->r);
	perch_pipe_writer_free(s->w);
	perch_conn_release(s->c);
}

/* The caller's task completed with `want`, or the round fails. */
static bool task_done_with(struct race *r, struct pipe_state *s, uint64_t round, int64_t want)
{
	int64_t result = 0;
	int rc = perch_vtask_result(s->h, &result);
	if (rc == 0 && result == want)
		return true;
	race_fail(r, round, "task %s (rc %d, result %lld), %u deliveries",
		  rc == PERCH_PENDING ? "never completed" : "wrong", rc, (long long)result,
		  s->deliveries);
	return false;
}

static bool judge_read_vs_close(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	bool ok;
	if (s->rc == 0) {
		/* A readied task means on_parking ran: the close marked the claim meanwhile. */
		race_branch(r, perch__vtask_version(&s->r->vt) ? 1 : 0);
		ok = s->deliveries == 0 && s->res.closed;
		if (!ok)
			race_fail(r, round, "served at once (closed=%d) and delivered %u times",
				  s->res.closed, s->deliveries);
	} else if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "read returned %d", s->rc);
		ok = false;
	} else {
		race_branch(r, 2);
		ok = s->deliveries == 1 && s->delivered_by == 1 && task_done_with(r, s, round, 0);
		if (ok && (perch_pipe_read(s->r, &s->res, &s->h) != 0 || !s->res.closed)) {
			race_fail(r, round, "the delivered result does not report the close");
			ok = false;
		} else if (!ok && s->deliveries != 1) {
			race_fail(r, round, "parked read delivered %u times", s->deliveries);
		}
	}
	end_round(s, ok);
	return ok;
}

static bool judge_flush_vs_close(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	bool ok;
	if (s->rc == -EPIPE) {
		/* A readied task: the close landed while the flush armed, and the flusher disarmed. */
		race_branch(r, perch__vtask_version(&s->w->vt) ? 1 : 0);
		ok = s->deliveries == 0;
		if (!ok)
			race_fail(r, round, "refused with -EPIPE and delivered %u times", s->deliveries);
	} else if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "flush returned %d", s->rc);
		ok = false;
	} else {
		/* The fake kernel never completes the send in the round: only close delivers. */
		race_branch(r, 2);
		ok = s->deliveries == 1 && s->delivered_by == 1 && task_done_with(r, s, round, -EPIPE);
		if (!ok && s->deliveries != 1)
			race_fail(r, round, "parked flush delivered %u times", s->deliveries);
	}
	end_round(s, ok);
	return ok;
}

const struct race_def race_pipe_read_vs_close = {
	.name = "pipes: a parked read is delivered once when close races its arming",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_conn_adapters,
	.actor = { pipe_read, conn_closes }, .judge = judge_read_vs_close,
	.branch_names = { "served at once: closed before the claim",
			  "served: close marked the claim during on_parking",
			  "parked, close delivered" },
	.window_branch = 2,
};

const struct race_def race_pipe_flush_vs_close = {
	.name = "pipes: a parked flush is delivered once when close races its arming",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_staged,
	.actor = { pipe_flush, conn_closes }, .judge = judge_flush_vs_close,
	.branch_names = { "refused at once: closed before", "refused: close landed while arming",
			  "parked, close signalled -EPIPE" },
	.window_branch = 2,
};

/* ---- the in-memory pipe: a flush waiting for room against the reader's consume ---- */

#define MEM_PAUSE 8
#define MEM_RESUME 4

/* 6 bytes unread and held by the reader's last result; the flush of 4 more crosses pause. */
static void setup_mem_full(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	struct perch_pipe_opts o = { .pause_bytes = MEM_PAUSE, .resume_bytes = MEM_RESUME };
	struct perch_vtask_handle h;
	round_reset(s);
	if (perch_pipe_new(&o, &s->r, &s->w) != 0 || perch_pipe_write(s->w, "abcdef", 6) != 0 ||
	    perch_pipe_flush(s->w, &h) != 0 || perch_pipe_read(s->r, &s->res, &h) != 0 ||
	    perch_pipe_write(s->w, "ghij", 4) != 0)
		abort();
}

static void reader_consumes(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	perch_pipe_advance_to(s->r, 6, 6);
}

static bool judge_mem_flush_vs_consume(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	bool ok = true;
	if (s->rc == 0) {
		race_branch(r, 0);             /* the room was there when it looked */
	} else if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "flush returned %d", s->rc);
		ok = false;
	} else {
		race_branch(r, 1);
		ok = task_done_with(r, s, round, 0);
	}
	/* Either way nothing waits any more: the writer may write again. */
	if (ok && perch_pipe_write(s->w, "k", 1) != 0) {
		race_fail(r, round, "writes still refused after the flush completed");
		ok = false;
	}
	perch_pipe_reader_free(s->r);
	perch_pipe_writer_free(s->w);
	return ok;
}

const struct race_def race_mem_flush_vs_consume = {
	.name = "pipes: an in-memory flush waiting for room races the reader's consume",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_mem_full,
	.actor = { pipe_flush, reader_consumes }, .judge = judge_mem_flush_vs_consume,
	.branch_names = { "room already made: done at once", "waited, the consume completed it" },
};

/* ---- the reader's re-park, and its complete(), against deliveries ---- */

/* A read parked before the round: the caller holds s->h. */
static void setup_parked_read(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_conn_adapters(p, round);
	if (perch_pipe_read(s->r, &s->res, &s->h) != PERCH_PENDING)
		abort();
}

/* A completion with nothing new: what a second completion targeting one park does. */
static void stale_wake(void *p, uint64_t round)
{
	perch__conn_wake_reader(((struct pipe_state *)p)->c);
}

static void bytes_arrive(void *p, uint64_t round)
{
	fake_recv(((struct pipe_state *)p)->c, "x");
}

static void reader_completes(void *p, uint64_t round)
{
	perch_pipe_reader_complete(((struct pipe_state *)p)->r);
}

static bool judge_stale_wake_vs_bytes(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	/* The caller's version must be the one completed: a re-park that readied anew strands it. */
	bool ok = task_done_with(r, s, round, 0);
	if (ok && (perch_pipe_read(s->r, &res, &h) != 0 || res.len != 1)) {
		race_fail(r, round, "woken, but the read after it has no byte");
		ok = false;
	}
	if (ok) {
		perch_pipe_advance_to(s->r, 1, 1);
		race_branch(r, s->r->c->read_waiter == PERCH__SLOT_EMPTY ? 0 : 1);
		/* Which side took the park: the stale wake (it re-parked or served) or the bytes. */
		race_branch(r, s->delivered_by == 0 ? 2 : 3);
	}
	end_round(s, ok);
	return ok;
}

const struct race_def race_pipe_stale_wake_vs_bytes = {
	.name = "pipes: a wake with nothing new races bytes; the re-park keeps the caller",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_parked_read,
	.actor = { stale_wake, bytes_arrive }, .judge = judge_stale_wake_vs_bytes,
	.branch_names = { "the slot empty after", "the slot still held after (not expected)",
			  "the stale wake took the park", "the bytes took the park" },
	.window_branch = 3,
};

static bool judge_complete_vs_stale_wake(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	/* complete() promises its waiting read -ECANCELED, whoever delivered it. */
	bool ok = task_done_with(r, s, round, -ECANCELED);
	if (ok && s->t.segs_out != 0) {
		race_fail(r, round, "%u segments still held after complete", s->t.segs_out);
		ok = false;
	}
	race_branch(r, s->delivered_by == 1 ? 0 : 1);
	end_round(s, ok);
	return ok;
}

static void setup_parked_read_with_kept_bytes(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	struct perch_vtask_handle h;
	setup_conn_adapters(p, round);
	/* Bytes examined and kept: complete() must release them. */
	fake_recv(s->c, "kept");
	if (perch_pipe_read(s->r, &s->res, &h) != 0 || perch_pipe_advance_to(s->r, 0, 4) != 0 ||
	    perch_pipe_read(s->r, &s->res, &s->h) != PERCH_PENDING)
		abort();
}

const struct race_def race_pipe_complete_vs_stale_wake = {
	.name = "pipes: complete races a wake with nothing new (its re-park)",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy,
	.setup = setup_parked_read_with_kept_bytes,
	.actor = { reader_completes, stale_wake }, .judge = judge_complete_vs_stale_wake,
	.branch_names = { "the stale wake delivered", "complete's cancel delivered" },
	.window_branch = 1,
};

/* ---- cancel against the flush's completion ---- */

static void setup_parked_flush(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_staged(p, round);
	if (perch_pipe_flush(s->w, &s->h) != PERCH_PENDING)
		abort();
}

static void flush_canceled(void *p, uint64_t round)
{
	perch_pipe_cancel_pending_flush(((struct pipe_state *)p)->w);
}

static void kernel_took_it(void *p, uint64_t round)
{
	fake_send_done(((struct pipe_state *)p)->c, 0);
}

/*
 * Exactly one outcome: the cancel won (-ECANCELED, no mark left) or the
 * send did (0, and the cancel marked the next flush instead).
 */
static bool judge_cancel_vs_send_done(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	int64_t result = 1;
	bool ok = perch_vtask_result(s->h, &result) == 0 && (result == 0 || result == -ECANCELED);
	bool marked = perch__load_u32(&s->w->cancel) != 0;
	if (!ok)
		race_fail(r, round, "the flush's task: %lld", (long long)result);
	else if (marked != (result == 0))
		race_fail(r, round, "result %lld with the next flush %s", (long long)result,
			  marked ? "canceled too" : "not canceled: the cancel was lost");
	ok = ok && marked == (result == 0);
	race_branch(r, result == 0 ? 0 : 1);
	end_round(s, ok);
	return ok;
}

const struct race_def race_pipe_cancel_vs_send_done = {
	.name = "pipes: a flush cancel races the kernel's completion",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_parked_flush,
	.actor = { flush_canceled, kernel_took_it }, .judge = judge_cancel_vs_send_done,
	.branch_names = { "the send won: the next flush is canceled", "the cancel won" },
	.window_branch = 2,
};

/* ---- the in-memory flush against the reader's complete ---- */

static void reader_completes_mem(void *p, uint64_t round)
{
	perch_pipe_reader_complete(((struct pipe_state *)p)->r);
}

static bool judge_mem_flush_vs_reader_complete(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	bool ok = true;
	if (s->rc == -EPIPE) {
		race_branch(r, 0);
	} else if (s->rc == PERCH_PENDING) {
		race_branch(r, 1);
		ok = task_done_with(r, s, round, -EPIPE);
	} else {
		race_fail(r, round, "flush returned %d", s->rc);
		ok = false;
	}
	perch_pipe_reader_free(s->r);
	perch_pipe_writer_free(s->w);
	return ok;
}

const struct race_def race_mem_flush_vs_reader_complete = {
	.name = "pipes: an in-memory flush waiting for room races the reader's complete",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_mem_full,
	.actor = { pipe_flush, reader_completes_mem }, .judge = judge_mem_flush_vs_reader_complete,
	.branch_names = { "refused at once (-EPIPE)", "waited, the complete failed it" },
	.window_branch = 2,
};

/* ---- the same, with a read parked: the flush's own publish delivers it ---- */

/* As setup_mem_full, with everything examined and a read parked (its task in s->h2). */
static void setup_mem_full_read_parked(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_mem_full(p, round);
	if (perch_pipe_advance_to(s->r, 0, 6) != 0 ||
	    perch_pipe_read(s->r, &s->res, &s->h2) != PERCH_PENDING)
		abort();
}

/*
 * The judge of the race without a parked read. The publish wakes the read;
 * if complete() marked the reader by then, that delivery discards, and the
 * room it makes must not pass for a consume.
 */
static bool judge_mem_flush_vs_complete_read_parked(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	int64_t read_result = 1;
	if (perch_vtask_result(s->h2, &read_result) == 0 && read_result == 0)
		race_branch(r, 2);             /* the publish delivered the read before the mark */
	return judge_mem_flush_vs_reader_complete(r, p, round);
}

const struct race_def race_mem_flush_vs_reader_complete_read_parked = {
	.name = "pipes: an in-memory flush races the reader's complete, a read parked",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy,
	.setup = setup_mem_full_read_parked,
	.actor = { pipe_flush, reader_completes_mem },
	.judge = judge_mem_flush_vs_complete_read_parked,
	.branch_names = { "refused at once (-EPIPE)", "waited, the complete failed it",
			  "the publish delivered the read first" },
};

/* ---- a cancel from another thread against the next flush's park ---- */

/* Flush 1 parked and the kernel took it (its version completed with 0); "x" staged for flush 2. */
static void setup_flushed_then_staged(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_staged(p, round);
	if (perch_pipe_flush(s->w, &s->h) != PERCH_PENDING)
		abort();
	fake_send_done(s->c, 0);
	if (perch_pipe_write(s->w, "x", 1) != 0)
		abort();
	round_reset(s);
}

/* Flush 2 refused as canceled, or parked and canceled; either way no mark is left for flush 3. */
static bool judge_cancel_vs_next_flush(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	bool marked = perch__load_u32(&s->w->cancel) != 0;
	int64_t result = 0;
	bool ok;
	if (s->rc == -ECANCELED) {
		race_branch(r, 0);
		ok = !marked;
	} else if (s->rc == PERCH_PENDING) {
		race_branch(r, 1);
		ok = perch_vtask_result(s->h, &result) == 0 && result == -ECANCELED && !marked;
	} else {
		ok = false;
	}
	if (!ok)
		race_fail(r, round, "flush 2 returned %d (task %lld), the next flush %s", s->rc,
			  (long long)result, marked ? "marked: the cancel landed on flush 3" : "unmarked");
	end_round(s, true);
	return ok;
}

const struct race_def race_pipe_cancel_vs_next_flush = {
	.name = "pipes: a flush cancel races the next flush's park",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_flushed_then_staged,
	.actor = { pipe_flush, flush_canceled }, .judge = judge_cancel_vs_next_flush,
	.branch_names = { "the cancel came first: flush 2 refused", "flush 2 parked and canceled" },
	.window_branch = 2,
};

/* ---- a second flush against the kernel's completion of the first ---- */

static uint32_t first_flush_runs;
static int64_t first_flush_result;

static void count_first_flush(void *arg, int64_t result)
{
	first_flush_result = result;
	perch__faa_u32(&first_flush_runs, 1);
}

/* A flush parked with a continuation registered, as a server's response would be. */
static void setup_parked_flush_awaited(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_staged(p, round);
	first_flush_runs = 0;
	first_flush_result = 1;
	if (perch_pipe_flush(s->w, &s->h) != PERCH_PENDING ||
	    perch_vtask_on_complete(s->h, count_first_flush, NULL) != PERCH_PENDING)
		abort();
}

/* The writer's thread: another response, written and flushed (refused while the first waits). */
static void write_and_flush_again(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	struct perch_vtask_handle second;
	s->rc = perch_pipe_write(s->w, "y", 1);
	if (s->rc == 0)
		s->rc = perch_pipe_flush(s->w, &second);
}

/* The first flush's continuation runs once with 0, whatever the second flush got. */
static bool judge_second_flush_vs_send_done(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	uint32_t runs = perch__load_u32(&first_flush_runs);
	bool ok = runs == 1 && first_flush_result == 0 &&
		  (s->rc == -EBUSY || s->rc == PERCH_PENDING);
	race_branch(r, s->rc == PERCH_PENDING ? 1 : 0);
	if (!ok)
		race_fail(r, round, "the first flush's continuation ran %u times (result %lld); the second got %d",
			  runs, (long long)first_flush_result, s->rc);
	end_round(s, true);
	return ok;
}

const struct race_def race_pipe_second_flush_vs_send_done = {
	.name = "pipes: a second flush races the kernel's completion of the first",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_parked_flush_awaited,
	.actor = { write_and_flush_again, kernel_took_it }, .judge = judge_second_flush_vs_send_done,
	.branch_names = { "the second refused (the first still waited)", "the second parked after the first" },
	.window_branch = 2,
};

/* ---- one call to read or flush, or wait: the continuation runs once, never inside the call ---- */

/* The continuation of the round's one call: how often it ran, on which actor, and whether inside the call. */
static struct {
	uint32_t runs;
	int by;
	int64_t result;
	uint32_t in_call;              /* actor 0 is inside the call that registered it */
	uint32_t ran_in_call;
} cont;

static void cont_reset(void)
{
	perch__store_u32(&cont.runs, 0);
	perch__store_u32(&cont.ran_in_call, 0);
	cont.by = -1;
	cont.result = 1;
}

static void cont_ran(void *arg, int64_t result)
{
	perch__faa_u32(&cont.runs, 1);
	cont.by = race_current_actor();
	cont.result = result;
	if (cont.by == 0 && perch__load_u32(&cont.in_call))
		perch__store_u32(&cont.ran_in_call, 1);
}

/* Fails the round when the continuation ran inside its call (true), else false. */
static bool cont_ran_inside(struct race *r, uint64_t round)
{
	if (!perch__load_u32(&cont.ran_in_call))
		return false;
	race_fail(r, round, "the continuation ran inside the call that registered it");
	return true;
}

static void setup_flush_or_wait(void *p, uint64_t round)
{
	setup_staged(p, round);
	cont_reset();
}

static void flush_or_wait(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	perch__store_u32(&cont.in_call, 1);
	s->rc = perch_pipe_flush_or_wait(s->w, cont_ran, s);
	perch__store_u32(&cont.in_call, 0);
}

/*
 * -ECANCELED here and no continuation (the cancel came before the park,
 * or completed the version before the continuation was registered), or
 * PERCH_PENDING and the continuation run once with -ECANCELED by the
 * cancel's side.
 */
static bool judge_flush_or_wait_vs_cancel(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	uint32_t runs = perch__load_u32(&cont.runs);
	bool ok = false;
	if (cont_ran_inside(r, round)) {
		end_round(s, false);
		return false;
	}
	if (s->rc == -ECANCELED) {
		ok = runs == 0;
		race_branch(r, s->t.sent ? 1 : 0);
	} else if (s->rc == PERCH_PENDING) {
		ok = runs == 1 && cont.by == 1 && cont.result == -ECANCELED;
		race_branch(r, 2);
	}
	if (!ok)
		race_fail(r, round, "returned %d; the continuation ran %u times (by actor %d, result %lld)", s->rc,
			  runs, cont.by, (long long)cont.result);
	end_round(s, ok);
	return ok;
}

const struct race_def race_pipe_flush_or_wait_vs_cancel = {
	.name = "pipes: flush_or_wait races a cancel; the continuation runs once, never inside the call",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_flush_or_wait,
	.actor = { flush_or_wait, flush_canceled }, .judge = judge_flush_or_wait_vs_cancel,
	.branch_names = { "the cancel came first: refused at once", "canceled as it parked: -ECANCELED in the call",
			  "waited: the continuation ran once" },
	.window_branch = 2,
};

static uint32_t version_before;

static void setup_read_or_wait(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_conn_adapters(p, round);
	cont_reset();
	version_before = perch__vtask_version(&s->r->vt);
}

/*
 * As if the last read readied its task to park and was then served: a
 * version never published. The task is not the owner's alone then, so the
 * call registers its continuation after the park, not before it.
 */
static void setup_read_or_wait_unpublished(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	setup_read_or_wait(p, round);
	perch_vtask_ready(&s->r->vt);
	version_before = perch__vtask_version(&s->r->vt);
}

static void read_or_wait(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	perch__store_u32(&cont.in_call, 1);
	s->rc = perch_pipe_read_or_wait(s->r, &s->res, cont_ran, s);
	perch__store_u32(&cont.in_call, 0);
}

/*
 * 0 with the byte and no continuation, or PENDING and the continuation
 * run once by the bytes' side, after which a read has the byte. A 0 from
 * a read that readied its task to park (its version moved) is the window:
 * the bytes came as it parked, or while the continuation was being
 * registered, and the call read again itself; the reader waits for no
 * delivery then, or its free would wait forever.
 */
static bool judge_read_or_wait_vs_bytes(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	uint32_t runs = perch__load_u32(&cont.runs);
	bool ok = true;
	if (cont_ran_inside(r, round)) {
		ok = false;
	} else if (s->rc == 0) {
		uint32_t parked = s->r->parked_token;
		ok = s->res.len == 1 && runs == 0;
		if (!ok)
			race_fail(r, round, "returned 0 with %zu bytes, the continuation ran %u times", s->res.len, runs);
		else if (parked && perch__vtask_pending(&s->r->vt, parked)) {
			race_fail(r, round, "returned 0, but the reader waits for the delivery of version %u", parked);
			ok = false;
		} else
			race_branch(r, perch__vtask_version(&s->r->vt) != version_before ? 1 : 0);
	} else if (s->rc == PERCH_PENDING) {
		struct perch_read_result res;
		ok = runs == 1 && cont.by == 1 && perch_pipe_try_read(s->r, &res) == 0 && res.len == 1;
		if (!ok)
			race_fail(r, round, "waited: the continuation ran %u times (by actor %d)", runs, cont.by);
		else
			race_branch(r, 2);
	} else {
		race_fail(r, round, "returned %d", s->rc);
		ok = false;
	}
	if (ok)
		perch_pipe_advance_to(s->r, 1, 1);
	end_round(s, ok);
	return ok;
}

const struct race_def race_pipe_read_or_wait_vs_bytes = {
	.name = "pipes: read_or_wait races its bytes; the continuation runs once, never inside the call",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_read_or_wait,
	.actor = { read_or_wait, bytes_arrive }, .judge = judge_read_or_wait_vs_bytes,
	.branch_names = { "the bytes came first: a result at once", "readied to park, then served in the call",
			  "waited: the continuation ran once" },
	.window_branch = 2,
	.window_needs_scheduler = true,
};

const struct race_def race_pipe_read_or_wait_unpublished_vs_bytes = {
	.name = "pipes: read_or_wait after an unpublished version races its bytes; the continuation runs once",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_read_or_wait_unpublished,
	.actor = { read_or_wait, bytes_arrive }, .judge = judge_read_or_wait_vs_bytes,
	.branch_names = { "the bytes came first: a result at once", "ready while registering, or readied and served: read again in the call",
			  "waited: the continuation ran once" },
	.window_branch = 2,
	.window_needs_scheduler = true,
};

/* ---- two read_or_wait calls on one reader: the refused one touches nothing ---- */

static uint32_t second_runs;
static int64_t second_result;
static int second_rc;

static void second_ran(void *arg, int64_t result)
{
	perch__faa_u32(&second_runs, 1);
	second_result = result;
}

static void setup_two_read_or_wait(void *p, uint64_t round)
{
	setup_read_or_wait(p, round);
	perch__store_u32(&second_runs, 0);
	second_rc = 1;
}

static void second_read_or_wait(void *p, uint64_t round)
{
	struct pipe_state *s = p;
	struct perch_read_result res;
	second_rc = perch_pipe_read_or_wait(s->r, &res, second_ran, s);
}

/*
 * One call parked and the other was refused (-EBUSY); the bytes then run
 * the parked call's continuation once, and never the refused one's.
 */
static bool judge_two_read_or_wait(struct race *r, void *p, uint64_t round)
{
	struct pipe_state *s = p;
	bool first_parked = s->rc == PERCH_PENDING;
	bool ok = first_parked ? second_rc == -EBUSY : s->rc == -EBUSY && second_rc == PERCH_PENDING;
	if (ok) {
		bytes_arrive(p, round);
		uint32_t runs = perch__load_u32(&cont.runs), seconds = perch__load_u32(&second_runs);
		ok = first_parked ? runs == 1 && cont.result == 0 && seconds == 0
				  : seconds == 1 && second_result == 0 && runs == 0;
		race_branch(r, first_parked ? 0 : 1);
	}
	if (!ok)
		race_fail(r, round, "the calls returned %d and %d; their continuations ran %u and %u times", s->rc,
			  second_rc, perch__load_u32(&cont.runs), perch__load_u32(&second_runs));
	end_round(s, ok);
	return ok;
}

const struct race_def race_pipe_two_read_or_wait = {
	.name = "pipes: two read_or_wait calls race; the refused one touches nothing",
	.actors = 2, .exhaustive = true, .create = pipe_create, .destroy = pipe_destroy, .setup = setup_two_read_or_wait,
	.actor = { read_or_wait, second_read_or_wait }, .judge = judge_two_read_or_wait,
	.branch_names = { "the first parked", "the second parked" },
};
