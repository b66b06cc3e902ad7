/* lib/uring.c: the io_uring backend: turns CQEs into the loop's perch__loop_* calls, nothing more. */
#include "config.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend.h"
#include "invariant.h"

#define BGID 0                 /* one buffer group per ring, so per loop */
#define CQE_BATCH 64
#define MAX_BATCHES 16         /* per poll: then let the caller's turn end (posted work, stop) */
#define RING_TARGET_MIN 64     /* the ring starts with this many (doubled when short, halved back once quiet) */
#define RING_SHRINK_POLLS 1024 /* polls (not time) in which a ring never used half its buffers, before it halves */
#define SQE_RETRIES 16         /* submits a full SQ tries, each after emptying the CQ, before the ring is broken */

/* user_data: op (8 bits) | generation (24 bits) | slot (32 bits). */
enum op { OP_WAKE = 1, OP_ACCEPT, OP_CONNECT, OP_RECV, OP_SEND, OP_CLOSE_CANCEL, OP_PAUSE_CANCEL };

#define UD(op, s) (((uint64_t)(op) << 56) | ((uint64_t)((s)->gen & 0xffffff) << 32) | (s)->slot)
#define UD_OP(ud) ((unsigned)((ud) >> 56))
#define UD_GEN(ud) ((uint32_t)((ud) >> 32) & 0xffffff)
#define UD_SLOT(ud) ((uint32_t)(ud))

/* usock.flags */
#define F_RECV        1u   /* a recv is in flight */
#define F_RECV_MS     2u   /* ... and it is multishot */
#define F_RECV_CANCEL 4u   /* a pause's cancel for it is in flight */
#define F_ACCEPT      8u   /* a listener's multishot accept is in flight */
#define F_SEND       16u   /* a send is in flight */

/* This backend's state for one socket, kept after the loop's (perch__sock_be). */
struct usock {
	uint32_t inflight;           /* operations whose last completion has not come */
	uint32_t flags;              /* F_* */
	struct msghdr msg;           /* a send of several buffers */
	struct iovec iov[PERCH__TX_IOV];
};

static struct usock *us_of(struct perch__sock *s)
{
	return perch__sock_be(s);
}

struct uring {
	struct io_uring ring;
	struct perch_loop *loop;
	bool needs_enable;           /* created disabled: the first poll enables it (binds the thread) */
	int broken;                  /* the kernel refused the ring for good (-errno): no SQE, the poll returns it */
	struct io_uring_buf_ring *br;
	size_t br_bytes;
	uint8_t *bufs;
	struct perch__rxseg *segs;   /* one per buffer id */
	uint32_t nbufs, buf_size, mask;
	uint32_t ring_free;          /* buffers in the ring now */
	/*
	 * The kernel takes a ring's buffers in the order they went in, so a
	 * ring of all buf_count buffers makes each receive land in the one
	 * used longest ago (cold in the cache). The ring holds ring_target
	 * of them (more for a while after a shrink, until the kernel has
	 * used the extra ones); the rest wait on `spare`, the most recently
	 * returned on top, and go in warmest first.
	 */
	uint32_t ring_target;
	uint32_t *spare;
	uint32_t nspare;
	bool grew_this_poll;         /* an ENOBUFS grows the ring once a poll, not once a CQE */
	uint32_t ring_low;           /* the fewest free buffers in the ring since the last shrink check */
	uint32_t polls_since_check;
	uint64_t parks_at_check;     /* stats.enobufs_parks then: an ENOBUFS since means not quiet */
	struct perch__park_list parked; /* ENOBUFS, FIFO: first parked, first served */
	uint64_t wake_val;
	struct cqe_copy *backlog;    /* CQEs taken off a full CQ to free it, not yet dispatched */
	size_t nbacklog, capbacklog;
};

struct cqe_copy {
	uint64_t ud;
	int res;
	uint32_t flags;
};

static struct uring *st_of(struct perch_loop *loop)
{
	return loop->be_state;
}

static int enable_ring(struct uring *u)
{
	/* liburing 2.3 declares io_uring_enable_rings but does not export it. */
	int rc = (int)syscall(__NR_io_uring_register, u->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS,
			      NULL, 0);
	if (rc < 0)
		return -errno;
	u->needs_enable = false;
	return 0;
}

