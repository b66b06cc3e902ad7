/* lib/recv.c: the loop's side of receiving: segments queued on the connection, pausing and resuming for backpressure, buffers given back. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "invariant.h"
#include "loop_internal.h"

/* ================= receive: segments and backpressure ================= */

bool perch__loop_recv_wanted(const struct perch__sock *s)
{
	return !s->closing && !s->rx_ended && !s->rx_paused;
}

/*
 * Closed here: the close ran on the loop (closing), or the user closed the
 * conn on another thread and the close is still on its way, or the conn
 * failed. What the kernel still completes (bytes, FIN, RST) is not handed
 * to it: a read after a close sees "closed" only.
 */
static bool locally_closed(const struct perch__sock *s)
{
	return s->closing || perch_conn_is_closed(perch__sock_conn(s));
}

/* A segment goes back: a pool buffer to its backend, a heap one (perch__loop_recv_own's) freed. */
static void give_back(struct perch_loop *loop, struct perch__rxseg *rs)
{
	if (rs->seg.buf_id == PERCH__SEG_HEAP)
		free(rs);
	else
		loop->be->buf_release(loop, rs);
}

/* The conn could not queue a segment (out of memory): it fails, and receives no more. */
static void arrival_failed(struct perch__sock *s)
{
	s->rx_ended = true;
	s->loop->be->recv_pause(s);
	perch__conn_failed(perch__sock_conn(s), -ENOMEM);
}

void perch__loop_received(struct perch__sock *s, struct perch__rxseg *rs)
{
	struct perch_loop *loop = s->loop;
	uint32_t len = rs->seg.len;
	if (locally_closed(s)) {
		give_back(loop, rs);
		return;
	}
	bool pool = rs->seg.buf_id != PERCH__SEG_HEAP;
	rs->slot = s->slot;
	rs->gen = s->gen;
	rs->tail_bytes = 0;
	s->unconsumed += len;
	s->pool_held += pool;
	if (perch__conn_recv_arrived(perch__sock_conn(s), &rs->seg) != 0) {
		s->unconsumed -= len;
		s->pool_held -= pool;
		give_back(loop, rs);
		arrival_failed(s);
		return;
	}
	/*
	 * Inline, in this turn: a deferred pause would let the rest of this
	 * batch (and the next) overfill the connection. What arrives before
	 * the pause lands is still queued above, never dropped. The conn's
	 * reader may have consumed (and even closed) inside recv_arrived: the
	 * socket stays valid until the end of this completion.
	 */
	if (s->unconsumed >= s->opts->pause_bytes)
		s->rx_full = true;
	/* A peer sending a few bytes a segment would otherwise hold a buffer a segment. */
	if (!s->rx_paused && (s->rx_full || s->pool_held >= s->opts->pool_max)) {
		s->rx_paused = true;
		loop->stats.recv_pauses++;
		if (!s->closing)
			loop->be->recv_pause(s);
	}
}

/* What the socket holds (FIONREAD), at least 1 so that a read sees an end, at most `room`. */
static size_t queued_bytes(int fd, size_t room)
{
	int queued = 0;
	if (ioctl(fd, FIONREAD, &queued) != 0 || queued < 1)
		queued = 1;
	return (size_t)queued < room ? (size_t)queued : room;
}

/* One recv into a heap segment: the segment, or NULL with *res 0 (the end) or -errno. */
static struct perch__rxseg *recv_into_heap(struct perch__sock *s, size_t want, int *res)
{
	struct perch__rxseg *rs = malloc(sizeof(*rs) + want);
	if (!rs) {
		*res = -ENOMEM;
		return NULL;
	}
	ssize_t n;
	do
		n = recv(s->fd, rs + 1, want, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n <= 0) {
		*res = n == 0 ? 0 : -errno;
		free(rs);
		return NULL;
	}
	rs->seg = (struct perch_seg){ .data = (uint8_t *)(rs + 1), .len = (uint32_t)n, .buf_id = PERCH__SEG_HEAP,
				      .owner = s->loop };
	return rs;
}

void perch__loop_recv_own(struct perch__sock *s)
{
	/* Parked: no recv of the backend's is armed (once unparked, one may be, and it reads the rest). */
	while (s->parked && perch__loop_recv_wanted(s) && !locally_closed(s)) {
		PERCH_ASSERT(s->unconsumed < s->opts->pause_bytes); /* not paused */
		int res = 0;
		struct perch__rxseg *rs = recv_into_heap(s, queued_bytes(s->fd, s->opts->pause_bytes - s->unconsumed), &res);
		if (!rs) {
			if (res == -ENOMEM)
				arrival_failed(s);
			else if (res != -EAGAIN && res != -EWOULDBLOCK)
				perch__loop_recv_ended(s, res); /* 0: the end, after every byte */
			return;
		}
		s->loop->stats.own_receives++;
		perch__loop_received(s, rs); /* counted, and paused at the threshold like any receive */
	}
}

