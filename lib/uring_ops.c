/* lib/uring_ops.c: the io_uring backend's socket operations (one SQE each) and their completions. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "uring_internal.h"

/* ================= socket operations ================= */

/*
 * Whether a multishot recv skips waiting for readability (POLL_FIRST):
 * only over bytes already queued. Waiting first keeps an idle connection
 * from taking a buffer (so from parking); but a multishot armed with it
 * over bytes and a reset that both came first may never report the reset
 * (doc/loop.md, "The receive ring"). Single-shot recvs always wait.
 */
static bool bytes_waiting_for_multishot(const struct perch__sock *s)
{
	int queued = 0;
	return s->recv_mode != PERCH_RECV_SINGLESHOT && s->family != AF_UNIX &&
	       ioctl(s->fd, FIONREAD, &queued) == 0 &&
	       queued > 0;
}

/*
 * A multishot recv stops by itself once it has taken the connection's
 * room before its pause (the kernel's optlen, in the field liburing 2.3
 * names file_index; checked after each buffer, so it overshoots by less
 * than one). Without it the kernel fills buffers until the pause's cancel
 * lands, as many as one pass of its task work drains: the ring's worth
 * for a peer that keeps sending. A kernel that predates the limit refuses
 * it (EINVAL, taking no buffer): perch__uring_on_recv arms without it then.
 * The kernel subtracts each receive from it as an int: a limit of 2 GiB
 * or more would end the multishot after one buffer, so room is capped
 * below that; 0 would mean no limit.
 */
static void limit_to_room(struct uring *u, struct perch__sock *s, struct io_uring_sqe *sqe)
{
	if (u->recv_limit_refused)
		return;
	uint64_t room = s->unconsumed < s->opts->pause_bytes ? s->opts->pause_bytes - s->unconsumed : 1;
	sqe->file_index = room < INT32_MAX ? (uint32_t)room : INT32_MAX;
	us_of(s)->flags |= F_RECV_LIM;
}

/*
 * A Unix socket always receives single-shot: a multishot recv armed to
 * wait for readability first (as an idle one must be, or it takes a
 * buffer's turn and parks) now and then never reported the end of a
 * stream that came right after bytes (kernel 6.18: doc/loop.md, "Unix
 * domain sockets").
 */
void perch__uring_recv_arm(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	struct usock *us = us_of(s);
	if (s->closing || (us->flags & F_RECV))
		return; /* in flight already: its last completion re-arms if still wanted */
	if (s->parked) {
		/*
		 * Parked, and (say) resumed from a pause: a free buffer that no
		 * one took is its to try. None free means none spare either:
		 * perch__uring_serve_parked grows the ring before it leaves anyone parked.
		 */
		if (u->ring_free == 0) {
			perch__uring_watch_for_hangup(u, s); /* resumed while parked: it listens for the end again */
			return;
		}
	}
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return; /* the ring is broken: the poll reports it */
	perch__unpark(s);
	if (s->recv_mode == PERCH_RECV_SINGLESHOT || s->family == AF_UNIX) {
		io_uring_prep_recv(sqe, s->fd, NULL, 0, 0);
		us->flags |= F_RECV;
	} else {
		io_uring_prep_recv_multishot(sqe, s->fd, NULL, 0, 0);
		us->flags |= F_RECV | F_RECV_MS;
		limit_to_room(u, s, sqe);
		if (u->bundles)
			sqe->ioprio |= IORING_RECVSEND_BUNDLE;
	}
	sqe->flags |= IOSQE_BUFFER_SELECT;
	perch__uring_sqe_fixed(s, sqe);
	if (!bytes_waiting_for_multishot(s))
		sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
	sqe->buf_group = BGID;
	io_uring_sqe_set_data64(sqe, UD(OP_RECV, s));
	us->inflight++;
	s->loop->stats.recv_arms++;
}

