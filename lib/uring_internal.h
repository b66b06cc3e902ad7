/* lib/uring_internal.h: the io_uring backend's own state and what its files share (uring.c, uring_bufs.c, uring_ops.c, uring_park.c, uring_fixed.c, uring_zc.c, uring_enomem.c). */
#ifndef PERCH_LIB_URING_INTERNAL_H
#define PERCH_LIB_URING_INTERNAL_H

#include <liburing.h>
#include <string.h>

#include "backend.h"
#include "invariant.h"
#include "pool_trim.h"

#define BGID 0                 /* one buffer group per ring, so per loop */
#define CQE_BATCH 64
#define MAX_BATCHES 16         /* per poll: then let the caller's turn end (posted work, stop) */
#define RING_TARGET_MIN 64     /* the ring starts with this many (doubled when short, halved back once quiet) */
#define RING_SHRINK_POLLS 1024 /* polls (not time) in which a ring never used half its buffers, before it halves */
/* liburing 2.3's headers predate recv bundles (Linux 6.10). */
#ifndef IORING_RECVSEND_BUNDLE
#define IORING_RECVSEND_BUNDLE (1U << 4)
#endif
#ifndef IORING_FEAT_RECVSEND_BUNDLE
#define IORING_FEAT_RECVSEND_BUNDLE (1U << 14)
#endif
#define SQE_RETRIES 16         /* submits a full SQ tries, each after emptying the CQ, before the ring is broken */

/* user_data: op (8 bits) | generation (24 bits) | slot (32 bits). */
enum op { OP_WAKE = 1, OP_ACCEPT, OP_CONNECT, OP_RECV, OP_SEND, OP_CLOSE_CANCEL, OP_PAUSE_CANCEL, OP_HANGUP,
	  OP_SEND_ZC, OP_FIXED_SET, OP_FIXED_CLEAR };

#define UD(op, s) (((uint64_t)(op) << 56) | ((uint64_t)((s)->gen & 0xffffff) << 32) | (s)->slot)
#define UD_OP(ud) ((unsigned)((ud) >> 56))
#define UD_GEN(ud) ((uint32_t)((ud) >> 32) & 0xffffff)
#define UD_SLOT(ud) ((uint32_t)(ud))
/* A zero-copy send's: op (8 bits) | its hold's address (below 2^56), so its notification finds its chain. */
#define UD_ZC(h) (((uint64_t)OP_SEND_ZC << 56) | (uint64_t)(uintptr_t)(h))
#define UD_ZC_HOLD(ud) ((struct zc_hold *)(uintptr_t)((ud) & ((UINT64_C(1) << 56) - 1)))

/* usock.flags */
#define F_RECV        1u   /* a recv is in flight */
#define F_RECV_MS     2u   /* ... and it is multishot */
#define F_RECV_CANCEL 4u   /* a pause's cancel for it is in flight */
#define F_ACCEPT      8u   /* a listener's multishot accept is in flight */
#define F_SEND       16u   /* a send is in flight */
#define F_CONNECT    32u   /* a connect is in flight */
#define F_HANGUP     64u   /* a poll for the peer's end is in flight (armed while parked) */
#define F_SEND_ZC   128u   /* ... the send in flight is zero-copy (its user_data is UD_ZC) */
#define F_NO_ZC     256u   /* the kernel refused a zero-copy send on this socket: plain ones only */
#define F_RECV_LIM  512u   /* the multishot recv in flight stops at a byte limit (the pause's room) */
#define F_FIX_TRIED 2048u  /* its entry in the file table was asked for (or could not be) */
#define F_FIXING    4096u  /* ... and the update is in flight */
#define F_FIXED     8192u  /* its fd is in the file table at its own index: operations say IOSQE_FIXED_FILE */
#define F_SENDS_SHIFT 24   /* bits 24-27: sends prepared before its entry is asked for (lib/uring_fixed.c) */
#define F_SENDS_MASK (15u << F_SENDS_SHIFT)

/*
 * A chain some of whose sends went zero-copy: the kernel reads its bytes
 * until each such send's notification comes, which may be after the send
 * completed. Then the chain goes back (its references released).
 */
