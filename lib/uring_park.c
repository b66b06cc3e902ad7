/* lib/uring_park.c: the io_uring backend's ENOBUFS park list: connections waiting for a receive buffer, served as buffers come back, hearing their peer's end meanwhile. */
#include "config.h"

#include <poll.h>

#include "uring_internal.h"

/*
 * Buffers came back: re-arm parked connections, first parked first, no
 * more of them than there are buffers in the ring (each can take at least
 * one), the ring growing while any are held back. So a connection waits
 * only while every buffer is taken. One that loses the race for them
 * parks again at the tail, so no connection starves and nothing spins.
 * One that takes none (its recv ends on a FIN, an error or a cancel
 * without a buffer) leaves its share unused: perch__uring_on_recv serves the list again
 * then, while the ring has a free buffer.
 */
void perch__uring_serve_parked(struct uring *u)
{
	uint32_t budget = u->ring_free;
	struct perch__sock *s;
	while ((s = perch__parked_first(u->loop)) != NULL) {
		/* Paused, ended or closing: it waits for nothing here (a resume arms it), and grows nothing. */
		if (!perch__loop_recv_wanted(s)) {
			perch__unpark(s);
			continue;
		}
		if (budget == 0 && (budget = perch__uring_ring_grow(u)) == 0)
			return; /* every buffer is taken: a return serves the list again */
		perch__unpark(s);
		perch__uring_recv_arm(s);
		budget--;
	}
}

/*
 * Parked with no recv in flight, a socket would not hear its peer hang up
 * until a buffer came back (and a peer gone for good would pin the fd):
 * a one-shot poll for the end (POLLRDHUP; POLLHUP and POLLERR come
 * unasked) listens meanwhile. One at a time: it may outlive the park, and
 * then finds nothing to do when it fires, or is canceled by the close.
 */
void perch__uring_watch_for_hangup(struct uring *u, struct perch__sock *s)
{
	struct usock *us = us_of(s);
	if (us->flags & F_HANGUP)
		return;
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return; /* the ring is broken: the poll reports it */
	io_uring_prep_poll_add(sqe, s->fd, POLLRDHUP);
	perch__uring_sqe_fixed(s, sqe);
	io_uring_sqe_set_data64(sqe, UD(OP_HANGUP, s));
	us->flags |= F_HANGUP;
	us->inflight++;
}

void perch__uring_on_hangup(struct uring *u, struct perch__sock *s, int res)
{
	us_of(s)->flags &= ~F_HANGUP;
	if (res <= 0 || !s->parked || s->closing)
		return; /* canceled, or no longer waiting: its recv hears the end */
	PERCH_ASSERT(!(us_of(s)->flags & F_RECV)); /* parked: no recv of the kernel's races ours */
	perch__loop_recv_own(s);
	if (!perch__loop_recv_wanted(s))
		perch__unpark(s);
}

void perch__uring_buf_release(struct perch_loop *loop, struct perch__rxseg *rs)
{
	struct uring *u = st_of(loop);
	perch__uring_buf_return(u, rs->seg.buf_id);
	perch__uring_serve_parked(u);
}
