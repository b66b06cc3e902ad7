/* lib/conn.c: the connection's lifecycle: creation, references, its own listeners, failure and close. */
#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conn_core.h"

/* ================= the connection as its own listener ================= */

/* Set before the park that calls these: the slot's publish orders it for the completing thread. */
static struct perch__conn_tasks *own_tasks(struct perch_conn *c)
{
	struct perch__conn_tasks *t = perch__load_ptr((void *const *)&c->own_tasks);
	PERCH_ASSERT(t != NULL);
	return t;
}

static uint64_t self_read_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	return perch_vtask_ready(&own_tasks(c)->read_task);
}

/* Completes the version this park readied: a late delivery cannot complete a newer one. */
static void self_read_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	perch_vtask_complete(&own_tasks(c)->read_task, (uint32_t)cookie, 0);
}

static uint64_t self_flush_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	return perch_vtask_ready(&own_tasks(c)->flush_task);
}

static void self_flush_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie,
			    int result)
{
	perch_vtask_complete(&own_tasks(c)->flush_task, (uint32_t)cookie, result);
}

/*
 * The reader and the flusher may make them at once, each on its first
 * call: one CAS installs a block, and the loser frees its own.
 */
struct perch__conn_tasks *perch__conn_tasks(struct perch_conn *c)
{
	struct perch__conn_tasks *t = perch__load_ptr((void *const *)&c->own_tasks);
	if (t)
		return t;
	struct perch__conn_tasks *made = malloc(sizeof(*made));
	if (!made)
		return NULL;
	perch_vtask_init(&made->read_task);
	perch_vtask_init(&made->flush_task);
	if (perch__cas_ptr((void **)&c->own_tasks, NULL, made))
		return made;
	free(made);
	return perch__load_ptr((void *const *)&c->own_tasks);
}

struct perch_recv_listener perch__conn_self_reader = {
	.on_parking = self_read_parking,
	.on_recv_ready = self_read_ready,
};

struct perch_flush_listener perch__conn_self_flusher = {
	.on_parking = self_flush_parking,
	.on_flush_done = self_flush_done,
};

/* ================= creation and references ================= */

/* A connection in a block with `extra` bytes after it (its transport's, when it has them there). */
static struct perch_conn *conn_make(const struct perch__transport_ops *ops, size_t extra)
{
	if (!ops || !ops->send || !ops->release_seg)
		return NULL;
	/*
	 * Aligned by hand in a block a line larger, not by posix_memalign: that
	 * leaves the pieces around its block to malloc's bins, where a
	 * connection's other allocations, none of their sizes, do not reuse them
	 * (doc/perf/scale).
	 */
	_Static_assert(_Alignof(max_align_t) >= 16, "malloc's blocks are 16-aligned");
	uint8_t *block = malloc(sizeof(struct perch_conn) + CK_MD_CACHELINE - 16 + extra);
	if (!block)
		return NULL;
	size_t skip = (size_t)(-(uintptr_t)block & (CK_MD_CACHELINE - 1));
	PERCH_ASSERT(skip <= CK_MD_CACHELINE - 16);
	struct perch_conn *c = (struct perch_conn *)(void *)(block + skip);
	memset(c, 0, sizeof(*c));
	c->block_skip = (uint8_t)skip;
	perch__fifo_init(c);
	c->refs = 1;
	c->ops = ops;
	return c;
}

struct perch_conn *perch__conn_new(const struct perch__transport_ops *ops, void *transport)
{
	struct perch_conn *c = conn_make(ops, 0);
	if (c)
		c->transport = transport;
	return c;
}

struct perch_conn *perch__conn_new_with(const struct perch__transport_ops *ops, size_t transport_size)
{
	struct perch_conn *c = conn_make(ops, transport_size);
	if (c) {
		c->transport = c + 1;
		memset(c->transport, 0, transport_size);
	}
	return c;
}

void perch__conn_destroy(struct perch_conn *c)
{
	struct perch_seg *seg;
	perch__read_drain_fifo(c);
	while ((seg = c->rd_head) != NULL) {
		c->rd_head = seg->next;
		perch__seg_release(c, seg);
	}
	/* Every entry, from the oldest spent one on. */
	for (struct perch__rx_entry *e = c->rx_garbage, *next; e; e = next) {
		next = e->next;
		if (!perch__fifo_entry_own(c, e))
			free(e);
	}
	perch__stage_drop(c);
	if (c->ops->destroy)
		c->ops->destroy(c);
	free(c->own_tasks);
	free((uint8_t *)c - c->block_skip);
}

/* ================= completion entry points (the backend's thread) ================= */

void perch__conn_failed(struct perch_conn *c, int err)
{
	/* The read's delivery may release the user's reference; the flush's must still find the conn. */
	perch__conn_ref(c);
	perch__store_u32((uint32_t *)&c->rx_error, (uint32_t)(err < 0 ? err : -err));
	perch__for_u32(&c->rx_flags, PERCH__RX_ERROR);
	perch__read_wake(c);
	perch__flush_complete(c, err < 0 ? err : -err);
	perch__conn_unref(c);
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
	perch__read_wake(c);
	perch__flush_complete(c, -EPIPE);
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
	return !c || perch__tx_is_closed(c);
}
