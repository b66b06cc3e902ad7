/* lib/conn.c: the transport-agnostic connection core: received-segment queue, read slot, flush arm. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "conn_internal.h"
#include "vtask_internal.h"

static uint64_t self_read_parking(struct perch_recv_listener *l, struct perch_conn *c);
static void self_read_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie);
static uint64_t self_flush_parking(struct perch_flush_listener *l, struct perch_conn *c);
static void self_flush_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie,
			    int result);

/* ================= state ================= */

static uint32_t rx_flags(const struct perch_conn *c)
{
	return perch__load_u32(&c->rx_flags);
}

static bool tx_is_closed(const struct perch_conn *c)
{
	return (rx_flags(c) & (PERCH__RX_CLOSED | PERCH__RX_ERROR)) != 0;
}

/* Closed, or shut by its writer: nothing more may be staged (the writer's own calls). */
static bool tx_is_ended(const struct perch_conn *c)
{
	return c->tx_shut || tx_is_closed(c);
}

/* ================= the received-segment fifo ================= */

/*
 * ck_fifo_spsc: the backend enqueues, the claim holder dequeues. Its
 * enqueue writes the entry and publishes it with ck_pr inline assembly,
 * which TSan cannot see (and no annotation fits between the two); under
 * TSan the same algorithm runs on the builtins lib/atomic.h maps to.
 */
#ifdef PERCH_TSAN
static void fifo_enqueue(ck_fifo_spsc_t *f, ck_fifo_spsc_entry_t *entry, void *value)
{
	entry->value = value;
	entry->next = NULL;
	perch__store_ptr((void **)&f->tail->next, entry);
	f->tail = entry;
}

static bool fifo_dequeue(ck_fifo_spsc_t *f, void *value)
{
	ck_fifo_spsc_entry_t *entry = perch__load_ptr((void *const *)&f->head->next);
	if (!entry)
		return false;
	*(void **)value = entry->value;
	perch__store_ptr((void **)&f->head, entry);
	return true;
}

static ck_fifo_spsc_entry_t *fifo_recycle(ck_fifo_spsc_t *f)
{
	if (f->head_snapshot == f->garbage) {
		f->head_snapshot = perch__load_ptr((void *const *)&f->head);
		if (f->head_snapshot == f->garbage)
			return NULL;
	}
	ck_fifo_spsc_entry_t *garbage = f->garbage;
	f->garbage = garbage->next;
	return garbage;
}
#else
#define fifo_enqueue ck_fifo_spsc_enqueue
#define fifo_dequeue ck_fifo_spsc_dequeue
#define fifo_recycle ck_fifo_spsc_recycle
#endif

/* ================= read engine (the reader owns the slot) ================= */

