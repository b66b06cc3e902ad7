/* lib/backend.h: the one interface between the backend-agnostic loop (loop.c and its parts, see loop_internal.h) and a kernel backend (uring.c, epoll.c). */
#ifndef PERCH_LIB_BACKEND_H
#define PERCH_LIB_BACKEND_H

#include <ck_stack.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <perch/loop.h>
#include <perch/timer.h>

#include "conn_internal.h"

/*
 * Threads: everything here runs on the loop thread, except where a comment
 * says otherwise. Work from other threads reaches the loop as a perch__msg
 * pushed on its inbox (a ck_stack, many producers, one consumer that pops
 * the whole batch and reverses it into FIFO order).
 */

struct perch__msg;
typedef void (*perch__msg_fn)(struct perch_loop *loop, struct perch__msg *m);

/* One posted item. Embedded in what it carries, so posting never allocates (user posts aside). */
struct perch__msg {
	ck_stack_entry_t entry;
	perch__msg_fn run;
};

enum perch__sock_kind { PERCH__SOCK_CONN, PERCH__SOCK_LISTENER };

/* A received buffer lent to a connection: one per buffer id, owned by the backend (ring or pool). */
struct perch__rxseg {
	struct perch_seg seg;        /* what the conn core queues: owner = the loop, buf_id = the backend's id */
	struct perch__msg release;   /* posted when released off the loop thread */
	uint32_t slot, gen;          /* the socket it was delivered to (accounting) */
	uint32_t tail_bytes;         /* bytes it moved into a compacted tail: its release keeps them counted */
};

#define PERCH__TX_IOV 64            /* iovecs per sendmsg; the rest goes in the next one */

/*
 * A connection's connect, from perch_connect or perch_conn_adopt until it is
 * answered with success (then freed), else until the socket is freed (a
 * failed connect's SQE may still read addr).
 */
struct perch__connecting {
	struct perch__sock *s;
	struct sockaddr_storage addr; /* the peer */
	socklen_t addr_len;
	bool adopted;                /* connected already (perch_conn_adopt): reported once in the loop */
	perch_connect_fn on_connected;
	void *connect_arg;
	struct perch__msg connect_msg;
	double connect_deadline_ms;  /* CLOCK_MONOTONIC; 0: no timeout */
	unsigned connect_timeout_ms; /* perch_conn_opts': the timer's duration */
	struct perch_timer connect_timer; /* armed for connect_deadline_ms while the connect waits */
};

/* A listener's own fields. */
struct perch__listening {
	struct perch__sock *s;
	struct sockaddr_storage addr; /* its bound address (set once, before it is shared) */
	socklen_t addr_len;
	perch_accept_fn on_accept;
	void *accept_arg;
	struct perch_conn_opts accept_opts;
	int port;
	bool accept_paused;          /* out of fds: on loop->accept_paused until one is freed */
	uint32_t accept_unlogged;    /* failed accepts since the last line on stderr */
	double accept_logged_at_ms;  /* when that line was written (0: never) */
	struct perch__sock *accept_paused_next;
	struct perch__msg listen_msg;
	struct perch__msg close_msg; /* perch_listener_close from another thread */
	bool listen_pending;         /* its insert is posted and has not run: a close leaves the free to it */
	struct perch__sock *dropped_next; /* on loop->dropped: never inserted */
	uint32_t dropped;            /* atomic: its insert failed and its fd is closed (perch_listener_addr reads it) */
};

/*
 * What a connection keeps of its perch_conn_opts, resolved (no zero
 * fields): a connect's timeout stays with the connect (perch__connecting).
 * One record, never changed once made, is shared by the connections a
 * listener accepts (and by those that connect with the defaults), so an
 * idle connection holds a pointer, not the values (doc/perf/scale).
 */
