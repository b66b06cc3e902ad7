/* lib/linger.c: lingering close: the write side shut, what the peer still sends read and dropped, then the close. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>

#include <perch/sock.h>
#include <perch/timer.h>

#include "atomic.h"
#include "loop_internal.h"

#define LINGER_DEFAULT_BYTES (1024u * 1024)
#define LINGER_DEFAULT_MS 5000u

/*
 * One connection lingering: it holds the caller's reference, a read
 * parked on the connection and a timer, all on the loop thread.
 */
struct lingering {
	struct perch__msg start_msg;   /* the start, posted from another thread */
	struct perch__msg drain_msg;   /* a wake delivered on another thread, drained on the loop's */
	struct perch_loop *loop;
	struct perch_conn *c;
	struct perch_recv_listener l;
	struct perch_timer timer;
	size_t left;                   /* bytes still to drop before giving up */
	unsigned timeout_ms;
	bool draining;                 /* past the first read (only its cancel may be one a freed pipe reader left) */
	bool *ended;                   /* set by linger_end while linger_timed_out waits on a close */
};

/* The close (idempotent), then the timer, the reference and the struct: once, on the loop thread. */
static void linger_end(struct lingering *lg)
{
	PERCH_ASSERT(perch__loop_is_current(lg->loop)); /* else the timer could not be unlinked */
	PERCH_ASSERT(lg->loop->stats.lingering > 0);
	lg->loop->stats.lingering--;
	perch_timer_stop(&lg->timer);
	perch_conn_close(lg->c);
	perch_conn_release(lg->c);
	if (lg->ended)
		*lg->ended = true;
	free(lg);
}

/*
 * Loop thread: drops what is there until a read parks. Ends at the
 * peer's end or error, a close, past the byte bound (the close then
 * resets: the peer's bytes are left unread), or when another reader
 * breaks in (a read refused, or a cancel after the first read: only the
 * first may carry the one a freed pipe reader left).
 */
static void linger_drain(struct lingering *lg)
{
	for (;;) {
		struct perch_read_result res;
		int rc = perch_conn_try_read_or_park(lg->c, &lg->l, &res);
		bool first = !lg->draining;
		lg->draining = true;
		if (rc == PERCH_PENDING)
			return;
		if (rc != 0 || res.len > lg->left) {
			linger_end(lg);
			return;
		}
		lg->left -= res.len;
		perch_conn_advance(lg->c, res.len, res.len);
		if (res.completed || res.error || res.closed || (res.canceled && !first)) {
			linger_end(lg);
			return;
		}
	}
}

static uint64_t linger_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	(void)l;
	(void)c;
	return 0;
}

static void run_posted_drain(struct perch_loop *loop, struct perch__msg *m)
{
	(void)loop;
	linger_drain(perch__container_of(m, struct lingering, drain_msg));
}

/*
 * A wake: the loop's own, or one a close or cancel on another thread
 * delivered there (the caller broke the contract, but the timer and the
 * end stay on the loop thread): one park, one wake, so one drain posted
 * at a time.
 */
static void linger_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	(void)c;
	(void)cookie;
	struct lingering *lg = perch__container_of(l, struct lingering, l);
	if (perch__loop_is_current(lg->loop)) {
		linger_drain(lg);
		return;
	}
	lg->drain_msg.run = run_posted_drain;
	perch__inbox_push(lg->loop, &lg->drain_msg);
}

/*
 * The time bound: the close delivers the parked read here, and its drain
 * ends the linger. Between drains a read is always parked, or its wake is
 * on its way to a posted drain (delivered on another thread), which then
 * ends it: either way the end is not this callback's to make again.
 */
static void linger_timed_out(struct perch_timer *t, void *arg)
{
	(void)t;
	struct lingering *lg = arg;
	bool ended = false;
	lg->ended = &ended;
	perch_conn_close(lg->c);
	if (!ended)
		lg->ended = NULL;
}

/*
 * Loop thread. Past linger_max lingering, or with a refused timer (the
 * loop is being freed), it ends at once: a flood of peers that neither
 * send nor close must not hold an fd each for the whole timeout.
 */
static void linger_start(struct lingering *lg)
{
	struct perch_loop *loop = lg->loop;
	bool over_cap = loop->stats.lingering >= loop->opts.linger_max;
	loop->stats.lingering++;
	if (over_cap) {
		loop->stats.lingers_refused++;
		linger_end(lg);
		return;
	}
	if (perch_timer_start(&lg->timer, lg->timeout_ms) != 0) {
		linger_end(lg);
		return;
	}
	linger_drain(lg);
}

static void run_posted_linger(struct perch_loop *loop, struct perch__msg *m)
{
	(void)loop;
	linger_start(perch__container_of(m, struct lingering, start_msg));
}

int perch_conn_close_lingering(struct perch_conn *c, const struct perch_linger_opts *opts)
{
	struct perch_linger_opts o = opts ? *opts : (struct perch_linger_opts){ 0 };
	if (!c || o.timeout_ms > PERCH_TIMER_MAX_MS)
		return -EINVAL;
	struct perch__sock *s = perch__conn_sock(c);
	if (!s)
		return -EOPNOTSUPP;
	struct lingering *lg = calloc(1, sizeof(*lg));
	if (!lg)
		return -ENOMEM;
	if (perch__for_u8(&s->posted, PERCH__LINGERING) & PERCH__LINGERING) {
		free(lg);
		return -EALREADY;
	}
	/* Shut first: -EBUSY (staged bytes, a flush out) or -EPIPE leaves everything as it was. */
	int rc = perch_conn_shutdown(c);
	if (rc != 0) {
		perch__fand_u8(&s->posted, (uint8_t)~PERCH__LINGERING);
		free(lg);
		return rc;
	}
	lg->loop = s->loop;
	lg->c = c;
	lg->l = (struct perch_recv_listener){ .on_parking = linger_parking, .on_recv_ready = linger_ready };
	lg->left = o.max_bytes ? o.max_bytes : LINGER_DEFAULT_BYTES;
	lg->timeout_ms = o.timeout_ms ? o.timeout_ms : LINGER_DEFAULT_MS;
	perch_timer_init(&lg->timer, s->loop, linger_timed_out, lg);
	if (perch__loop_is_current(s->loop)) {
		linger_start(lg);
		return 0;
	}
	lg->start_msg.run = run_posted_linger;
	perch__inbox_push(s->loop, &lg->start_msg);
	return 0;
}
