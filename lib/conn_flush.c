/* lib/conn_flush.c: the flush arm, whole: the park (doc/protocol.md's steps), its completion, shutdown, and the writer's flush calls. */
#include "config.h"

#include <errno.h>

#include "conn_core.h"
#include "vtask_internal.h"

/* ================= the completion ================= */

/*
 * In this order: disarm (only the side that saw the arm continues), take
 * the listener, release the guard, then signal. Releasing the guard first
 * would let a new flush be taken while this one is still armed, and be
 * signalled in its place.
 */
void perch__flush_complete(struct perch_conn *c, int result)
{
	/* Whatever this completion published (closed, an error) is ordered before the disarm. */
	perch__fence_rmw_then_load();
	if (perch__xchg_u32(&c->flush_armed, 0) == 0)
		return;
	struct perch_flush_listener *l = perch__xchg_ptr(&c->flush_listener, NULL);
	PERCH_ASSERT(l != NULL); /* stored before the arm that this disarm took */
	uint64_t cookie = perch__load_u64(&c->flush_cookie); /* before the guard lets a new flush store its own */
	void (*done)(struct perch_flush_listener *, struct perch_conn *, uint64_t, int) =
		l->on_flush_done;
	perch__store_u32(&c->flush_busy, 0);
	done(l, c, cookie, result);
}

void perch__conn_send_done(struct perch_conn *c, struct perch__txbuf *chain, int result)
{
	perch__chain_free(c, chain);
	/* After a close, the close already delivered: this disarms nothing. */
	perch__flush_complete(c, result);
	perch__conn_unref(c);
}

/* ================= the park ================= */

/*
 * A close landed after step 3's check but maybe before the arm: whoever
 * disarms delivers. If we do, the caller gets -EPIPE now, unsignalled; if
 * the close did, it has signalled -EPIPE and the flush is PERCH_PENDING.
 * Either way the chain and the send's reference are ours to drop, and the
 * connection is not touched after that reference goes.
 */
static int flush_closed_while_arming(struct perch_conn *c, struct perch__txbuf *chain)
{
	int rc = PERCH_PENDING;
	perch__chain_free(c, chain);
	if (perch__xchg_u32(&c->flush_armed, 0) != 0) {
		struct perch_flush_listener *l = perch__xchg_ptr(&c->flush_listener, NULL);
		/* The conn's own task: the version this park readied is nobody's; ended while the conn is held. */
		if (l == &perch__conn_self_flusher)
			perch_vtask_complete(&c->own_tasks->flush_task,
					     (uint32_t)perch__load_u64(&c->flush_cookie), -EPIPE);
		perch__store_u32(&c->flush_busy, 0);
		rc = -EPIPE;
	}
	perch__conn_unref(c);
	return rc;
}

int perch__conn_park_flush(struct perch_conn *c, struct perch_flush_listener *listener,
			   uint64_t *cookie_out)
{
	/* 1. The guard; a refused flush leaves the parked one untouched. */
	if (!perch__cas_u32(&c->flush_busy, 0, 1))
		return -EBUSY;
	/* 2. Nothing staged: an earlier flush's result stays readable. */
	if (c->staged_len == 0) {
		perch__store_u32(&c->flush_busy, 0);
		return 0;
	}
	/*
	 * 3. Closed, or shut (bytes committed after the end cannot follow it):
	 * a send the kernel still holds keeps its own chain until it completes.
	 */
	if (perch__tx_is_ended(c)) {
		perch__stage_drop(c);
		perch__store_u32(&c->flush_busy, 0);
		return -EPIPE;
	}
	/*
	 * Before anything is published, take the chain and the send's
	 * reference: once armed, a close may release the guard and signal, and
	 * the listener may stage, flush or release the connection at once.
	 * From the arm on, this call touches only its own chain and reference.
	 */
	struct perch__txbuf *chain = perch__stage_take(c);
	perch__conn_ref(c);
	/* 4. Ready, store the listener, then the arm that publishes it: an exchange, fenced before the re-check of `closed`. */
	*cookie_out = listener->on_parking(listener, c);
	perch__store_u64(&c->flush_cookie, *cookie_out);
	perch__store_ptr(&c->flush_listener, listener);
	uint32_t was_armed = perch__xchg_u32(&c->flush_armed, 1);
	PERCH_ASSERT(was_armed == 0); /* under the guard, the last completion disarmed */
	(void)was_armed;
	perch__fence_rmw_then_load();
	if (perch__tx_is_closed(c))
		return flush_closed_while_arming(c, chain);
	/* 5. Hand the chain over: it lives until perch__conn_send_done, and so does the connection. */
	c->ops->send(c, chain);
	return PERCH_PENDING;
}

/* ================= public calls: one writer, any thread ================= */

int perch_conn_try_flush_or_park(struct perch_conn *c, struct perch_flush_listener *listener)
{
	if (!c || !listener || !listener->on_parking || !listener->on_flush_done)
		return -EINVAL;
	uint64_t cookie;
	return perch__conn_park_flush(c, listener, &cookie);
}

int perch_conn_flush(struct perch_conn *c, struct perch_vtask_handle *task)
{
	if (!c || !task)
		return -EINVAL;
	struct perch__conn_tasks *own = perch__conn_tasks(c);
	if (!own)
		return -ENOMEM;
	/*
	 * The completion lets the guard go before it signals: a flush in that
	 * gap would ready a new version of the one task over the version its
	 * caller still waits on. Pending means still waiting, or still being
	 * signalled; the continuation flushing again finds it complete.
	 */
	if (perch__vtask_current_pending(&own->flush_task))
		return -EBUSY;
	uint64_t token;
	int rc = perch__conn_park_flush(c, &perch__conn_self_flusher, &token);
	if (rc == PERCH_PENDING) {
		task->task = &own->flush_task;
		task->token = (uint32_t)token;
	}
	return rc;
}

/*
 * Under the flush guard no flush can stage or take bytes, and the last
 * send has completed (the guard outlives it): the end goes after every
 * byte sent, and a second call finds tx_shut set.
 */
int perch_conn_shutdown(struct perch_conn *c)
{
	if (!c)
		return -EINVAL;
	if (!c->ops->shutdown)
		return -EOPNOTSUPP;
	if (!perch__cas_u32(&c->flush_busy, 0, 1))
		return -EBUSY;
	int rc = 0;
	if (perch__tx_is_closed(c)) {
		rc = -EPIPE;
	} else if (c->staged_len) {
		rc = -EBUSY;
	} else if (!c->tx_shut) {
		c->tx_shut = true;
		c->ops->shutdown(c);
	}
	perch__store_u32(&c->flush_busy, 0);
	return rc;
}
