/* lib/epoll.c: the epoll backend: edge-triggered readiness turned into the loop's perch__loop_* calls, reads bounded per turn. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "backend.h"
#include "invariant.h"

#define MAX_EVENTS 256
#define ACCEPT_BATCH 64            /* accepts per readiness event: then the other events of the batch */
#define WAKE_TAG UINT64_MAX
#define TAG(s) (((uint64_t)(s)->gen << 32) | (s)->slot)

/* esock.flags */
#define F_ADDED      1u   /* registered with the epoll fd */
#define F_CONNECTING 2u   /* a connect waits for EPOLLOUT */
#define F_SEND_WAIT  4u   /* a send met EAGAIN and waits for EPOLLOUT */
#define F_REFUSED    8u   /* the kernel refused its interest: the connection failed, no ctl until its close */

/* esock.pend: completions reported at the end of the turn, never inside the call that started them */
#define P_CONNECTED 1u
#define P_SENT      2u
#define P_CLOSE     4u

/* This backend's state for one socket, kept after the loop's (perch__sock_be). */
struct esock {
	uint32_t flags;              /* F_* */
	uint32_t events;             /* the interest the kernel has for the fd */
	uint32_t pend;               /* P_*: completions to report at the end of the turn */
	int res;                     /* the pending connect's or send's result */
	struct perch__sock *pend_next;
	struct msghdr msg;
	struct iovec iov[PERCH__TX_IOV];
};

static struct esock *es_of(struct perch__sock *s)
{
	return perch__sock_be(s);
}

struct ep {
	int epfd;
	uint64_t budget;             /* bytes a connection reads per turn */
	uint8_t *bufs;               /* the receive pool: nbufs x buf_size */
	struct perch__rxseg *segs;   /* one per buffer id */
	uint32_t *free_ids;          /* a stack: the buffer used last is reused first (warm) */
	uint32_t nfree, nbufs, buf_size;
	struct perch__park_list parked; /* no buffer: first parked, first served */
	struct perch__sock *pend_head, *pend_tail; /* sockets with esock.pend set, in order */
	struct epoll_event events[MAX_EVENTS];
};

static struct ep *ep_of(struct perch_loop *loop)
{
	return loop->be_state;
}

/* ================= interest: a direction only while someone waits on it ================= */

/* Whether the connection reads now: recv wanted (not paused, ended, closing) and not parked. */
static bool reading(const struct perch__sock *s)
{
	return perch__loop_recv_wanted(s) && !s->parked;
}

/*
 * Edge-triggered: a ready event is reported once, so no direction can turn
 * into a storm; EPOLLIN is held only while the connection reads, EPOLLOUT
 * only while a connect or a blocked send waits.
 */
static uint32_t interest(struct perch__sock *s)
{
	if (s->kind == PERCH__SOCK_LISTENER) /* level-triggered: a batch of accepts per turn, the rest next turn */
		return s->accept_paused ? 0 : EPOLLIN;
	uint32_t ev = EPOLLET;
	if (es_of(s)->flags & F_CONNECTING)
		return ev | EPOLLOUT;
	if (reading(s))
		ev |= EPOLLIN | EPOLLRDHUP;
	if (es_of(s)->flags & F_SEND_WAIT)
		ev |= EPOLLOUT;
	return ev;
}

static int ctl(struct ep *e, int op, struct perch__sock *s, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.u64 = TAG(s) };
	return epoll_ctl(e->epfd, op, s->fd, &ev) == 0 ? 0 : -errno;
}

/*
 * Tells the kernel the interest the socket has now (MOD only when it
 * changed). A MOD re-polls the fd, so readiness that came while a
 * direction was off is reported as soon as it is back on. Returns 0 or
 * the kernel's -errno (nothing changed then).
 */
