/* lib/conn_read.c: the read waiter slot, whole: the park (doc/protocol.md's steps), its completion, and the reader's calls. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn_core.h"

/* ================= the reader's queue (the claim holder's) ================= */

void perch__read_drain_fifo(struct perch_conn *c)
{
	struct perch_seg *seg;
	while (perch__fifo_dequeue(c, &seg)) {
		seg->next = NULL;
		if (c->rd_tail)
			c->rd_tail->next = seg;
		else
			c->rd_head = seg;
		c->rd_tail = seg;
		c->rd_drained += seg->len;
	}
}

static void fill_result(struct perch_conn *c, struct perch_read_result *out)
{
	/* Flags first: every byte queued before a FIN or an error is in the fifo by then. */
	uint32_t flags = perch__rx_flags(c);
	perch__read_drain_fifo(c);
	out->first = c->rd_head;
	out->first_off = c->rd_head_off;
	PERCH_ASSERT(c->rd_drained >= c->rd_consumed);
	out->len = (size_t)(c->rd_drained - c->rd_consumed);
	out->completed = (flags & PERCH__RX_PEER_FIN) != 0;
	out->error = (flags & PERCH__RX_ERROR) ? perch__load_u32((uint32_t *)&c->rx_error) : 0;
	out->closed = (flags & PERCH__RX_CLOSED) != 0;
	/* A load first: cancels are rare, and this runs for every result. */
	out->canceled = perch__load_u32(&c->rd_cancel) != 0 && perch__xchg_u32(&c->rd_cancel, 0) != 0;
	c->rd_result_base = c->rd_consumed;
	c->rd_result_len = out->len;
	c->rd_have_result = true;
}

/* Serves a read under the claim: fills *out (none: the caller reads later), lets the claim go. */
static int serve_claimed(struct perch_conn *c, struct perch_read_result *out)
{
	if (out)
		fill_result(c, out);
	perch__slot_release(c);
	return 0;
}

/* ================= the park ================= */

int perch__conn_park_read(struct perch_conn *c, struct perch_recv_listener *listener,
			  struct perch_read_result *out, uint64_t *cookie_out)
{
	/* 1. Claim. Failing means another read owns the slot: touch nothing. */
	if (!perch__slot_claim_to_recheck(c))
		return -EBUSY;
	/* 2. Re-check under the claim: a completion before the claim left no mark. */
	if (perch__conn_read_ready(c))
		return serve_claimed(c, out);
	/* 3. Ready the listener: only here, past every guard, when the read is about to park. */
	c->rd_have_result = false;
	*cookie_out = listener->on_parking(listener, c);
	perch__store_u64(&c->read_cookie, *cookie_out);
	/* 4. Publish. Pairs with the CAS in perch__read_wake that takes a published listener back. */
	while (!perch__cas_uptr(&c->read_waiter, PERCH__SLOT_CLAIM, (uintptr_t)listener)) {
		/*
		 * The claim was marked: usually by a completion during step 3, but
		 * one that loaded an earlier claim (since served and given back)
		 * can mark this one with nothing new. So clear the mark and look
		 * again: serve what is there, or publish again.
		 */
		uintptr_t was = perch__xchg_uptr(&c->read_waiter, PERCH__SLOT_CLAIM);
		PERCH_ASSERT(was == PERCH__SLOT_CLAIM_MARKED); /* only a completion's mark replaces a claim */
		(void)was;
		perch__fence_rmw_then_load();
		if (perch__conn_read_ready(c))
			return serve_claimed(c, out);
	}
	return PERCH_PENDING;
}

/* ================= the completion ================= */

/*
 * On whichever thread changed the state (with a read-modify-write, before
 * this). Only the side whose CAS takes a published listener back delivers.
 */
