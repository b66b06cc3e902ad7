/* lib/conn_stage.c: staged output: the writer's buffers, pooled or its own, and the chains a send gives back. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn_core.h"

/* ================= buffers and chains ================= */

/* The lent bytes go back to their owner now that the send is done with them. */
static void return_lent(struct perch__txbuf *b)
{
	struct perch__lent_seg *l = (struct perch__lent_seg *)(void *)b->data;
	if (l->release)
		l->release(l->arg, l->data, l->len);
	else
		perch__seg_give_back(l->ops, l->seg);
	free(b);
}

void perch__chain_give_back(struct perch_conn *c, struct perch__txbuf *b)
{
	while (b) {
		struct perch__txbuf *next = b->next;
		if (perch__txbuf_is_lent(b))
			return_lent(b);
		else if (b->cap != PERCH__TXBUF_CAP || !c->ops->txbuf_put(c, b))
			free(b);
		b = next;
	}
}

void perch__conn_free_chain(struct perch__txbuf *b)
{
	while (b) {
		struct perch__txbuf *next = b->next;
		if (perch__txbuf_is_lent(b))
			return_lent(b);
		else
			free(b);
		b = next;
	}
}

/*
 * A write up to this size may span several pooled buffers (a received
 * 16 KiB segment echoed back, say); a bigger one gets one buffer of its own
 * size, so a large send stays one buffer and the pool is not drained.
 */
#define TXBUF_POOLED_WRITE_MAX (64u * 1024)

struct perch__txbuf *perch__txbuf_alloc(struct perch_conn *c, size_t room, size_t want)
{
	uint32_t pooled_max = c->ops->txbuf_pooled_max ? c->ops->txbuf_pooled_max : TXBUF_POOLED_WRITE_MAX;
	if (room <= PERCH__TXBUF_CAP && want <= pooled_max && c->ops->txbuf_get) {
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
		b->flags = 0;
	}
	return b;
}

/* The staged tail when it has `room` bytes free, else a new buffer of at least `want` bytes. */
static struct perch__txbuf *txbuf_with_room(struct perch_conn *c, size_t room, size_t want)
{
	struct perch__txbuf *t = c->staged_tail;
	if (t && t->cap - t->len >= room)
		return t;
	struct perch__txbuf *b = perch__txbuf_alloc(c, room, want);
	if (!b)
		return NULL;
	b->next = NULL;
	b->len = 0;
	perch__stage_append(c, b, b, 0);
	return b;
}

/* ================= public calls: one writer, any thread ================= */

size_t perch_conn_staged(const struct perch_conn *c)
{
	return c ? c->staged_len : 0;
}

int perch_conn_write(struct perch_conn *c, const void *data, size_t len)
{
	if (!c || (!data && len))
		return -EINVAL;
	int rc = perch__writer_may_stage(c);
	if (rc != 0)
		return rc;
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

int perch_conn_write_ref(struct perch_conn *c, const void *data, size_t len, perch_release_fn release,
			 void *arg)
{
	if (!c || !data || !release || len == 0 || len > UINT32_MAX)
		return -EINVAL;
	int rc = perch__writer_may_stage(c);
	if (rc != 0)
		return rc;
	struct perch__txbuf *b = malloc(sizeof(*b) + sizeof(struct perch__lent_seg));
	if (!b)
		return -ENOMEM;
	*(struct perch__lent_seg *)(void *)b->data =
		(struct perch__lent_seg){ .release = release, .arg = arg, .data = data, .len = len };
	b->next = NULL;
	b->bytes = (uint8_t *)(uintptr_t)data; /* read only: sent, never written */
	b->len = b->cap = (uint32_t)len;       /* no room: a later write starts a buffer of its own */
	b->flags = PERCH__TXBUF_REF;
	perch__stage_append(c, b, b, len);
	return 0;
}

/* ================= staging for the pipe adapters ================= */

int perch__conn_stage_buffer(struct perch_conn *c, size_t hint, uint8_t **buf, size_t *len)
{
	if (hint > UINT32_MAX)
		return -EINVAL;
	int rc = perch__writer_may_stage(c);
	if (rc != 0)
		return rc;
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
	/* -EPIPE for a buffer lent before a shutdown: its bytes cannot follow the end. */
	int rc = perch__writer_may_stage(c);
	if (rc != 0)
		return rc;
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
	struct perch__txbuf *chain = perch__stage_take(c);
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