static int set_interest(struct ep *e, struct perch__sock *s)
{
	struct esock *es = es_of(s);
	if (s->closing || (es->flags & F_REFUSED))
		return 0;
	uint32_t want = interest(s);
	if (!(es->flags & F_ADDED)) {
		int rc = ctl(e, EPOLL_CTL_ADD, s, want);
		if (rc == 0) {
			es->flags |= F_ADDED;
			es->events = want;
		}
		return rc;
	}
	if (want == es->events)
		return 0;
	s->loop->stats.interest_changes++;
	int rc = ctl(e, EPOLL_CTL_MOD, s, want);
	if (rc == 0)
		es->events = want;
	return rc;
}

static void pend(struct ep *e, struct perch__sock *s, uint32_t what);

/*
 * The kernel refused a connection's interest (ENOMEM, ENOSPC, ...): it
 * could no longer be told when to read or write, so it fails with that
 * errno, delivered once to each waiter: a connect or a send waiting for
 * EPOLLOUT completes with it at the end of the turn; the reader sees it
 * after the bytes already queued. The close that follows takes it off epoll.
 */
static void conn_refused(struct ep *e, struct perch__sock *s, int err)
{
	struct esock *es = es_of(s);
	es->flags |= F_REFUSED;
	if (es->flags & (F_CONNECTING | F_SEND_WAIT)) {
		uint32_t what = es->flags & F_CONNECTING ? P_CONNECTED : P_SENT;
		es->flags &= ~(F_CONNECTING | F_SEND_WAIT);
		es->res = err;
		pend(e, s, what);
		if (what == P_CONNECTED)
			return; /* not connected yet: the callback gets the error, nobody reads */
	}
	perch__loop_recv_ended(s, err);
}

/* The interest a connection has now, or its failure when the kernel refuses it. */
static void update_interest(struct ep *e, struct perch__sock *s)
{
	int rc = set_interest(e, s);
	if (rc != 0)
		conn_refused(e, s, rc);
}

/*
 * A yielded turn: MOD with the socket's own interest (EPOLLOUT kept when a
 * send waits), which re-polls the fd and queues it again behind the
 * events already ready, so its next turn comes after theirs.
 */
static void rearm(struct ep *e, struct perch__sock *s)
{
	uint32_t want = interest(s);
	s->loop->stats.interest_changes++;
	int rc = ctl(e, EPOLL_CTL_MOD, s, want);
	if (rc == 0)
		es_of(s)->events = want;
	else
		conn_refused(e, s, rc);
}

/*
 * Takes the socket off epoll. A DEL fails only for an fd the set does not
 * hold (ENOENT) or that is not open (EBADF); either way the set no longer
 * has it, which is all a DEL is for.
 */
static void remove_interest(struct ep *e, struct perch__sock *s)
{
	struct esock *es = es_of(s);
	if (!(es->flags & F_ADDED))
		return;
	if (epoll_ctl(e->epfd, EPOLL_CTL_DEL, s->fd, NULL) != 0)
		PERCH_ASSERT(errno == ENOENT || errno == EBADF);
	es->flags &= ~F_ADDED;
}

/* ================= pending completions ================= */

static void pend(struct ep *e, struct perch__sock *s, uint32_t what)
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
		if (s->on_connected)
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

static struct perch__rxseg *buf_take(struct ep *e)
{
	return e->nfree ? &e->segs[e->free_ids[--e->nfree]] : NULL;
}

static void buf_put(struct ep *e, struct perch__rxseg *rs)
{
	e->free_ids[e->nfree++] = rs->seg.buf_id;
}

static void park(struct ep *e, struct perch__sock *s)
{
	perch__park(&e->parked, s);
	s->loop->stats.enobufs_parks++;
	update_interest(e, s); /* EPOLLIN off until a buffer is free for it */
}

/*
 * Buffers are free: give parked connections EPOLLIN back, first parked
 * first, no more of them than there are free buffers. The MOD re-polls, so
 * each gets an event; one that finds no buffer then parks again at the tail.
 */
static void serve_parked(struct ep *e)
{
	uint32_t budget = e->nfree;
	while (budget > 0 && e->parked.head) {
		struct perch__sock *s = e->parked.head;
		perch__unpark(&e->parked, s);
		if (reading(s)) {
			update_interest(e, s);
			budget--;
		}
	}
}

