/* pipes/reader.c: the pipe reader, parked directly in the connection's read slot. */
#include "config.h"

#include <stdlib.h>

#include "atomic.h"
#include "pipe_internal.h"
#include "vtask_internal.h"

#define READER_OF(l, member) perch__container_of(l, struct perch_pipe_reader, member)

/*
 * What a park on this thread hands its own readying (reader_parking),
 * through a per-thread pointer to a struct on the parking call's stack; a
 * park nested in another keeps its own. Either read_or_wait's
 * continuation: the park readies the task under the slot's claim, so a
 * second call the claim refuses never reaches it (and touches nothing);
 * `token` comes back set when the park registered the continuation
 * itself. Or the version a re-park from inside a delivery keeps (`kept`):
 * the caller already waits on it.
 */
struct handoff {
	struct perch_pipe_reader *r;
	perch_vtask_fn fn;
	void *arg;
	uint32_t token;
	uint32_t kept;
};

static __thread struct handoff *handing;

/*
 * The connection is about to park this read: ready the one task the caller
 * will await, with read_or_wait's continuation registered when the task
 * is the reader's alone. Then the token is noted here, before the park is
 * published: once it is, the continuation may run, and free the reader,
 * on another thread.
 */
static uint64_t reader_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	struct perch_pipe_reader *r = READER_OF(l, listener);
	struct handoff *h = handing;
	if (!h || h->r != r)
		return perch_vtask_ready(&r->vt);
	if (h->kept)
		return h->kept;
	bool registered;
	uint32_t token = perch__vtask_ready_registered(&r->vt, h->fn, h->arg, &registered);
	if (registered) {
		r->parked_token = token;
		h->token = token;
	}
	return token;
}

/* Parks the read again from inside its delivery, on the version `cookie` the caller waits on. */
static int repark(struct perch_pipe_reader *r, struct perch_conn *c, uint64_t cookie)
{
	struct handoff h = { .r = r, .kept = (uint32_t)cookie }, *outer = handing;
	handing = &h;
	int rc = perch__conn_park_read(c, &r->listener, NULL, &cookie);
	handing = outer;
	return rc;
}

static void discard_all(struct perch_pipe_reader *r)
{
	/* Busy only while another side holds the slot for a moment; a parked read is canceled first. */
	unsigned spins = 0;
	while (perch__conn_discard(r->c) != 0) {
		perch_conn_cancel_read(r->c);
		perch__spin_wait(&spins);
	}
}

/*
 * Whether the last read that parked has not completed yet (reading thread).
 * Not the task's current version: on_parking may ready one for a read then
 * served at once, which nothing ever completes.
 */
static bool reader_waiting(struct perch_pipe_reader *r)
{
	return (r->parked_token && perch__vtask_pending(&r->vt, r->parked_token)) ||
	       perch__vtask_registrant_late(&r->vt);
}

/* The rare ways of a delivery: the reader completed, or the wake brought nothing new. */
static __attribute__((noinline)) void reader_ready_slow(struct perch_pipe_reader *r,
							 struct perch_conn *c, uint64_t cookie)
{
	if (perch__load_u32(&r->state) & READER_COMPLETED) {
		discard_all(r);
		perch_vtask_complete(&r->vt, (uint32_t)cookie, -ECANCELED);
		return;
	}
	/* No result: if bytes came meanwhile, the caller's next read serves them. */
	int rc = repark(r, c, cookie);
	if (rc == PERCH_PENDING)
		return;
	if (rc != PERCH_PENDING && (perch__load_u32(&r->state) & READER_COMPLETED)) {
		/*
		 * complete() came meanwhile: its cancel made the read ready, or it
		 * holds the slot to discard (-EBUSY). The caller gets what
		 * complete promises.
		 */
		discard_all(r);
		rc = -ECANCELED;
	}
	perch_vtask_complete(&r->vt, (uint32_t)cookie, rc);
}

/*
 * The park's one delivery. A wake with nothing new parks again (same
 * version) instead of waking the caller to find nothing; otherwise the
 * caller is woken and its next read is served by the connection. The
 * task's completion is the last touch of the reader: its continuation may
 * free it.
 */
static void reader_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	struct perch_pipe_reader *r = READER_OF(l, listener);
	/*
	 * State after readiness: complete() marks the reader before its cancel
	 * makes a read ready, so a ready read that is complete's own goes the
	 * slow way and gets -ECANCELED.
	 */
	if (__builtin_expect(perch__conn_read_ready(c) && perch__load_u32(&r->state) == 0, 1)) {
		perch_vtask_complete(&r->vt, (uint32_t)cookie, 0);
		return;
	}
	reader_ready_slow(r, c, cookie);
}