/*
 * Moves every CQE ready into the backlog (in order, behind what is there)
 * without dispatching it: handlers are not re-entered, and the CQ has room
 * again. Returns how many moved.
 */
static unsigned stash_cqes(struct uring *u)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	io_uring_for_each_cqe(&u->ring, head, cqe) {
		if (u->nbacklog == u->capbacklog) {
			size_t cap = u->capbacklog ? u->capbacklog * 2 : 256;
			struct cqe_copy *b = realloc(u->backlog, cap * sizeof(*b));
			if (!b)
				break; /* left in the CQ: the kernel keeps overflow, nothing is lost */
			u->backlog = b;
			u->capbacklog = cap;
		}
		u->backlog[u->nbacklog++] = (struct cqe_copy){ cqe->user_data, cqe->res, cqe->flags };
		n++;
	}
	io_uring_cq_advance(&u->ring, n);
	return n;
}

/* The ring takes no more work: the first refusal stays, and the next poll returns it. */
static void ring_broken(struct uring *u, int err)
{
	if (!u->broken)
		u->broken = err;
}

/* A refusal to retry after the CQ is emptied: a full CQ (-EBUSY), a short allocation (-EAGAIN), a signal. */
static bool refused_for_now(int rc)
{
	return rc == -EBUSY || rc == -EAGAIN || rc == -EINTR;
}

/*
 * An SQE, flushing the queue when it is full (the loop thread owns the
 * ring). A submit refused for now is retried after the CQ is emptied into
 * the backlog and the kernel's task work is run, SQE_RETRIES times at
 * most. Any other refusal, or that many, breaks the ring: NULL, here and
 * from then on, and the caller starts nothing.
 */
static struct io_uring_sqe *sqe_get(struct uring *u)
{
	int rc;
	if (u->broken)
		return NULL;
	/* Work posted before the first poll reaches here first: bind the ring to this thread now. */
	if (u->needs_enable && (rc = enable_ring(u)) != 0) {
		ring_broken(u, rc);
		return NULL;
	}
	struct io_uring_sqe *sqe;
	for (int tries = 0; !(sqe = io_uring_get_sqe(&u->ring)); tries++) {
		if (tries == SQE_RETRIES) {
			ring_broken(u, -EBUSY);
			return NULL;
		}
		rc = io_uring_submit(&u->ring);
		if (rc > 0)
			continue;
		if (rc < 0 && !refused_for_now(rc)) {
			ring_broken(u, rc);
			return NULL;
		}
		stash_cqes(u);
		rc = io_uring_get_events(&u->ring);
		if (rc < 0 && !refused_for_now(rc)) {
			ring_broken(u, rc);
			return NULL;
		}
		stash_cqes(u);
	}
	return sqe;
}

/* ================= ring and buffer ring ================= */

/* Newest flags first; EINVAL means "this kernel does not know a flag": try plainer ones. */
static int ring_setup(struct perch_loop *loop, struct uring *u, unsigned entries)
{
	static const unsigned flag_sets[] = {
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED,
		IORING_SETUP_COOP_TASKRUN,
		0,
	};
	int rc = -EINVAL;
	for (size_t i = 0; i < sizeof(flag_sets) / sizeof(flag_sets[0]); i++) {
		struct io_uring_params p;
		memset(&p, 0, sizeof(p));
		p.flags = flag_sets[i];
		rc = io_uring_queue_init_params(entries, &u->ring, &p);
		if (rc == 0) {
			u->needs_enable = (flag_sets[i] & IORING_SETUP_R_DISABLED) != 0;
			return 0;
		}
		if (rc != -EINVAL)
			break;
	}
	loop->be_refused_at = "io_uring_queue_init";
	return rc;
}

/* Writes entry `offset` past the ring's tail; io_uring_buf_ring_advance publishes it. */
static void buf_add(struct uring *u, uint32_t bid, int offset)
{
	io_uring_buf_ring_add(u->br, u->bufs + (size_t)bid * u->buf_size, u->buf_size, (unsigned short)bid,
			      (int)u->mask, offset);
	u->ring_free++;
}

