/* lib/sock.c: the loop's sockets: the table and the park list, addresses, creating and closing, and the conn core's transport ops. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "invariant.h"
#include "loop_internal.h"

static const struct perch__transport_ops loop_conn_ops;
static void run_posted(struct perch_loop *loop, struct perch__msg *m);

/* ================= socket table (loop thread) ================= */

#define GEN_MASK 0xffffffu         /* generations fit the backend's 24-bit tag */

static int table_grow(struct perch_loop *loop)
{
	uint32_t cap = loop->cap ? loop->cap * 2 : 64;
	struct perch__sock **table = realloc(loop->table, cap * sizeof(*table));
	if (!table)
		return -ENOMEM;
	loop->table = table;
	uint32_t *gens = realloc(loop->gens, cap * sizeof(*gens));
	if (!gens)
		return -ENOMEM;
	loop->gens = gens;
	uint32_t *free_slots = realloc(loop->free_slots, cap * sizeof(*free_slots));
	if (!free_slots)
		return -ENOMEM;
	loop->free_slots = free_slots;
	uint32_t *park_next = realloc(loop->park_next, cap * sizeof(*park_next));
	if (!park_next)
		return -ENOMEM;
	loop->park_next = park_next;
	if (loop->connecting) {
		struct perch__connecting **connecting = realloc(loop->connecting, cap * sizeof(*connecting));
		if (!connecting)
			return -ENOMEM;
		loop->connecting = connecting;
	}
	/* Pushed high to low so the lowest slots are used first. */
	for (uint32_t i = cap; i > loop->cap; i--) {
		table[i - 1] = NULL;
		gens[i - 1] = 0;
		free_slots[loop->nfree++] = i - 1;
	}
	loop->cap = cap;
	return 0;
}

int perch__table_insert(struct perch_loop *loop, struct perch__sock *s)
{
	if (loop->nfree == 0 && table_grow(loop) != 0)
		return -ENOMEM;
	uint32_t slot = loop->free_slots[--loop->nfree];
	PERCH_ASSERT(!s->in_table && loop->table[slot] == NULL);
	loop->table[slot] = s;
	if (loop->connecting)
		loop->connecting[slot] = NULL; /* what a connect kept here is its own only while it holds the slot */
	s->slot = slot;
	s->gen = loop->gens[slot];
	s->in_table = true;
	loop->live++;
	return 0;
}

static void table_remove(struct perch_loop *loop, struct perch__sock *s)
{
	/* The slot holds this socket at the generation it was given. */
	PERCH_ASSERT(s->in_table && loop->table[s->slot] == s && loop->gens[s->slot] == s->gen);
	PERCH_ASSERT(loop->live > 0);
	PERCH_ASSERT(!s->parked); /* its link is the slot's */
	loop->table[s->slot] = NULL;
	/* Completions and releases still tagged with the old generation are dropped. */
	loop->gens[s->slot] = (loop->gens[s->slot] + 1) & GEN_MASK;
	loop->free_slots[loop->nfree++] = s->slot;
	loop->live--;
	s->in_table = false;
}

struct perch__sock *perch__loop_sock(struct perch_loop *loop, uint32_t slot, uint32_t gen)
{
	return perch__table_lookup(loop, slot, gen);
}

void perch__park(struct perch__sock *s)
{
	struct perch_loop *loop = s->loop;
	PERCH_ASSERT(!s->parked && s->in_table);
	s->parked = true;
	loop->park_next[s->slot] = PERCH__PARK_NONE;
	if (loop->park_tail != PERCH__PARK_NONE)
		loop->park_next[loop->park_tail] = s->slot;
	else
		loop->park_head = s->slot;
	loop->park_tail = s->slot;
}

bool perch__unpark(struct perch__sock *s)
{
	if (!s->parked)
		return false;
	struct perch_loop *loop = s->loop;
	uint32_t *pp = &loop->park_head, prev = PERCH__PARK_NONE;
	while (*pp != s->slot) {
		PERCH_ASSERT(*pp != PERCH__PARK_NONE); /* a parked socket is on the list */
		prev = *pp;
		pp = &loop->park_next[prev];
	}
	*pp = loop->park_next[s->slot];
	if (loop->park_tail == s->slot)
		loop->park_tail = prev;
	s->parked = false;
	return true;
}

/* ================= sockets: addresses, creation ================= */

/* Numeric host + port -> sockaddr. Returns 0 or -EINVAL. */
int perch__addr_parse(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len)
{
	if (!host || port < 0 || port > 65535)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)port);
		*len = sizeof(*in4);
		return 0;
	}
	if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
		return 0;
	}
	return -EINVAL;
}

