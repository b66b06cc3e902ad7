/* pipes/reader.c: the pipe reader, parked directly in the connection's read slot. */
#include "config.h"

#include <sched.h>
#include <stdlib.h>

#include "atomic.h"
#include "pipe_internal.h"

#define READER_OF(l, member) \
	((struct perch_pipe_reader *)((char *)(l) - offsetof(struct perch_pipe_reader, member)))

/* The connection is about to park this read: ready the one task the caller will await. */
static uint64_t reader_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	struct perch_pipe_reader *r = READER_OF(l, listener);
	r->token = perch_vtask_ready(&r->vt);
	return r->token;
}

/* Parking again from inside a delivery: the caller already waits on this version. */
static uint64_t reader_reparking(struct perch_recv_listener *l, struct perch_conn *c)
{
	return perch__load_u64(&READER_OF(l, repark)->repark_cookie);
}

static void discard_all(struct perch_pipe_reader *r)
{
	/* Busy only while another side holds the slot for a moment; a parked read is canceled first. */
	unsigned spins = 0;
	while (perch__conn_discard(r->c) != 0) {
		perch_conn_cancel_read(r->c);
		if (++spins % 64 == 0)
			sched_yield();
		else
			perch__cpu_relax();
	}
}

/*
 * The park's one delivery. Read here, on the delivering thread, so a wake
 * with nothing new parks again (same version) instead of waking the caller
 * to find nothing; the result waits in `delivered` for the caller's next
 * read. The task's completion is the last touch of the reader: its
 * continuation may free it.
 */
static void reader_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	struct perch_pipe_reader *r = READER_OF(l, listener);
	if (perch__load_u32(&r->completed)) {
		discard_all(r);
		perch_vtask_complete(&r->vt, (uint32_t)cookie, -ECANCELED);
		return;
	}
	perch__store_u64(&r->repark_cookie, cookie);
	int rc = perch_conn_try_read_or_park(c, &r->repark, &r->delivered);
	if (rc == PERCH_PENDING)
		return;
	if (rc == 0)
		perch__store_u32(&r->has_delivered, 1);
	perch_vtask_complete(&r->vt, (uint32_t)cookie, rc);
}

static void reader_reready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	reader_ready(&READER_OF(l, repark)->listener, c, cookie);
}

int perch__pipe_reader_init(struct perch_pipe_reader **out, struct perch_conn *c,
			    struct perch__mem_pipe *mem)
{
	struct perch_pipe_reader *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->listener.on_parking = reader_parking;
	r->listener.on_recv_ready = reader_ready;
	r->repark.on_parking = reader_reparking;
	r->repark.on_recv_ready = reader_reready;
	r->c = c;
	r->mem = mem;
	perch_vtask_init(&r->vt);
	perch__conn_ref(c);
	*out = r;
	return 0;
}

int perch_pipe_reader_new(struct perch_conn *c, struct perch_pipe_reader **out)
{
	if (!c || !out)
		return -EINVAL;
	return perch__pipe_reader_init(out, c, NULL);
}

/* A result a delivery already read for the caller, if one waits. */
static bool take_delivered(struct perch_pipe_reader *r, struct perch_read_result *out)
{
	if (!perch__load_u32(&r->has_delivered))
		return false;
	*out = r->delivered;
	perch__store_u32(&r->has_delivered, 0);
	return true;
}

int perch_pipe_read(struct perch_pipe_reader *r, struct perch_read_result *out,
		    struct perch_vtask_handle *task)
{
	if (!r || !out || !task || perch__load_u32(&r->completed))
		return -EINVAL;
	if (take_delivered(r, out))
		return 0;
	int rc = perch_conn_try_read_or_park(r->c, &r->listener, out);
	if (rc == PERCH_PENDING) {
		task->task = &r->vt;
		task->token = r->token;
	}
	return rc;
}

int perch_pipe_try_read(struct perch_pipe_reader *r, struct perch_read_result *out)
{
	if (!r || !out || perch__load_u32(&r->completed))
		return -EINVAL;
	if (take_delivered(r, out))
		return 0;
	return perch_conn_try_read(r->c, out);
}

int perch_pipe_advance_to(struct perch_pipe_reader *r, size_t consumed, size_t examined)
{
	if (!r || perch__load_u32(&r->completed))
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
	if (perch__xchg_u32(&r->completed, 1))
		return 0;
	/* First, so the room the discard makes fails a waiting flush instead of completing it. */
	if (r->mem)
		perch__mem_reader_completed(r->mem);
	/* A parked read is delivered (canceled) by this cancel, on this thread. */
	perch_conn_cancel_read(r->c);
	discard_all(r);
	perch__store_u32(&r->has_delivered, 0);
	return 0;
}

void perch_pipe_reader_free(struct perch_pipe_reader *r)
{
	if (!r)
		return;
	perch_pipe_reader_complete(r);
	perch__conn_unref(r->c);
	free(r);
}