void perch__loop_recv_ended(struct perch__sock *s, int res)
{
	if (s->rx_ended)
		return;
	s->rx_ended = true;
	if (locally_closed(s))
		return;
	if (res == 0)
		perch__conn_peer_closed(perch__sock_conn(s));
	else
		perch__conn_failed(perch__sock_conn(s), res);
}

void perch__loop_failed(struct perch__sock *s, int err)
{
	s->rx_ended = true;
	if (!locally_closed(s))
		perch__conn_failed(perch__sock_conn(s), err);
}

/*
 * Bytes resume at resume_bytes; buffers as soon as one is back below the
 * bound (a reader that waits gives up a tail spread thin: conn_read.c).
 */
static void maybe_resume(struct perch__sock *s)
{
	if (!s->rx_paused || (s->rx_full && s->unconsumed > s->opts->resume_bytes) || s->pool_held >= s->opts->pool_max)
		return;
	s->rx_full = false;
	s->rx_paused = false;
	if (perch__loop_recv_wanted(s))
		s->loop->be->recv_arm(s);
}

/* Loop thread: the buffer goes back; the socket it was lent to (if still there) may resume. */
static void release_now(struct perch_loop *loop, struct perch__rxseg *rs)
{
	struct perch__sock *s = perch__table_lookup(loop, rs->slot, rs->gen);
	uint32_t len = rs->seg.len, tail = rs->tail_bytes;
	bool pool = rs->seg.buf_id != PERCH__SEG_HEAP;
	give_back(loop, rs);
	if (s && s->kind == PERCH__SOCK_CONN) {
		/* What it moved into a compacted tail stays counted, in the tail's segment. */
		s->unconsumed += tail;
		PERCH_ASSERT(s->unconsumed >= len); /* every released byte was counted when delivered */
		PERCH_ASSERT(s->pool_held >= pool);
		s->unconsumed -= len;
		s->pool_held -= pool;
		maybe_resume(s);
	}
}

static void run_posted_release(struct perch_loop *loop, struct perch__msg *m)
{
	release_now(loop, perch__container_of(m, struct perch__rxseg, release));
}

/*
 * Each segment given up for a tail carries the bytes it moves into it:
 * all of its own, but the first's consumed head. So each release, adding
 * them before it takes its length away, leaves the count as it was or
 * lower, in any order, and the sum moves the tail's `len` whole.
 */
static void stamp_moved_bytes(struct perch_seg *first, size_t len)
{
	size_t rest = 0;
	for (struct perch_seg *seg = first->next; seg; seg = seg->next) {
		struct perch__rxseg *rs = (struct perch__rxseg *)seg;
		PERCH_ASSERT(rs->tail_bytes == 0);
		rs->tail_bytes = seg->len;
		rest += seg->len;
	}
	struct perch__rxseg *head = (struct perch__rxseg *)first;
	PERCH_ASSERT(head->tail_bytes == 0 && rest < len && len - rest <= first->len);
	head->tail_bytes = (uint32_t)(len - rest);
}

/*
 * The conn core's tail_seg: loop memory sized to a compacted tail, which
 * counts against the connection's pause like a received segment. The
 * reader's thread, so the loop's count moves with the given-up segments'
 * releases (stamp_moved_bytes). The new segment's release may run before
 * them (inline on the loop thread while theirs are posted), which the
 * count allows: until then they still hold more than its bytes.
 */
struct perch_seg *perch__op_tail_seg(struct perch_seg *first, size_t len)
{
	PERCH_ASSERT(first->buf_id != PERCH__SEG_OWN); /* a loop's segment: a struct perch__rxseg */
	if (len > UINT32_MAX)
		return NULL;
	struct perch__rxseg *model = (struct perch__rxseg *)first;
	struct perch__rxseg *rs = malloc(sizeof(*rs) + len);
	if (!rs)
		return NULL;
	rs->seg = (struct perch_seg){ .data = (uint8_t *)(rs + 1), .len = (uint32_t)len, .buf_id = PERCH__SEG_HEAP,
				      .owner = first->owner };
	rs->slot = model->slot;
	rs->gen = model->gen;
	rs->tail_bytes = 0;
	stamp_moved_bytes(first, len);
	return &rs->seg;
}

/* The conn core's release_seg: at once on the loop thread, else posted on the segment's own message. */
void perch__op_release_seg(struct perch_seg *seg)
{
	struct perch__rxseg *rs = (struct perch__rxseg *)seg;
	struct perch_loop *loop = seg->owner;
	if (perch__loop_is_current(loop)) {
		release_now(loop, rs);
		return;
	}
	rs->release.run = run_posted_release;
	perch__inbox_push(loop, &rs->release);
}
