/* lib/epoll.c: the epoll backend: setup, the receive pool, socket operations, and the poll whose completions are reported at the end of its turn. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "epoll_internal.h"

/* ================= pending completions ================= */

void perch__epoll_pend(struct ep *e, struct perch__sock *s, uint32_t what)
{
	struct esock *es = es_of(s);
	if (!es->pend) {
		es->pend_next = NULL;
		if (e->pend_tail)
			es_of(e->pend_tail)->pend_next = s;
		else
			e->pend_head = s;
		e->pend_tail = s;
	}
	es->pend |= what;
}

/* Reports what a closed socket still owes, closes its fd, and lets it leave the table. */
static void finalize(struct perch__sock *s)
{
	if (s->kind == PERCH__SOCK_CONN) {
		if (perch__sock_connecting(s))
			perch__loop_connected(s, -ECANCELED);
		if (es_of(s)->flags & F_SEND_WAIT) {
			es_of(s)->flags &= ~F_SEND_WAIT;
			perch__loop_sent(s, -ECANCELED);
		}
	}
	close(s->fd);
	perch__loop_sock_closed(s); /* may free s */
}

/*
 * Runs the completions pending when it starts (those they cause wait for
 * the next turn, so a callback that sends again cannot hold the loop).
 * Returns how many sockets it served.
 */
static int run_pending(struct ep *e)
{
	struct perch__sock *s = e->pend_head;
	e->pend_head = e->pend_tail = NULL;
	int n = 0;
	while (s) {
		/* Read first: reporting may pend s again (relinking it) or free it. */
		struct esock *es = es_of(s);
		struct perch__sock *next = es->pend_next;
		uint32_t what = es->pend;
		es->pend = 0;
		if (what & P_CONNECTED)
			perch__loop_connected(s, es->res);
		/* A refusal fails the connection before its waiting send ends: whoever the flush wakes finds it failed. */
		if (what & P_FAILED)
			perch__loop_failed(s, es->refused);
		if (what & P_SENT)
			perch__loop_sent(s, es->res);
		if (what & P_CLOSE)
			finalize(s);
		s = next;
		n++;
	}
	return n;
}

/* ================= the receive pool and the park list ================= */

void perch__epoll_park(struct ep *e, struct perch__sock *s)
{
	perch__park(s);
	s->loop->stats.enobufs_parks++;
	perch__epoll_update_interest(e, s); /* EPOLLIN off until a buffer is free for it */
}

/*
 * Buffers are free: give parked connections EPOLLIN back, first parked
 * first, no more of them than there are free buffers. The MOD re-polls, so
 * each gets an event; one that finds no buffer then parks again at the tail.
 */
static void serve_parked(struct perch_loop *loop, struct ep *e)
{
	uint32_t budget = e->nfree;
	struct perch__sock *s;
	while (budget > 0 && (s = perch__parked_first(loop)) != NULL) {
		perch__unpark(s);
		if (reading(s)) {
			perch__epoll_update_interest(e, s);
			budget--;
		}
	}
}

static void epoll_buf_release(struct perch_loop *loop, struct perch__rxseg *rs)
{
	struct ep *e = ep_of(loop);
	perch__epoll_buf_put(e, rs);
	serve_parked(loop, e);
}

/* ================= setup ================= */

/* A socket the loop's free left (its close never reported): a send result it held is reported now. */
static void settle_abandoned(struct perch__sock *s)
{
	struct esock *es = es_of(s);
	if (es->pend & P_SENT)
		perch__loop_sent(s, es->res);
	es->pend = 0;
	es->flags &= ~F_SEND_WAIT;
}

static void epoll_destroy(struct perch_loop *loop)
{
	struct ep *e = ep_of(loop);
	if (!e)
		return;
	if (e->epfd >= 0)
		close(e->epfd);
	perch__loop_abandon_all(loop, settle_abandoned);
	free(e->bufs);
	free(e->segs);
	free(e->free_ids);
	free(e);
	loop->be_state = NULL;
}

/* Once a second while free buffers may keep pages: those the interval left untouched give them back. */
static void pool_tick(struct perch_timer *t, void *arg)
{
	struct perch_loop *loop = arg;
	struct ep *e = ep_of(loop);
	loop->stats.bufs_given_back += perch__pool_trim_stack(&e->trim, e->free_ids, e->nfree);
}

static int pool_setup(struct perch_loop *loop, struct ep *e, uint32_t count, uint32_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	if (posix_memalign((void **)&e->bufs, (size_t)page, (size_t)count * size) != 0)
		return -ENOMEM;
	e->segs = calloc(count, sizeof(*e->segs));
	e->free_ids = calloc(count, sizeof(*e->free_ids));
	if (!e->segs || !e->free_ids)
		return -ENOMEM;
	e->nbufs = count;
	e->buf_size = size;
	for (uint32_t i = 0; i < count; i++) {
		struct perch__rxseg *rs = &e->segs[i];
		rs->seg.data = e->bufs + (size_t)i * size;
		rs->seg.buf_id = i;
		rs->seg.owner = loop;
		e->free_ids[i] = count - 1 - i; /* buffer 0 on top */
	}
	e->nfree = count;
	perch__pool_trim_init(&e->trim, loop, e->bufs, size, count, pool_tick, loop);
	return 0;
}