/* Moves what the backend queued onto the reader's private list. */
static void drain_fifo(struct perch_conn *c)
{
	struct perch_seg *seg;
	while (fifo_dequeue(&c->rx_fifo, &seg)) {
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
	uint32_t flags = rx_flags(c);
	drain_fifo(c);
	out->first = c->rd_head;
	out->first_off = c->rd_head_off;
	out->len = (size_t)(c->rd_drained - c->rd_consumed);
	out->completed = (flags & PERCH__RX_PEER_FIN) != 0;
	out->error = (flags & PERCH__RX_ERROR) ? perch__load_u32((uint32_t *)&c->rx_error) : 0;
	out->closed = (flags & PERCH__RX_CLOSED) != 0;
	out->canceled = perch__xchg_u32(&c->rd_cancel, 0) != 0;
	c->rd_result_base = c->rd_consumed;
	c->rd_result_len = out->len;
	c->rd_have_result = true;
}

/*
 * Gives the claim back. An exchange, not a store: a completion may have
 * marked the claim meanwhile, and the read-modify-write keeps the chain of
 * release/acquire from that completion unbroken.
 */
static void release_claim(struct perch_conn *c)
{
	perch__xchg_uptr(&c->read_waiter, PERCH__SLOT_EMPTY);
}

/* Serves a read under the claim: fills *out (none: the caller reads later), lets the claim go. */
static int serve_claimed(struct perch_conn *c, struct perch_read_result *out)
{
	if (out)
		fill_result(c, out);
	release_claim(c);
	return 0;
}

int perch__conn_park_read(struct perch_conn *c, struct perch_recv_listener *listener,
			  struct perch_read_result *out, uint64_t *cookie_out)
{
	/* 1. Claim. Failing means another read owns the slot: touch nothing. */
	if (!perch__cas_uptr(&c->read_waiter, PERCH__SLOT_EMPTY, PERCH__SLOT_CLAIM))
		return -EBUSY;
	perch__fence_rmw_then_load();
	/* 2. Re-check under the claim: a completion before the claim left no mark. */
	if (perch__conn_read_ready(c))
		return serve_claimed(c, out);
	/* 3. Ready the listener: only here, past every guard, when the read is about to park. */
	c->rd_have_result = false;
	c->read_cookie = *cookie_out = listener->on_parking(listener, c);
	/* 4. Publish. Pairs with the CAS in wake_reader that takes a published listener back. */
	while (!perch__cas_uptr(&c->read_waiter, PERCH__SLOT_CLAIM, (uintptr_t)listener)) {
		/*
		 * The claim was marked. Usually a completion landed during step 3;
		 * but a completion that loaded an earlier claim (since served and
		 * given back) can mark this one with nothing new. So clear the
		 * mark and look again: serve what is there, or publish again.
		 */
		perch__xchg_uptr(&c->read_waiter, PERCH__SLOT_CLAIM);
		perch__fence_rmw_then_load();
		if (perch__conn_read_ready(c))
			return serve_claimed(c, out);
	}
	return PERCH_PENDING;
}

/*
 * Completion side, on whichever thread changed the state (which it did
 * with a read-modify-write before calling this). Only the side whose CAS
 * takes a published listener back delivers.
 */
static void wake_reader(struct perch_conn *c)
{
	perch__fence_rmw_then_load();
	for (;;) {
		uintptr_t w = perch__load_uptr(&c->read_waiter);
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
			uint64_t cookie = c->read_cookie;
			void (*ready)(struct perch_recv_listener *, struct perch_conn *, uint64_t) =
				l->on_recv_ready;
			perch__xchg_uptr(&c->read_waiter, PERCH__SLOT_EMPTY);
			ready(l, c, cookie);
		}
		return;
	}
}

static void release_seg(struct perch_conn *c, struct perch_seg *seg)
{
	seg->next = NULL;
	c->ops->release_seg(seg);
}

/*
 * Drops `n` consumed bytes from the head of the reader's list and returns
 * the whole segments they covered, for release_segs once the claim is let
 * go: a transport's release may run code (an in-memory pipe wakes its
 * writer) that must not find the slot still claimed.
 */
