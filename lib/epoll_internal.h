/* lib/epoll_internal.h: the epoll backend's own state and what its three files share (epoll.c, epoll_interest.c, epoll_ready.c). */
#ifndef PERCH_LIB_EPOLL_INTERNAL_H
#define PERCH_LIB_EPOLL_INTERNAL_H

#include <sys/epoll.h>

#include "backend.h"
#include "invariant.h"
#include "pool_trim.h"

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
#define P_FAILED    8u   /* the kernel refused its interest: the connection fails with esock.refused */

/* This backend's state for one socket, kept after the loop's (perch__sock_be). */
struct esock {
	uint16_t flags;              /* F_* */
	uint16_t pend;               /* P_*: completions to report at the end of the turn */
	uint32_t events;             /* the interest the kernel has for the fd */
	int res;                     /* the pending connect's or send's result */
	int refused;                 /* the -errno of a refused epoll_ctl (F_REFUSED) */
	struct perch__sock *pend_next;
};

static inline struct esock *es_of(struct perch__sock *s)
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
	struct perch__pool_trim trim; /* the free stack's cold bottom gives its pages back */
	struct perch__sock *pend_head, *pend_tail; /* sockets with esock.pend set, in order */
	struct epoll_event events[MAX_EVENTS];
};

static inline struct ep *ep_of(struct perch_loop *loop)
{
	return loop->be_state;
}

/* ================= interest: a direction only while someone waits on it ================= */

/* Whether the connection reads now: recv wanted (not paused, ended, closing) and not parked. */
static inline bool reading(const struct perch__sock *s)
{
	return perch__loop_recv_wanted(s) && !s->parked;
}

static inline struct perch__rxseg *perch__epoll_buf_take(struct ep *e)
{
	if (!e->nfree)
		return NULL;
	struct perch__rxseg *rs = &e->segs[e->free_ids[--e->nfree]];
	perch__pool_trim_popped(&e->trim, e->nfree);
	return rs;
}

static inline void perch__epoll_buf_put(struct ep *e, struct perch__rxseg *rs)
{
	e->free_ids[e->nfree++] = rs->seg.buf_id;
	perch__pool_trim_pushed(&e->trim, e->nfree);
}

/* ---- interest (lib/epoll_interest.c) ---- */

/* The interest a socket has now, told to the kernel: 0 or its -errno (nothing changed then). */
int perch__epoll_set_interest(struct ep *e, struct perch__sock *s);
/* The same for a connection, which fails with the errno when the kernel refuses. */
void perch__epoll_update_interest(struct ep *e, struct perch__sock *s);
/* A yielded turn: re-polls the fd so its next turn comes after the batch's others. */
void perch__epoll_rearm(struct ep *e, struct perch__sock *s);
/* Takes the socket off epoll. */
void perch__epoll_remove_interest(struct ep *e, struct perch__sock *s);

/* ---- lib/epoll.c ---- */

/* Reports `what` (P_*) for s at the end of the turn. */
void perch__epoll_pend(struct ep *e, struct perch__sock *s, uint32_t what);
/* No free buffer: s waits on the park list, EPOLLIN off. */
void perch__epoll_park(struct ep *e, struct perch__sock *s);

/* ---- readiness (lib/epoll_ready.c) ---- */

/* One sendmsg of what is left: bytes taken or -errno (-EAGAIN: the socket is full). */
int perch__epoll_try_send(struct perch__sock *s);
void perch__epoll_on_listener_ready(struct perch__sock *ls);
void perch__epoll_on_conn_ready(struct ep *e, struct perch__sock *s, uint32_t ev);

#endif /* PERCH_LIB_EPOLL_INTERNAL_H */
