/* lib/loop_internal.h: what the loop's files (loop, inbox, sock, recv, send, listen, connect) share with each other. */
#ifndef PERCH_LIB_LOOP_INTERNAL_H
#define PERCH_LIB_LOOP_INTERNAL_H

#include <stddef.h>

#include "backend.h"

#define PERCH__TXBUF_POOL_MAX 256u  /* staging buffers a loop keeps: 1 MiB */
#define PERCH__ACCEPT_RETRY_MS 100  /* a listener paused for want of fds tries again after this */
#define PERCH__ACCEPT_LOG_MS 10000  /* at most one line a listener about failed accepts */

/* ---- timers (lib/timer.c; loop thread) ---- */

/* CLOCK_MONOTONIC in milliseconds. */
double perch__now_ms(void);
/* Reads the clock afresh; in a turn, it is the turn's clock from then on. */
double perch__loop_clock_read(struct perch_loop *loop);
/* Whether this thread owns the loop, claiming it if no thread has yet (as a turn does). */
bool perch__loop_claim(struct perch_loop *loop);
/* Arms (or re-arms) t for due_ms, a timer of `ms`, with no thread check: the loop's own timers. */
void perch__timer_arm_at(struct perch_timer *t, double due_ms, unsigned ms);
/*
 * perch_timer_start measured from the turn's clock (perch__loop_now_ms),
 * with the same checks and returns: for a timeout pushed back at every
 * request, where a lag of the turn's own run time does not matter.
 */
int perch__timer_restart(struct perch_timer *t, unsigned ms);
/* Disarms t wherever it waits; a disarmed timer is left alone. */
void perch__timer_disarm(struct perch_timer *t);
/* The soonest armed timer's due time; false when none is armed. */
bool perch__timers_soonest(const struct perch_loop *loop, double *due_ms);
/* After a turn's completions: runs every timer due now, soonest first. */
void perch__timers_expire(struct perch_loop *loop);
/* perch_loop_free: disarms every timer still armed and unbinds it from the loop. */
void perch__timers_unbind_all(struct perch_loop *loop);

/* ---- thread identity and the inbox (lib/inbox.c) ---- */

/*
 * The TLS model of a variable shared by the library's files: read as a
 * static of one file would be (an extern defaults to initial-exec, a load
 * more). Local-exec in code built for an executable (not PIC, or PIE),
 * local-dynamic in code that may go in a shared object.
 */
#if defined(__PIE__) || !defined(__PIC__)
#define PERCH__TLS_MODEL __attribute__((tls_model("local-exec")))
#else
#define PERCH__TLS_MODEL __attribute__((tls_model("local-dynamic")))
#endif

/*
 * The loop this thread is running (inside run_once or free): "on the loop
 * thread". Set and restored only by lib/loop.c's turns and free.
 */
extern __thread struct perch_loop *perch__current_loop
	__attribute__((visibility("hidden"))) PERCH__TLS_MODEL;

/*
 * Bumped at each turn's start and each wait of a poll on this thread, of
 * any loop (perch__loop_waited): a turn's kept clock holds while it stands
 * still. Never 0 in a turn, so a loop's first turn keeps nothing.
 */
extern __thread uint64_t perch__thread_clock_epoch __attribute__((visibility("hidden"))) PERCH__TLS_MODEL;

/*
 * Loop thread: the clock as a turn sees it. Forgotten at the turn's
 * start and whenever a poll on this thread waits (its own, or a nested
 * loop's run from its callbacks); read afresh at the first use after
 * that (the sleep's computation, when a timer is armed, is one) and kept
 * until then, so a turn that restarts many timers reads it once. It lags
 * the true time by what ran on the thread since the read: a timer armed
 * from it may fire that much early, one expired by it that much late.
 * Outside a turn, perch__now_ms.
 */
static inline double perch__loop_now_ms(struct perch_loop *loop)
{
	if (loop->in_turn && loop->turn_clock_epoch == perch__thread_clock_epoch)
		return loop->turn_clock_ms;
	return perch__loop_clock_read(loop);
}

/* Any thread: whether this thread is running `loop` (false for NULL). perch_loop_is_current, inline. */
static inline bool perch__loop_is_current(const struct perch_loop *loop)
{
	return loop && perch__current_loop == loop;
}

/*
 * Any thread: posts m to the loop's inbox and wakes the loop; m runs on the
 * loop thread and must stay valid until then. Safe against a concurrent
 * perch_loop_free (which waits for it: perch__inbox_wait_posters).
 */
void perch__inbox_push(struct perch_loop *loop, struct perch__msg *m);
/* Loop thread: runs everything posted so far in FIFO order; returns how many ran. */
int perch__inbox_drain(struct perch_loop *loop);
/* Loop thread, in perch_loop_free: returns once no thread is inside a post or a stop. */
void perch__inbox_wait_posters(struct perch_loop *loop);
/* Whether anything posted waits to run (perch_loop_free: work it will never run). */
bool perch__inbox_has_posts(struct perch_loop *loop);

/* ---- the socket table, options, sockets (lib/sock.c; loop thread unless said) ---- */

/* The socket at slot/gen, or NULL when that generation has left the table (perch__loop_sock, inline). */
static inline struct perch__sock *perch__table_lookup(struct perch_loop *loop, uint32_t slot,
						      uint32_t gen)
{
	if (slot >= loop->cap || loop->gens[slot] != gen)
		return NULL;
	return loop->table[slot];
}