static struct perch_seg *consume_bytes(struct perch_conn *c, uint64_t n)
{
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

static void release_segs(struct perch_conn *c, struct perch_seg *seg)
{
	while (seg) {
		struct perch_seg *next = seg->next;
		release_seg(c, seg);
		seg = next;
	}
}

/* ================= flush engine ================= */

/* Whose a lent segment is: kept in the data of the buffer that lends it to a send. */
struct lent_seg {
	const struct perch__transport_ops *ops;
	struct perch_seg *seg;
};

static bool txbuf_is_lent(const struct perch__txbuf *b)
{
	return b->bytes != b->data;
}

/* The segment goes back to its owner now that the send is done with its bytes. */
static void return_lent(struct perch__txbuf *b)
{
	struct lent_seg *l = (struct lent_seg *)(void *)b->data;
	l->seg->next = NULL;
	l->ops->release_seg(l->seg);
	free(b);
}

static void free_buffers(struct perch__txbuf *b)
{
	while (b) {
		struct perch__txbuf *next = b->next;
		if (txbuf_is_lent(b))
			return_lent(b);
		else
			free(b);
		b = next;
	}
}

/* The transport pools staging buffers: each one of the pool's size is offered back. */
static void give_back_chain(struct perch_conn *c, struct perch__txbuf *b)
{
	while (b) {
		struct perch__txbuf *next = b->next;
		if (txbuf_is_lent(b))
			return_lent(b);
		else if (b->cap != PERCH__TXBUF_CAP || !c->ops->txbuf_put(c, b))
			free(b);
		b = next;
	}
}

static inline void free_chain(struct perch_conn *c, struct perch__txbuf *b)
{
	if (c->ops->txbuf_put)
		give_back_chain(c, b);
	else
		free_buffers(b);
}

/*
 * A write up to this size may span several pooled buffers (a received
 * 16 KiB segment echoed back, say); a bigger one gets one buffer of its own
 * size, so a large send stays one buffer and the pool is not drained.
 */
#define TXBUF_POOLED_WRITE_MAX (64u * 1024)

/*
 * A staging buffer with `room` contiguous bytes for a write of `want`: the
 * transport's pooled one when it fits and it lends one, else a new one.
 */
static struct perch__txbuf *txbuf_alloc(struct perch_conn *c, size_t room, size_t want)
{
	if (room <= PERCH__TXBUF_CAP && want <= TXBUF_POOLED_WRITE_MAX && c->ops->txbuf_get) {
		struct perch__txbuf *b = c->ops->txbuf_get(c);
		if (b)
			return b;
	}
	size_t cap = want > PERCH__TXBUF_CAP ? want : PERCH__TXBUF_CAP;
	return perch__txbuf_new(cap > UINT32_MAX ? UINT32_MAX : cap);
}

struct perch__txbuf *perch__txbuf_new(size_t cap)
{
	struct perch__txbuf *b = malloc(sizeof(*b) + cap);
	if (b) {
		b->bytes = b->data;
		b->cap = (uint32_t)cap;
	}
	return b;
}

/* Takes the whole staged chain from the writer's list. */
static struct perch__txbuf *take_staged(struct perch_conn *c)
{
	struct perch__txbuf *chain = c->staged_head;
	c->staged_head = c->staged_tail = NULL;
	c->staged_len = 0;
	return chain;
}

static void drop_staged(struct perch_conn *c)
{
	free_chain(c, take_staged(c));
}

/*
 * The flush completion, in this order: disarm (only the side that saw the
 * arm continues), take the listener, release the guard, then signal.
 * Releasing the guard first would let a new flush be taken while this one
 * is still armed, and be signalled in its place.
 */
static void complete_flush(struct perch_conn *c, int result)
{
	/* Whatever this completion published (closed, an error) is ordered before the disarm. */
	perch__fence_rmw_then_load();
	if (perch__xchg_u32(&c->flush_armed, 0) == 0)
		return;
	struct perch_flush_listener *l = perch__xchg_ptr(&c->flush_listener, NULL);
	uint64_t cookie = c->flush_cookie; /* before the guard lets a new flush store its own */
	void (*done)(struct perch_flush_listener *, struct perch_conn *, uint64_t, int) =
		l->on_flush_done;
	perch__store_u32(&c->flush_busy, 0);
	done(l, c, cookie, result);
}

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
	free_chain(c, chain);
	if (perch__xchg_u32(&c->flush_armed, 0) != 0) {
		struct perch_flush_listener *l = perch__xchg_ptr(&c->flush_listener, NULL);
		/*
		 * The conn's own task: the version this park readied is nobody's.
		 * Ended here, while the send's reference still holds the conn.
		 */
		if (l == &c->self_flusher)
			perch_vtask_complete(&c->flush_task, (uint32_t)c->flush_cookie, -EPIPE);
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
	if (tx_is_ended(c)) {
		drop_staged(c);
		perch__store_u32(&c->flush_busy, 0);
		return -EPIPE;
	}
	/*
	 * Before anything is published, take the chain and the send's
	 * reference: once armed, a close may release the guard and signal, and
	 * the listener may stage, flush or release the connection at once.
	 * From the arm on, this call touches only its own chain and reference.
	 */
	struct perch__txbuf *chain = take_staged(c);
	perch__conn_ref(c);
	/* 4. Ready, store the listener, then the arm that publishes it: an exchange, fenced before the re-check of `closed`. */
	c->flush_cookie = *cookie_out = listener->on_parking(listener, c);
	perch__store_ptr(&c->flush_listener, listener);
	perch__xchg_u32(&c->flush_armed, 1);
	perch__fence_rmw_then_load();
	if (tx_is_closed(c))
		return flush_closed_while_arming(c, chain);
	/* 5. Hand the chain over: it lives until perch__conn_send_done, and so does the connection. */
	c->ops->send(c, chain);
	return PERCH_PENDING;
}

/* ================= completion entry points (the backend's thread) ================= */

int perch__conn_recv_arrived(struct perch_conn *c, struct perch_seg *seg)
{
	/* An empty segment would mark a claim with nothing to show, and could do so forever. */
	uint32_t len = seg->len;
	if (len == 0)
		return -EINVAL;
	ck_fifo_spsc_entry_t *entry = fifo_recycle(&c->rx_fifo);
	if (!entry) {
		entry = malloc(sizeof(*entry));
		if (!entry)
			return -ENOMEM;
	}
	/*
	 * Once enqueued the segment is the reader's: it may consume and
	 * release it at once (the in-memory pipe's reader frees it on its own
	 * thread), so its length was read before.
	 */
	fifo_enqueue(&c->rx_fifo, entry, seg);
	/* A read-modify-write, so the count is visible before we look at the slot. */
	perch__faa_u64(&c->rx_total, len);
	wake_reader(c);
	return 0;
}

void perch__conn_peer_closed(struct perch_conn *c)
{
	perch__for_u32(&c->rx_flags, PERCH__RX_PEER_FIN);
	wake_reader(c);
}

void perch__conn_failed(struct perch_conn *c, int err)
{
	/* The read's delivery may release the user's reference; the flush's must still find the conn. */
	perch__conn_ref(c);
	perch__store_u32((uint32_t *)&c->rx_error, (uint32_t)(err < 0 ? err : -err));
	perch__for_u32(&c->rx_flags, PERCH__RX_ERROR);
	wake_reader(c);
	complete_flush(c, err < 0 ? err : -err);
	perch__conn_unref(c);
}

void perch__conn_send_done(struct perch_conn *c, struct perch__txbuf *chain, int result)
{
	free_chain(c, chain);
	/* After a close, the close already delivered: this disarms nothing. */
	complete_flush(c, result);
	perch__conn_unref(c);
}

/* ================= lifecycle ================= */

struct perch_conn *perch__conn_new(const struct perch__transport_ops *ops, void *transport)
{
	if (!ops || !ops->send || !ops->release_seg)
		return NULL;
	struct perch_conn *c;
	if (posix_memalign((void **)&c, CK_MD_CACHELINE, sizeof(*c)) != 0)
		return NULL;
	memset(c, 0, sizeof(*c));
	ck_fifo_spsc_entry_t *stub = malloc(sizeof(*stub));
	if (!stub) {
		free(c);
		return NULL;
	}
	ck_fifo_spsc_init(&c->rx_fifo, stub);
	c->refs = 1;
	c->ops = ops;
	c->transport = transport;
	c->self_reader.on_parking = self_read_parking;
	c->self_reader.on_recv_ready = self_read_ready;
	c->self_flusher.on_parking = self_flush_parking;
	c->self_flusher.on_flush_done = self_flush_done;
	perch_vtask_init(&c->read_task);
	perch_vtask_init(&c->flush_task);
	return c;
}

void perch__conn_ref(struct perch_conn *c)
{
	perch__faa_u32(&c->refs, 1);
}

static void destroy(struct perch_conn *c)
{
	struct perch_seg *seg;
	drain_fifo(c);
	while ((seg = c->rd_head) != NULL) {
		c->rd_head = seg->next;
		release_seg(c, seg);
	}
	ck_fifo_spsc_entry_t *garbage;
	ck_fifo_spsc_deinit(&c->rx_fifo, &garbage);
	while (garbage) {
		ck_fifo_spsc_entry_t *next = garbage->next;
		free(garbage);
		garbage = next;
	}
	drop_staged(c);
	if (c->ops->destroy)
		c->ops->destroy(c);
	free(c);
}

void perch__conn_unref(struct perch_conn *c)
{
	if (perch__faa_u32(&c->refs, (uint32_t)-1) == 1)
		destroy(c);
}

/* ================= the connection as its own listener ================= */

static uint64_t self_read_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	return perch_vtask_ready(&c->read_task);
}

