/* lib/uring_zc.c: zero-copy sends: which sends go zero-copy, and the chains they hold until the kernel's notification. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

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
	struct usock_rare *rare = perch__uring_rare(us_of(s));
	if (!rare)
		return NULL;
	if (!rare->zcfd && (rare->zcfd = calloc(1, sizeof(*rare->zcfd))))
		rare->zcfd->fd = s->fd;
	struct zc_hold *h = rare->zcfd ? calloc(1, sizeof(*h)) : NULL;
	if (!h)
		return NULL;
	if ((uintptr_t)h >> 56) {
		free(h); /* its address would not fit in a user_data beside the op */
		return NULL;
	}
	h->s = s;
	h->zfd = rare->zcfd;
	h->zfd->holds++;
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
	struct zc_fd *zfd = h->zfd;
	if (--zfd->holds == 0 && zfd->orphaned) {
		if (zfd->fd >= 0)
			close(zfd->fd);
		free(zfd);
	}
	perch__conn_free_chain(h->chain);
	free(h);
}

/* ================= the socket's fd ================= */

/*
 * Whether a close of `fd` resets the connection, so the kernel drops the
 * bytes at once: an abort set SO_LINGER 0, or received bytes are unread.
 */
static bool closes_with_reset(int fd)
{
	struct linger lg = { 0 };
	socklen_t len = sizeof(lg);
	int unread = 0;
	if (getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff && lg.l_linger == 0)
		return true;
	return ioctl(fd, FIONREAD, &unread) == 0 && unread > 0;
}

/* The socket's holds forget its fd, which the caller closes; the record goes now, or with the last hold. */
static void forget_fd(struct zc_fd *zfd)
{
	if (!zfd)
		return;
	if (zfd->holds == 0) {
		free(zfd);
		return;
	}
	zfd->fd = -1;
	zfd->orphaned = true;
}

/* The socket's fd record, taken from it (NULL: it never sent zero-copy). */
static struct zc_fd *take_zcfd(struct perch__sock *s)
{
	struct usock_rare *rare = us_of(s)->rare;
	struct zc_fd *zfd = rare ? rare->zcfd : NULL;
	if (rare)
		rare->zcfd = NULL;
	return zfd;
}

void perch__uring_zc_close_fd(struct perch__sock *s)
{
	struct zc_fd *zfd = take_zcfd(s);
	if (zfd && zfd->holds > 0 && !closes_with_reset(s->fd)) {
		/* The end follows the bytes, and the peer's later bytes get a reset, as after a close. */
		shutdown(s->fd, SHUT_RDWR);
		zfd->orphaned = true;
		return;
	}
	forget_fd(zfd);
	close(s->fd);
}

void perch__uring_zc_settle(struct perch__sock *s)
{
	struct usock_rare *rare = us_of(s)->rare;
	/*
	 * A zero-copy send still the socket's: the ring is gone and its
	 * connection reset (zc_reset_held), so abandon_all's -ECANCELED gives
	 * its chain back at once; the hold, freed by zc_free_all, forgets the
	 * socket, which goes before it.
	 */
	if (rare && rare->zc)
		rare->zc->s = NULL;
	forget_fd(take_zcfd(s)); /* abandon_all closes the fd: reset already when a hold needed it */
	perch__uring_rare_free(us_of(s)); /* the kernel copied the gather block when it took the send's SQE */
}

/* ================= sends ================= */

bool perch__uring_zc_prep(struct uring *u, struct perch__sock *s, struct io_uring_sqe *sqe,
			  const struct iovec *iov, int n)
{
	struct usock *us = us_of(s);
	/* Off (the default) costs every send one compare, not a walk of its buffers. */
	if (!u->zerocopy || s->opts->zerocopy_min == PERCH_ZEROCOPY_OFF || (us->flags & F_NO_ZC) ||
	    !perch__loop_tx_wants_zerocopy(s, n))
		return false;
	struct zc_hold *h = us->rare ? us->rare->zc : NULL;
	if (!h && !(h = hold_new(u, s)))
		return false; /* out of memory: a plain send, which needs nothing */
	us->rare->zc = h;
	if (n == 1) {
		io_uring_prep_send_zc(sqe, s->fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL, 0);
	} else {
		io_uring_prep_sendmsg_zc(sqe, s->fd, perch__uring_send_msg(us, n), MSG_NOSIGNAL);
	}
	perch__uring_sqe_fixed(s, sqe);
	io_uring_sqe_set_data64(sqe, UD_ZC(h));
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
	PERCH_ASSERT(s != NULL && us->rare && us->rare->zc == h); /* a result comes while its send is the socket's */
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
	struct usock_rare *rare = us_of(s)->rare;
	struct zc_hold *h = rare ? rare->zc : NULL;
	if (!h)
		return false;
	rare->zc = NULL;
	if (h->owed == 0) {
		hold_free(st_of(s->loop), h); /* every notification came (or none was announced) */
		return false;
	}
	h->chain = chain;
	h->s = NULL; /* the socket may go before the notifications come */
	return true;
}

/* ================= the loop's free ================= */

/*
 * Resets the connection now: the kernel drops what it has not sent. A
 * connect to AF_UNSPEC disconnects whatever else holds the file (the ring's
 * requests do until its exit work ends them), where a close would only
 * drop this reference; SO_LINGER 0 makes the close that follows quiet.
 */
static void reset_now(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };
	if (fd < 0)
		return;
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	connect(fd, &unspec, sizeof(unspec)); /* a failure (not TCP: no zero-copy was sent) leaves the close's end */
}

/*
 * No notification can come once the ring is gone, yet the kernel may still
 * be sending the caller's bytes: each connection with a notification owed
 * is reset instead (its queued bytes dropped, never sent changed), a
 * finalized one's fd closed now, a live one's by perch__loop_abandon_all.
 * Bytes a network card has taken already may still leave before the reset
 * (doc/loop.md, "Zero-copy sends").
 */
void perch__uring_zc_reset_held(struct uring *u)
{
	for (struct zc_hold *h = u->zc_holds; h; h = h->next) {
		struct zc_fd *zfd = h->zfd;
		if ((h->owed == 0 && !h->s) || zfd->fd < 0)
			continue; /* nothing owed, or reset already; a send in flight may have queued bytes */
		reset_now(zfd->fd);
		if (zfd->orphaned) {
			close(zfd->fd);
			zfd->fd = -1;
		}
	}
}

/*
 * The ring is gone, and with it the notifications owed; every connection
 * that owed one was reset (perch__uring_zc_reset_held), so the kernel sends
 * none of its bytes again: their memory goes back to its owner
 * (doc/loop.md, "Zero-copy sends").
 */
void perch__uring_zc_free_all(struct uring *u)
{
	while (u->zc_holds)
		hold_free(u, u->zc_holds);
}
