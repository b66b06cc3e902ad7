/* lib/conn_internal.h: the connection's state and the entry points a backend (or a test reactor) calls. */
#ifndef PERCH_LIB_CONN_INTERNAL_H
#define PERCH_LIB_CONN_INTERNAL_H

#include <ck_cc.h>
#include <ck_md.h>
#include <stddef.h>

#include <perch/conn.h>

#include "atomic.h"
#include "invariant.h"

/* The struct of `type` that holds `ptr` as its `member` (a posted message's carrier, a listener's adapter). */
#define perch__container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/*
 * Staged outbound bytes: a chain owned by the writer until flush hands it
 * to the backend. `bytes` is `data` for a staging buffer; a received
 * segment forwarded without a copy (perch_conn_forward) is lent instead:
 * `bytes` points into the segment, which goes back to its owner when the
 * chain is freed, and `data` holds the record of whose it is.
 */
struct perch__txbuf {
	struct perch__txbuf *next;
	uint8_t *bytes;
	uint32_t len;
	uint32_t cap;                  /* room at data; a lent segment's is its len: none left */
	uint32_t flags;                /* PERCH__TXBUF_REF: the caller's memory (perch_conn_write_ref) */
	uint8_t data[] __attribute__((aligned(8))); /* a lent segment's record is kept here */
};

#define PERCH__TXBUF_REF 1u

/* The staging buffer's usual size: a bigger write gets one buffer of its own size. */
#define PERCH__TXBUF_CAP 4096u

/*
 * What the conn core needs from whatever moves its bytes (io_uring, epoll,
 * a test playing the reactor). The core calls these; it never calls the
 * kernel itself.
 */
struct perch__transport_ops {
	/* Owns `chain` until it calls perch__conn_send_done(c, chain, result). */
	void (*send)(struct perch_conn *c, struct perch__txbuf *chain);
	/*
	 * A consumed segment goes back to its owner (seg->owner says whose);
	 * called from any thread. Without the connection: a forwarded segment
	 * comes back when another connection's send completes, and the one it
	 * was received on may be gone by then.
	 */
	void (*release_seg)(struct perch_seg *seg);
	/*
	 * Optional: a segment of `len` bytes of the transport's own memory for
	 * a waiting tail the reader's list gives up (perch_conn_advance: the
	 * reader's thread, under the claim), counted as the connection's until
	 * release_seg gives it back, as a received one is. `first` is the
	 * first segment given up (the transport's, of this connection), and is
	 * released after the call: the transport may hang the accounting on
	 * it. NULL (no memory): the tail stays where it is. Without it the
	 * reader never compacts.
	 */
	struct perch_seg *(*tail_seg)(struct perch_seg *first, size_t len);
	/* The connection was closed: cancel in-flight work (its completions still come). */
	void (*close)(struct perch_conn *c);
	/*
	 * Optional: close as `close` does, with a reset for the peer
	 * (perch_conn_abort). Without it an abort is a close.
	 */
	void (*abort)(struct perch_conn *c);
	/*
	 * Optional: end the write side after what was sent (perch_conn_shutdown;
	 * no send is in flight). Any thread; at most once; may come after close.
	 */
	void (*shutdown)(struct perch_conn *c);
	/* Last reference gone; optional. The core frees `c` after it returns. */
	void (*destroy)(struct perch_conn *c);
	/*
	 * The reader consumed `n` more bytes (optional; the reader's thread,
	 * after the slot is let go): byte-exact, where release_seg comes only
	 * per whole segment. The in-memory pipe's backpressure counts on it.
	 */
	void (*consumed)(struct perch_conn *c, uint64_t n);
	/*
	 * Optional, both: a pool of PERCH__TXBUF_CAP staging buffers. txbuf_get
	 * lends one (cap set) or says NULL (the core mallocs one, of a big
	 * write's whole size); txbuf_put takes a spent one back or refuses it
	 * (false: the core frees it). Called on whatever
	 * thread writes or completes; a pool that serves one thread refuses the
	 * others.
	 */
	struct perch__txbuf *(*txbuf_get)(struct perch_conn *c);
	bool (*txbuf_put)(struct perch_conn *c, struct perch__txbuf *b);
	/*
	 * With a pool: the largest write staged across pooled buffers (0: 64
	 * KiB); a bigger one gets one buffer of its own size. A transport that
	 * cuts its sends at buffer ends (TLS: one record a buffer) sets
	 * PERCH__TXBUF_CAP, so that a write of up to a record stays one.
	 */
	uint32_t txbuf_pooled_max;
	/*
	 * Optional: the pipe writer over this connection completed
	 * (perch_pipe_writer_complete; the writer's thread): a layer ends its
	 * stream (TLS sends close_notify). A socket's connection stays open.
	 */
	void (*end_of_writes)(struct perch_conn *c);
};