struct perch__sock_opts {
	size_t pause_bytes;
	size_t resume_bytes;
	size_t zerocopy_min;
	uint32_t pool_max;           /* pool_held that pauses recv: twice pause_bytes' worth, and two */
	uint32_t refs;               /* atomic: its holders (a listener, the loop, each socket) */
};

/*
 * A socket on the loop: a connection or a listener. Lives in the loop's
 * table. Laid out without holes: an idle connection's bytes
 * (doc/perf/scale).
 */
struct perch__sock {
	struct perch_loop *loop;
	int fd;
	uint32_t slot, gen;          /* table index and its generation while in the table */
	uint8_t family;              /* AF_INET, AF_INET6 or AF_UNIX (a backend may treat Unix sockets apart) */
	uint8_t kind;                /* enum perch__sock_kind */
	bool in_table;
	bool closing;                /* close started: no new work is submitted */
	bool tx_lends;               /* tx_chain holds a received segment a forward lent: never zero-copy */
	uint8_t recv_mode;           /* a connection's perch_conn_opts.recv_mode (enum perch_recv_mode) */
	bool nagle;                  /* a connection's perch_conn_opts.nagle */
	uint8_t posted;              /* atomic: PERCH__POSTED_* calls waiting in msg, and PERCH__LINGERING */
	uint32_t tx_off;             /* bytes of tx_cur already sent */

	/* ---- connections (a listener's opts are those it gives what it accepts) ---- */
	struct perch__sock_opts *opts;
	uint64_t unconsumed;         /* bytes delivered and not yet released */
	uint32_t pool_held;          /* pool buffers among them (not the loop's own memory) */
	bool rx_full;                /* unconsumed reached pause_bytes: paused until resume_bytes */
	bool rx_paused;              /* backpressure wants recv stopped */
	bool rx_ended;               /* FIN or error seen: never re-armed */
	bool parked;                 /* on the loop's list of those waiting for a receive buffer (perch__park) */
	struct perch__txbuf *tx_chain; /* the chain being sent (one send in flight) */
	struct perch__txbuf *tx_cur;   /* first buffer with unsent bytes */
	struct perch__msg msg;       /* a connection's: its calls from other threads, all in one (perch__sock_post) */
	struct perch__txbuf *posted_chain; /* a posted send's */
	/*
	 * A socket is a connection or a listener for life (kind). What only a
	 * connect or a listener needs lives apart, found without a pointer: a
	 * listener's fields after its backend state in its block (perch__lx),
	 * a waiting connect's by its slot (perch__sock_cx). An accepted
	 * connection, most of them, carries neither.
	 */
	/* the backend's own state follows the socket: perch__sock_be */
};

struct perch_listener {
	struct perch__sock sk;
};

_Static_assert(sizeof(struct perch_listener) == sizeof(struct perch__sock),
	       "a listener's backend state follows its socket as a connection's does");


/* The backend's per-socket state (backend->sock_size bytes), right after the socket. */
static inline void *perch__sock_be(struct perch__sock *s)
{
	return s + 1;
}

/*
 * A connection socket's connection: the socket lives in its block, right
 * after it (perch__conn_new_with). The loop holds one reference on it until
 * the socket is finalized.
 */
static inline struct perch_conn *perch__sock_conn(const struct perch__sock *s)
{
	PERCH_ASSERT(s->kind == PERCH__SOCK_CONN);
	return (struct perch_conn *)(void *)s - 1;
}

/*
 * The backend interface, Redis ae style: the loop calls these, a backend
 * turns kernel events into the perch__loop_* calls below. Every socket
 * operation is started on the loop thread.
 */