/* Puts s in the table (slot, gen, in_table set; live counted): 0, or -ENOMEM when it cannot grow. */
int perch__table_insert(struct perch_loop *loop, struct perch__sock *s);
/* Any thread: `in` (NULL: defaults) with every zero field resolved into *out; 0 or -EINVAL. */
int perch__conn_opts_resolve(const struct perch_conn_opts *in, struct perch_conn_opts *out);
/* Any thread: a numeric host and port as a sockaddr in *ss, its size in *len; 0 or -EINVAL. */
int perch__addr_parse(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len);
/*
 * Any thread: a Unix socket name (a path, or "@name": abstract) as a
 * sockaddr_un in *ss, its exact size in *len; 0, -EINVAL (NULL, empty, a
 * bare "@") or -ENAMETOOLONG (lib/unix_addr.c).
 */
int perch__unix_addr_parse(const char *name, struct sockaddr_storage *ss, socklen_t *len,
			   bool *abstract);
/*
 * Any thread: a connection socket over `fd` (of `family`) with the loop's
 * reference on its conn; NULL: out of memory (fd left open). opts are
 * resolved; `shared`, when not NULL, is a record made for them (a
 * listener's), which the socket references.
 */
struct perch__sock *perch__conn_sock_new(struct perch_loop *loop, int fd, sa_family_t family,
					 const struct perch_conn_opts *opts, struct perch__sock_opts *shared);
/* Any thread: a record of o (resolved) for sockets of `loop`, its one reference the caller's; NULL: out of memory. */
struct perch__sock_opts *perch__sock_opts_new(const struct perch_loop *loop, const struct perch_conn_opts *o);
/* Any thread: a reference to the record for o (resolved): `shared` (made for o), the loop's defaults when o is those, else a new one; NULL: out of memory. */
struct perch__sock_opts *perch__sock_opts_for(struct perch_loop *loop, const struct perch_conn_opts *o,
					       struct perch__sock_opts *shared);
/* Any thread: drops a reference (NULL: none); the last frees the record. */
void perch__sock_opts_unref(struct perch__sock_opts *r);
/* Frees a listener's block, and its reference on its opts. */
void perch__listener_free(struct perch__sock *ls);
/* Any thread: the loop socket under a connection, or NULL when it is not a loop's (an in-memory pipe). */
struct perch__sock *perch__conn_sock(const struct perch_conn *c);
/* TCP_NODELAY unless the connection asked for Nagle's algorithm. */
void perch__sock_set_nodelay(const struct perch__sock *s);
/* Starts closing s, once: through the backend when in the table, else at once (a listener is freed). */
void perch__sock_start_close(struct perch__sock *s);

/* ---- the conn core's transport ops, kept by the file of their path (lib/sock.c holds the table) ---- */

/* Any thread: a received segment goes back to its loop (lib/recv.c). */
void perch__op_release_seg(struct perch_seg *seg);
struct perch_seg *perch__op_tail_seg(struct perch_seg *first, size_t len);
/* Any thread: hands a staged chain to the loop to send (lib/send.c). */
void perch__op_send(struct perch_conn *c, struct perch__txbuf *chain);
/* Loop thread: starts sending chain (c is passed apart from perch__sock_conn(s): after a close the socket may be finalized). */
void perch__send_start(struct perch__sock *s, struct perch_conn *c, struct perch__txbuf *chain);
/* Any thread: posts a connection's call (a PERCH__POSTED_* bit) to its loop, riding a message already pushed. */
void perch__sock_post(struct perch__sock *s, uint8_t call);
/*
 * Any thread: a pooled staging buffer of PERCH__TXBUF_CAP on the loop's
 * thread (new if the pool is empty), else NULL (lib/send.c).
 */
struct perch__txbuf *perch__loop_txbuf_get(struct perch_loop *loop);
/* Any thread: true when the pool took b back (loop thread, room left); else the caller frees it. */
bool perch__loop_txbuf_put(struct perch_loop *loop, struct perch__txbuf *b);
/* The two above for a socket's connection: its loop's pool. */
struct perch__txbuf *perch__op_txbuf_get(struct perch_conn *c);
bool perch__op_txbuf_put(struct perch_conn *c, struct perch__txbuf *b);
/* perch_loop_free: frees the staging pool (lib/send.c). */
void perch__txbuf_pool_free(struct perch_loop *loop);

/* ---- connecting (lib/connect.c) ---- */

/* A connect's fields (zeroed), for perch__conn_adopted_post; NULL for want of memory. */
struct perch__connecting *perch__connecting_new(void);

/*
 * Any thread: s, over an fd connected already, is posted to its loop with
 * cx (perch__connecting_new's, which s then owns), which puts it in the
 * table and reports it to on_connected as a connect would (-ENOMEM or
 * -ECANCELED closing it), never from inside the caller.
 */
void perch__conn_adopted_post(struct perch__sock *s, struct perch__connecting *cx, perch_connect_fn on_connected,
			      void *arg);

/* ---- accepting (lib/listen.c; loop thread) ---- */

/* A socket closed (an fd is free) or the retry time passed: every paused listener tries again. */
void perch__accept_resume(struct perch_loop *loop);
/* loop->accept_retry's callback (arg: the loop): resumes the paused listeners. */
void perch__accept_retry_due(struct perch_timer *t, void *arg);
/* Any thread: `in` (NULL: defaults) with every zero field resolved into *out; 0 or -EINVAL. */
int perch__listen_opts_resolve(const struct perch_listen_opts *in, struct perch_listen_opts *out);
/*
 * Any thread: a listener accepting on `fd` (listening already) with the
 * resolved options `o`, as perch_listen returns it. On success the fd is
 * the listener's; on failure (getsockname's error, -ENOMEM, or on the
 * loop thread -ENOMEM or -ECANCELED) it is still the caller's.
 */
int perch__listener_start(struct perch_loop *loop, int fd, const struct perch_conn_opts *o,
			  perch_accept_fn on_accept, void *arg, struct perch_listener **out);

#endif /* PERCH_LIB_LOOP_INTERNAL_H */