/* Tops the ring up to its target from the spare stack, warmest first, and publishes the entries. */
static void ring_refill(struct uring *u)
{
	int n = 0;
	while (u->ring_free < u->ring_target && u->nspare > 0)
		buf_add(u, u->spare[--u->nspare], n++);
	if (n > 0)
		io_uring_buf_ring_advance(u->br, n); /* a release store of the tail */
}

/* A new window of RING_SHRINK_POLLS polls in which the ring must stay quiet to shrink. */
static void shrink_window_restart(struct uring *u)
{
	u->polls_since_check = 0;
	u->ring_low = u->ring_free;
	u->parks_at_check = u->loop->stats.enobufs_parks;
}

/*
 * The ring ran dry, or connections wait for more buffers than it has,
 * while buffers wait on the spare stack: the busiest moment needs more,
 * so the target doubles (ring_maybe_shrink halves it once quiet again)
 * and the ring is topped up. Returns how many buffers went in.
 */
static uint32_t ring_grow(struct uring *u)
{
	if (u->nspare == 0 || u->ring_target == u->nbufs)
		return 0;
	uint32_t before = u->ring_free;
	/* From what it holds: after a shrink the ring may hold more than its target. */
	uint32_t from = u->ring_free > u->ring_target ? u->ring_free : u->ring_target;
	u->ring_target = from * 2 < u->nbufs ? from * 2 : u->nbufs;
	u->loop->stats.ring_target = u->ring_target;
	ring_refill(u);
	shrink_window_restart(u); /* a ring that just grew is not quiet */
	return u->ring_free - before;
}

/* The kernel took a buffer from the ring (a CQE says which). */
static void buf_taken(struct uring *u)
{
	u->ring_free--;
	if (u->ring_free < u->ring_low)
		u->ring_low = u->ring_free;
}

/*
 * A ring that grew for a burst goes back towards RING_TARGET_MIN once the
 * burst is over: when, for RING_SHRINK_POLLS polls, it never had fewer
 * than half its buffers free and no connection waited, the target halves.
 * Nothing is taken out: the extra buffers leave as the kernel uses them,
 * since returns then go to the spare stack until the ring is back at its
 * target.
 */
static void ring_maybe_shrink(struct uring *u)
{
	if (++u->polls_since_check < RING_SHRINK_POLLS)
		return;
	/*
	 * Quiet: never below half its buffers free (perch's count, which may
	 * lag the kernel's: so also no ENOBUFS, the kernel's own word), no
	 * connection parked, and the last halving done (no leftover beyond
	 * the target to make it look idle).
	 */
	if (u->ring_target > RING_TARGET_MIN && u->ring_low >= u->ring_target / 2 &&
	    u->ring_free <= u->ring_target && u->loop->stats.enobufs_parks == u->parks_at_check &&
	    !u->parked.head) {
		u->ring_target /= 2;
		u->loop->stats.ring_target = u->ring_target;
	}
	shrink_window_restart(u);
}

/* liburing 2.3 has no io_uring_setup_buf_ring: map the ring ourselves and register it. */
static int buf_ring_setup(struct perch_loop *loop, struct uring *u, uint32_t count, uint32_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	u->nbufs = count;
	u->buf_size = size;
	u->mask = (uint32_t)io_uring_buf_ring_mask(count);
	u->br_bytes = ((count * sizeof(struct io_uring_buf)) + (size_t)page - 1) & ~((size_t)page - 1);
	if (posix_memalign((void **)&u->br, (size_t)page, u->br_bytes) != 0)
		return -ENOMEM;
	if (posix_memalign((void **)&u->bufs, (size_t)page, (size_t)count * size) != 0)
		return -ENOMEM;
	u->segs = calloc(count, sizeof(*u->segs));
	u->spare = malloc(count * sizeof(*u->spare));
	if (!u->segs || !u->spare)
		return -ENOMEM;
	memset(u->br, 0, u->br_bytes);
	io_uring_buf_ring_init(u->br);
	struct io_uring_buf_reg reg = {
		.ring_addr = (unsigned long)u->br,
		.ring_entries = count,
		.bgid = BGID,
	};
	int rc = io_uring_register_buf_ring(&u->ring, &reg, 0);
	if (rc != 0) {
		loop->be_refused_at = "io_uring_register_buf_ring";
		return rc;
	}
	/* Low ids on top of the spare stack, so the ring starts with 0, 1, 2... */
	for (uint32_t i = 0; i < count; i++)
		u->spare[i] = count - 1 - i;
	u->nspare = count;
	u->ring_target = count < RING_TARGET_MIN ? count : RING_TARGET_MIN;
	u->loop = loop;
	loop->stats.ring_target = u->ring_target;
	ring_refill(u);
	shrink_window_restart(u);
	return 0;
}