struct perch__backend {
	const char *name;            /* perch_loop_backend_name */
	const char *env_name;        /* what $PERCH_BACKEND says for it (its name works too) */
	enum perch_backend id;       /* what perch_loop_opts.backend says for it */
	size_t sock_size;            /* its state for each socket (perch__sock_be) */
	/* Optional: a refusal's cause (-EPERM, -ENOSYS, -ENOMEM from init) in words, for the log. */
	const char *(*refusal_cause)(int err);
	/*
	 * Sets loop->be_state; watches loop->wake_fd (readable: perch__loop_woken).
	 * Returns 0 or -errno; when the kernel refused it, loop->be_refused_at
	 * names the call and, when the backend can tell the cause better than
	 * refusal_cause(err) can, loop->be_refused_why says it (the loop logs
	 * the line and may fall back).
	 */
	int (*init)(struct perch_loop *loop, const struct perch_loop_opts *opts);
	/*
	 * Last: normally after every socket is finalized; any left (their
	 * completions never came) go to perch__loop_abandon_all once the
	 * kernel holds nothing of theirs.
	 */
	void (*destroy)(struct perch_loop *loop);
	/* Submits, waits up to timeout_ms (<0 none), dispatches. Returns completions seen or -errno. */
	int (*poll)(struct perch_loop *loop, int timeout_ms);
	/*
	 * Optional, both: perch_loop_run starts and returns, on the one thread
	 * that runs it. What a backend holds of that thread's (io_uring's
	 * registered ring fd) lives between the two.
	 */
	void (*run_start)(struct perch_loop *loop);
	void (*run_end)(struct perch_loop *loop);
	/* Starts accepting on s->fd: each new fd goes to perch__loop_accepted. */
	void (*accept)(struct perch__sock *s);
	/*
	 * Stops accepting until accept() is called again (perch__lx(s)->accept_paused is
	 * set): called from inside perch__loop_accepted's failure, so a backend
	 * whose accept ended with that failure has nothing to stop.
	 */
	void (*accept_pause)(struct perch__sock *s);
	/* Starts connecting s->fd to perch__sock_cx(s)->addr; the result goes to perch__loop_connected. */
	void (*connect)(struct perch__sock *s);
	/* (Re)starts receiving: segments to perch__loop_received, the end to perch__loop_recv_ended. */
	void (*recv_arm)(struct perch__sock *s);
	/* Stops receiving; what the kernel already took is still delivered. */
	void (*recv_pause)(struct perch__sock *s);
	/* Sends s->tx_cur from s->tx_off: perch__loop_sent with each result. */
	void (*send)(struct perch__sock *s);
	/*
	 * Optional: the send of `chain` finished. True when the backend keeps
	 * the chain, because the kernel may still read its bytes (a zero-copy
	 * send's notification is owed); it frees it later, on the loop thread,
	 * with perch__conn_free_chain.
	 */
	bool (*send_keep)(struct perch__sock *s, struct perch__txbuf *chain);
	/* Cancels everything; once the last completion came and the fd is closed: perch__loop_sock_closed. */
	void (*close)(struct perch__sock *s);
	/* Takes back a buffer given in a segment (loop thread). */
	void (*buf_release)(struct perch_loop *loop, struct perch__rxseg *rs);
};

/*
 * Semantics both backends keep (doc/loop.md): completions are never
 * reported from inside the call that started the operation (a send or
 * connect that finishes at once is reported later in the turn); interest
 * in a direction exists only while the loop waits on it; a connection
 * that runs out of buffers parks until one comes back, first parked first
 * served (stats.enobufs_parks), and still hears its peer's end while it
 * waits (perch__loop_recv_own).
 */

/* A list of timers in due order (lib/timer.c): one per duration in use, `ms` while not empty. */
struct perch__timer_list {
	struct perch_timer *head, *tail;
	unsigned ms;
};

/* Durations with a list of their own; timers of any other go on one more list, by a walk. */
#define PERCH__TIMER_DURATIONS 8

/*
 * A backend uses only wake_fd, be_state, be_refused_at, be_refused_why, opts and stats;
 * the rest is the loop's own (lib/loop_internal.h's files), kept here so
 * that the struct is one definition.
 */