/* Completes the version this park readied: a late delivery cannot complete a newer one. */
static void self_read_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	perch_vtask_complete(&c->read_task, (uint32_t)cookie, 0);
}

static uint64_t self_flush_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	return perch_vtask_ready(&c->flush_task);
}

static void self_flush_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie,
			    int result)
{
	perch_vtask_complete(&c->flush_task, (uint32_t)cookie, result);
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
	if (!perch__cas_uptr(&c->read_waiter, PERCH__SLOT_EMPTY, PERCH__SLOT_CLAIM))
		return -EBUSY;
	perch__fence_rmw_then_load();
	int rc = -EAGAIN;
	if (perch__conn_read_ready(c)) {
		fill_result(c, out);
		rc = 0;
	}
	release_claim(c);
	return rc;
}

int perch_conn_read(struct perch_conn *c, struct perch_read_result *out,
		    struct perch_vtask_handle *task)
{
	if (!c || !out || !task)
		return -EINVAL;
	uint64_t token;
	int rc = perch__conn_park_read(c, &c->self_reader, out, &token);
	if (rc == PERCH_PENDING) {
		task->task = &c->read_task;
		task->token = (uint32_t)token;
	}
	return rc;
}

/* Whether the last result (the claim holder's) has room for this advance. */
static bool advance_fits(const struct perch_conn *c, size_t consumed, size_t examined)
{
	return c->rd_have_result && consumed <= examined && examined <= c->rd_result_len &&
	       c->rd_result_base + examined >= c->rd_examined;
}