static void prep_wake(struct perch_loop *loop, struct io_uring_sqe *sqe)
{
	struct uring *u = st_of(loop);
	io_uring_prep_read(sqe, loop->wake_fd, &u->wake_val, sizeof(u->wake_val), 0);
	io_uring_sqe_set_data64(sqe, (uint64_t)OP_WAKE << 56);
}

/* Loop thread. */
static void arm_wake(struct perch_loop *loop)
{
	struct io_uring_sqe *sqe = sqe_get(st_of(loop));
	if (sqe)
		prep_wake(loop, sqe);
}

/* A socket whose completions never came (the ring broke): its send ends canceled. */
static void settle_abandoned(struct perch__sock *s)
{
	struct usock *us = us_of(s);
	if (us->flags & F_SEND) {
		us->flags &= ~F_SEND;
		perch__loop_sent(s, -ECANCELED);
	}
}

static void uring_destroy(struct perch_loop *loop)
{
	struct uring *u = st_of(loop);
	if (!u)
		return;
	/* Exiting the ring cancels what is left; the sockets it held go next, the buffers last. */
	io_uring_queue_exit(&u->ring);
	perch__loop_abandon_all(loop, settle_abandoned);
	free(u->backlog);
	free(u->br);
	free(u->bufs);
	free(u->segs);
	free(u->spare);
	free(u);
	loop->be_state = NULL;
}

static int uring_init(struct perch_loop *loop, const struct perch_loop_opts *opts)
{
	struct uring *u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	int rc = ring_setup(loop, u, opts->sq_entries);
	if (rc != 0) {
		free(u);
		return rc;
	}
	loop->be_state = u;
	rc = buf_ring_setup(loop, u, opts->buf_count, opts->buf_size);
	if (rc != 0) {
		uring_destroy(loop);
		return rc;
	}
	/* On the creating thread: the SQ is empty, and sqe_get would bind the ring to this thread. */
	prep_wake(loop, io_uring_get_sqe(&u->ring));
	return 0;
}

/* ================= buffers and the ENOBUFS park list ================= */

static void uring_recv_arm(struct perch__sock *s);

/*
 * Buffers came back: re-arm parked connections, first parked first, no
 * more of them than there are buffers in the ring (each can take at least
 * one), the ring growing while any are held back. So a connection waits
 * only while every buffer is taken. One that loses the race for them
 * parks again at the tail, so no connection starves and nothing spins.
 * One that takes none (its recv ends on a FIN, an error or a cancel
 * without a buffer) leaves its share unused: on_recv serves the list again
 * then, while the ring has a free buffer.
 */
static void serve_parked(struct uring *u)
{
	uint32_t budget = u->ring_free;
	while (u->parked.head) {
		struct perch__sock *s = u->parked.head;
		/* Paused, ended or closing: it waits for nothing here (a resume arms it), and grows nothing. */
		if (!perch__loop_recv_wanted(s)) {
			perch__unpark(&u->parked, s);
			continue;
		}
		if (budget == 0 && (budget = ring_grow(u)) == 0)
			return; /* every buffer is taken: a return serves the list again */
		perch__unpark(&u->parked, s);
		uring_recv_arm(s);
		budget--;
	}
}

/* A buffer back from the kernel or a reader: on top of the spare stack, into the ring if it is short. */
static void buf_return(struct uring *u, uint32_t bid)
{
	PERCH_ASSERT(u->nspare < u->nbufs); /* each buffer is in the ring, a reader's or spare: never returned twice */
	u->spare[u->nspare++] = bid;
	ring_refill(u);
}