static int epoll_init(struct perch_loop *loop, const struct perch_loop_opts *opts)
{
	struct ep *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	loop->be_state = e;
	e->budget = opts->read_budget == PERCH_READ_BUDGET_UNBOUNDED ? UINT64_MAX : opts->read_budget;
	e->epfd = epoll_create1(EPOLL_CLOEXEC);
	int rc = e->epfd < 0 ? -errno : pool_setup(loop, e, opts->buf_count, opts->buf_size);
	if (rc == 0) {
		/* Level-triggered: the loop drains the eventfd each time it is readable. */
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = WAKE_TAG };
		if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, loop->wake_fd, &ev) != 0)
			rc = -errno;
	}
	if (rc != 0)
		epoll_destroy(loop);
	return rc;
}

/* ================= socket operations ================= */

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 ? 0 : -errno;
}

static void epoll_accept(struct perch__sock *ls)
{
	struct ep *e = ep_of(ls->loop);
	int rc = set_nonblock(ls->fd);
	if (rc == 0)
		rc = perch__epoll_set_interest(e, ls);
	if (rc != 0)
		perch__loop_accepted(ls, rc); /* logged; the listener accepts nothing */
}

/* Out of fds: the listener stays readable, so it leaves the set until resumed (epoll_accept adds it back). */
static void epoll_accept_pause(struct perch__sock *ls)
{
	perch__epoll_remove_interest(ep_of(ls->loop), ls);
}

static void epoll_connect(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	const struct perch__connecting *cx = perch__sock_cx(s);
	int rc = set_nonblock(s->fd);
	if (rc == 0 && connect(s->fd, (struct sockaddr *)&cx->addr, cx->addr_len) != 0 &&
	    errno != EINPROGRESS)
		rc = -errno;
	if (rc != 0) {
		es_of(s)->res = rc;
		perch__epoll_pend(e, s, P_CONNECTED);
		return;
	}
	/* Writable (or an error) once the handshake ends. */
	es_of(s)->flags |= F_CONNECTING;
	perch__epoll_update_interest(e, s);
}

static void epoll_recv_arm(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	if (s->closing)
		return;
	/* Parked, and (say) resumed from a pause: a free buffer that no one took is its to try. */
	if (s->parked && e->nfree > 0)
		perch__unpark(s);
	perch__epoll_update_interest(e, s); /* still parked: EPOLLRDHUP back, the end heard again */
}

/* Paused or ended: EPOLLIN goes (a stalled consumer costs no events); resuming re-polls. */
static void epoll_recv_pause(struct perch__sock *s)
{
	perch__epoll_update_interest(ep_of(s->loop), s);
}
/*
 * Written at once (speculatively); EPOLLOUT is armed only when the socket
 * is full. The result is reported at the end of the turn: never from
 * inside the send call (a flush from inside on_flush_done would recurse).
 */
static void epoll_send(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	int r = perch__epoll_try_send(s);
	if (r == -EAGAIN) {
		es_of(s)->flags |= F_SEND_WAIT;
		perch__epoll_update_interest(e, s); /* refused: the send fails with it at the end of the turn */
		return;
	}
	es_of(s)->res = r;
	perch__epoll_pend(e, s, P_SENT);
}

/* Off epoll now; finalized at the end of the turn, so no caller has the socket freed under it. */
static void epoll_close(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	perch__unpark(s);
	perch__epoll_remove_interest(e, s);
	perch__epoll_pend(e, s, P_CLOSE);
}

static void dispatch(struct perch_loop *loop, const struct epoll_event *ev)
{
	struct ep *e = ep_of(loop);
	if (ev->data.u64 == WAKE_TAG) {
		uint64_t v;
		ssize_t r = read(loop->wake_fd, &v, sizeof(v));
		(void)r; /* EAGAIN: another read emptied it; the inbox is drained either way */
		perch__loop_woken(loop);
		return;
	}
	/* The socket may have left (or its slot been reused) since epoll queued the event. */
	struct perch__sock *s = perch__loop_sock(loop, (uint32_t)ev->data.u64,
						 (uint32_t)(ev->data.u64 >> 32));
	if (!s || s->closing)
		return;
	if (s->kind == PERCH__SOCK_LISTENER)
		perch__epoll_on_listener_ready(s);
	else
		perch__epoll_on_conn_ready(e, s, ev->events);
}

static int epoll_poll(struct perch_loop *loop, int timeout_ms)
{
	struct ep *e = ep_of(loop);
	int done = run_pending(e);
	if (done || e->pend_head)
		timeout_ms = 0; /* completions were reported, or are waiting: do not sleep */
	loop->stats.waits++;
	int n = epoll_wait(e->epfd, e->events, MAX_EVENTS, timeout_ms);
	int err = n < 0 ? errno : 0;
	perch__loop_waited(loop);
	if (n < 0)
		return err == EINTR ? done : -err;
	for (int i = 0; i < n; i++)
		dispatch(loop, &e->events[i]);
	done += run_pending(e);
	/* A re-armed parked connection that took no buffer (a FIN) leaves it to the next one. */
	if (e->nfree && perch__parked_first(loop))
		serve_parked(loop, e);
	return n + done;
}

const struct perch__backend perch__epoll_backend = {
	.name = "epoll",
	.env_name = "epoll",
	.id = PERCH_BACKEND_EPOLL,
	.sock_size = sizeof(struct esock),
	.init = epoll_init,
	.destroy = epoll_destroy,
	.poll = epoll_poll,
	.accept = epoll_accept,
	.accept_pause = epoll_accept_pause,
	.connect = epoll_connect,
	.recv_arm = epoll_recv_arm,
	.recv_pause = epoll_recv_pause,
	.send = epoll_send,
	.close = epoll_close,
	.buf_release = epoll_buf_release,
};