/* The read slot's marks; any other value is a parked struct perch_recv_listener *. */
#define PERCH__SLOT_EMPTY        ((uintptr_t)0)
#define PERCH__SLOT_CLAIM        ((uintptr_t)1)
#define PERCH__SLOT_CLAIM_MARKED ((uintptr_t)2)
#define PERCH__SLOT_DELIVERING   ((uintptr_t)3)  /* a completion took the park; reading its cookie */

/* rx_flags bits, only ever set (by read-modify-write), never cleared. */
#define PERCH__RX_PEER_FIN  1u
#define PERCH__RX_ERROR     2u
#define PERCH__RX_CLOSED    4u

/*
 * An entry of the received-segment fifo: ck_fifo_spsc's algorithm (an
 * entry always stands as the stub, spent entries are recycled by the
 * producer), laid out over the connection's lines rather than in ck's
 * own padded struct: its producer end shares the completions' line, its
 * consumer end the reader's (lib/conn_core.h has the operations).
 */
struct perch__rx_entry {
	void *value;
	struct perch__rx_entry *next;
};

/*
 * Three groups, each starting a cache line, so a reader and a flusher on
 * two threads do not share one: what completions publish (and the slot
 * every side claims), the reader's own state and the fifo's entries of
 * the connection's own, the flush side's. What is written once at
 * creation (ops, transport) fills the reader's second line beside the
 * fifo's entries, which the loop thread writes: a flusher on another
 * thread reads ops from there, a matter of speed only. The connection's
 * own value tasks (perch_conn_read and perch_conn_flush: the pipes do not
 * use them) are a block of their own, reached from the flush side's line.
 * The fifo is ck_fifo_spsc's algorithm rather than ck's struct, whose
 * padding would add a line (doc/perf/scale).
 */
struct perch_conn {
	/* ---- read slot, what completions publish, the fifo's producer end (any thread) ---- */
	uintptr_t read_waiter CK_CC_CACHELINE;
	uint64_t read_cookie;          /* the parked read's, stored before the publish (atomic.h: a scheduling point) */
	uint64_t rx_total;             /* bytes ever queued (faa by the producer) */
	uint32_t rx_flags;             /* PERCH__RX_* */
	uint32_t rd_cancel;            /* a cancel not yet reported */
	int32_t rx_error;              /* written before PERCH__RX_ERROR is set */
	struct perch__rx_entry *rx_tail;      /* the last entry queued */
	struct perch__rx_entry *rx_head_seen; /* rd_fifo_head as the producer last read it: recycling stops there */
	struct perch__rx_entry *rx_garbage;   /* the oldest spent entry, the next to reuse */

	/* ---- reader-private: touched only by the read that owns the slot ---- */
	struct perch__rx_entry *rd_fifo_head CK_CC_CACHELINE; /* the stub: its next is the first queued */
	struct perch_seg *rd_head;
	struct perch_seg *rd_tail;
	size_t rd_head_off;            /* consumed bytes of rd_head */
	uint64_t rd_drained;           /* bytes moved from the fifo to the rd_ list */
	uint64_t rd_consumed;          /* stream offset of the first unconsumed byte */
	uint64_t rd_examined;          /* stream offset the reader has examined to (atomic: a delivery looks at it) */
	uint64_t rd_result_base;       /* stream offset the last result started at */
	uint64_t rd_result_len;
	bool rd_have_result;
	uint32_t compact_max;          /* a quarter of a transport buffer: a waiting tail this short, or
					* spread over several buffers at most half full, leaves them (0: never) */
	/* The fifo's first two entries, never freed: one segment at a time in flight takes no malloc. */
	struct perch__rx_entry rx_first[2];
	/* Set at creation, then only read (by every side): they fill the reader's second line. */
	const struct perch__transport_ops *ops;
	void *transport;               /* the backend's per-connection state */