static void uring_buf_release(struct perch_loop *loop, struct perch__rxseg *rs)
{
	struct uring *u = st_of(loop);
	buf_return(u, rs->seg.buf_id);
	serve_parked(u);
}

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
	return s->opts.recv_mode != PERCH_RECV_SINGLESHOT && ioctl(s->fd, FIONREAD, &queued) == 0 &&
	       queued > 0;
}

static void uring_recv_arm(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	struct usock *us = us_of(s);
	if (s->closing || (us->flags & F_RECV))
		return; /* in flight already: its last completion re-arms if still wanted */
	if (s->parked) {
		/*
		 * Parked, and (say) resumed from a pause: a free buffer that no
		 * one took is its to try. None free means none spare either:
		 * serve_parked grows the ring before it leaves anyone parked.
		 */
		if (u->ring_free == 0)
			return;
	}
	struct io_uring_sqe *sqe = sqe_get(u);
	if (!sqe)
		return; /* the ring is broken: the poll reports it */
	perch__unpark(&u->parked, s);
	if (s->opts.recv_mode == PERCH_RECV_SINGLESHOT) {
		io_uring_prep_recv(sqe, s->fd, NULL, 0, 0);
		us->flags |= F_RECV;
	} else {
		io_uring_prep_recv_multishot(sqe, s->fd, NULL, 0, 0);
		us->flags |= F_RECV | F_RECV_MS;
	}
	sqe->flags |= IOSQE_BUFFER_SELECT;
	if (!bytes_waiting_for_multishot(s))
		sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
	sqe->buf_group = BGID;
	io_uring_sqe_set_data64(sqe, UD(OP_RECV, s));
	us->inflight++;
}

static void uring_recv_pause(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	/* Single-shot: simply not re-armed. Multishot: cancel it; CQEs already on the way are kept. */
	if ((us_of(s)->flags & (F_RECV | F_RECV_MS | F_RECV_CANCEL)) != (F_RECV | F_RECV_MS))
		return;
	struct io_uring_sqe *sqe = sqe_get(u);
	if (!sqe)
		return;
	io_uring_prep_cancel64(sqe, UD(OP_RECV, s), 0);
	io_uring_sqe_set_data64(sqe, UD(OP_PAUSE_CANCEL, s));
	us_of(s)->flags |= F_RECV_CANCEL;
	us_of(s)->inflight++;
}

static void uring_send(struct perch__sock *s)
{
	struct usock *us = us_of(s);
	struct io_uring_sqe *sqe = sqe_get(st_of(s->loop));
	if (!sqe)
		return; /* the ring is broken: the send is settled when the loop is freed */
	int n = perch__loop_tx_iov(s, us->iov, PERCH__TX_IOV);
	if (n == 1) {
		/* One buffer (a typical reply): a plain send spares the kernel copying a msghdr and importing an iovec. */
		io_uring_prep_send(sqe, s->fd, us->iov[0].iov_base, us->iov[0].iov_len, MSG_NOSIGNAL);
	} else {
		memset(&us->msg, 0, sizeof(us->msg));
		us->msg.msg_iov = us->iov;
		us->msg.msg_iovlen = (size_t)n;
		io_uring_prep_sendmsg(sqe, s->fd, &us->msg, MSG_NOSIGNAL);
	}
	io_uring_sqe_set_data64(sqe, UD(OP_SEND, s));
	us->flags |= F_SEND;
	us->inflight++;
}

static void uring_accept(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	if (us_of(s)->flags & F_ACCEPT)
		return; /* still armed: a resume must not arm a second */
	struct io_uring_sqe *sqe = sqe_get(u);
	if (!sqe)
		return;
	us_of(s)->flags |= F_ACCEPT;
	io_uring_prep_multishot_accept(sqe, s->fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, UD(OP_ACCEPT, s));
	us_of(s)->inflight++;
}

static void uring_connect(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	struct io_uring_sqe *sqe = sqe_get(u);
	if (!sqe)
		return;
	io_uring_prep_connect(sqe, s->fd, (struct sockaddr *)&s->peer, s->peer_len);
	io_uring_sqe_set_data64(sqe, UD(OP_CONNECT, s));
	us_of(s)->inflight++;
}

/*
 * One cancel for everything on the fd. Its own completion is counted, so
 * the socket is finalized from a completion, never inline here (callers
 * may still be using it).
 */