static void epoll_buf_release(struct perch_loop *loop, struct perch__rxseg *rs)
{
	struct ep *e = ep_of(loop);
	buf_put(e, rs);
	serve_parked(e);
}

/* ================= setup ================= */

/* A socket the loop's free left (its close never reported): what it still owed is reported now. */
static void settle_abandoned(struct perch__sock *s)
{
	struct esock *es = es_of(s);
	if (es->pend & P_SENT)
		perch__loop_sent(s, es->res);
	else if (es->flags & F_SEND_WAIT)
		perch__loop_sent(s, -ECANCELED);
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
		rc = set_interest(e, ls);
	if (rc != 0)
		perch__loop_accepted(ls, rc); /* logged; the listener accepts nothing */
}

/* Out of fds: the listener stays readable, so it leaves the set until resumed (epoll_accept adds it back). */
static void epoll_accept_pause(struct perch__sock *ls)
{
	remove_interest(ep_of(ls->loop), ls);
}

static void epoll_connect(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	int rc = set_nonblock(s->fd);
	if (rc == 0 && connect(s->fd, (struct sockaddr *)&s->peer, s->peer_len) != 0 &&
	    errno != EINPROGRESS)
		rc = -errno;
	if (rc != 0) {
		es_of(s)->res = rc;
		pend(e, s, P_CONNECTED);
		return;
	}
	/* Writable (or an error) once the handshake ends. */
	es_of(s)->flags |= F_CONNECTING;
	update_interest(e, s);
}

static void epoll_recv_arm(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	if (s->closing)
		return;
	if (s->parked) {
		/* Parked, and (say) resumed from a pause: a free buffer that no one took is its to try. */
		if (e->nfree == 0)
			return;
		perch__unpark(&e->parked, s);
	}
	update_interest(e, s);
}

/* Paused or ended: EPOLLIN goes (a stalled consumer costs no events); resuming re-polls. */
static void epoll_recv_pause(struct perch__sock *s)
{
	update_interest(ep_of(s->loop), s);
}