struct zc_hold {
	struct zc_hold *prev, *next; /* on uring.zc_holds, so a loop's free finds it */
	struct perch__sock *s;       /* while its send is the socket's; NULL once the chain is kept */
	struct zc_fd *zfd;           /* its socket's fd, which outlives the socket while holds need it */
	struct perch__txbuf *chain;  /* set once its send finished */
	uint32_t owed;               /* notifications the kernel announced (F_MORE) and has not sent */
};

/*
 * A socket's fd while holds of its chains live. A finalized socket's fd
 * stays open (shut for writing, so its end still follows the bytes) until
 * the last hold goes: so the loop's free can still reset the connection,
 * and the kernel drop the bytes, before the caller gets its memory back.
 */
struct zc_fd {
	int fd;                      /* -1 once closed */
	uint32_t holds;
	bool orphaned;               /* its socket is finalized: the last hold closes the fd */
};

/*
 * A send of several buffers: its msghdr and iovecs, which must stay put
 * from the prep until the kernel takes the SQE (it copies them then:
 * IORING_FEAT_SUBMIT_STABLE, on every kernel perch runs on). Made at a
 * socket's first such send and kept until it is finalized, so a prepared
 * send never waits for memory: an idle connection, or one whose answers
 * each fit one buffer, carries none.
 */
struct usend_gather {
	struct msghdr msg;
	struct iovec iov[PERCH__TX_IOV];
};

/*
 * What only some sockets' sends need, in a block made at the first of
 * them (an idle connection, or one whose answers each fit one buffer and
 * go plain, has none) and freed with the socket.
 */
struct usock_rare {
	struct usend_gather *gather; /* NULL until a send gathered several buffers */
	struct zc_hold *zc;          /* the chain being sent, once a send of it went zero-copy */
	struct zc_fd *zcfd;          /* set at the first zero-copy send */
};

/* This backend's state for one socket, kept after the loop's (perch__sock_be). */
struct usock {
	uint32_t inflight;           /* operations whose last completion has not come */
	uint32_t flags;              /* F_* */
	struct usock_rare *rare;     /* NULL until a send gathered or went zero-copy */
};

static inline struct usock *us_of(struct perch__sock *s)
{
	return perch__sock_be(s);
}

/* The socket's rare block, made now if it has none; NULL out of memory. */
struct usock_rare *perch__uring_rare(struct usock *us);
/* The socket is finalized: its gather block and rare block go (its zero-copy records are settled first). */
void perch__uring_rare_free(struct usock *us);

/* The msghdr of a send of the gather block's iov[0..n). */
static inline struct msghdr *perch__uring_send_msg(struct usock *us, int n)
{
	PERCH_ASSERT(us->rare && us->rare->gather && n > 1);
	struct usend_gather *g = us->rare->gather;
	memset(&g->msg, 0, sizeof(g->msg));
	g->msg.msg_iov = g->iov;
	g->msg.msg_iovlen = (size_t)n;
	return &g->msg;
}

struct uring {
	struct io_uring ring;
	struct perch_loop *loop;
	bool needs_enable;           /* created disabled: the first poll enables it (binds the thread) */
	bool ring_fd_registered;     /* perch_loop_run's thread holds the ring's fd in its table (uring_run_start) */
	bool defer_taskrun;          /* the kernel touches buffers only inside this thread's io_uring_enter */
	int broken;                  /* the kernel refused the ring for good (-errno): no SQE, the poll returns it */
	struct io_uring_buf_ring *br;
	size_t br_bytes;
	uint8_t *bufs;
	struct perch__rxseg *segs;   /* one per buffer id */
	uint16_t *ring_pos;          /* buffer id -> where it went in the ring (the tail then, unmasked): a bundle's next ones follow it there */
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
	struct perch__pool_trim trim; /* the spare stack's cold bottom gives its pages back, an idle ring its extra */
	uint64_t taken, taken_at_tick; /* buffers the kernel took: none in a tick's interval means an idle ring */
	bool grew_this_poll;         /* an ENOBUFS grows the ring once a poll, not once a CQE */
	uint32_t ring_low;           /* the fewest free buffers in the ring since the last shrink check */
	uint32_t polls_since_check;
	uint64_t parks_at_check;     /* stats.enobufs_parks then: an ENOBUFS since means not quiet */
	uint64_t wake_val;
	bool zerocopy;               /* the kernel has SEND_ZC and SENDMSG_ZC (probed at init) */
	bool bundles;                /* multishot recvs take bundles: several buffers a completion (perch__uring_bundles_probe) */
	bool recv_limit_refused;     /* the kernel refused a multishot recv's byte limit: none from then on */
	bool recv_limit_known;       /* a limited one received: the kernel takes the limit */
	uint32_t fixed_n;            /* the registered file table's size (a socket at its fd's index); 0: none */
	struct zc_hold *zc_holds;    /* every hold, until its chain went back */
	struct cqe_copy *backlog;    /* CQEs taken off a full CQ to free it, not yet dispatched */
	size_t nbacklog, capbacklog;
};