struct perch_loop {
	/* ---- any thread ---- */
	ck_stack_t inbox CK_CC_CACHELINE;
	uint32_t wake_pending;       /* one eventfd write until the loop drains */
	uint32_t stop;
	uint32_t posting;            /* threads inside a post or stop: free waits them out */
	int wake_fd;                 /* backends watch it (readable: perch__loop_woken) */

	/* ---- loop thread ---- */
	const struct perch__backend *be;
	void *be_state;              /* the backend's own */
	struct perch__sock **table;  /* slot -> socket, NULL when free */
	uint32_t *gens;              /* slot -> generation, bumped when a socket leaves */
	uint32_t *free_slots;
	uint32_t *park_next;         /* slot -> the next parked slot (PERCH__PARK_NONE ends the list) */
	struct perch__connecting **connecting; /* slot -> its socket's connect's fields, or NULL (made at the first connect) */
	struct perch__sock_opts *default_opts; /* default perch_conn_opts' record (connect and adopt share it; any thread reads) */
	uint32_t nfree, cap, live;
	uint32_t park_head, park_tail; /* connections waiting for a receive buffer, first parked first */
	uint32_t owner_tid;          /* the thread that first ran the loop; 0 before (claimed by CAS) */
	bool freeing;
	bool in_turn;                /* one of its turns runs (on its thread): another, nested, is refused */
	uint64_t turn_clock_epoch;   /* turn_clock_ms is this turn's clock while perch__thread_clock_epoch equals it */
	double turn_clock_ms;
	struct perch_loop_opts opts; /* resolved: backend and read_budget included */
	const char *be_refused_at;   /* set by a failed init: the call the kernel refused */
	char be_refused_why[160];    /* set by a failed init that knows its cause better than refusal_cause */
	int tls_kernel;              /* TLS's probe for kTLS (pipes/tls_kernel.c): 0 not yet, 1 yes, -errno no */
	struct perch__txbuf *txbuf_pool; /* spent staging buffers, lent to the next writes */
	uint32_t txbuf_pooled;       /* at most PERCH__TXBUF_POOL_MAX */
	struct perch__sock *accept_paused; /* listeners out of fds, resumed when a socket closes */
	struct perch__sock *dropped;  /* listeners never inserted (no room, or the loop being freed): freed by their close or the loop's free */
	struct perch_timer accept_retry;   /* armed while any is paused: resumes them all once it fires */
	/* armed timers (timed connects too): a list per duration, [DURATIONS] for the rest */
	struct perch__timer_list timers[PERCH__TIMER_DURATIONS + 1];
	uint32_t timers_held;        /* bit i set while timers[i] holds a timer: a turn looks at those alone */
	struct perch__timer_list timers_firing; /* due ones, while perch__timers_expire runs them */
	struct {
		uint64_t enobufs_parks;   /* recvs parked for want of buffers */
		uint64_t own_receives;    /* recvs into the connection's own memory: its peer ended while it was parked */
		uint64_t posted_together; /* runs of a connection's posted calls that took more than one (loop thread; not public) */
		uint64_t posted_during_run; /* runs holding a call's reference that end with a call posted (loop thread; not public) */
		uint64_t zerocopy_available; /* io_uring: 1 when the kernel has zero-copy sends (probed once) */
		uint64_t zerocopy_sends;  /* io_uring: sends submitted zero-copy (SEND_ZC, SENDMSG_ZC) */
		uint64_t zerocopy_notifs; /* io_uring: their notifications: the kernel let go of the bytes */
		uint64_t zerocopy_refused; /* io_uring: sockets whose zero-copy send the kernel refused (Unix) */
		uint64_t recv_pauses;     /* backpressure pauses */
		uint64_t accept_errors;   /* failed accepts, every one */
		uint64_t accept_pauses;   /* listeners paused for want of fds or memory */
		uint64_t lingering;       /* lingering closes started and not yet ended */
		uint64_t lingers_refused; /* lingering closes made at once: opts.linger_max were lingering */
		uint64_t recv_limit_refused; /* io_uring: 1 once the kernel refused a multishot recv's byte limit */
		uint64_t bufs_given_back; /* receive buffers whose pages went back after a quiet interval (pool_trim.h) */
		uint64_t ring_fd_registered; /* io_uring: 1 while perch_loop_run holds the ring's fd registered */
		uint64_t recv_bundles;    /* io_uring: 1 when multishot receives take bundles */
		uint64_t bundle_bufs;     /* io_uring: buffers that came in completions of more than one */
		uint64_t fixed_files;     /* io_uring: 1 when the ring has a registered file table */
		uint64_t fixed_sockets;   /* io_uring: sockets entered in it */
		uint64_t fixed_refused;   /* io_uring: entries, or removals, the kernel refused */
		uint64_t recv_arms;       /* io_uring: recv SQEs prepared (a multishot's counts once) */
		uint64_t timer_walk_steps; /* timers a start walked past to keep its list in due order */
		uint64_t ring_target;     /* io_uring: receive buffers the ring is kept at (doubled when short,
					   * halved once quiet; it may hold more for a while after a halving) */
		/* epoll: read turns (one per connection per readiness event), those that hit the budget */
		uint64_t read_turns, read_yields;
		uint64_t turn_bytes_max;  /* epoll: the most bytes one turn read */
		uint64_t waits;           /* epoll: epoll_wait calls */
		uint64_t interest_changes; /* epoll: EPOLL_CTL_MOD calls (yields included) */
	} stats;
};

