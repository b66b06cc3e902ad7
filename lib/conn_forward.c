/* lib/conn_forward.c: forwarding: a reader's consumed bytes staged on another connection's writer, big segments lent instead of copied. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn_core.h"


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
	struct perch__txbuf *b = malloc(sizeof(*b) + sizeof(struct perch__lent_seg));
	if (!b)
		return NULL;
	*(struct perch__lent_seg *)(void *)b->data = (struct perch__lent_seg){ .ops = src->ops, .seg = seg };
	b->bytes = seg->data + off;
	b->len = b->cap = seg->len - (uint32_t)off;
	b->flags = 0;
	return b;
}

/* Copies `n` bytes onto the chain: into its last staging buffer while that has room, then new ones. */
static int chain_copy(struct perch_conn *dst, struct txchain *ch, const uint8_t *p, size_t n)
{
	while (n > 0) {
		struct perch__txbuf *t = ch->tail;
		if (!t || perch__txbuf_is_lent(t) || t->len == t->cap) {
			t = perch__txbuf_alloc(dst, 1, n);
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
			perch__seg_release(c, done);
		done = next;
	}
}

/* The reader's advance under the claim, with the consumed bytes made into a chain first. */
int perch_conn_forward(struct perch_conn *src, size_t consumed, size_t examined,
		       struct perch_conn *dst)
{
	if (!src || !dst)
		return -EINVAL;
	int rc = perch__writer_may_stage(dst);
	if (rc != 0)
		return rc;
	if (!perch__slot_claim(src))
		return -EBUSY;
	struct txchain ch = { NULL, NULL };
	size_t first_off = src->rd_head_off;
	struct perch_seg *done = NULL, *given_up = NULL;
	rc = perch__advance_fits(src, consumed, examined) ? chain_consumed(src, dst, consumed, &ch)
							   : -EINVAL;
	if (rc == 0)
		done = perch__read_end_result(src, consumed, examined, &given_up);
	perch__slot_release(src);
	if (rc != 0) {
		chain_abandon(&ch);
		return rc;
	}
	release_copied(src, done, first_off);
	perch__segs_release(src, given_up);
	if (ch.head)
		perch__stage_append(dst, ch.head, ch.tail, consumed);
	if (consumed > 0 && src->ops->consumed)
		src->ops->consumed(src, consumed);
	return 0;
}