	/* ---- flush arm (any thread) ---- */
	uint32_t flush_busy CK_CC_CACHELINE;   /* the in-progress guard */
	uint32_t flush_armed;          /* a parked flusher not yet signalled */
	void *flush_listener;          /* stored before flush_armed publishes it */
	uint64_t flush_cookie;         /* likewise; read before the guard is released */

	/* ---- writer-private ---- */
	struct perch__txbuf *staged_head;
	struct perch__txbuf *staged_tail;
	size_t staged_len;

	/* ---- lifecycle ---- */
	uint32_t refs;
	bool tx_shut;                  /* perch_conn_shutdown ended the write side */
	uint8_t block_skip;            /* where the connection starts in its malloc'd block */
	/* Its own tasks, made by its first perch_conn_read or perch_conn_flush (a pipe's conn never has them). */
	struct perch__conn_tasks *own_tasks;
};

/*
 * The connection as its own reader and flusher (perch__conn_self_reader,
 * perch__conn_self_flusher): the value tasks perch_conn_read and
 * perch_conn_flush hand out. Installed once, by a CAS; freed with the conn.
 */
struct perch__conn_tasks {
	struct perch_vtask read_task;
	struct perch_vtask flush_task;
};

/* An idle connection's bytes (doc/perf/scale): each group starts a line, four in all. */
_Static_assert(offsetof(struct perch_conn, rd_fifo_head) == CK_MD_CACHELINE &&
		       offsetof(struct perch_conn, flush_busy) == 3 * CK_MD_CACHELINE &&
		       sizeof(struct perch_conn) <= 4 * CK_MD_CACHELINE,
	       "struct perch_conn grew past its lines");

/*
 * The connection as its own listener, for perch_conn_read and
 * perch_conn_flush: one for every connection, as the calls it makes are
 * handed the connection (lib/conn.c).
 */
extern struct perch_recv_listener perch__conn_self_reader;
extern struct perch_flush_listener perch__conn_self_flusher;

/* Any thread: the connection's own tasks, made at the first call that asks. NULL on ENOMEM. */
struct perch__conn_tasks *perch__conn_tasks(struct perch_conn *c);

/*
 * The backend's contract: it calls the completion entry points below while
 * it holds a reference (perch__conn_ref), from one thread at a time (the
 * loop's); every chain ops->send receives gets exactly one
 * perch__conn_send_done, also after ops->close, and never from inside
 * ops->send (a flush made from inside on_flush_done would recurse).
 *
 * Creates a connection driven by `ops`. Returns NULL on ENOMEM or NULL ops.
 * The caller holds one reference (perch_conn_release drops it).
 */
struct perch_conn *perch__conn_new(const struct perch__transport_ops *ops, void *transport);

/*
 * As perch__conn_new, with its transport's state (transport_size bytes,
 * zeroed, aligned as malloc's) in the connection's own block: one malloc,
 * and the transport's memory goes with the connection's (ops->destroy
 * must not free it).
 */
struct perch_conn *perch__conn_new_with(const struct perch__transport_ops *ops, size_t transport_size);

/* ---- completion entry points: one producer (the loop thread) at a time ---- */

/*
 * buf_id of a segment allocated with its bytes in one malloc that the conn
 * frees itself, never giving it back to a transport (none is made now; a
 * transport may still hand one over).
 */
#define PERCH__SEG_OWN UINT32_MAX

/*
 * buf_id of a loop's segment of malloc'd memory (a receive while the pool
 * was empty, perch__loop_recv_own; a compacted tail, perch__op_tail_seg):
 * released through the loop like a pool buffer, so its bytes count
 * against the connection's pause, and freed there.
 */
