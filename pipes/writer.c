/* pipes/writer.c: the pipe writer: zero-copy staging on the connection, its flush parked in the flush arm. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "pipe_internal.h"
#include "vtask_internal.h"

#define WRITER_OF(l) ((struct perch_pipe_writer *)(l))

static void writer_destroy(struct perch_pipe_writer *w)
{
	perch__conn_unref(w->c);
	free(w);
}

/* The connection is about to park this flush: ready the one task the caller will await. */
static uint64_t writer_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	return perch_vtask_ready(&WRITER_OF(l)->vt);
}

/* An arm ended (signalled, or taken back by the flusher): frees the writer if it was freed meanwhile. */
static void writer_disarmed(struct perch_pipe_writer *w)
{
	uint32_t before = perch__faa_u32(&w->life, (uint32_t)-WRITER_ARMED);
	if ((before & ~WRITER_FREEING) == (WRITER_ARMED | WRITER_FREED))
		writer_destroy(w);
}

/*
 * Completes the version the park readied (a canceled one stays canceled).
 * Its continuation may free the writer: the arm still counted keeps it
 * until writer_disarmed, which is the last touch.
 */
static void writer_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie,
			int result)
{
	struct perch_pipe_writer *w = WRITER_OF(l);
	perch_vtask_complete(&w->vt, (uint32_t)cookie, result);
	writer_disarmed(w);
}

int perch__pipe_writer_init(struct perch_pipe_writer **out, struct perch_conn *c, bool mem)
{
	struct perch_pipe_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->listener.on_parking = writer_parking;
	w->listener.on_flush_done = writer_done;
	w->c = c;
	w->gate = mem ? WRITER_GATE_MEM : 0;
	w->high_water = PERCH_PIPE_HIGH_WATER_DEFAULT;
	perch_vtask_init(&w->vt);
	perch__conn_ref(c);
	*out = w;
	return 0;
}

int perch_pipe_writer_new(struct perch_conn *c, struct perch_pipe_writer **out)
{
	if (!c || !out)
		return -EINVAL;
	return perch__pipe_writer_init(out, c, false);
}

static bool writer_usable(struct perch_pipe_writer *w)
{
	return w && !(perch__load_u32(&w->gate) & WRITER_GATE_COMPLETED);
}

/*
 * Why a write is refused now, from one load of the gate: -EINVAL (no
 * writer, or completed), an in-memory pipe's refusal (-EBUSY, -EPIPE:
 * perch__mem_write_refusal, never -EINVAL), or 0.
 */
static int write_refusal(struct perch_pipe_writer *w)
{
	if (!w)
		return -EINVAL;
	uint32_t gate = perch__load_u32(&w->gate);
	if (gate & WRITER_GATE_COMPLETED)
		return -EINVAL;
	return (gate & WRITER_GATE_MEM) ? perch__mem_write_refusal(perch__mem_pipe_of(w->c)) : 0;
}

/* The writer writes an in-memory pipe: its gate says so from its creation. */
static bool writes_memory(struct perch_pipe_writer *w)
{
	return perch__load_u32(&w->gate) & WRITER_GATE_MEM;
}

int perch_pipe_get_buffer(struct perch_pipe_writer *w, size_t size_hint, uint8_t **buf,
			  size_t *len)
{
	if (!buf || !len)
		return -EINVAL;
	int refused = write_refusal(w);
	if (refused)
		return refused;
	int rc = perch__conn_stage_buffer(w->c, size_hint, buf, len);
	w->room = rc == 0 ? (uint32_t)*len : 0;
	return rc;
}

int perch_pipe_advance(struct perch_pipe_writer *w, size_t n)
{
	int refused = write_refusal(w);
	if (refused)
		return refused;
	if (perch__load_u32(&w->c->flush_busy))
		return -EBUSY;
	/* Only what the last get_buffer lent: a write in between took that buffer's place. */
	if (n > w->room)
		return -EINVAL;
	int rc = perch__conn_stage_commit(w->c, n);
	if (rc == 0)
		w->room -= n;
	return rc;
}

size_t perch_pipe_writer_staged(const struct perch_pipe_writer *w)
{
	return w ? perch_conn_staged(w->c) : 0;
}

int perch_pipe_writer_set_high_water(struct perch_pipe_writer *w, size_t bytes)
{
	if (!w)
		return -EINVAL;
	w->high_water = bytes ? bytes : PERCH_PIPE_HIGH_WATER_DEFAULT;
	return 0;
}