void perch__uring_recv_pause(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	/* Single-shot: simply not re-armed. Multishot: cancel it; CQEs already on the way are kept. */
	if ((us_of(s)->flags & (F_RECV | F_RECV_MS | F_RECV_CANCEL)) != (F_RECV | F_RECV_MS))
		return;
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return;
	io_uring_prep_cancel64(sqe, UD(OP_RECV, s), 0);
	io_uring_sqe_set_data64(sqe, UD(OP_PAUSE_CANCEL, s));
	us_of(s)->flags |= F_RECV_CANCEL;
	us_of(s)->inflight++;
}

/*
 * The first send of several buffers makes the socket's gather block.
 * Returns the iovecs' count in it; out of memory, 1: the first buffer
 * (already in the caller's) goes alone, and the rest after it, as after a
 * short send.
 */
static int gather_first(struct perch__sock *s, struct usock *us, struct iovec **iov)
{
	struct usock_rare *rare = perch__uring_rare(us);
	if (!rare || !(rare->gather = malloc(sizeof(*rare->gather))))
		return 1;
	*iov = rare->gather->iov;
	return perch__loop_tx_iov(s, rare->gather->iov, PERCH__TX_IOV);
}

struct usock_rare *perch__uring_rare(struct usock *us)
{
	if (!us->rare && (us->rare = malloc(sizeof(*us->rare))))
		*us->rare = (struct usock_rare){ NULL, NULL, NULL };
	return us->rare;
}

void perch__uring_rare_free(struct usock *us)
{
	if (!us->rare)
		return;
	free(us->rare->gather);
	free(us->rare);
	us->rare = NULL;
}

void perch__uring_send(struct perch__sock *s)
{
	struct usock *us = us_of(s);
	struct uring *u = st_of(s->loop);
	perch__uring_fixed_enter(u, s);
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return; /* the ring is broken: the loop's free settles the send (perch__loop_abandon_all) */
	struct iovec first[2];
	struct usend_gather *g = us->rare ? us->rare->gather : NULL;
	struct iovec *iov = g ? g->iov : first;
	int n = perch__loop_tx_iov(s, iov, g ? PERCH__TX_IOV : 2);
	if (n > 1 && iov == first)
		n = gather_first(s, us, &iov);
	if (perch__uring_zc_prep(u, s, sqe, iov, n)) {
		us->flags |= F_SEND;
		us->inflight++;
		return;
	}
	if (n == 1) {
		/* One buffer (a typical reply): a plain send spares the kernel copying a msghdr and importing an iovec. */
		io_uring_prep_send(sqe, s->fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
	} else {
		io_uring_prep_sendmsg(sqe, s->fd, perch__uring_send_msg(us, n), MSG_NOSIGNAL);
	}
	perch__uring_sqe_fixed(s, sqe);
	io_uring_sqe_set_data64(sqe, UD(OP_SEND, s));
	us->flags |= F_SEND;
	us->inflight++;
}

void perch__uring_accept(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	if (us_of(s)->flags & F_ACCEPT)
		return; /* still armed: a resume must not arm a second */
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return;
	us_of(s)->flags |= F_ACCEPT;
	io_uring_prep_multishot_accept(sqe, s->fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, UD(OP_ACCEPT, s));
	us_of(s)->inflight++;
}

void perch__uring_connect(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return;
	const struct perch__connecting *cx = perch__sock_cx(s);
	io_uring_prep_connect(sqe, s->fd, (struct sockaddr *)&cx->addr, cx->addr_len);
	io_uring_sqe_set_data64(sqe, UD(OP_CONNECT, s));
	us_of(s)->flags |= F_CONNECT;
	us_of(s)->inflight++;
}

/* Submits a cancel of the operation whose user_data is `target` (or, with 0, a no-op), counted in flight. */
static bool close_cancel(struct uring *u, struct perch__sock *s, uint64_t target)
{
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return false; /* the ring is broken: the loop's free finalizes the socket */
	if (target)
		io_uring_prep_cancel64(sqe, target, 0);
	else
		io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, UD(OP_CLOSE_CANCEL, s));
	us_of(s)->inflight++;
	return true;
}