struct cqe_copy {
	uint64_t ud;
	int res;
	uint32_t flags;
};

static inline struct uring *st_of(struct perch_loop *loop)
{
	return loop->be_state;
}


/* ---- the provided-buffer ring (lib/uring_bufs.c) ---- */

/* Writes entry `offset` past the ring's tail; io_uring_buf_ring_advance publishes it. */
static inline void perch__uring_buf_add(struct uring *u, uint32_t bid, int offset)
{
	io_uring_buf_ring_add(u->br, u->bufs + (size_t)bid * u->buf_size, u->buf_size, (unsigned short)bid,
			      (int)u->mask, offset);
	u->ring_pos[bid] = (uint16_t)(u->br->tail + offset);
	u->ring_free++;
}

/* Tops the ring up to its target from the spare stack, warmest first, and publishes the entries. */
static inline void perch__uring_ring_refill(struct uring *u)
{
	int n = 0;
	while (u->ring_free < u->ring_target && u->nspare > 0)
		perch__uring_buf_add(u, u->spare[--u->nspare], n++);
	if (n > 0) {
		io_uring_buf_ring_advance(u->br, n); /* a release store of the tail */
		perch__pool_trim_popped(&u->trim, u->nspare);
	}
}

/* The kernel took a buffer from the ring (a CQE says which). */
static inline void perch__uring_buf_taken(struct uring *u)
{
	u->taken++;
	u->ring_free--;
	if (u->ring_free < u->ring_low)
		u->ring_low = u->ring_free;
}

/* A buffer back from the kernel or a reader: on top of the spare stack, into the ring if it is short. */
static inline void perch__uring_buf_return(struct uring *u, uint32_t bid)
{
	PERCH_ASSERT(u->nspare < u->nbufs); /* each buffer is in the ring, a reader's or spare: never returned twice */
	u->spare[u->nspare++] = bid;
	perch__uring_ring_refill(u);
	perch__pool_trim_pushed(&u->trim, u->nspare);
}

/* Maps and registers the ring of `count` buffers of `size` (liburing 2.3 has no setup helper). */
int perch__uring_bufs_setup(struct perch_loop *loop, struct uring *u, uint32_t count, uint32_t size);
/* A receive's completion for a socket that has left: every buffer it took (a bundle's too) goes back. */
void perch__uring_recv_orphaned(struct uring *u, int res, uint32_t flags);
/* Once the ring is set up: whether multishot recvs take bundles (not when `off`); sets stats.recv_bundles. */
void perch__uring_bundles_probe(struct uring *u, bool off);

/* uring_enomem.c: what the kernel locks for a ring of `entries`, and for a buffer ring of `count` (lower bounds). */
size_t perch__uring_ring_lock_bytes(uint32_t entries);
size_t perch__uring_buf_ring_lock_bytes(uint32_t count);
/* After an -ENOMEM from the ring's setup that needed `need` locked bytes: loop->be_refused_why says why. */
void perch__uring_explain_enomem(struct perch_loop *loop, size_t need);
/* The ring ran short while spares wait: doubles the target, tops up. Returns how many went in. */
uint32_t perch__uring_ring_grow(struct uring *u);
/* Once a poll: halves the target after RING_SHRINK_POLLS quiet polls. */
void perch__uring_ring_maybe_shrink(struct uring *u);

/* ---- submissions (lib/uring.c) ---- */

/* Whether the running kernel's release is major.minor or later (false when uname cannot say). */
bool perch__uring_kernel_at_least(unsigned major, unsigned minor);

/* An SQE, or NULL once the ring is broken (the caller starts nothing). */
struct io_uring_sqe *perch__uring_sqe_get(struct uring *u);