bool perch_pipe_writer_above_high_water(const struct perch_pipe_writer *w)
{
	return w && perch_conn_staged(w->c) >= w->high_water;
}

/* A closed gate (the hot path's one load): completed, or an in-memory pipe's writer. */
static bool gate_open(struct perch_pipe_writer *w)
{
	return __builtin_expect(w && perch__load_u32(&w->gate) == 0, 1);
}

static __attribute__((noinline)) int write_gated(struct perch_pipe_writer *w, const void *data,
						size_t len)
{
	int refused = write_refusal(w);
	if (refused != -EINVAL)
		w->room = 0; /* as a write: it ends get_buffer's loan */
	return refused ? refused : perch_conn_write(w->c, data, len);
}

int perch_pipe_write(struct perch_pipe_writer *w, const void *data, size_t len)
{
	if (!gate_open(w))
		return write_gated(w, data, len);
	w->room = 0;
	/* The conn's copying write stages exactly as get_buffer + advance would. */
	return perch_conn_write(w->c, data, len);
}

int perch_pipe_write_ref(struct perch_pipe_writer *w, const void *data, size_t len, perch_release_fn release,
			 void *arg)
{
	int refused = write_refusal(w);
	if (refused != -EINVAL)
		w->room = 0; /* as a write: it ends get_buffer's loan */
	return refused ? refused : perch_conn_write_ref(w->c, data, len, release, arg);
}

int perch_pipe_forward(struct perch_pipe_reader *r, size_t consumed, size_t examined,
		       struct perch_pipe_writer *w)
{
	if (!r)
		return -EINVAL;
	int refused = write_refusal(w);
	if (refused)
		return refused;
	int rc = perch_conn_forward(r->c, consumed, examined, w->c);
	if (rc == 0)
		w->room = 0; /* the forwarded bytes took the lent buffer's place */
	return rc;
}

/* Takes a pending cancel, if one was made (a load first: cancels are rare, an exchange is not free). */
static bool take_cancel(uint32_t *cancel)
{
	return perch__load_u32(cancel) && perch__xchg_u32(cancel, 0);
}

/*
 * Another flush still waits, though the connection's guard may be free:
 * the conn lets its guard go before it signals (so the continuation can
 * flush again), and a park in that gap would ready a new version over the
 * one its caller waits on. An arm still counted with its task pending is
 * that flush; one whose task completed is a continuation flushing again,
 * or a canceled flush the kernel still holds (the guard refuses that).
 */
static bool another_flush_waits(struct perch_pipe_writer *w, uint32_t life_before)
{
	return __builtin_expect((life_before & WRITER_ARMS) != 0, 0) &&
	       perch__vtask_current_pending(&w->vt);
}

/*
 * Mark first, then look: a parking flush readies its task, arms (an
 * exchange, which orders the ready before what follows), then looks for
 * the mark, so one of the two sees the other. Only parks ready this task:
 * a pending version is a flush that waits or is parking, and whoever takes
 * the mark back cancels it. One that completed meanwhile leaves the cancel
 * to the next flush: mark and look again.
 */
static void cancel_waiting_or_mark(struct perch_pipe_writer *w)
{
	for (;;) {
		perch__xchg_u32(&w->cancel, 1);
		perch__fence_rmw_then_load();
		uint32_t token = perch__vtask_version(&w->vt);
		if (!token || !perch__vtask_pending(&w->vt, token))
			return;                 /* none waits: the mark is the next flush's */
		if (!perch__xchg_u32(&w->cancel, 0))
			return;                 /* the parking flush took it: it cancels itself */
		if (perch_vtask_complete(&w->vt, token, -ECANCELED) == 0)
			return;
	}
}

/*
 * A cancel's mark this flush took finds the flush complete already: the
 * cancel is the next flush's, made again as a cancel makes it (mark, then
 * look), in case another flush parked meanwhile.
 */
static __attribute__((noinline)) void cancel_this_or_the_next(struct perch_pipe_writer *w,
							     uint32_t token)
{
	if (perch_vtask_complete(&w->vt, token, -ECANCELED) != 0)
		cancel_waiting_or_mark(w);
}

/*
 * Closed while arming, and this flush disarmed: the version its park
 * readied is nobody's. Ended, so a later cancel marks the next flush
 * instead of completing it (a pending version is this one: a flush that
 * still waited was refused before the park). A cancel that lands before
 * this completes the orphan and is spent; the connection is closed, so
 * later flushes say so (-EPIPE, or 0 with nothing staged) either way.
 */