struct perch__sock *perch__conn_sock_new(struct perch_loop *loop, int fd, sa_family_t family,
					 const struct perch_conn_opts *opts, struct perch__sock_opts *shared)
{
	/* One block for the connection and its socket: the socket lives exactly as long. */
	struct perch_conn *c = perch__conn_new_with(&loop_conn_ops, sizeof(struct perch__sock) + loop->be->sock_size);
	if (!c)
		return NULL;
	struct perch__sock *s = c->transport;
	s->loop = loop;
	s->kind = PERCH__SOCK_CONN;
	PERCH_ASSERT(perch__sock_conn(s) == c);
	s->opts = perch__sock_opts_for(loop, opts, shared);
	if (!s->opts) {
		perch__conn_unref(c);
		return NULL;
	}
	s->fd = fd;
	s->family = (uint8_t)family;
	s->msg.run = run_posted; /* set once: a poster never writes the message a run may be reading */
	s->recv_mode = (uint8_t)opts->recv_mode;
	s->nagle = opts->nagle;
	/* A waiting tail up to a quarter of a receive buffer gives its pool buffers back (conn_read.c). */
	c->compact_max = loop->opts.buf_size / 4;
	return s;
}

void perch__listener_free(struct perch__sock *ls)
{
	PERCH_ASSERT(ls->kind == PERCH__SOCK_LISTENER);
	perch__sock_opts_unref(ls->opts);
	free(ls);
}

struct perch__sock *perch__conn_sock(const struct perch_conn *c)
{
	return c && c->ops == &loop_conn_ops ? c->transport : NULL;
}

/*
 * TCP_NODELAY unless the connection asked to keep Nagle's algorithm
 * (perch_conn_opts.nagle). A failure is ignored: it can only come from a
 * socket that is not TCP, and the connection works either way.
 */