static void uring_close(struct perch__sock *s)
{
	struct uring *u = st_of(s->loop);
	perch__unpark(&u->parked, s);
	struct io_uring_sqe *sqe = sqe_get(u);
	if (!sqe)
		return; /* the ring is broken: the loop's free finalizes the socket */
	io_uring_prep_cancel_fd(sqe, s->fd, IORING_ASYNC_CANCEL_ALL);
	io_uring_sqe_set_data64(sqe, UD(OP_CLOSE_CANCEL, s));
	us_of(s)->inflight++;
}

/* ================= completions ================= */

static void on_recv(struct uring *u, struct perch__sock *s, int res, uint32_t flags, bool last)
{
	if (last)
		us_of(s)->flags &= ~(F_RECV | F_RECV_MS | F_RECV_CANCEL);
	if (flags & IORING_CQE_F_BUFFER) {
		uint32_t bid = flags >> IORING_CQE_BUFFER_SHIFT;
		buf_taken(u);
		if (res > 0) {
			struct perch__rxseg *rs = &u->segs[bid];
			rs->seg.next = NULL;
			rs->seg.data = u->bufs + (size_t)bid * u->buf_size;
			rs->seg.len = (uint32_t)res;
			rs->seg.buf_id = bid;
			rs->seg.owner = s->loop;
			perch__loop_received(s, rs);
		} else {
			buf_return(u, bid); /* an error or EOF that still took a buffer */
		}
	}
	if (res == 0)
		perch__loop_recv_ended(s, 0);
	else if (res == -ENOBUFS) {
		if (!s->closing && !s->parked) {
			perch__park(&u->parked, s);
			s->loop->stats.enobufs_parks++;
			/*
			 * The kernel found the ring empty: the busiest moment needs
			 * more. Our count of free ones may not show it yet (buffers it
			 * took whose CQEs come later in this batch), so this grows by
			 * the kernel's word, once a poll.
			 */
			if (!u->grew_this_poll && ring_grow(u) > 0)
				u->grew_this_poll = true;
			/*
			 * Buffers may have come back between the kernel's try and
			 * this CQE (released earlier in this batch): then no later
			 * release would wake the connection. Serve the list now.
			 */
			serve_parked(u);
		}
		return;
	} else if (res < 0 && res != -ECANCELED && res != -EINTR)
		perch__loop_recv_ended(s, res);
	/* Any CQE without F_MORE ended the recv: re-arm unless paused, ended or closing. */
	if (last && perch__loop_recv_wanted(s))
		uring_recv_arm(s);
	/*
	 * A recv ended (perhaps one serve_parked re-armed, counting on it to
	 * take a buffer) and a buffer is free: the next parked one may have it.
	 */
	if (last && u->parked.head && u->ring_free > 0)
		serve_parked(u);
}

static void on_accept(struct perch__sock *s, int res, bool last)
{
	if (last)
		us_of(s)->flags &= ~F_ACCEPT;
	if (res != -ECANCELED)
		perch__loop_accepted(s, res);
	if (last && !s->closing && !s->accept_paused)
		uring_accept(s);
}

/* A failed accept ends the multishot (on_accept then does not re-arm): nothing to stop. */
static void uring_accept_pause(struct perch__sock *s)
{
	(void)s;
}

static void dispatch(struct perch_loop *loop, uint64_t ud, int res, uint32_t flags)
{
	struct uring *u = st_of(loop);
	unsigned op = UD_OP(ud);
	if (op == OP_WAKE) {
		arm_wake(loop);
		perch__loop_woken(loop);
		return;
	}
	struct perch__sock *s = perch__loop_sock(loop, UD_SLOT(ud), UD_GEN(ud));
	if (!s) {
		/* A completion for a socket that has left: its buffer still goes back. */
		if (flags & IORING_CQE_F_BUFFER) {
			buf_taken(u);
			buf_return(u, flags >> IORING_CQE_BUFFER_SHIFT);
			serve_parked(u);
		}
		return;
	}
	bool last = !(flags & IORING_CQE_F_MORE);
	struct usock *us = us_of(s);
	if (last) {
		PERCH_ASSERT(us->inflight > 0); /* every last completion is of an operation counted in flight */
		us->inflight--;
	}
	switch (op) {
	case OP_RECV:
		on_recv(u, s, res, flags, last);
		break;
	case OP_SEND:
		us->flags &= ~F_SEND;
		perch__loop_sent(s, res);
		break;
	case OP_ACCEPT:
		on_accept(s, res, last);
		break;
	case OP_CONNECT:
		perch__loop_connected(s, res);
		break;
	default: /* the cancels: their targets report for themselves */
		break;
	}
	/* Last: the socket is freed here once closing and nothing is in flight. */
	if (s->closing && us->inflight == 0) {
		close(s->fd);
		perch__loop_sock_closed(s);
	}
}