/* One sendmsg of what is left: bytes taken or -errno (-EAGAIN: the socket is full). */
static int try_send(struct perch__sock *s)
{
	struct esock *es = es_of(s);
	int n = perch__loop_tx_iov(s, es->iov, PERCH__TX_IOV);
	memset(&es->msg, 0, sizeof(es->msg));
	es->msg.msg_iov = es->iov;
	es->msg.msg_iovlen = (size_t)n;
	ssize_t r;
	do
		r = sendmsg(s->fd, &es->msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : (int)r;
}

/*
 * Written at once (speculatively); EPOLLOUT is armed only when the socket
 * is full. The result is reported at the end of the turn: never from
 * inside the send call (a flush from inside on_flush_done would recurse).
 */
static void epoll_send(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	int r = try_send(s);
	if (r == -EAGAIN) {
		es_of(s)->flags |= F_SEND_WAIT;
		update_interest(e, s); /* refused: the send fails with it at the end of the turn */
		return;
	}
	es_of(s)->res = r;
	pend(e, s, P_SENT);
}

/* Off epoll now; finalized at the end of the turn, so no caller has the socket freed under it. */
static void epoll_close(struct perch__sock *s)
{
	struct ep *e = ep_of(s->loop);
	perch__unpark(&e->parked, s);
	remove_interest(e, s);
	pend(e, s, P_CLOSE);
}

/* ================= readiness ================= */

static void on_listener_ready(struct perch__sock *ls)
{
	for (int i = 0; i < ACCEPT_BATCH && !ls->closing; i++) {
		int fd = accept4(ls->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			perch__loop_accepted(ls, fd);
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return;
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		perch__loop_accepted(ls, -errno); /* logged; level-triggered: tried again next turn */
		return;
	}
}

static void on_connect_ready(struct perch__sock *s)
{
	int err = 0;
	socklen_t len = sizeof(err);
	if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		err = errno;
	es_of(s)->flags &= ~F_CONNECTING;
	perch__loop_connected(s, -err);
}

static void on_writable(struct perch__sock *s)
{
	int r = try_send(s);
	if (r == -EAGAIN)
		return;
	es_of(s)->flags &= ~F_SEND_WAIT;
	perch__loop_sent(s, r); /* a short send comes back to epoll_send */
}

/*
 * One turn of reading: until EAGAIN, a short read, or the budget (then the
 * socket is re-armed and the turn yields: returns true). Stops at once
 * when the delivery paused recv (backpressure, inline: the next buffer is
 * not read), or when the connection was closed locally: a closing
 * connection is not read and never yields (its close, already on its way,
 * ends it; a MOD must not re-arm a socket being torn down).
 */
static bool read_turn(struct ep *e, struct perch__sock *s)
{
	struct perch_loop *loop = s->loop;
	uint64_t got = 0;
	bool yielded = false;
	loop->stats.read_turns++;
	while (reading(s) && !perch_conn_is_closed(s->conn)) {
		if (got >= e->budget) {
			loop->stats.read_yields++;
			rearm(e, s);
			yielded = true;
			break;
		}
		struct perch__rxseg *rs = buf_take(e);
		if (!rs) {
			park(e, s);
			break;
		}
		ssize_t n = recv(s->fd, rs->seg.data, e->buf_size, 0);
		if (n > 0) {
			rs->seg.next = NULL;
			rs->seg.len = (uint32_t)n;
			got += (uint64_t)n;
			perch__loop_received(s, rs);
			if ((uint32_t)n < e->buf_size)
				break; /* short: the receive queue was empty */
			continue;
		}
		int err = n == 0 ? 0 : errno;
		buf_put(e, rs);
		if (err == EINTR)
			continue;
		if (err != EAGAIN && err != EWOULDBLOCK)
			perch__loop_recv_ended(s, -err); /* 0: the FIN, after every byte */
		break;
	}
	if (got > loop->stats.turn_bytes_max)
		loop->stats.turn_bytes_max = got;
	return yielded;
}

/*
 * The event's half-close and error step, for a turn that read everything
 * queued: a read that stopped short took the last bytes (and the FIN
 * marker) without seeing the end, and edge-triggered epoll will not report
 * it again. Not for a turn that yielded: bytes before the FIN come first,
 * and the re-armed socket reports the FIN again.
 */
static void on_hangup(struct perch__sock *s, uint32_t ev)
{
	if (!reading(s) || perch_conn_is_closed(s->conn))
		return; /* paused or parked: the MOD that resumes it re-polls and reports this again */
	int err = 0;
	socklen_t len = sizeof(err);
	if ((ev & EPOLLERR) && getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err) {
		perch__loop_recv_ended(s, -err);
		return;
	}
	if (ev & (EPOLLRDHUP | EPOLLHUP))
		perch__loop_recv_ended(s, 0);
}

static void on_conn_ready(struct ep *e, struct perch__sock *s, uint32_t ev)
{
	if (es_of(s)->flags & F_CONNECTING) {
		on_connect_ready(s);
	} else {
		if ((es_of(s)->flags & F_SEND_WAIT) && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			on_writable(s);
		if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
			bool yielded = read_turn(e, s);
			if (!yielded && (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
				on_hangup(s, ev);
		}
	}
	update_interest(e, s); /* the directions still waited on (a no-op when unchanged) */
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
		on_listener_ready(s);
	else
		on_conn_ready(e, s, ev->events);
}

static int epoll_poll(struct perch_loop *loop, int timeout_ms)
{
	struct ep *e = ep_of(loop);
	int done = run_pending(e);
	if (done || e->pend_head)
		timeout_ms = 0; /* completions were reported, or are waiting: do not sleep */
	loop->stats.waits++;
	int n = epoll_wait(e->epfd, e->events, MAX_EVENTS, timeout_ms);
	if (n < 0)
		return errno == EINTR ? done : -errno;
	for (int i = 0; i < n; i++)
		dispatch(loop, &e->events[i]);
	done += run_pending(e);
	/* A re-armed parked connection that took no buffer (a FIN) leaves it to the next one. */
	if (e->parked.head && e->nfree)
		serve_parked(e);
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