/* Ends the last result; returns the whole segments the consumed bytes covered. */
static struct perch_seg *end_result(struct perch_conn *c, size_t consumed, size_t examined)
{
	struct perch_seg *done = consume_bytes(c, consumed);
	c->rd_consumed = c->rd_result_base + consumed;
	perch__store_u64(&c->rd_examined, c->rd_result_base + examined);
	c->rd_have_result = false;
	return done;
}

static int advance_claimed(struct perch_conn *c, size_t consumed, size_t examined,
			   struct perch_seg **done)
{
	if (!advance_fits(c, consumed, examined))
		return -EINVAL;
	*done = end_result(c, consumed, examined);
	return 0;
}

/* Under the claim: the reader-private queue is never touched by two calls, nor while a read is parked. */
int perch_conn_advance(struct perch_conn *c, size_t consumed, size_t examined)
{
	if (!c)
		return -EINVAL;
	if (!perch__cas_uptr(&c->read_waiter, PERCH__SLOT_EMPTY, PERCH__SLOT_CLAIM))
		return -EBUSY;
	struct perch_seg *done = NULL;
	int rc = advance_claimed(c, consumed, examined, &done);
	release_claim(c);
	release_segs(c, done);
	if (rc == 0 && consumed > 0 && c->ops->consumed)
		c->ops->consumed(c, consumed);
	return rc;
}

int perch_conn_cancel_read(struct perch_conn *c)
{
	if (!c)
		return -EINVAL;
	perch__xchg_u32(&c->rd_cancel, 1);
	wake_reader(c);
	return 0;
}

/* ================= public calls: one writer, any thread ================= */

/* The staged tail when it has `room` bytes free, else a new buffer of at least `want` bytes. */
static struct perch__txbuf *txbuf_with_room(struct perch_conn *c, size_t room, size_t want)
{
	struct perch__txbuf *t = c->staged_tail;
	if (t && t->cap - t->len >= room)
		return t;
	struct perch__txbuf *b = txbuf_alloc(c, room, want);
	if (!b)
		return NULL;
	b->next = NULL;
	b->len = 0;
	if (t)
		t->next = b;
	else
		c->staged_head = b;
	c->staged_tail = b;
	return b;
}

int perch_conn_write(struct perch_conn *c, const void *data, size_t len)
{
	if (!c || (!data && len))
		return -EINVAL;
	if (perch__load_u32(&c->flush_busy))
		return -EBUSY;
	if (tx_is_ended(c))
		return -EPIPE;
	const uint8_t *p = data;
	while (len > 0) {
		struct perch__txbuf *b = txbuf_with_room(c, 1, len);
		if (!b)
			return -ENOMEM;
		size_t n = b->cap - b->len;
		if (n > len)
			n = len;
		memcpy(b->data + b->len, p, n);
		b->len += (uint32_t)n;
		c->staged_len += n;
		p += n;
		len -= n;
	}
	return 0;
}

/* ================= staging and draining for the pipe adapters ================= */

int perch__conn_stage_buffer(struct perch_conn *c, size_t hint, uint8_t **buf, size_t *len)
{
	if (hint > UINT32_MAX)
		return -EINVAL;
	if (perch__load_u32(&c->flush_busy))
		return -EBUSY;
	if (tx_is_ended(c))
		return -EPIPE;
	size_t room = hint ? hint : 1;
	struct perch__txbuf *b = txbuf_with_room(c, room, room);
	if (!b)
		return -ENOMEM;
	*buf = b->data + b->len;
	*len = b->cap - b->len;
	return 0;
}

