/* lib/conn_core.h: what the connection core's own files share: the state queries, the slot claim, the segment fifo, staging. */
#ifndef PERCH_LIB_CONN_CORE_H
#define PERCH_LIB_CONN_CORE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "atomic.h"
#include "conn_internal.h"
#include "invariant.h"

/* ---- state ---- */

static inline uint32_t perch__rx_flags(const struct perch_conn *c)
{
	return perch__load_u32(&c->rx_flags);
}

/* Closed locally or failed: no byte will be sent again. */
static inline bool perch__tx_is_closed(const struct perch_conn *c)
{
	return (perch__rx_flags(c) & (PERCH__RX_CLOSED | PERCH__RX_ERROR)) != 0;
}

/* Closed, or shut by its writer: nothing more may be staged (the writer's own calls). */
static inline bool perch__tx_is_ended(const struct perch_conn *c)
{
	return c->tx_shut || perch__tx_is_closed(c);
}

/*
 * The writer's guard for staging: 0, -EBUSY while a flush is in progress
 * (its chain is being sent), -EPIPE once the write side ended.
 */
static inline int perch__writer_may_stage(const struct perch_conn *c)
{
	if (perch__load_u32(&c->flush_busy))
		return -EBUSY;
	return perch__tx_is_ended(c) ? -EPIPE : 0;
}

/* ---- the read slot's claim (lib/conn_read.c has the protocol) ---- */

/*
 * Claims the read slot for a call that touches only the reader-private
 * state (advance, forward): false when another read owns it. No fence:
 * such a call decides nothing from what completions publish, so it has no
 * store-load pair to order.
 */
static inline bool perch__slot_claim(struct perch_conn *c)
{
	return perch__cas_uptr(&c->read_waiter, PERCH__SLOT_EMPTY, PERCH__SLOT_CLAIM);
}

/*
 * Claims the slot for a call that then looks at what completions publish
 * (rx_total, rx_flags, rd_cancel): the fence orders the claim before those
 * loads, pairing with wake_reader's fence after a completion's update, so
 * one of the two sides always sees the other.
 */
static inline bool perch__slot_claim_to_recheck(struct perch_conn *c)
{
	if (!perch__slot_claim(c))
		return false;
	perch__fence_rmw_then_load();
	return true;
}

/*
 * Gives the claim back. An exchange, not a store: a completion may have
 * marked the claim meanwhile, and the read-modify-write keeps the chain of
 * release/acquire from that completion unbroken.
 */
static inline void perch__slot_release(struct perch_conn *c)
{
	uintptr_t was = perch__xchg_uptr(&c->read_waiter, PERCH__SLOT_EMPTY);
	PERCH_ASSERT(was == PERCH__SLOT_CLAIM || was == PERCH__SLOT_CLAIM_MARKED);
	(void)was;
}

/* ---- the received-segment fifo: the backend enqueues, the claim holder dequeues ---- */

/*
 * ck_fifo_spsc's algorithm on lib/atomic.h, so TSan and the scheduler see
 * every step. The producer fills an entry and publishes it as the tail's
 * next; the consumer takes the stub's next as the new stub; the producer
 * reuses entries the consumer has passed, oldest first.
 */
static inline void perch__fifo_init(struct perch_conn *c)
{
	/* As if one entry had passed: rx_first[0] spent, to reuse, and [1] the stub. */
	struct perch__rx_entry *spent = &c->rx_first[0], *stub = &c->rx_first[1];
	stub->next = NULL;
	spent->next = stub;
	c->rx_garbage = spent;
	c->rd_fifo_head = c->rx_tail = c->rx_head_seen = stub;
}

/* Whether a fifo entry is one of the connection's own, not malloc'd. */
static inline bool perch__fifo_entry_own(const struct perch_conn *c, const struct perch__rx_entry *e)
{
	return e == &c->rx_first[0] || e == &c->rx_first[1];
}

/* Producer. */
static inline void perch__fifo_enqueue(struct perch_conn *c, struct perch__rx_entry *entry, void *value)
{
	entry->value = value;
	entry->next = NULL;
	perch__store_ptr((void **)&c->rx_tail->next, entry);
	c->rx_tail = entry;
}

/* Consumer: false when empty. */
static inline bool perch__fifo_dequeue(struct perch_conn *c, void *value)
{
	struct perch__rx_entry *entry = perch__load_ptr((void *const *)&c->rd_fifo_head->next);
	if (!entry)
		return false;
	*(void **)value = entry->value;
	perch__store_ptr((void **)&c->rd_fifo_head, entry);
	return true;
}