void perch__read_wake(struct perch_conn *c)
{
	perch__fence_rmw_then_load();
	for (;;) {
		uintptr_t w = perch__load_uptr(&c->read_waiter);
		/* One of the four marks, or a parked listener (aligned, so never one of them). */
		PERCH_ASSERT(w <= PERCH__SLOT_DELIVERING || w % _Alignof(struct perch_recv_listener) == 0);
		/* DELIVERING: the side handing the park over delivers after our state was published. */
		if (w == PERCH__SLOT_EMPTY || w == PERCH__SLOT_CLAIM_MARKED || w == PERCH__SLOT_DELIVERING)
			return;
		if (w == PERCH__SLOT_CLAIM) {
			/* The claiming read will serve. If the CAS fails the claim was published or released: look again. */
			if (perch__cas_uptr(&c->read_waiter, PERCH__SLOT_CLAIM, PERCH__SLOT_CLAIM_MARKED))
				return;
			continue;
		}
		/*
		 * A failed CAS means another side took this listener back and
		 * delivers; it reads our state after. The winner holds the slot
		 * as DELIVERING while it reads the park's cookie (no new park can
		 * overwrite it then), and frees the slot before the callback, which
		 * may park again.
		 */
		if (perch__cas_uptr(&c->read_waiter, w, PERCH__SLOT_DELIVERING)) {
			struct perch_recv_listener *l = (struct perch_recv_listener *)w;
			uint64_t cookie = perch__load_u64(&c->read_cookie);
			void (*ready)(struct perch_recv_listener *, struct perch_conn *, uint64_t) =
				l->on_recv_ready;
			uintptr_t was = perch__xchg_uptr(&c->read_waiter, PERCH__SLOT_EMPTY);
			PERCH_ASSERT(was == PERCH__SLOT_DELIVERING); /* nobody else writes a slot being delivered */
			(void)was;
			ready(l, c, cookie);
		}
		return;
	}
}

int perch__conn_recv_arrived(struct perch_conn *c, struct perch_seg *seg)
{
	/* An empty segment would mark a claim with nothing to show, and could do so forever. */
	uint32_t len = seg->len;
	if (len == 0)
		return -EINVAL;
	struct perch__rx_entry *entry = perch__fifo_recycle(c);
	if (!entry) {
		entry = malloc(sizeof(*entry));
		if (!entry)
			return -ENOMEM;
	}
	/*
	 * Once enqueued the segment is the reader's, who may release it at once
	 * (the in-memory pipe's reader frees it on its own thread): its length
	 * was read before.
	 */
	perch__fifo_enqueue(c, entry, seg);
	/* A read-modify-write, so the count is visible before we look at the slot. */
	perch__faa_u64(&c->rx_total, len);
	perch__read_wake(c);
	return 0;
}

void perch__conn_peer_closed(struct perch_conn *c)
{
	perch__for_u32(&c->rx_flags, PERCH__RX_PEER_FIN);
	perch__read_wake(c);
}

void perch__conn_wake_reader(struct perch_conn *c)
{
	perch__read_wake(c);
}

/* ================= consuming ================= */

/*
 * Drops `n` consumed bytes from the head of the reader's list and returns
 * the whole segments they covered, for release_segs once the claim is let
 * go: a transport's release may run code (an in-memory pipe wakes its
 * writer) that must not find the slot still claimed.
 */
static struct perch_seg *consume_bytes(struct perch_conn *c, uint64_t n)
{
	PERCH_ASSERT(n <= c->rd_drained - c->rd_consumed); /* never more than was drained */
	struct perch_seg *done = NULL, **tail = &done;
	while (n > 0 && c->rd_head) {
		struct perch_seg *seg = c->rd_head;
		uint64_t left = seg->len - c->rd_head_off;
		if (n < left) {
			c->rd_head_off += n;
			break;
		}
		n -= left;
		c->rd_head = seg->next;
		if (!c->rd_head)
			c->rd_tail = NULL;
		c->rd_head_off = 0;
		*tail = seg;
		tail = &seg->next;
	}
	*tail = NULL;
	return done;
}

void perch__segs_release(struct perch_conn *c, struct perch_seg *seg)
{
	while (seg) {
		struct perch_seg *next = seg->next;
		perch__seg_release(c, seg);
		seg = next;
	}
}

/* The receive buffers (the transport's pool, not its own memory) in the reader's list. */
static uint64_t transport_buffers(const struct perch_conn *c)
{
	uint64_t n = 0;
	for (const struct perch_seg *seg = c->rd_head; seg; seg = seg->next)
		n += seg->buf_id != PERCH__SEG_OWN && seg->buf_id != PERCH__SEG_HEAP;
	return n;
}

/*
 * A peer that sends the start of a message and goes quiet would otherwise
 * keep a whole receive buffer (16 KiB of the loop's pool) for a few bytes,
 * and one that sends it a few bytes a segment would keep a buffer per
 * segment: with enough such peers no connection of the loop could
 * receive, and the loop's per-connection bound on buffers would leave the
 * reader waiting for bytes it cannot get. So a waiting tail of at most
 * compact_max bytes, or spread over several buffers at most half full, is
 * copied into one segment of the transport's own. A copy per wait: for a
 * tail of several buffers, at most about half a buffer per byte received.
 * Returns the buffers given up (NULL: the list stays as it was).
 */
