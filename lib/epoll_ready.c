/* lib/epoll_ready.c: readiness, turned into the loop's calls: accepts, a connect's end, room to send, and reads bounded per turn. */
#include "config.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "epoll_internal.h"

/*
 * One sendmsg of what is left: bytes taken or -errno (-EAGAIN: the socket
 * is full). Its iovecs are this call's: the kernel has read them when
 * sendmsg returns, so no socket carries them.
 */
int perch__epoll_try_send(struct perch__sock *s)
{
	struct iovec iov[PERCH__TX_IOV];
	struct msghdr msg = { .msg_iov = iov };
	msg.msg_iovlen = (size_t)perch__loop_tx_iov(s, iov, PERCH__TX_IOV);
	ssize_t r;
	do
		r = sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : (int)r;
}

void perch__epoll_on_listener_ready(struct perch__sock *ls)
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
	int r = perch__epoll_try_send(s);
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
	while (reading(s) && !perch_conn_is_closed(perch__sock_conn(s))) {
		if (got >= e->budget) {
			loop->stats.read_yields++;
			perch__epoll_rearm(e, s);
			yielded = true;
			break;
		}
		struct perch__rxseg *rs = perch__epoll_buf_take(e);
		if (!rs) {
			perch__epoll_park(e, s);
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
		perch__epoll_buf_put(e, rs);
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
	if (!reading(s) || perch_conn_is_closed(perch__sock_conn(s)))
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

/* Parked for a buffer, its peer hung up: it receives into memory of its own, and the end. */
static void on_parked_hangup(struct ep *e, struct perch__sock *s)
{
	perch__loop_recv_own(s);
	if (!perch__loop_recv_wanted(s))
		perch__unpark(s);
}

void perch__epoll_on_conn_ready(struct ep *e, struct perch__sock *s, uint32_t ev)
{
	if (es_of(s)->flags & F_CONNECTING) {
		on_connect_ready(s);
	} else {
		if ((es_of(s)->flags & F_SEND_WAIT) && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			on_writable(s);
		if (s->parked) {
			if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
				on_parked_hangup(e, s);
		} else if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
			bool yielded = read_turn(e, s);
			if (!yielded && (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
				on_hangup(s, ev);
		}
	}
	perch__epoll_update_interest(e, s); /* the directions still waited on (a no-op when unchanged) */
}
