/* lib/epoll_interest.c: what the kernel is told to wait for: a direction only while someone waits on it, and the one outcome of a refusal. */
#include "config.h"

#include <errno.h>
#include <sys/epoll.h>

#include "epoll_internal.h"

/*
 * Edge-triggered: a ready event is reported once, so no direction can turn
 * into a storm; EPOLLIN is held only while the connection reads (EPOLLRDHUP
 * also while it waits for a buffer), EPOLLOUT only while a connect or a
 * blocked send waits.
 */
static uint32_t interest(struct perch__sock *s)
{
	if (s->kind == PERCH__SOCK_LISTENER) /* level-triggered: a batch of accepts per turn, the rest next turn */
		return perch__lx(s)->accept_paused ? 0 : EPOLLIN;
	uint32_t ev = EPOLLET;
	if (es_of(s)->flags & F_CONNECTING)
		return ev | EPOLLOUT;
	if (reading(s))
		ev |= EPOLLIN | EPOLLRDHUP;
	else if (s->parked && perch__loop_recv_wanted(s))
		ev |= EPOLLRDHUP; /* waiting for a buffer, it still hears its peer hang up */
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
int perch__epoll_set_interest(struct ep *e, struct perch__sock *s)
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


/*
 * The kernel refused a connection's interest (ENOMEM, ENOSPC, ...): it
 * could no longer be told when to read or write, so it fails with that
 * errno, reported at the end of the turn (never from inside the call that
 * asked, which may be the caller's own flush), once to each waiter: a
 * connect, or a send waiting for EPOLLOUT, completes with it; then the
 * connection fails, its reader seeing the error after the bytes already
 * queued. The close that follows takes it off epoll.
 */
static void conn_refused(struct ep *e, struct perch__sock *s, int err)
{
	struct esock *es = es_of(s);
	es->flags |= F_REFUSED;
	es->refused = err;
	if (es->flags & F_CONNECTING) {
		/* Not connected yet: the callback gets the error, nobody reads. */
		es->flags &= ~F_CONNECTING;
		es->res = err;
		perch__epoll_pend(e, s, P_CONNECTED);
		return;
	}
	if (es->flags & F_SEND_WAIT) {
		es->flags &= ~F_SEND_WAIT;
		es->res = err; /* no other send result is pending while one waits */
		perch__epoll_pend(e, s, P_SENT);
	}
	s->rx_ended = true; /* no more reading this turn (nor a FIN reported before the failure) */
	perch__epoll_pend(e, s, P_FAILED);
}

/* The interest a connection has now, or its failure when the kernel refuses it. */
void perch__epoll_update_interest(struct ep *e, struct perch__sock *s)
{
	int rc = perch__epoll_set_interest(e, s);
	if (rc != 0)
		conn_refused(e, s, rc);
}

/*
 * A yielded turn: MOD with the socket's own interest (EPOLLOUT kept when a
 * send waits), which re-polls the fd and queues it again behind the
 * events already ready, so its next turn comes after theirs.
 */
void perch__epoll_rearm(struct ep *e, struct perch__sock *s)
{
	if (es_of(s)->flags & F_REFUSED)
		return; /* failed already: no ctl until its close */
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
void perch__epoll_remove_interest(struct ep *e, struct perch__sock *s)
{
	struct esock *es = es_of(s);
	if (!(es->flags & F_ADDED))
		return;
	if (epoll_ctl(e->epfd, EPOLL_CTL_DEL, s->fd, NULL) != 0)
		PERCH_ASSERT(errno == ENOENT || errno == EBADF);
	es->flags &= ~F_ADDED;
}
