/* lib/uring_zc.c: zero-copy sends: which sends go zero-copy, and the chains they hold until the kernel's notification. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>

#include "uring_internal.h"

/* ================= the probe ================= */

void perch__uring_zc_probe(struct uring *u)
{
	struct io_uring_probe *p = io_uring_get_probe_ring(&u->ring);
	u->zerocopy = p && io_uring_opcode_supported(p, IORING_OP_SEND_ZC) &&
		      io_uring_opcode_supported(p, IORING_OP_SENDMSG_ZC);
	u->loop->stats.zerocopy_available = u->zerocopy;
	io_uring_free_probe(p);
}

/* ================= holds ================= */

static struct zc_hold *hold_new(struct uring *u, struct perch__sock *s)
{
	struct zc_hold *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	if ((uintptr_t)h >> 56) {
		free(h); /* its address would not fit in a user_data beside the op */
		return NULL;
	}
	h->s = s;
	h->next = u->zc_holds;
	if (h->next)
		h->next->prev = h;
	u->zc_holds = h;
	return h;
}

/* The chain goes back (its references released, on the loop thread) and the hold with it. */
static void hold_free(struct uring *u, struct zc_hold *h)
{
	if (h->prev)
		h->prev->next = h->next;
	else
		u->zc_holds = h->next;
	if (h->next)
		h->next->prev = h->prev;
	perch__conn_free_chain(h->chain);
	free(h);
}

/* ================= sends ================= */

bool perch__uring_zc_prep(struct uring *u, struct perch__sock *s, struct io_uring_sqe *sqe, int n)
{
	struct usock *us = us_of(s);
	if (!u->zerocopy || (us->flags & F_NO_ZC) || !perch__loop_tx_wants_zerocopy(s, n))
		return false;
	if (!us->zc && !(us->zc = hold_new(u, s)))
		return false; /* out of memory: a plain send, which needs nothing */
	if (n == 1) {
		io_uring_prep_send_zc(sqe, s->fd, us->iov[0].iov_base, us->iov[0].iov_len, MSG_NOSIGNAL, 0);
	} else {
		io_uring_prep_sendmsg_zc(sqe, s->fd, perch__uring_send_msg(us, n), MSG_NOSIGNAL);
	}
	io_uring_sqe_set_data64(sqe, UD_ZC(us->zc));
	us->flags |= F_SEND_ZC;
	s->loop->stats.zerocopy_sends++;
	return true;
}

/*
 * The send's result comes first; with F_MORE set, a notification follows
 * once the kernel let go of the bytes (a failed send may announce none).
 * The result goes on as a plain send's would: a short one resubmits from
 * where it stopped (under the same hold), a whole one completes the flush,
 * and the chain waits in the hold for the notifications owed.
 */
void perch__uring_on_send_zc(struct zc_hold *h, int res, uint32_t flags)
{
	struct perch__sock *s = h->s;
	struct usock *us = us_of(s);
	PERCH_ASSERT(s != NULL && us->zc == h); /* a result comes while its send is the socket's */
	if (flags & IORING_CQE_F_MORE)
		h->owed++;
	us->flags &= ~(F_SEND | F_SEND_ZC);
	if (res == -EOPNOTSUPP && !s->closing) {
		/* A socket the kernel sends no zero-copy on (a Unix one): nothing went; plain from now on. */
		us->flags |= F_NO_ZC;
		s->loop->stats.zerocopy_refused++;
		perch__uring_send(s);
		return;
	}
	perch__loop_sent(s, res);
}

/*
 * Not counted in the socket's flight: a peer that reads nothing keeps the
 * bytes queued, and only the socket's close lets the kernel drop them, so
 * the close must not wait for the notification.
 */
void perch__uring_zc_notified(struct uring *u, struct zc_hold *h)
{
	PERCH_ASSERT(h->owed > 0); /* announced by its send's result */
	u->loop->stats.zerocopy_notifs++;
	if (--h->owed == 0 && h->chain)
		hold_free(u, h);
}

bool perch__uring_zc_keep(struct perch__sock *s, struct perch__txbuf *chain)
{
	struct usock *us = us_of(s);
	struct zc_hold *h = us->zc;
	if (!h)
		return false;
	us->zc = NULL;
	if (h->owed == 0) {
		hold_free(st_of(s->loop), h); /* every notification came (or none was announced) */
		return false;
	}
	h->chain = chain;
	h->s = NULL; /* the socket may go before the notifications come */
	return true;
}

/*
 * The ring is gone, and with it the notifications owed: the kernel keeps
 * its own reference to the pages it still reads, so their memory may go
 * back to its owner (doc/loop.md, "Zero-copy sends").
 */
void perch__uring_zc_free_all(struct uring *u)
{
	while (u->zc_holds)
		hold_free(u, u->zc_holds);
}