/*
 * A connection's calls made on another thread than its loop's ride one
 * message: the first posted since the message last ran pushes it, later
 * ones set their bit in `posted` and ride it, and its run takes every bit
 * at once and makes the calls in this order (a send before the end that
 * follows it). The core makes each at most once at a time (one send in
 * flight; shutdown, and close or abort, once a connection).
 */
#define PERCH__POSTED_SEND     1u
#define PERCH__POSTED_SHUTDOWN 2u
#define PERCH__POSTED_CLOSE    4u
#define PERCH__POSTED_ABORT    8u
#define PERCH__POSTED          0x0fu
#define PERCH__LINGERING       0x10u  /* perch_conn_close_lingering took the connection (a second call is -EALREADY) */

/* Where a listener's own fields start in its block: after its socket and the backend's state. */
static inline size_t perch__lx_offset(const struct perch_loop *loop)
{
	return (sizeof(struct perch__sock) + loop->be->sock_size + _Alignof(struct perch__listening) - 1) &
	       ~(_Alignof(struct perch__listening) - 1);
}

/* A listener's own fields. */
static inline struct perch__listening *perch__lx(const struct perch__sock *ls)
{
	return (struct perch__listening *)((char *)ls + perch__lx_offset(ls->loop));
}

/* The fields of a connect (or adoption) in the table, from its start until its socket is finalized; else NULL. */
static inline struct perch__connecting *perch__sock_cx(const struct perch__sock *s)
{
	return s->kind == PERCH__SOCK_CONN && s->in_table && s->loop->connecting ? s->loop->connecting[s->slot] : NULL;
}

/* A connection whose connect (or adoption) is not answered yet. */
static inline bool perch__sock_connecting(const struct perch__sock *s)
{
	struct perch__connecting *cx = perch__sock_cx(s);
	return cx && cx->on_connected;
}

/* ---- loop services for backends (loop thread) ---- */

/*
 * Connections waiting for a receive buffer, first parked first served.
 * Linked by slot in the loop's own array, so a socket carries no link:
 * a parked socket is in the table (a close unparks it first).
 */