static int uring_poll(struct perch_loop *loop, int timeout_ms)
{
	struct uring *u = st_of(loop);
	int rc;
	if (u->needs_enable && (rc = enable_ring(u)) != 0)
		ring_broken(u, rc);
	if (u->broken)
		return u->broken;
	u->grew_this_poll = false;
	ring_maybe_shrink(u);
	struct io_uring_cqe *cqe;
	if (u->nbacklog)
		timeout_ms = 0; /* completions are waiting already: do not sleep */
	if (timeout_ms < 0) {
		rc = io_uring_submit_and_wait(&u->ring, 1);
	} else if (timeout_ms == 0) {
		rc = io_uring_submit_and_get_events(&u->ring);
	} else {
		struct __kernel_timespec ts = { .tv_sec = timeout_ms / 1000,
						.tv_nsec = (long long)(timeout_ms % 1000) * 1000000 };
		rc = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, &ts, NULL);
	}
	if (rc < 0 && rc != -ETIME && !refused_for_now(rc)) {
		ring_broken(u, rc);
		return rc;
	}
	/*
	 * Copy out, then advance, then dispatch: handlers submit, which may
	 * post more CQEs (and sqe_get may stash some in the backlog). The
	 * backlog is always older than what is still in the CQ, so it goes
	 * first: per-socket order (recv data) is kept.
	 */
	int seen = 0;
	for (int batch = 0; batch < MAX_BATCHES; batch++) {
		if (u->nbacklog) {
			struct cqe_copy *b = u->backlog;
			size_t n = u->nbacklog;
			u->backlog = NULL;
			u->nbacklog = u->capbacklog = 0;
			for (size_t i = 0; i < n; i++)
				dispatch(loop, b[i].ud, b[i].res, b[i].flags);
			free(b);
			seen += (int)n;
			continue;
		}
		struct io_uring_cqe *cqes[CQE_BATCH];
		struct cqe_copy got[CQE_BATCH];
		unsigned n = io_uring_peek_batch_cqe(&u->ring, cqes, CQE_BATCH);
		if (n == 0)
			break;
		for (unsigned i = 0; i < n; i++)
			got[i] = (struct cqe_copy){ cqes[i]->user_data, cqes[i]->res, cqes[i]->flags };
		io_uring_cq_advance(&u->ring, n);
		for (unsigned i = 0; i < n; i++)
			dispatch(loop, got[i].ud, got[i].res, got[i].flags);
		seen += (int)n;
	}
	return seen;
}

/* What a refusal of io_uring means here, for the loop's one log line. */
static const char *uring_refusal_cause(int err)
{
	switch (err) {
	case -EPERM: return "not permitted (kernel.io_uring_disabled, seccomp, or a container policy)";
	case -ENOSYS: return "not supported by this kernel";
	case -ENOMEM: return "out of locked memory for the ring (RLIMIT_MEMLOCK)";
	default: return strerror(-err);
	}
}

const struct perch__backend perch__uring_backend = {
	.name = "io_uring",
	.env_name = "uring",
	.id = PERCH_BACKEND_URING,
	.refusal_cause = uring_refusal_cause,
	.sock_size = sizeof(struct usock),
	.init = uring_init,
	.destroy = uring_destroy,
	.poll = uring_poll,
	.accept = uring_accept,
	.accept_pause = uring_accept_pause,
	.connect = uring_connect,
	.recv_arm = uring_recv_arm,
	.recv_pause = uring_recv_pause,
	.send = uring_send,
	.close = uring_close,
	.buf_release = uring_buf_release,
};