void perch__sock_set_nodelay(const struct perch__sock *s)
{
	int one = 1;
	if (!s->nagle)
		setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ================= closing ================= */

/* Takes a listener off loop->dropped, if it was never inserted. */
static void undrop(struct perch_loop *loop, struct perch__sock *ls)
{
	for (struct perch__sock **p = &loop->dropped; *p; p = &(perch__lx(*p))->dropped_next) {
		if (*p == ls) {
			*p = perch__lx(ls)->dropped_next;
			return;
		}
	}
}

void perch__sock_start_close(struct perch__sock *s)
{
	if (s->closing)
		return;
	s->closing = true;
	if (s->in_table) {
		s->loop->be->close(s);
		return;
	}
	/* Its posted insert has not run yet, and frees it when it does (its message is still queued). */
	if (s->kind == PERCH__SOCK_LISTENER && perch__lx(s)->listen_pending)
		return;
	/* Never reached the backend: nothing in flight (a listener dropped for want of memory has no fd). */
	if (s->fd >= 0)
		close(s->fd);
	if (s->kind == PERCH__SOCK_LISTENER) {
		undrop(s->loop, s);
		perch__listener_free(s);
	}
}

void perch__loop_abandon_all(struct perch_loop *loop, void (*settle)(struct perch__sock *s))
{
	/*
	 * All closing first, and none parked: finalizing one resumes paused
	 * listeners and serves parked connections, which must not start work
	 * on a backend that is gone (a free off the owner's thread never
	 * closed them), and a parked one's link is its slot's, going too.
	 */
	for (uint32_t i = 0; i < loop->cap; i++)
		if (loop->table[i]) {
			loop->table[i]->closing = true;
			loop->table[i]->parked = false;
		}
	loop->park_head = loop->park_tail = PERCH__PARK_NONE;
	for (uint32_t i = 0; i < loop->cap; i++) {
		struct perch__sock *s = loop->table[i];
		if (!s)
			continue;
		if (settle)
			settle(s);
		if (s->kind == PERCH__SOCK_CONN && s->tx_chain)
			perch__loop_sent(s, -ECANCELED); /* a send the kernel never finished */
		if (perch__sock_connecting(s))
			perch__loop_connected(s, -ECANCELED);
		close(s->fd);
		perch__loop_sock_closed(s);
	}
}

void perch__loop_sock_closed(struct perch__sock *s)
{
	PERCH_ASSERT(s->closing); /* a backend finalizes only what the loop closed */
	struct perch__connecting *cx = perch__sock_cx(s);
	if (cx) {
		/* Answered with a failure (or never): nothing of the kernel's reads its address now. */
		perch__timer_disarm(&cx->connect_timer);
		free(cx); /* the slot's next socket finds none: perch__table_insert */
	}
	table_remove(s->loop, s);
	/*
	 * Its fd is closed: a listener paused for want of one may have it. This
	 * also empties the paused list before a closing listener is freed below
	 * (resume skips it): a paused listener is in the table, so this is the
	 * only place it is freed.
	 */
	if (s->loop->accept_paused)
		perch__accept_resume(s->loop);
	if (s->kind == PERCH__SOCK_LISTENER) {
		perch__listener_free(s);
		return;
	}
	/* The loop's reference: the last one frees the socket, with its conn's block. */
	perch__conn_unref(perch__sock_conn(s));
}

/* ================= the conn core's transport ops ================= */

/* A close whose fd goes with a reset: SO_LINGER 0 makes the kernel's last release send an RST. */
static void start_abort(struct perch__sock *s)
{
	if (!s->closing) {
		struct linger now = { .l_onoff = 1, .l_linger = 0 };
		setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
	}
	perch__sock_start_close(s);
}

/*
 * On the loop thread only, where the fd cannot be closed under the call:
 * a socket already closing keeps its close's cancel. An error (the peer
 * reset) is the reader's to see, from its receive.
 */
static void shutdown_write(struct perch__sock *s)
{
	if (!s->closing)
		shutdown(s->fd, SHUT_WR);
}

/* A connection socket's calls from other threads, run on its loop: see PERCH__POSTED_SEND. */
static void run_posted(struct perch_loop *loop, struct perch__msg *m)
{
	struct perch__sock *s = perch__container_of(m, struct perch__sock, msg);
	struct perch_conn *c = perch__sock_conn(s);
	uint8_t calls = perch__fand_u8(&s->posted, (uint8_t)~PERCH__POSTED) & PERCH__POSTED;
	PERCH_ASSERT(calls != 0); /* the message is pushed only with a call for it */
	if (calls & (calls - 1))
		loop->stats.posted_together++; /* one rode the message another pushed: the race suite counts it */
	if (calls & PERCH__POSTED_SEND)
		perch__send_start(s, c, s->posted_chain);
	if (calls & PERCH__POSTED_SHUTDOWN)
		shutdown_write(s);
	if (calls & PERCH__POSTED_CLOSE)
		perch__sock_start_close(s);
	if (calls & PERCH__POSTED_ABORT)
		start_abort(s);
	/* Each call but the send (whose reference is the core's) took one to keep s while it waited. */
	unsigned held = calls & ~PERCH__POSTED_SEND;
	if (held && (perch__load_u8(&s->posted) & PERCH__POSTED))
		loop->stats.posted_during_run++; /* a call landed while these ran: the race suite counts it */
	for (; held; held &= held - 1)
		perch__conn_unref(c);
}

void perch__sock_post(struct perch__sock *s, uint8_t call)
{
	uint8_t was = perch__for_u8(&s->posted, call);
	PERCH_ASSERT(!(was & call)); /* each call at most once at a time */
	/* The first call since the message last ran pushes it; the others ride it. */
	if (!(was & PERCH__POSTED))
		perch__inbox_push(s->loop, &s->msg);
}

/*
 * Runs a connection's call on its loop thread: at once when already there,
 * else posted. The caller holds a reference only for the call; the one
 * taken here keeps s alive while the call waits, and run_posted drops it.
 */
static void call_on_loop(struct perch__sock *s, uint8_t posted, void (*call)(struct perch__sock *s))
{
	if (perch__loop_is_current(s->loop)) {
		call(s);
		return;
	}
	perch__conn_ref(perch__sock_conn(s));
	perch__sock_post(s, posted);
}

static void op_close(struct perch_conn *c)
{
	call_on_loop(c->transport, PERCH__POSTED_CLOSE, perch__sock_start_close);
}

/* The core calls close or abort once per connection. */
static void op_abort(struct perch_conn *c)
{
	call_on_loop(c->transport, PERCH__POSTED_ABORT, start_abort);
}

/* The core calls it once per connection, with no send in flight: nothing is queued before the FIN. */
static void op_shutdown(struct perch_conn *c)
{
	call_on_loop(c->transport, PERCH__POSTED_SHUTDOWN, shutdown_write);
}

static void op_destroy(struct perch_conn *c)
{
	struct perch__sock *s = c->transport;
	perch__sock_opts_unref(s->opts); /* the socket goes with the conn's block */
}

static const struct perch__transport_ops loop_conn_ops = {
	.send = perch__op_send,
	.release_seg = perch__op_release_seg,
	.tail_seg = perch__op_tail_seg,
	.close = op_close,
	.abort = op_abort,
	.shutdown = op_shutdown,
	.destroy = op_destroy,
	.txbuf_get = perch__op_txbuf_get,
	.txbuf_put = perch__op_txbuf_put,
};