#define PERCH__PARK_NONE UINT32_MAX
/* Appends s (in the table, not parked) at the tail and marks it parked. */
void perch__park(struct perch__sock *s);
/* Takes s out wherever it is, if parked; false when it was not. */
bool perch__unpark(struct perch__sock *s);
/* The first parked connection, or NULL when none waits. */
static inline struct perch__sock *perch__parked_first(const struct perch_loop *loop)
{
	return loop->park_head == PERCH__PARK_NONE ? NULL : loop->table[loop->park_head];
}

/* The socket at slot/gen, or NULL when that generation has left the table. */
struct perch__sock *perch__loop_sock(struct perch_loop *loop, uint32_t slot, uint32_t gen);
/* The wake eventfd was readable: runs posted work. */
void perch__loop_woken(struct perch_loop *loop);
/* The poll's wait returned (right after it, before any dispatch): every turn's clock on this thread is read again at its next use. */
void perch__loop_waited(struct perch_loop *loop);
/*
 * A listener accepted `fd`, or failed with -errno (logged, at most a line
 * every 10 s): a failure of that one connection (ECONNABORTED, EPROTO,
 * ...) is retried at once; any other (EMFILE, ENFILE, ENOBUFS, ENOMEM,
 * ...) pauses the listener (accept_pause) until a socket of the loop
 * closes or 100 ms pass.
 */
void perch__loop_accepted(struct perch__sock *ls, int fd);
/* The connect finished with `res` (0 or -errno). */
void perch__loop_connected(struct perch__sock *s, int res);
/* A buffer was filled: queue it on the connection, pausing recv inline past the threshold. */
void perch__loop_received(struct perch__sock *s, struct perch__rxseg *rs);
/* Receiving ended: 0 is the peer's FIN, else -errno. Called after every byte before it. */
void perch__loop_recv_ended(struct perch__sock *s, int res);
/*
 * A connection parked for a receive buffer saw its peer's end or failure
 * (a hangup: POLLRDHUP, POLLHUP, POLLERR): what the socket holds is
 * received into memory of the connection's own, then the end or the
 * error, so its reader sees them and a close gives back all it held. At
 * most pause_bytes: past that it waits for a pool buffer as before. The
 * backend unparks it when receiving is no longer wanted afterwards.
 */
void perch__loop_recv_own(struct perch__sock *s);
/*
 * The connection failed outside its receive (the kernel refused what the
 * backend asked for it): receiving ends, and the conn fails with `err`
 * (its reader and flush told once), even after a FIN; nothing once closed.
 */
void perch__loop_failed(struct perch__sock *s, int err);
/* Whether recv should be (re)armed now: open, not ended, not paused. */
bool perch__loop_recv_wanted(const struct perch__sock *s);
/* A send took `res` bytes (or failed, -errno): resubmits or completes the chain. */
void perch__loop_sent(struct perch__sock *s, int res);
/* Fills iov from tx_cur/tx_off; returns the count. */
int perch__loop_tx_iov(struct perch__sock *s, struct iovec *iov, int max);
/*
 * Whether the first `max` buffers from tx_cur hold a reference of at least
 * opts.zerocopy_min unsent bytes, and the chain no received segment a
 * forward lent.
 */
bool perch__loop_tx_wants_zerocopy(const struct perch__sock *s, int max);
/* Every completion of the socket came and its fd is closed: leaves the table. */
void perch__loop_sock_closed(struct perch__sock *s);
/*
 * For a backend's destroy, once the kernel holds nothing of the loop's
 * (after a fatal poll, or a free that stopped waiting): finalizes every
 * socket still in the table: settle(s) first (optional: a result the
 * backend holds but has not reported), then a send still unfinished ends
 * -ECANCELED, a connect is answered -ECANCELED, the fd is closed.
 */
void perch__loop_abandon_all(struct perch_loop *loop, void (*settle)(struct perch__sock *s));

extern const struct perch__backend perch__uring_backend;
extern const struct perch__backend perch__epoll_backend;

#endif /* PERCH_LIB_BACKEND_H */