/*
 * A cancel for each operation in flight, found by its user_data: the
 * kernel finds that in one hash bucket, where a cancel by fd scans every
 * pending request of the ring (with 10,000 idle connections, two thirds
 * of the loop's CPU went there). The cancels' own completions are
 * counted, and with nothing in flight a no-op stands in, so the socket is
 * finalized from a completion, never inline here (callers may still be
 * using it).
 */
void perch__uring_close(struct perch__sock *s)
{
	static const struct { uint32_t flag; enum op op; } in_flight[] = {
		{ F_RECV, OP_RECV }, { F_SEND, OP_SEND }, { F_CONNECT, OP_CONNECT }, { F_ACCEPT, OP_ACCEPT },
		{ F_HANGUP, OP_HANGUP },
	};
	struct uring *u = st_of(s->loop);
	uint32_t flags = us_of(s)->flags;
	bool any = false;
	perch__unpark(s);
	for (size_t i = 0; i < sizeof(in_flight) / sizeof(in_flight[0]); i++) {
		if (!(flags & in_flight[i].flag))
			continue;
		bool zc = in_flight[i].op == OP_SEND && (flags & F_SEND_ZC);
		if (!close_cancel(u, s, zc ? UD_ZC(us_of(s)->rare->zc) : UD(in_flight[i].op, s)))
			return;
		any = true;
	}
	if (flags & (F_FIXING | F_FIXED)) {
		if (!perch__uring_fixed_leave(u, s))
			return;
		any = true;
	}
	if (!any)
		close_cancel(u, s, 0);
}

/* ================= completions ================= */

/*
 * A byte limit this kernel does not know: refused before any buffer was
 * taken, so nothing was lost. Once one limited recv received, the kernel
 * knows it: a later EINVAL is the connection's own.
 */
static bool limit_refused(struct uring *u, struct perch__sock *s, int res, uint32_t flags, bool last)
{
	if (res != -EINVAL) {
		if (!u->recv_limit_known && res > 0 && (us_of(s)->flags & F_RECV_LIM))
			u->recv_limit_known = true; /* once a loop: no store a completion after */
		return false;
	}
	if (!last || (flags & IORING_CQE_F_BUFFER) || !(us_of(s)->flags & F_RECV_LIM) || u->recv_limit_known)
		return false;
	u->recv_limit_refused = true;
	s->loop->stats.recv_limit_refused = 1;
	return true;
}

/*
 * The buffers a receive of `res` bytes filled, from `bid` on, as a list
 * of segments: one buffer, or a bundle's, each full but the last. A
 * bundle's buffers after the first are the ones that followed it into
 * the ring, read off the ring before any is delivered: a delivery may
 * give buffers back, and the refill they start may reuse ring slots
 * once their buffers are counted out of the ring.
 */
static struct perch_seg *take_buffers(struct uring *u, uint32_t bid, uint32_t res)
{
	struct perch_seg *first = NULL, **tail = &first;
	uint16_t pos = u->ring_pos[bid];
	PERCH_ASSERT(u->bundles || res <= u->buf_size); /* only a bundle spans buffers */
	PERCH_ASSERT(u->br->bufs[pos & u->mask].bid == bid); /* counted in the ring until now: not reused */
	/* The common receive, one buffer, pays no division. */
	uint32_t nbufs = res <= u->buf_size ? 1 : (res + u->buf_size - 1) / u->buf_size;
	for (uint32_t i = 0; i < nbufs; i++) {
		uint32_t id = i == 0 ? bid : u->br->bufs[(uint16_t)(pos + i) & u->mask].bid;
		struct perch_seg *seg = &u->segs[id].seg;
		seg->data = u->bufs + (size_t)id * u->buf_size;
		seg->len = i + 1 < nbufs ? u->buf_size : res - i * u->buf_size;
		seg->buf_id = id;
		*tail = seg;
		tail = &seg->next;
		perch__uring_buf_taken(u);
	}
	*tail = NULL;
	if (nbufs > 1)
		u->loop->stats.bundle_bufs += nbufs;
	return first;
}

