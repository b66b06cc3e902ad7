/* pipes/writer.c: the pipe writer: zero-copy staging on the connection, its flush parked in the flush arm. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "pipe_internal.h"

#define WRITER_OF(l) ((struct perch_pipe_writer *)(l))

/* The connection is about to park this flush: ready the one task the caller will await. */
static uint64_t writer_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	struct perch_pipe_writer *w = WRITER_OF(l);
	uint32_t token = perch_vtask_ready(&w->vt);
	perch__store_u32(&w->token, token);
	return token;
}

/* Completes the version the park readied (a canceled one stays canceled): the last touch of w. */
static void writer_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie,
			int result)
{
	perch_vtask_complete(&WRITER_OF(l)->vt, (uint32_t)cookie, result);
}

int perch__pipe_writer_init(struct perch_pipe_writer **out, struct perch_conn *c,
			    struct perch__mem_pipe *mem)
{
	struct perch_pipe_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->listener.on_parking = writer_parking;
	w->listener.on_flush_done = writer_done;
	w->c = c;
	w->mem = mem;
	perch_vtask_init(&w->vt);
	perch__conn_ref(c);
	*out = w;
	return 0;
}

int perch_pipe_writer_new(struct perch_conn *c, struct perch_pipe_writer **out)
{
	if (!c || !out)
		return -EINVAL;
	return perch__pipe_writer_init(out, c, NULL);
}

static bool writer_usable(struct perch_pipe_writer *w)
{
	return w && !perch__load_u32(&w->completed);
}

int perch_pipe_get_buffer(struct perch_pipe_writer *w, size_t size_hint, uint8_t **buf,
			  size_t *len)
{
	if (!writer_usable(w) || !buf || !len)
		return -EINVAL;
	int refused = w->mem ? perch__mem_write_refusal(w->mem) : 0;
	if (refused)
		return refused;
	return perch__conn_stage_buffer(w->c, size_hint, buf, len);
}

int perch_pipe_advance(struct perch_pipe_writer *w, size_t n)
{
	if (!writer_usable(w))
		return -EINVAL;
	int refused = w->mem ? perch__mem_write_refusal(w->mem) : 0;
	if (refused)
		return refused;
	return perch__conn_stage_commit(w->c, n);
}

int perch_pipe_write(struct perch_pipe_writer *w, const void *data, size_t len)
{
	if (!writer_usable(w))
		return -EINVAL;
	int refused = w->mem ? perch__mem_write_refusal(w->mem) : 0;
	if (refused)
		return refused;
	/* The conn's copying write stages exactly as get_buffer + advance would. */
	return perch_conn_write(w->c, data, len);
}

int perch_pipe_flush(struct perch_pipe_writer *w, struct perch_vtask_handle *task)
{
	if (!writer_usable(w) || !task)
		return -EINVAL;
	if (w->mem)
		return perch__mem_flush(w, task);
	if (perch__xchg_u32(&w->cancel, 0))
		return -ECANCELED;
	uint64_t token;
	int rc = perch__conn_park_flush(w->c, &w->listener, &token);
	if (rc == PERCH_PENDING) {
		task->task = &w->vt;
		task->token = (uint32_t)token;
	}
	return rc;
}

int perch_pipe_cancel_pending_flush(struct perch_pipe_writer *w)
{
	if (!w)
		return -EINVAL;
	if (w->mem) {
		if (perch__mem_wake_flush(w->mem, -ECANCELED))
			return 0;
	} else {
		uint32_t token = perch__load_u32(&w->token);
		/* A version still pending is the waiting flush's; a completed one means none waits. */
		if (token && perch_vtask_complete(&w->vt, token, -ECANCELED) == 0)
			return 0;
	}
	perch__store_u32(&w->cancel, 1);
	return 0;
}

int perch_pipe_writer_complete(struct perch_pipe_writer *w)
{
	if (!w)
		return -EINVAL;
	if (perch__xchg_u32(&w->completed, 1))
		return 0;
	if (w->mem) {
		perch__mem_writer_completed(w);
	} else {
		/* Staged bytes are the writer's alone (a flush in progress took its own). */
		size_t len;
		perch__conn_free_chain(perch__conn_take_staged(w->c, &len));
	}
	return 0;
}

void perch_pipe_writer_free(struct perch_pipe_writer *w)
{
	if (!w)
		return;
	perch_pipe_writer_complete(w);
	perch__conn_unref(w->c);
	free(w);
}
