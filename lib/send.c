/* lib/send.c: the loop's side of sending: one send in flight per socket, short sends resumed, and the pool of staging buffers. */
#include "config.h"

#include <errno.h>

#include "invariant.h"
#include "loop_internal.h"

/* ================= send ================= */

int perch__loop_tx_iov(struct perch__sock *s, struct iovec *iov, int max)
{
	int n = 0;
	uint32_t off = s->tx_off;
	for (struct perch__txbuf *b = s->tx_cur; b && n < max; b = b->next, off = 0) {
		if (b->len == off)
			continue;
		iov[n].iov_base = b->bytes + off;
		iov[n].iov_len = b->len - off;
		n++;
	}
	return n;
}

/* The buffers perch__loop_tx_iov would send. */
bool perch__loop_tx_wants_zerocopy(const struct perch__sock *s, int max)
{
	if (s->tx_lends)
		return false;
	uint32_t off = s->tx_off;
	int n = 0;
	for (const struct perch__txbuf *b = s->tx_cur; b && n < max; b = b->next, off = 0) {
		if (b->len == off)
			continue;
		n++;
		if ((b->flags & PERCH__TXBUF_REF) && b->len - off >= s->opts->zerocopy_min)
			return true;
	}
	return false;
}

/*
 * A received segment lent by a forward keeps its whole chain plain: a
 * zero-copy send holds the chain for its notification, and the segment
 * would stay out of its loop's receive pool while the peer does not read.
 * Looked at only where zero-copy may be asked for.
 */
static bool chain_lends(const struct perch__sock *s, const struct perch__txbuf *chain)
{
	if (s->opts->zerocopy_min == PERCH_ZEROCOPY_OFF)
		return false;
	for (const struct perch__txbuf *b = chain; b; b = b->next)
		if (!(b->flags & PERCH__TXBUF_REF) && b->bytes != b->data)
			return true;
	return false;
}

/* Skips `n` sent bytes; true when the whole chain is sent. */
static bool tx_advance(struct perch__sock *s, size_t n)
{
	while (s->tx_cur) {
		size_t left = s->tx_cur->len - s->tx_off;
		if (n < left) {
			s->tx_off += (uint32_t)n;
			return false;
		}
		n -= left;
		s->tx_cur = s->tx_cur->next;
		s->tx_off = 0;
	}
	return true;
}

static void finish_send(struct perch__sock *s, int result)
{
	struct perch__txbuf *chain = s->tx_chain;
	PERCH_ASSERT(chain != NULL); /* one send in flight, and this is its end */
	s->tx_chain = s->tx_cur = NULL;
	s->tx_off = 0;
	const struct perch__backend *be = s->loop->be;
	if (be->send_keep && be->send_keep(s, chain))
		chain = NULL; /* the kernel may still read it: the backend frees it later */
	/* May drop the send's reference; the loop's keeps the socket alive. */
	perch__conn_send_done(perch__sock_conn(s), chain, result);
}

void perch__loop_sent(struct perch__sock *s, int res)
{
	if (res < 0) {
		finish_send(s, res);
		return;
	}
	if (tx_advance(s, (size_t)res)) {
		finish_send(s, 0);
		return;
	}
	/* A short send: resubmit from where it stopped, unless closing (or the kernel took nothing). */
	if (s->closing)
		finish_send(s, -ECANCELED);
	else if (res == 0)
		finish_send(s, -EIO);
	else
		s->loop->be->send(s);
}

void perch__send_start(struct perch__sock *s, struct perch_conn *c, struct perch__txbuf *chain)
{
	if (s->closing || !s->in_table) {
		perch__conn_send_done(c, chain, -EPIPE);
		return;
	}
	if (s->tx_chain) {
		/* The flush guard allows one send at a time; refuse rather than reorder. */
		perch__conn_send_done(c, chain, -EBUSY);
		return;
	}
	s->tx_chain = s->tx_cur = chain;
	s->tx_off = 0;
	s->tx_lends = chain_lends(s, chain);
	if (tx_advance(s, 0)) {
		finish_send(s, 0);
		return;
	}
	s->loop->be->send(s);
}

/* The conn core's send: started at once on the loop thread, else posted. */
void perch__op_send(struct perch_conn *c, struct perch__txbuf *chain)
{
	struct perch__sock *s = c->transport;
	if (perch__loop_is_current(s->loop)) {
		perch__send_start(s, c, chain);
		return;
	}
	/* The send's own conn reference (taken by the core) keeps s alive until it runs. */
	s->posted_chain = chain;
	perch__sock_post(s, PERCH__POSTED_SEND);
}

/* ================= the staging pool ================= */

/*
 * Staging buffers, pooled per loop and touched only on its thread: a write
 * there stages in a buffer a send gave back instead of a new one. Without
 * the pool every write mallocs and every send completion frees, and glibc
 * trims the loop thread's heap and grows it back, each regrown page a
 * fault. Bounded, so idle connections hold none and a burst's buffers go.
 */
static struct perch_loop *loop_of_conn(struct perch_conn *c)
{
	return ((struct perch__sock *)c->transport)->loop;
}

/*
 * On the loop's thread, a buffer of the pool's size: pooled, or new when
 * the pool is empty (so that it comes back to the pool: a write the core
 * would give one bigger buffer of its own never would).
 */
struct perch__txbuf *perch__loop_txbuf_get(struct perch_loop *loop)
{
	if (!perch__loop_is_current(loop))
		return NULL;
	struct perch__txbuf *b = loop->txbuf_pool;
	if (!b)
		return perch__txbuf_new(PERCH__TXBUF_CAP);
	loop->txbuf_pool = b->next;
	loop->txbuf_pooled--;
	return b;
}

bool perch__loop_txbuf_put(struct perch_loop *loop, struct perch__txbuf *b)
{
	if (!perch__loop_is_current(loop) || loop->txbuf_pooled >= PERCH__TXBUF_POOL_MAX)
		return false;
	b->next = loop->txbuf_pool;
	loop->txbuf_pool = b;
	loop->txbuf_pooled++;
	return true;
}

struct perch__txbuf *perch__op_txbuf_get(struct perch_conn *c)
{
	return perch__loop_txbuf_get(loop_of_conn(c));
}

bool perch__op_txbuf_put(struct perch_conn *c, struct perch__txbuf *b)
{
	return perch__loop_txbuf_put(loop_of_conn(c), b);
}

void perch__txbuf_pool_free(struct perch_loop *loop)
{
	perch__conn_free_chain(loop->txbuf_pool);
	loop->txbuf_pool = NULL;
	loop->txbuf_pooled = 0;
}
