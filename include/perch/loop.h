/* perch/loop.h: one event loop per thread (io_uring or epoll), its TCP listeners and outbound connects. */
#ifndef PERCH_LOOP_H
#define PERCH_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <perch/common.h>
#include <perch/conn.h>

#ifdef __cplusplus
extern "C" {
#endif

struct perch_loop;
struct perch_listener;

/* How a connection receives (doc/loop.md says why the default is multishot). */
enum perch_recv_mode {
	PERCH_RECV_DEFAULT = 0,    /* the loop's default: multishot */
	PERCH_RECV_MULTISHOT,      /* one armed recv keeps delivering until paused or ended */
	PERCH_RECV_SINGLESHOT,     /* one recv per buffer, re-armed after each completion */
};

/*
 * The kernel interface a loop runs on. Both give the same behaviour
 * (doc/loop.md); epoll is for kernels, containers or seccomp profiles that
 * refuse io_uring.
 */
enum perch_backend {
	PERCH_BACKEND_DEFAULT = 0, /* $PERCH_BACKEND ("uring", "io_uring" or "epoll") if set, else io_uring,
				    * falling back to epoll (one stderr line) when io_uring is refused */
	PERCH_BACKEND_URING,       /* io_uring only: a refusal fails perch_loop_new */
	PERCH_BACKEND_EPOLL,       /* epoll */
};

/* read_budget value: no per-turn bound (for measurements; a flood then holds the loop). */
#define PERCH_READ_BUDGET_UNBOUNDED UINT32_MAX

/* Loop options; a zeroed struct (or NULL) means every default. */
struct perch_loop_opts {
	uint32_t sq_entries;       /* io_uring submission queue size; 0: 256 */
	uint32_t buf_count;        /* receive buffers (io_uring's provided ring, epoll's pool),
				    * a power of two <= 32768; 0: 512. io_uring cycles through
				    * 64 of them (warmer in the cache than all of them), more
				    * while a burst needs them (doc/loop.md, "A warm ring") */
	uint32_t buf_size;         /* bytes per receive buffer, <= 1 MiB; 0: 16 KiB */
	enum perch_backend backend; /* PERCH_BACKEND env overrides only DEFAULT */
	uint32_t read_budget;      /* epoll: bytes one connection reads in one turn before the
				    * others get theirs; 0: 64 KiB; PERCH_READ_BUDGET_UNBOUNDED */
	uint32_t linger_max;       /* connections in a lingering close at once (perch/sock.h);
				    * past it a lingering close shuts and closes at once, as a
				    * plain close would; 0: 1024 */
	bool recv_bundles_off;     /* io_uring: a multishot receive takes one buffer per
				    * completion even where the kernel can hand over several
				    * queued ones at once (recv bundles, Linux 6.16+, used by
				    * default there: stats.recv_bundles says whether). For
				    * measuring, or a kernel whose bundles misbehave */
	bool fixed_files_off;      /* io_uring: no registered file table. By default a
				    * connection's socket enters the ring's table at its eighth
				    * send, so its later sends, receives and polls skip the
				    * kernel's fd lookup (Linux 6.13+: stats.fixed_files says
				    * whether). For measuring (doc/loop.md, "Registered files") */
};

/* Per-connection options; a zeroed struct (or NULL) means every default. */
struct perch_conn_opts {
	enum perch_recv_mode recv_mode;  /* io_uring receives a Unix socket single-shot whatever this says (perch/sock.h) */
	size_t pause_bytes;        /* unconsumed bytes that pause recv; 0: 256 KiB. A reader
				    * that waits for more while holding back this much (examined,
				    * not consumed) waits for good: set it above the largest
				    * message a reader holds back whole */
	size_t resume_bytes;       /* recv resumes at or below this; 0: pause_bytes / 4; < pause_bytes */
	unsigned connect_timeout_ms; /* perch_connect: give up with -ETIMEDOUT this long after
				    * the call; 0: wait as long as the kernel does (minutes). A
				    * listener ignores it; above PERCH_CONNECT_TIMEOUT_MAX_MS it
				    * is refused (-EINVAL) by both */
	bool nagle;                /* false (default): TCP_NODELAY, set before the accept or
				    * connect callback: a small flush is not held back (requests
				    * and answers). true: Nagle's algorithm stays on, so a small
				    * segment waits while an earlier small one is unacknowledged
				    * and leaves with what follows: fewer, fuller segments for
				    * bulk streams. Fixed for the connection's life (not to be
				    * changed through perch_conn_fd); a listener's is its accepted
				    * ones' (doc/loop.md, "TCP_NODELAY") */
	size_t zerocopy_min;       /* io_uring, TCP: a referenced write (perch_conn_write_ref) of
				    * at least this many bytes goes out as a zero-copy send where
				    * the kernel has one (IORING_OP_SEND_ZC), its release then
				    * waiting for the kernel's notification; 0: the default,
				    * PERCH_ZEROCOPY_MIN_DEFAULT (off); PERCH_ZEROCOPY_OFF: never.
				    * Smaller references, and every reference on epoll, are
				    * sent from the caller's memory by a plain send (no copy
				    * by perch either way; doc/loop.md, "Zero-copy sends") */
};

/* perch_conn_opts.zerocopy_min: never send zero-copy. */
#define PERCH_ZEROCOPY_OFF SIZE_MAX
/*
 * perch_conn_opts.zerocopy_min's default: off. Measured here (bench/run.sh
 * zerocopy, loopback) zero-copy sends cost the server's core more than
 * plain sends at every size from 16 KiB to 4 MiB: the kernel copies
 * zero-copy pages when it delivers them to a local socket, so only the
 * pinning and the notification are left. Over a real NIC, set it (the
 * kernel's MSG_ZEROCOPY notes put the gain above about 10 KB a write);
 * doc/loop.md, "Zero-copy sends", has the figures.
 */
#define PERCH_ZEROCOPY_MIN_DEFAULT PERCH_ZEROCOPY_OFF

/* The longest connect_timeout_ms: a day. */
#define PERCH_CONNECT_TIMEOUT_MAX_MS (24u * 60 * 60 * 1000)

/* Work posted to a loop; runs once on the loop's thread. */
typedef void (*perch_loop_fn)(void *arg);

/*
 * A listener accepted `c`. Runs on the loop thread. The callback owns one
 * reference to `c` (drop it with perch_conn_release). Receiving has started.
 */
typedef void (*perch_accept_fn)(struct perch_listener *l, struct perch_conn *c, void *arg);

/*
 * An outbound connect finished. Runs on the loop thread, exactly once.
 * result 0: `c` is connected and the callback owns one reference to it;
 * otherwise result is a negative errno (-ECONNREFUSED, ...) and c is NULL.
 */
typedef void (*perch_connect_fn)(struct perch_loop *loop, struct perch_conn *c, int result,
				 void *arg);

/* ---- The loop. new/free/run on the owning thread; stop and post from any thread. ---- */

/*
 * Creates a loop. It is bound to the first thread that runs it (or that
 * starts or stops one of its timers, perch/timer.h); every later run, and
 * perch_loop_free, must happen on that thread. With the
 * default backend, an io_uring refused by the kernel (EPERM, ENOSYS,
 * ENOMEM) falls back to epoll with one stderr line naming the reason.
 * Returns 0 with *out set; -EINVAL for a NULL out, a bad option or a
 * PERCH_BACKEND that is none of "uring", "io_uring" and "epoll"; -EPERM, -ENOSYS or
 * -ENOMEM when io_uring was asked for explicitly (option or environment)
 * and the kernel refuses it or its memory (one stderr line names the
 * cause); epoll_create1's error; -ENOMEM.
 */
PERCH_API int perch_loop_new(const struct perch_loop_opts *opts, struct perch_loop **out);

/* The backend the loop runs on: "io_uring" or "epoll" (NULL for NULL). Any thread. */
PERCH_API const char *perch_loop_backend_name(const struct perch_loop *loop);

/*
 * What a loop has done since it was made, counted on its thread
 * (perch_loop_stats). A counter marked "io_uring:" reads 0 on the epoll
 * backend.
 */
struct perch_loop_stats {
	uint64_t enobufs_parks;      /* receives that waited for a free receive buffer */
	uint64_t own_receives;       /* receives into a connection's own memory: its peer ended while it waited */
	uint64_t recv_pauses;        /* backpressure pauses, each time one starts: pause_bytes
				      * unconsumed, or pool buffers held at the bound thin
				      * segments reach (doc/loop.md, "Receive memory") */
	uint64_t accept_errors;      /* failed accepts */
	uint64_t accept_pauses;      /* listeners paused for want of fds or memory */
	uint64_t zerocopy_available; /* io_uring: 1 when the kernel has zero-copy sends (probed at start) */
	uint64_t zerocopy_sends;     /* io_uring: sends submitted zero-copy (perch_conn_opts.zerocopy_min) */
	uint64_t zerocopy_notifs;    /* io_uring: their notifications: the kernel let go of the bytes */
	uint64_t zerocopy_refused;   /* io_uring: sockets that refused a zero-copy send (Unix ones): plain after */
	uint64_t lingering;          /* connections in a lingering close now (perch_conn_close_lingering) */
	uint64_t lingers_refused;    /* lingering closes made at once: linger_max were lingering */
	uint64_t recv_limit_refused; /* io_uring: 1 once the kernel refused a multishot receive's byte
				      * limit (one that predates it): receives may then overshoot a
				      * pause by what the kernel takes before the pause's cancel lands */
	uint64_t bufs_given_back;    /* receive buffers whose pages a loop gave back to the kernel after
				      * they sat unused for a second (each time: doc/loop.md, "Receive memory") */
	uint64_t ring_fd_registered; /* io_uring: 1 while perch_loop_run runs with the ring's fd
				      * registered in its thread's table, so io_uring_enter skips
				      * the fd lookup; 0 outside perch_loop_run (perch_loop_run_once
				      * alone never registers) and where refused: before Linux
				      * 5.18, or that thread's 16 entries are taken (doc/loop.md,
				      * "Registered ring fd") */
	uint64_t recv_bundles;       /* io_uring: 1 when a multishot receive may take several buffers
				      * in one completion (recv bundles: Linux 6.16+, a ring with
				      * DEFER_TASKRUN, recv_bundles_off not set) */
	uint64_t bundle_bufs;        /* io_uring: receive buffers that came in completions of more than one */
	uint64_t fixed_files;        /* io_uring: 1 when the ring has a registered file table
				      * (Linux 6.13+, fixed_files_off not set) */
	uint64_t fixed_sockets;      /* io_uring: sockets entered in the table (at a connection's
				      * eighth send) since the loop was made: a running count,
				      * not those in it now */
	uint64_t fixed_refused;      /* io_uring: entries or removals the kernel refused (the socket
				      * then keeps its plain fd; doc/loop.md, "Registered files") */
};

/*
 * Copies the loop's counters into *out. On the loop's thread only (its
 * callbacks, posted functions and timers, or the thread that runs it
 * between turns; like perch_timer_start, the first thread to touch a loop
 * that never ran claims it): the counters are that thread's, unlocked.
 * From another thread, post a function that calls it. Returns 0, -EINVAL
 * (NULL), or -EEXIST (another thread owns the loop).
 */
PERCH_API int perch_loop_stats(struct perch_loop *loop, struct perch_loop_stats *out);

/*
 * Runs turns until perch_loop_stop. Returns 0 after a stop, or a negative
 * errno: -EINVAL (NULL); -EEXIST run from a thread that does not own it;
 * -EBUSY inside one of its own turns (its callbacks, or another loop's
 * run from one); or the backend's fatal error (a broken ring: doc/loop.md,
 * "When the kernel refuses a call"; then free the loop).
 */
PERCH_API int perch_loop_run(struct perch_loop *loop);

/*
 * Runs one turn: runs posted work, waits up to timeout_ms (negative: no
 * limit, 0: do not wait) for at least one completion, dispatches every
 * completion ready. While a listener is paused (out of fds, perch_listen),
 * a turn waits at most until its retry, 100 ms, and may return 0; while a
 * timer is armed (perch/timer.h; a connect's timeout is one), at most
 * until the soonest is due, and runs the due ones after the completions:
 * a turn that only ran timers may also return 0. Returns
 * the number of completions dispatched, or a negative errno (-EINVAL;
 * -EEXIST from a thread that does not own the loop; -EBUSY inside one of
 * its own turns: its callbacks, or another loop's turn run from one; or
 * the backend's fatal error, which every
 * later turn returns too: free the loop).
 */
PERCH_API int perch_loop_run_once(struct perch_loop *loop, int timeout_ms);

/*
 * Makes perch_loop_run return after its current turn. Any thread, and
 * async-signal-safe (atomics and one write(2), which may set errno: a
 * handler saves it); the wake is coalesced with pending posts. Returns 0
 * or -EINVAL.
 */
PERCH_API int perch_loop_stop(struct perch_loop *loop);

/*
 * Runs fn(arg) once on the loop thread, in posting order per poster, at
 * the loop's next turn. Any thread; wakes are coalesced (one eventfd write
 * until the loop drains). Returns 0, -EINVAL, or -ENOMEM.
 */
PERCH_API int perch_loop_post(struct perch_loop *loop, perch_loop_fn fn, void *arg);

/*
 * True inside one of `loop`'s turns on the thread running it: in its
 * callbacks, posted functions and timers (and during perch_loop_free's
 * last turns). False between turns, even on the loop's own thread.
 */
PERCH_API bool perch_loop_is_current(const struct perch_loop *loop);

/*
 * Closes every listener and connection still on the loop, waits for their
 * last completions (a few seconds at most), disarms and unbinds every
 * timer still armed without running it (calls on such a timer then return
 * -EINVAL until perch_timer_init binds it again), then frees the loop.
 * Call it on the thread that owns the loop (any thread if none does), after
 * perch_loop_run returned, and after releasing every connection (their
 * buffers belong to the loop) and every buffer forwarded from them has
 * come back (perch_conn_forward: a send completed, an in-memory pipe's
 * reader consumed it or was freed). Every call other threads make on the
 * loop (post, stop, listen, connect, adopt, a listener's close, a
 * lingering close) must have
 * returned before it starts: one still running may touch the freed loop.
 * Work posted before it started runs in its last drains (connects and
 * adoptions then report -ECANCELED), as does work those callbacks post,
 * up to 64 drains. Listener handles are invalid once it starts. Called
 * off the owner's thread, it runs no callbacks: posted work is dropped
 * (a line on stderr says so). NULL is ignored.
 */
PERCH_API void perch_loop_free(struct perch_loop *loop);

/* ---- Listeners and connects: any thread. ---- */

/*
 * How a listening socket is made; a zeroed struct (or NULL) means every
 * default.
 */
struct perch_listen_opts {
	int backlog;               /* listen(2)'s backlog; 0: SOMAXCONN; negative: -EINVAL */
	bool reuseport;            /* false (default): a port (TCP) another socket listens on,
				    * in this process or another, is refused with -EADDRINUSE.
				    * true: SO_REUSEPORT, so loops (one per thread) share the
				    * port and the kernel spreads connections among them; every
				    * listener on the port must ask for it, and a server started
				    * twice then splits its clients silently. Ignored by Unix
				    * sockets (a name has one listener) */
	unsigned mode;             /* perch_listen_unix on a path: the socket file's permission
				    * bits (connecting needs write permission on it), set by
				    * chmod(2) between bind and listen, so no connect is ever
				    * accepted under the umask's bits; e.g. 0660. 0: as the
				    * umask left them. Above 07777, or with an abstract name
				    * (no file): -EINVAL. Set through a handle that follows no
				    * symlink (O_PATH, then /proc/self/fd: /proc must be
				    * mounted): if the bound file was replaced meanwhile by a
				    * non-socket (a symlink, by whoever else can write its
				    * directory), -ENOTSOCK and nothing is listening */
	bool unlink_stale;         /* perch_listen_unix on a path: a socket file there that no
				    * one listens on (a connect to it is refused: its server
				    * died without removing it) is removed and the bind made
				    * again. A live listener's file, or a file that is not a
				    * socket, is never removed (-EADDRINUSE). The probe is a
				    * real connect: a live server accepts it, and sees an
				    * empty connection from this process. Every perch starter
				    * on a path holds an flock(2) on its directory from bind
				    * until listen, so two at once never both take the name:
				    * one wins, the other hears -EADDRINUSE. With this option
				    * the lock is required: the directory must be readable
				    * (open's -EACCES otherwise), and a lock held for half a
				    * second (a forked child that kept it) is -EAGAIN.
				    * Servers outside perch take no such lock. false
				    * (default): any file there is -EADDRINUSE. Ignored for
				    * an abstract name, which vanishes with its last socket */
};

/*
 * Listens on host (a numeric IPv4 or IPv6 address) and port (0: the
 * kernel picks, see perch_listener_port), with `lopts` (NULL: defaults,
 * so no SO_REUSEPORT). SO_REUSEADDR is always set (a port whose old
 * connections wait in TIME_WAIT is free); an IPv6 address listens on IPv6
 * only (IPV6_V6ONLY: "::" leaves IPv4's 0.0.0.0 to another listener).
 * Accepted connections get `opts` (NULL: defaults) and go to on_accept on
 * the loop thread; a listener out of fds or memory pauses for up to 100 ms
 * (doc/loop.md, "Out of fds").
 * Returns 0 with *out set (valid until perch_listener_close); -EINVAL for
 * a bad argument (a NULL loop, on_accept or out, a host that is not a
 * numeric address, a port out of 0..65535, bad opts or lopts);
 * -EADDRINUSE when another socket listens on the port and either of the
 * two did not ask for reuseport; bind's or listen's other errors
 * (-EACCES for a port below 1024 without the privilege, ...); -ENOMEM.
 * Inside one of the loop's turns the listener is in the loop on return
 * (no room: -ENOMEM; during perch_loop_free: -ECANCELED); outside them the
 * insert is queued, and a queued insert that fails is logged, with *out
 * valid until closed or the loop is freed (doc/loop.md, "A listen out of
 * memory").
 */
PERCH_API int perch_listen_tcp(struct perch_loop *loop, const char *host, int port,
			       const struct perch_listen_opts *lopts,
			       const struct perch_conn_opts *opts, perch_accept_fn on_accept,
			       void *arg, struct perch_listener **out);

/* perch_listen_tcp with the default listen options (no SO_REUSEPORT). */
PERCH_API int perch_listen(struct perch_loop *loop, const char *host, int port,
			   const struct perch_conn_opts *opts, perch_accept_fn on_accept,
			   void *arg, struct perch_listener **out);

/* The port the listener is bound to (host order), or -EINVAL for NULL. */
PERCH_API int perch_listener_port(const struct perch_listener *l);

/*
 * Stops accepting and frees the listener once its last completion came.
 * Connections already accepted are untouched. Any thread; `l` must not be
 * used after. Asynchronous: the socket closes on the loop's thread (off it,
 * at its next turn) once the kernel gave back its accept, so until then a
 * connect may still complete (and be reset or dropped), and a listen on
 * the same port may get -EADDRINUSE; nothing reports that moment (a
 * server restarting on its port sets reuseport, or retries). Returns 0 or
 * -EINVAL.
 */
PERCH_API int perch_listener_close(struct perch_listener *l);

/*
 * Connects to host:port (numeric IPv4 or IPv6; port 1..65535) on `loop`;
 * on_connected runs exactly once on the loop thread with the result: the
 * connection, or NULL and the connect's error (-ECONNREFUSED, ...), or
 * -ETIMEDOUT once opts->connect_timeout_ms passed since this call (the
 * socket is closed, and a connect the kernel finishes later is dropped;
 * the time runs from the call, so a connect posted to a loop too busy to
 * start it in time times out unstarted),
 * or -ECANCELED from inside perch_loop_free when the loop is freed first,
 * so keep what `arg` points to until then. A connect the loop sees
 * finished in the turn its timeout passes is reported connected. Without
 * a timeout the kernel's own applies (minutes, for a peer that never
 * answers); there is no cancel other than perch_loop_free. Returns 0 when
 * the connect started; -EINVAL for a bad argument (a NULL loop or
 * on_connected, a host that is not a numeric address, port 0 or out of
 * range, bad opts, a timeout above PERCH_CONNECT_TIMEOUT_MAX_MS); -ENOMEM;
 * socket()'s error.
 */
PERCH_API int perch_connect(struct perch_loop *loop, const char *host, int port,
			    const struct perch_conn_opts *opts, perch_connect_fn on_connected,
			    void *arg);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_LOOP_H */