/* ---- socket operations and their completions (lib/uring_ops.c) ---- */

void perch__uring_recv_arm(struct perch__sock *s);
void perch__uring_recv_pause(struct perch__sock *s);
void perch__uring_send(struct perch__sock *s);
void perch__uring_accept(struct perch__sock *s);
void perch__uring_accept_pause(struct perch__sock *s);
void perch__uring_connect(struct perch__sock *s);
void perch__uring_close(struct perch__sock *s);

/* A recv CQE (`last`: no F_MORE) and a listener's accept CQE. */
void perch__uring_on_recv(struct uring *u, struct perch__sock *s, int res, uint32_t flags, bool last);
void perch__uring_on_accept(struct perch__sock *s, int res, bool last);

/* ---- the ENOBUFS park list (lib/uring_park.c) ---- */

/* backend.buf_release: a reader gave a buffer back; parked connections may take it. */
void perch__uring_buf_release(struct perch_loop *loop, struct perch__rxseg *rs);
/* Buffers came back: re-arms parked connections while the ring has buffers for them. */
void perch__uring_serve_parked(struct uring *u);
/* Parked with no recv in flight: a one-shot poll listens for the peer's end meanwhile (one at a time). */
void perch__uring_watch_for_hangup(struct uring *u, struct perch__sock *s);
/* The poll for a parked socket's peer ending completed with `res` (its events, or -errno). */
void perch__uring_on_hangup(struct uring *u, struct perch__sock *s, int res);

/* ---- registered files (lib/uring_fixed.c) ---- */

/* At init: the sparse file table (not when `off`, or refused); sets stats.fixed_files. */
void perch__uring_fixed_probe(struct uring *u, bool off);
/* Before a send's SQE is taken: at the socket's eighth, queues its entry in the table. */
void perch__uring_fixed_enter(struct uring *u, struct perch__sock *s);
/* At the close of a socket with an entry (F_FIXING or F_FIXED): queues its removal, counted in flight; false once the ring is broken. */
bool perch__uring_fixed_leave(struct uring *u, struct perch__sock *s);
/* The completions of the entry's update (`res` 1: done) and of its removal. */
void perch__uring_on_fixed_set(struct perch__sock *s, int res);
void perch__uring_on_fixed_clear(struct perch__sock *s, int res);

/* An operation prepared on s->fd goes through the table once s is in it. */
static inline void perch__uring_sqe_fixed(struct perch__sock *s, struct io_uring_sqe *sqe)
{
	if (us_of(s)->flags & F_FIXED)
		sqe->flags |= IOSQE_FIXED_FILE;
}

/* ---- zero-copy sends (lib/uring_zc.c) ---- */

/* Whether the kernel has zero-copy sends; sets u->zerocopy (init, before the ring is enabled). */
void perch__uring_zc_probe(struct uring *u);
/*
 * Preps `sqe` as a zero-copy send of iov[0..n) (n > 1: the gather block's) when
 * s's bytes want one; false: prep a plain one.
 */
bool perch__uring_zc_prep(struct uring *u, struct perch__sock *s, struct io_uring_sqe *sqe,
			  const struct iovec *iov, int n);
/* A zero-copy send's result CQE (its socket's send ends here). */
void perch__uring_on_send_zc(struct zc_hold *h, int res, uint32_t flags);
/* A zero-copy send's notification (IORING_CQE_F_NOTIF): the kernel let go of its bytes. */
void perch__uring_zc_notified(struct uring *u, struct zc_hold *h);
/* backend.send_keep: keeps a finished chain whose notifications are owed. */
bool perch__uring_zc_keep(struct perch__sock *s, struct perch__txbuf *chain);
/* A finalized socket's fd: closed now, or (holds still need it) shut for writing and left to them. */
void perch__uring_zc_close_fd(struct perch__sock *s);
/* The loop's free, before the ring goes: connections whose bytes the kernel still reads are reset. */
void perch__uring_zc_reset_held(struct uring *u);
/* perch__loop_abandon_all's settle: the socket's fd is closed there; its holds forget it, its gather block goes. */
void perch__uring_zc_settle(struct perch__sock *s);
/* The loop's free, after every socket went: gives back every chain still held. */
void perch__uring_zc_free_all(struct uring *u);

#endif /* PERCH_LIB_URING_INTERNAL_H */