/*
 * Hands the segments of one receive to `s`, in order. One the connection
 * could not queue (out of memory) ends its receiving: the bundle's later
 * ones go back, so the reader sees no bytes past the hole.
 */
static void deliver(struct uring *u, struct perch__sock *s, struct perch_seg *seg)
{
	bool ended_before = s->rx_ended;
	while (seg) {
		struct perch_seg *next = seg->next;
		seg->next = NULL;
		if (s->rx_ended && !ended_before) {
			perch__uring_buf_return(u, seg->buf_id);
		} else {
			seg->owner = s->loop;
			perch__loop_received(s, perch__container_of(seg, struct perch__rxseg, seg));
		}
		seg = next;
	}
}

void perch__uring_recv_orphaned(struct uring *u, int res, uint32_t flags)
{
	uint32_t bid = flags >> IORING_CQE_BUFFER_SHIFT;
	if (res <= 0) {
		perch__uring_buf_taken(u);
		perch__uring_buf_return(u, bid);
		return;
	}
	for (struct perch_seg *seg = take_buffers(u, bid, (uint32_t)res), *next; seg; seg = next) {
		next = seg->next;
		seg->next = NULL;
		perch__uring_buf_return(u, seg->buf_id);
	}
}

void perch__uring_on_recv(struct uring *u, struct perch__sock *s, int res, uint32_t flags, bool last)
{
	if (limit_refused(u, s, res, flags, last))
		res = -ECANCELED; /* as a recv that ended with nothing: re-armed below, unlimited */
	if (last)
		us_of(s)->flags &= ~(F_RECV | F_RECV_MS | F_RECV_CANCEL | F_RECV_LIM);
	if (flags & IORING_CQE_F_BUFFER) {
		uint32_t bid = flags >> IORING_CQE_BUFFER_SHIFT;
		if (res > 0) {
			deliver(u, s, take_buffers(u, bid, (uint32_t)res));
		} else {
			perch__uring_buf_taken(u);
			perch__uring_buf_return(u, bid); /* an error or EOF that still took a buffer */
		}
	}
	if (res == 0)
		perch__loop_recv_ended(s, 0);
	else if (res == -ENOBUFS) {
		if (!s->closing && !s->parked) {
			perch__park(s);
			s->loop->stats.enobufs_parks++;
			perch__uring_watch_for_hangup(u, s);
			/*
			 * The kernel found the ring empty: the busiest moment needs
			 * more. Our count of free ones may not show it yet (buffers it
			 * took whose CQEs come later in this batch), so this grows by
			 * the kernel's word, once a poll.
			 */
			if (!u->grew_this_poll && perch__uring_ring_grow(u) > 0)
				u->grew_this_poll = true;
			/*
			 * Buffers may have come back between the kernel's try and
			 * this CQE (released earlier in this batch): then no later
			 * release would wake the connection. Serve the list now.
			 */
			perch__uring_serve_parked(u);
		}
		return;
	} else if (res < 0 && res != -ECANCELED && res != -EINTR)
		perch__loop_recv_ended(s, res);
	/* Any CQE without F_MORE ended the recv: re-arm unless paused, ended or closing. */
	if (last && perch__loop_recv_wanted(s))
		perch__uring_recv_arm(s);
	/*
	 * A recv ended (perhaps one perch__uring_serve_parked re-armed, counting on it to
	 * take a buffer) and a buffer is free: the next parked one may have it.
	 */
	if (last && u->ring_free > 0 && perch__parked_first(u->loop))
		perch__uring_serve_parked(u);
}

void perch__uring_on_accept(struct perch__sock *s, int res, bool last)
{
	if (last)
		us_of(s)->flags &= ~F_ACCEPT;
	if (res != -ECANCELED)
		perch__loop_accepted(s, res);
	if (last && !s->closing && !perch__lx(s)->accept_paused)
		perch__uring_accept(s);
}

/* A failed accept ends the multishot (perch__uring_on_accept then does not re-arm): nothing to stop. */
void perch__uring_accept_pause(struct perch__sock *s)
{
	(void)s;
}