#define PERCH__SEG_HEAP (UINT32_MAX - 1)

/* Queues a received segment; wakes a parked read. Returns 0, -ENOMEM or -EINVAL for an empty one (seg not taken). */
int perch__conn_recv_arrived(struct perch_conn *c, struct perch_seg *seg);
/* The peer sent FIN: the reader sees `completed` after every queued byte. */
void perch__conn_peer_closed(struct perch_conn *c);
/* The socket failed (RST, ...): reads report `err` after the queued bytes; flushes fail. */
void perch__conn_failed(struct perch_conn *c, int err);
/* The backend is done with a chain given to ops->send: taken whole (0) or failed. */
void perch__conn_send_done(struct perch_conn *c, struct perch__txbuf *chain, int result);

/*
 * Whether a read can be served now: bytes not yet examined, a final state,
 * or a cancel. For the slot's owner: the claim holder, or on_recv_ready,
 * which owns the reader's state while it runs.
 */
static inline bool perch__conn_read_ready(const struct perch_conn *c)
{
	/* New bytes first: the common reason, and any one reason will do. */
	if (perch__load_u64(&c->rx_total) > perch__load_u64(&c->rd_examined))
		return true;
	return perch__load_u32(&c->rx_flags) != 0 || perch__load_u32(&c->rd_cancel) != 0;
}

/* ---- for the pipe adapters (pipes/): the unchecked park calls, staging, discard ---- */

/*
 * perch_conn_try_read_or_park and perch_conn_try_flush_or_park without the
 * argument checks (the adapters pass their own, valid listeners), and with
 * the cookie on_parking returned in *cookie_out when they park. A NULL
 * `out` serves nothing: 0 then only says a read would be served now (a
 * re-park from inside on_recv_ready leaves the result to the caller's read).
 */
int perch__conn_park_read(struct perch_conn *c, struct perch_recv_listener *listener,
			  struct perch_read_result *out, uint64_t *cookie_out);
int perch__conn_park_flush(struct perch_conn *c, struct perch_flush_listener *listener,
			   uint64_t *cookie_out);

/*
 * Room for at least `hint` bytes (1 when 0) at the end of the staged bytes:
 * *buf and *len describe all of it. Returns 0, -EBUSY while a flush is in
 * progress, -EPIPE when closed, -ENOMEM, -EINVAL for a hint over 4 GiB.
 */
int perch__conn_stage_buffer(struct perch_conn *c, size_t hint, uint8_t **buf, size_t *len);
/* Commits `n` bytes written into the last perch__conn_stage_buffer. Returns 0, -EBUSY, -EINVAL (more than it gave). */
int perch__conn_stage_commit(struct perch_conn *c, size_t n);
/* Takes every staged buffer (the in-memory pipe hands them to its reader), *len bytes in all. */
struct perch__txbuf *perch__conn_take_staged(struct perch_conn *c, size_t *len);
void perch__conn_free_chain(struct perch__txbuf *chain);
/* A new staging buffer of `cap` bytes (cap set, nothing else), or NULL: for a transport's pool too. */
struct perch__txbuf *perch__txbuf_new(size_t cap);
/* Releases every received byte (the reader completed). Returns 0, or -EBUSY while a read owns the slot. */
int perch__conn_discard(struct perch_conn *c);
/* A completion with nothing new, as when two completions target one park (tests use it). */
void perch__conn_wake_reader(struct perch_conn *c);

/* Frees the connection once its last reference is gone (lib/conn.c). */
void perch__conn_destroy(struct perch_conn *c);

/* References held by in-flight backend work. Inline: every send takes and drops one. */
static inline void perch__conn_ref(struct perch_conn *c)
{
	perch__faa_u32(&c->refs, 1);
}

static inline void perch__conn_unref(struct perch_conn *c)
{
	uint32_t had = perch__faa_u32(&c->refs, (uint32_t)-1);
	PERCH_ASSERT(had > 0);
	if (had == 1)
		perch__conn_destroy(c);
}

#endif /* PERCH_LIB_CONN_INTERNAL_H */