/* Producer: a spent entry to reuse, or NULL when the consumer has passed none. */
static inline struct perch__rx_entry *perch__fifo_recycle(struct perch_conn *c)
{
	if (c->rx_head_seen == c->rx_garbage) {
		c->rx_head_seen = perch__load_ptr((void *const *)&c->rd_fifo_head);
		if (c->rx_head_seen == c->rx_garbage)
			return NULL;
	}
	struct perch__rx_entry *garbage = c->rx_garbage;
	c->rx_garbage = garbage->next;
	return garbage;
}

/* ---- received segments and the reader's queue (lib/conn_read.c) ---- */

/* A segment goes back to its owner (the loop's pool, the in-memory pipe), or is freed if it is the conn's. */
static inline void perch__seg_give_back(const struct perch__transport_ops *ops, struct perch_seg *seg)
{
	seg->next = NULL;
	if (seg->buf_id == PERCH__SEG_OWN)
		free(seg);
	else
		ops->release_seg(seg);
}

static inline void perch__seg_release(struct perch_conn *c, struct perch_seg *seg)
{
	perch__seg_give_back(c->ops, seg);
}

/* Whether the last result (the claim holder's) has room for this advance. */
static inline bool perch__advance_fits(const struct perch_conn *c, size_t consumed, size_t examined)
{
	return c->rd_have_result && consumed <= examined && examined <= c->rd_result_len &&
	       c->rd_result_base + examined >= c->rd_examined;
}

/*
 * Under the claim: ends the last result; returns the whole segments the
 * consumed bytes covered. When the reader examined all it was shown and
 * what is left is a short tail (c->compact_max) in the transport's
 * buffers, or a tail spread thin over several, the tail moves to a
 * segment of the transport's own memory (ops->tail_seg), sized to it,
 * and *given_up gets the buffers it left (else NULL): both lists go back
 * once the claim is let go.
 */
struct perch_seg *perch__read_end_result(struct perch_conn *c, size_t consumed, size_t examined,
					 struct perch_seg **given_up);
/* Gives back a list of segments (after the claim is let go). */
void perch__segs_release(struct perch_conn *c, struct perch_seg *seg);
/* Moves what the backend queued onto the reader's private list (under the claim, or at destroy). */
void perch__read_drain_fifo(struct perch_conn *c);
/* The completion side of the slot, after a read-modify-write published new state. Any thread. */
void perch__read_wake(struct perch_conn *c);

/* ---- staged output (lib/conn_stage.c) ---- */

/*
 * Whose lent bytes are, kept in the data of the buffer that lends them to
 * a send: a received segment (a forward: `seg`, given back through `ops`),
 * or the caller's memory (a referenced write: `release` set).
 */
struct perch__lent_seg {
	const struct perch__transport_ops *ops;
	struct perch_seg *seg;
	perch_release_fn release;
	void *arg;
	const void *data;
	size_t len;
};

/* A lent segment's buffer points into the segment, not at its own data. */
static inline bool perch__txbuf_is_lent(const struct perch__txbuf *b)
{
	return b->bytes != b->data;
}

/* Appends the chain head..tail (`len` bytes) to the writer's staged list. */
static inline void perch__stage_append(struct perch_conn *c, struct perch__txbuf *head,
				       struct perch__txbuf *tail, size_t len)
{
	if (c->staged_tail)
		c->staged_tail->next = head;
	else
		c->staged_head = head;
	c->staged_tail = tail;
	c->staged_len += len;
}

/* Takes the whole staged chain from the writer's list. */
static inline struct perch__txbuf *perch__stage_take(struct perch_conn *c)
{
	struct perch__txbuf *chain = c->staged_head;
	c->staged_head = c->staged_tail = NULL;
	c->staged_len = 0;
	return chain;
}

/* Frees a chain, pooled buffers offered back to the transport's pool (it has one). */
void perch__chain_give_back(struct perch_conn *c, struct perch__txbuf *b);

/* Frees a chain: pooled buffers back to the transport's pool, lent segments to their owners. */
static inline void perch__chain_free(struct perch_conn *c, struct perch__txbuf *b)
{
	if (c->ops->txbuf_put)
		perch__chain_give_back(c, b);
	else
		perch__conn_free_chain(b);
}

/* Drops everything staged (a flush after the end, or the last reference gone). */
static inline void perch__stage_drop(struct perch_conn *c)
{
	perch__chain_free(c, perch__stage_take(c));
}
/*
 * A staging buffer with `room` contiguous bytes for a write of `want`: the
 * transport's pooled one when it fits and it lends one, else a new one.
 */
struct perch__txbuf *perch__txbuf_alloc(struct perch_conn *c, size_t room, size_t want);

/* ---- the flush arm (lib/conn_flush.c) ---- */

/* The flush completion: disarm, take the listener, release the guard, then signal `result`. */
void perch__flush_complete(struct perch_conn *c, int result);

#endif /* PERCH_LIB_CONN_CORE_H */