int perch__pipe_reader_init(struct perch_pipe_reader **out, struct perch_conn *c)
{
	struct perch_pipe_reader *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->listener.on_parking = reader_parking;
	r->listener.on_recv_ready = reader_ready;
	r->c = c;
	perch_vtask_init(&r->vt);
	perch__conn_ref(c);
	*out = r;
	return 0;
}

int perch_pipe_reader_new(struct perch_conn *c, struct perch_pipe_reader **out)
{
	if (!c || !out)
		return -EINVAL;
	return perch__pipe_reader_init(out, c);
}

/* The hot path's one look at the reader: completed, or not. */
static bool reader_completed(struct perch_pipe_reader *r)
{
	return perch__load_u32(&r->state) & READER_COMPLETED;
}

int perch_pipe_read(struct perch_pipe_reader *r, struct perch_read_result *out,
		    struct perch_vtask_handle *task)
{
	if (!r || !out || !task || reader_completed(r))
		return -EINVAL;
	uint64_t token;
	int rc = perch__conn_park_read(r->c, &r->listener, out, &token);
	if (rc == PERCH_PENDING) {
		r->parked_token = (uint32_t)token;
		task->task = &r->vt;
		task->token = (uint32_t)token;
	}
	return rc;
}

/*
 * Parks with on_ready handed to the park's readying. Returns what the park
 * returned, and the token when the park registered on_ready itself (else
 * 0). A park served after it so readied the task leaves a version nobody
 * completes: retired here.
 */
static int park_handing_over(struct perch_pipe_reader *r, struct perch_read_result *out,
			     perch_vtask_fn on_ready, void *arg, uint64_t *token, uint32_t *registered)
{
	struct handoff h = { .r = r, .fn = on_ready, .arg = arg }, *outer = handing;
	handing = &h;
	int rc = perch__conn_park_read(r->c, &r->listener, out, token);
	handing = outer;
	*registered = h.token;
	if (*registered && rc != PERCH_PENDING)
		perch__vtask_retire(&r->vt, *registered);
	return rc;
}

int perch_pipe_read_or_wait(struct perch_pipe_reader *r, struct perch_read_result *out,
			    perch_vtask_fn on_ready, void *arg)
{
	if (!r || !out || !on_ready || reader_completed(r))
		return -EINVAL;
	for (;;) {
		uint64_t token;
		uint32_t registered;
		int rc = park_handing_over(r, out, on_ready, arg, &token, &registered);
		if (rc != PERCH_PENDING || registered)
			return rc; /* a registered park's reader is the continuation's now */
		r->parked_token = (uint32_t)token;
		rc = perch_vtask_on_complete((struct perch_vtask_handle){ &r->vt, (uint32_t)token }, on_ready, arg);
		if (rc != 0)
			return rc; /* PERCH_PENDING: on_ready carries on */
		/* Ready while registering: on_ready will not run; read again here, in this loop. */
	}
}

int perch_pipe_try_read(struct perch_pipe_reader *r, struct perch_read_result *out)
{
	if (!r || !out || reader_completed(r))
		return -EINVAL;
	return perch_conn_try_read(r->c, out);
}

int perch_pipe_advance_to(struct perch_pipe_reader *r, size_t consumed, size_t examined)
{
	/* A completed reader has no result left to advance: the connection refuses it. */
	if (!r)
		return -EINVAL;
	return perch_conn_advance(r->c, consumed, examined);
}

int perch_pipe_cancel_pending_read(struct perch_pipe_reader *r)
{
	if (!r)
		return -EINVAL;
	return perch_conn_cancel_read(r->c);
}

int perch_pipe_reader_complete(struct perch_pipe_reader *r)
{
	if (!r)
		return -EINVAL;
	/*
	 * The pipe's end before the reader's mark: a delivery that sees the
	 * mark discards too (reader_ready_slow), and the room any discard makes
	 * must fail a flush (waiting, or looking), not pass for a consume.
	 * Marking the end again is harmless.
	 */
	struct perch__mem_pipe *mem = perch__mem_pipe_of(r->c);
	if (mem)
		perch__mem_reader_completed(mem);
	if (perch__for_u32(&r->state, READER_COMPLETED) & READER_COMPLETED)
		return 0;
	/* A parked read is delivered (canceled) by this cancel, on this thread. */
	perch_conn_cancel_read(r->c);
	discard_all(r);
	return 0;
}

void perch_pipe_reader_free(struct perch_pipe_reader *r)
{
	if (!r)
		return;
	/* complete() may run a waiting read's continuation here, which may free the reader again. */
	if (perch__for_u32(&r->state, READER_FREEING) & READER_FREEING)
		return;
	perch_pipe_reader_complete(r);
	/*
	 * complete() took a parked read back; a delivery already under way on
	 * another thread is done with the reader once its completing CAS ran.
	 */
	unsigned spins = 0;
	while (reader_waiting(r))
		perch__spin_wait(&spins);
	perch__conn_unref(r->c);
	free(r);
}