static void end_the_orphan(struct perch_pipe_writer *w)
{
	if (perch__vtask_current_pending(&w->vt))
		perch_vtask_complete(&w->vt, perch__vtask_version(&w->vt), -EPIPE);
}

/* A flush that did not park (refused, canceled, closed, nothing staged): its arm is let go. */
static __attribute__((noinline)) int flush_not_parked(struct perch_pipe_writer *w, int rc)
{
	if (rc == -EPIPE)
		end_the_orphan(w);
	writer_disarmed(w);     /* not parked, or taken back (closed while arming) */
	return rc;
}

static int conn_flush(struct perch_pipe_writer *w, struct perch_vtask_handle *task)
{
	/* Counted before the park: its signal may come on another thread before the park returns. */
	uint32_t before = perch__faa_u32(&w->life, WRITER_ARMED);
	/* Refused first: a cancel's mark is then the waiting flush's, which the cancel takes back. */
	if (another_flush_waits(w, before))
		return flush_not_parked(w, -EBUSY);
	if (take_cancel(&w->cancel))
		return flush_not_parked(w, -ECANCELED);
	uint64_t token;
	int rc = perch__conn_park_flush(w->c, &w->listener, &token);
	if (__builtin_expect(rc != PERCH_PENDING, 0))
		return flush_not_parked(w, rc);
	task->task = &w->vt;
	task->token = (uint32_t)token;
	/* A cancel that looked before the park readied the task left its mark for this flush. */
	if (take_cancel(&w->cancel))
		cancel_this_or_the_next(w, (uint32_t)token);
	return PERCH_PENDING;
}

/* Off the fast path: a completed writer, an in-memory pipe's, or no task. */
static __attribute__((noinline)) int flush_gated(struct perch_pipe_writer *w,
						 struct perch_vtask_handle *task)
{
	if (!writer_usable(w) || !task)
		return -EINVAL;
	return perch__mem_flush(w, task);
}

int perch_pipe_flush(struct perch_pipe_writer *w, struct perch_vtask_handle *task)
{
	if (__builtin_expect(gate_open(w) && task != NULL, 1))
		return conn_flush(w, task);
	return flush_gated(w, task);
}

int perch_pipe_flush_or_wait(struct perch_pipe_writer *w, perch_vtask_fn on_flushed, void *arg)
{
	if (!on_flushed)
		return -EINVAL;
	struct perch_vtask_handle h;
	int rc = perch_pipe_flush(w, &h);
	if (rc != PERCH_PENDING)
		return rc;
	rc = perch_vtask_on_complete(h, on_flushed, arg);
	if (rc != 0)
		return rc; /* PERCH_PENDING: on_flushed carries on */
	/* Completed while registering: on_flushed will not run; its result is the answer. */
	int64_t result = -EIO;
	perch_vtask_result(h, &result);
	return (int)result;
}

int perch_pipe_cancel_pending_flush(struct perch_pipe_writer *w)
{
	if (!w)
		return -EINVAL;
	if (writes_memory(w)) {
		perch__mem_cancel_flush(w);
		return 0;
	}
	/* Counted as an arm while it runs: a free from the flush's continuation waits for it. */
	perch__faa_u32(&w->life, WRITER_ARMED);
	cancel_waiting_or_mark(w);
	writer_disarmed(w);
	return 0;
}

int perch_pipe_writer_complete(struct perch_pipe_writer *w)
{
	if (!w)
		return -EINVAL;
	if (perch__for_u32(&w->gate, WRITER_GATE_COMPLETED) & WRITER_GATE_COMPLETED)
		return 0;
	if (writes_memory(w)) {
		perch__mem_writer_completed(w);
	} else {
		/* Staged bytes are the writer's alone (a flush in progress took its own). */
		size_t len;
		perch__conn_free_chain(perch__conn_take_staged(w->c, &len));
		if (w->c->ops->end_of_writes)
			w->c->ops->end_of_writes(w->c);
	}
	return 0;
}

void perch_pipe_writer_free(struct perch_pipe_writer *w)
{
	if (!w)
		return;
	/*
	 * FREEING first: complete() may run a waiting flush's continuation
	 * here, and a free from there is then ignored. FREED last: still armed
	 * (a canceled flush the kernel holds), its signal frees the writer.
	 */
	if (perch__for_u32(&w->life, WRITER_FREEING) & WRITER_FREEING)
		return;
	perch_pipe_writer_complete(w);
	if ((perch__for_u32(&w->life, WRITER_FREED) & ~WRITER_FREEING) < WRITER_ARMED)
		writer_destroy(w);
}