int perch__conn_stage_commit(struct perch_conn *c, size_t n)
{
	struct perch__txbuf *t = c->staged_tail;
	if (perch__load_u32(&c->flush_busy))
		return -EBUSY;
	if (tx_is_ended(c))
		return -EPIPE; /* a buffer lent before a shutdown: its bytes cannot follow the end */
	if (n > (t ? t->cap - t->len : 0))
		return -EINVAL;
	if (n == 0)
		return 0;
	t->len += (uint32_t)n;
	c->staged_len += n;
	return 0;
}

struct perch__txbuf *perch__conn_take_staged(struct perch_conn *c, size_t *len)
{
	*len = c->staged_len;
	struct perch__txbuf *chain = take_staged(c);
	/* An empty tail (a buffer got and never committed) carries nothing: drop it here. */
	struct perch__txbuf **p = &chain;
	while (*p) {
		if ((*p)->len == 0) {
			struct perch__txbuf *empty = *p;
			*p = empty->next;
			free(empty);
		} else {
			p = &(*p)->next;
		}
	}
	return chain;
}

void perch__conn_free_chain(struct perch__txbuf *chain)
{
	free_buffers(chain);
}

/* ================= forwarding: consumed bytes staged on a writer without a copy ================= */

/*
 * A segment whose remainder is at least this big is lent; a smaller one is
 * copied: lending it would hold a whole receive buffer for a few bytes,
 * and cost a record and a release where a copy costs less.
 */
#define FORWARD_LEND_MIN 1024u

static bool forward_lends(size_t left)
{
	return left >= FORWARD_LEND_MIN;
}

/* A chain built aside, so that a forward stages all of it or nothing. */
struct txchain {
	struct perch__txbuf *head, *tail;
};

static void chain_append(struct txchain *ch, struct perch__txbuf *b)
{
	b->next = NULL;
	if (ch->tail)
		ch->tail->next = b;
	else
		ch->head = b;
	ch->tail = b;
}

/* Drops a chain that never took anything: the segments it would have lent stay the reader's. */
static void chain_abandon(struct txchain *ch)
{
	for (struct perch__txbuf *b = ch->head, *next; b; b = next) {
		next = b->next;
		free(b);
	}
}

/* A buffer lending bytes [off, len) of `seg`, received on `src`. */
static struct perch__txbuf *lend_new(const struct perch_conn *src, struct perch_seg *seg,
				     size_t off)
{
	struct perch__txbuf *b = malloc(sizeof(*b) + sizeof(struct lent_seg));
	if (!b)
		return NULL;
	struct lent_seg *l = (struct lent_seg *)(void *)b->data;
	l->ops = src->ops;
	l->seg = seg;
	b->bytes = seg->data + off;
	b->len = b->cap = seg->len - (uint32_t)off;
	return b;
}

/* Copies `n` bytes onto the chain: into its last staging buffer while that has room, then new ones. */
static int chain_copy(struct perch_conn *dst, struct txchain *ch, const uint8_t *p, size_t n)
{
	while (n > 0) {
		struct perch__txbuf *t = ch->tail;
		if (!t || txbuf_is_lent(t) || t->len == t->cap) {
			t = txbuf_alloc(dst, 1, n);
			if (!t)
				return -ENOMEM;
			t->len = 0;
			chain_append(ch, t);
		}
		size_t k = t->cap - t->len < n ? t->cap - t->len : n;
		memcpy(t->data + t->len, p, k);
		t->len += (uint32_t)k;
		p += k;
		n -= k;
	}
	return 0;
}

/*
 * The first `n` unconsumed bytes as a chain for `dst`: a segment whose
 * remainder they cover whole is lent when big enough, the rest is copied.
 * The reader's list is only read, so a failure loses nothing.
 */
static int chain_consumed(struct perch_conn *src, struct perch_conn *dst, size_t n,
			  struct txchain *ch)
{
	size_t off = src->rd_head_off;
	for (struct perch_seg *s = src->rd_head; n > 0; s = s->next, off = 0) {
		size_t left = s->len - off;
		size_t take = left < n ? left : n;
		if (take == left && forward_lends(left)) {
			struct perch__txbuf *b = lend_new(src, s, off);
			if (!b)
				return -ENOMEM;
			chain_append(ch, b);
		} else if (chain_copy(dst, ch, s->data + off, take) != 0) {
			return -ENOMEM;
		}
		n -= take;
	}
	return 0;
}

/* Releases the consumed whole segments that were copied; the lent ones come back with their send. */
static void release_copied(struct perch_conn *c, struct perch_seg *done, size_t first_off)
{
	for (size_t off = first_off; done; off = 0) {
		struct perch_seg *next = done->next;
		if (!forward_lends(done->len - off))
			release_seg(c, done);
		done = next;
	}
}