static struct perch_seg *compact_tail(struct perch_conn *c)
{
	uint64_t left = c->rd_drained - c->rd_consumed;
	if (left == 0 || c->compact_max == 0 || !c->ops->tail_seg)
		return NULL;
	uint64_t bufs = transport_buffers(c);
	if (bufs == 0 || left > (uint64_t)c->compact_max * (bufs >= 2 ? 2 * bufs : 1))
		return NULL;
	struct perch_seg *own = c->ops->tail_seg(c->rd_head, left);
	if (!own)
		return NULL; /* the tail stays where it is: nothing lost */
	PERCH_ASSERT(own->len == left && !own->next);
	size_t at = 0, off = c->rd_head_off;
	for (struct perch_seg *seg = c->rd_head; seg; seg = seg->next, off = 0) {
		memcpy(own->data + at, seg->data + off, seg->len - off);
		at += seg->len - off;
	}
	PERCH_ASSERT(at == left); /* the list holds exactly the unconsumed bytes */
	struct perch_seg *given_up = c->rd_head;
	c->rd_head = c->rd_tail = own;
	c->rd_head_off = 0;
	return given_up;
}

struct perch_seg *perch__read_end_result(struct perch_conn *c, size_t consumed, size_t examined,
					 struct perch_seg **given_up)
{
	/* The reader saw all it was shown: it waits for more, with what is left. */
	bool waits = examined == c->rd_result_len;
	struct perch_seg *done = consume_bytes(c, consumed);
	c->rd_consumed = c->rd_result_base + consumed;
	perch__store_u64(&c->rd_examined, c->rd_result_base + examined);
	c->rd_have_result = false;
	*given_up = waits ? compact_tail(c) : NULL;
	return done;
}

/* After the claim is let go: the segments go back, the transport hears how much was consumed. */
static inline void consumed(struct perch_conn *c, struct perch_seg *done, uint64_t n)
{
	perch__segs_release(c, done);
	if (n > 0 && c->ops->consumed)
		c->ops->consumed(c, n);
}

/* ================= public calls: one reader, any thread ================= */

int perch_conn_try_read_or_park(struct perch_conn *c, struct perch_recv_listener *listener,
				struct perch_read_result *out)
{
	if (!c || !listener || !out || !listener->on_parking || !listener->on_recv_ready)
		return -EINVAL;
	uint64_t cookie;
	return perch__conn_park_read(c, listener, out, &cookie);
}

int perch_conn_try_read(struct perch_conn *c, struct perch_read_result *out)
{
	if (!c || !out)
		return -EINVAL;
	if (!perch__slot_claim_to_recheck(c))
		return -EBUSY;
	int rc = -EAGAIN;
	if (perch__conn_read_ready(c)) {
		fill_result(c, out);
		rc = 0;
	}
	perch__slot_release(c);
	return rc;
}

int perch_conn_read(struct perch_conn *c, struct perch_read_result *out,
		    struct perch_vtask_handle *task)
{
	if (!c || !out || !task)
		return -EINVAL;
	struct perch__conn_tasks *own = perch__conn_tasks(c);
	if (!own)
		return -ENOMEM;
	uint64_t token;
	int rc = perch__conn_park_read(c, &perch__conn_self_reader, out, &token);
	if (rc == PERCH_PENDING) {
		task->task = &own->read_task;
		task->token = (uint32_t)token;
	}
	return rc;
}

/* Under the claim: the reader-private queue is never touched by two calls, nor while a read is parked. */
int perch_conn_advance(struct perch_conn *c, size_t consumed_bytes, size_t examined)
{
	if (!c)
		return -EINVAL;
	if (!perch__slot_claim(c))
		return -EBUSY;
	if (!perch__advance_fits(c, consumed_bytes, examined)) {
		perch__slot_release(c);
		return -EINVAL;
	}
	struct perch_seg *given_up;
	struct perch_seg *done = perch__read_end_result(c, consumed_bytes, examined, &given_up);
	perch__slot_release(c);
	consumed(c, done, consumed_bytes);
	perch__segs_release(c, given_up);
	return 0;
}

int perch_conn_cancel_read(struct perch_conn *c)
{
	if (!c)
		return -EINVAL;
	perch__xchg_u32(&c->rd_cancel, 1);
	perch__read_wake(c);
	return 0;
}

int perch__conn_discard(struct perch_conn *c)
{
	if (!perch__slot_claim_to_recheck(c))
		return -EBUSY;
	perch__read_drain_fifo(c);
	uint64_t n = c->rd_drained - c->rd_consumed;
	struct perch_seg *done = consume_bytes(c, n);
	c->rd_consumed = c->rd_drained;
	perch__store_u64(&c->rd_examined, c->rd_drained);
	c->rd_have_result = false;
	perch__slot_release(c);
	consumed(c, done, n);
	return 0;
}