static void stage_chain(struct perch_conn *c, const struct txchain *ch, size_t len)
{
	if (!ch->head)
		return;
	if (c->staged_tail)
		c->staged_tail->next = ch->head;
	else
		c->staged_head = ch->head;
	c->staged_tail = ch->tail;
	c->staged_len += len;
}

/* The reader's advance under the claim, with the consumed bytes made into a chain first. */
int perch_conn_forward(struct perch_conn *src, size_t consumed, size_t examined,
		       struct perch_conn *dst)
{
	if (!src || !dst)
		return -EINVAL;
	if (perch__load_u32(&dst->flush_busy))
		return -EBUSY;
	if (tx_is_ended(dst))
		return -EPIPE;
	if (!perch__cas_uptr(&src->read_waiter, PERCH__SLOT_EMPTY, PERCH__SLOT_CLAIM))
		return -EBUSY;
	struct txchain ch = { NULL, NULL };
	size_t first_off = src->rd_head_off;
	struct perch_seg *done = NULL;
	int rc = advance_fits(src, consumed, examined) ? chain_consumed(src, dst, consumed, &ch)
						       : -EINVAL;
	if (rc == 0)
		done = end_result(src, consumed, examined);
	release_claim(src);
	if (rc != 0) {
		chain_abandon(&ch);
		return rc;
	}
	release_copied(src, done, first_off);
	stage_chain(dst, &ch, consumed);
	if (consumed > 0 && src->ops->consumed)
		src->ops->consumed(src, consumed);
	return 0;
}

int perch__conn_discard(struct perch_conn *c)
{
	if (!perch__cas_uptr(&c->read_waiter, PERCH__SLOT_EMPTY, PERCH__SLOT_CLAIM))
		return -EBUSY;
	perch__fence_rmw_then_load();
	drain_fifo(c);
	uint64_t n = c->rd_drained - c->rd_consumed;
	struct perch_seg *done = consume_bytes(c, n);
	c->rd_consumed = c->rd_drained;
	perch__store_u64(&c->rd_examined, c->rd_drained);
	c->rd_have_result = false;
	release_claim(c);
	release_segs(c, done);
	if (n > 0 && c->ops->consumed)
		c->ops->consumed(c, n);
	return 0;
}

void perch__conn_wake_reader(struct perch_conn *c)
{
	wake_reader(c);
}

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
	/*
	 * complete_flush lets the guard go before it signals: a flush in that
	 * gap would ready a new version of the one task over the version its
	 * caller still waits on. Pending means still waiting, or still being
	 * signalled; the continuation flushing again finds it complete.
	 */
	if (perch__vtask_current_pending(&c->flush_task))
		return -EBUSY;
	uint64_t token;
	int rc = perch__conn_park_flush(c, &c->self_flusher, &token);
	if (rc == PERCH_PENDING) {
		task->task = &c->flush_task;
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
	if (tx_is_closed(c)) {
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

/* ================= public calls: lifecycle, any thread ================= */

/* The close, ending the transport with `end` (its close, or its abort). */
static int close_with(struct perch_conn *c, void (*end)(struct perch_conn *c))
{
	if (!c)
		return -EINVAL;
	/*
	 * Hold our own reference from before CLOSED is visible: once it is, a
	 * delivery on another thread may release the user's, and only ours
	 * keeps the connection for the rest of this call.
	 */
	perch__conn_ref(c);
	if (perch__for_u32(&c->rx_flags, PERCH__RX_CLOSED) & PERCH__RX_CLOSED) {
		perch__conn_unref(c);
		return 0;
	}
	wake_reader(c);
	complete_flush(c, -EPIPE);
	if (end)
		end(c);
	perch__conn_unref(c);
	return 0;
}

int perch_conn_close(struct perch_conn *c)
{
	return close_with(c, c ? c->ops->close : NULL);
}

int perch_conn_abort(struct perch_conn *c)
{
	return close_with(c, c ? (c->ops->abort ? c->ops->abort : c->ops->close) : NULL);
}

void perch_conn_release(struct perch_conn *c)
{
	if (!c)
		return;
	perch_conn_close(c);
	perch__conn_unref(c);
}

bool perch_conn_is_closed(const struct perch_conn *c)
{
	return !c || tx_is_closed(c);
}
