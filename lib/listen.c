/* lib/listen.c: listeners: listening, accepting, and the accept pause when fds run out (resumed when one is freed). */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <perch/sock.h>

#include "atomic.h"
#include "loop_internal.h"

/* ================= accepting without fds: pause, and resume when one is freed ================= */

/*
 * The failures accept(2) says are one connection's (it went away, or the
 * network said no): the next connection may do. Any other failure (out of
 * fds or memory, or a listening socket gone bad) lasts: retried at once it
 * would spin.
 */
static bool accept_retry_at_once(int err)
{
	switch (-err) {
	case ECONNABORTED: case EPROTO: case EPERM: case EINTR: case ENETDOWN: case ENOPROTOOPT:
	case EHOSTDOWN: case ENONET: case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
		return true;
	default:
		return false;
	}
}

/* A socket closed (an fd is free) or the retry time passed: every paused listener tries again. */
void perch__accept_resume(struct perch_loop *loop)
{
	struct perch__sock *ls = loop->accept_paused;
	loop->accept_paused = NULL;
	perch__timer_disarm(&loop->accept_retry);
	while (ls) {
		struct perch__listening *lx = perch__lx(ls);
		struct perch__sock *next = lx->accept_paused_next;
		lx->accept_paused = false;
		lx->accept_paused_next = NULL;
		if (!ls->closing)
			loop->be->accept(ls);
		ls = next;
	}
}

/* PERCH__ACCEPT_RETRY_MS after the first listener paused and no socket closed meanwhile. */
void perch__accept_retry_due(struct perch_timer *t, void *arg)
{
	perch__accept_resume(arg);
}

static void pause_accepting(struct perch__sock *ls)
{
	struct perch_loop *loop = ls->loop;
	struct perch__listening *lx = perch__lx(ls);
	if (lx->accept_paused)
		return;
	if (!loop->accept_paused)
		perch__timer_arm_at(&loop->accept_retry, perch__now_ms() + PERCH__ACCEPT_RETRY_MS,
				    PERCH__ACCEPT_RETRY_MS);
	lx->accept_paused = true;
	lx->accept_paused_next = loop->accept_paused;
	loop->accept_paused = ls;
	loop->stats.accept_pauses++;
	loop->be->accept_pause(ls);
}

/* ================= accepting ================= */

/* What a log line calls a listener: its address ("127.0.0.1:8080", "unix:/run/x.sock"), or its port. */
static const char *listener_name(const struct perch__sock *ls, char *buf, size_t size)
{
	const struct perch__listening *lx = perch__lx(ls);
	if (perch_addr_format((const struct sockaddr *)&lx->addr, lx->addr_len, buf, size) < 0)
		snprintf(buf, size, "port %d", lx->port);
	return buf;
}

/*
 * At most one line per listener every PERCH__ACCEPT_LOG_MS, with the count
 * since the last: at the fd limit every close lets one accept through and
 * the next fails, and a line each would flood a slow stderr from the loop.
 */
static void accept_failed(struct perch__sock *ls, int err)
{
	struct perch__listening *lx = perch__lx(ls);
	ls->loop->stats.accept_errors++;
	lx->accept_unlogged++;
	bool pause = !accept_retry_at_once(err) && !ls->closing;
	double now = perch__now_ms();
	if (lx->accept_logged_at_ms == 0 || now - lx->accept_logged_at_ms >= PERCH__ACCEPT_LOG_MS) {
		char name[PERCH_ADDR_FORMAT_MAX];
		fprintf(stderr, "perch: accept on %s failed: %s (%u failed since the last line)%s\n",
			listener_name(ls, name, sizeof(name)), strerror(-err), lx->accept_unlogged,
			pause ? "; paused until a socket closes or 100 ms pass" : "");
		lx->accept_logged_at_ms = now;
		lx->accept_unlogged = 0;
	}
	if (pause)
		pause_accepting(ls);
}

void perch__loop_accepted(struct perch__sock *ls, int fd)
{
	if (fd < 0) {
		accept_failed(ls, fd);
		return;
	}
	if (ls->closing) {
		close(fd);
		return;
	}
	struct perch__listening *lx = perch__lx(ls);
	struct perch__sock *s = perch__conn_sock_new(ls->loop, fd, ls->family, &lx->accept_opts, ls->opts);
	if (!s || perch__table_insert(ls->loop, s) != 0) {
		if (s)
			perch_conn_release(perch__sock_conn(s)); /* not in the table yet: closes fd inline */
		else
			close(fd);
		return;
	}
	perch__sock_set_nodelay(s);
	ls->loop->be->recv_arm(s);
	struct perch_conn *c = perch__sock_conn(s);
	perch__conn_ref(c); /* the callback's */
	lx->on_accept((struct perch_listener *)ls, c, lx->accept_arg);
}

/* ================= listening ================= */

/* Puts a listener in the loop's table and starts accepting: 0, -ENOMEM, or -ECANCELED while the loop is freed. */
static int listener_insert(struct perch_loop *loop, struct perch__sock *ls)
{
	/* Run by perch_loop_free's last drain (as connect_start is): nothing would ever close it. */
	if (loop->freeing)
		return -ECANCELED;
	int rc = perch__table_insert(loop, ls);
	if (rc == 0)
		loop->be->accept(ls);
	return rc;
}

/*
 * A listen queued from outside the loop's turns, whose caller already
 * holds the listener. If the insert fails (no room, or the loop is being
 * freed) its socket is closed (nothing would accept on it) and the struct
 * waits on loop->dropped for perch_listener_close or the loop's free.
 */
static void run_posted_listen(struct perch_loop *loop, struct perch__msg *m)
{
	struct perch__listening *lx = perch__container_of(m, struct perch__listening, listen_msg);
	struct perch__sock *ls = lx->s;
	lx->listen_pending = false;
	if (ls->closing) {
		/* Closed inside an earlier turn's callback, before this ran: perch__sock_start_close left it here. */
		close(ls->fd);
		perch__listener_free(ls);
		return;
	}
	int rc = listener_insert(loop, ls);
	if (rc != 0) {
		char name[PERCH_ADDR_FORMAT_MAX];
		fprintf(stderr, "perch: listener on %s dropped: %s\n", listener_name(ls, name, sizeof(name)),
			rc == -ECANCELED ? "the loop is being freed" : "out of memory");
		perch__store_u32(&lx->dropped, 1); /* before the close: perch_listener_addr says -EBADF from here */
		close(ls->fd);
		ls->fd = -1;
		lx->dropped_next = loop->dropped;
		loop->dropped = ls;
	}
}

/* Any thread: the listen options (NULL: defaults) with zero fields resolved; 0 or -EINVAL. */
int perch__listen_opts_resolve(const struct perch_listen_opts *in, struct perch_listen_opts *out)
{
	struct perch_listen_opts o = in ? *in : (struct perch_listen_opts){ 0 };
	if (o.backlog < 0 || o.mode > 07777)
		return -EINVAL;
	if (o.backlog == 0)
		o.backlog = SOMAXCONN;
	*out = o;
	return 0;
}

/*
 * A TCP listening socket. SO_REUSEPORT only when asked: without it on
 * both sides, bind refuses a port another socket listens on (EADDRINUSE),
 * which is what a server started twice must hear.
 */
static int tcp_listen_socket(const struct sockaddr_storage *ss, socklen_t len,
			     const struct perch_listen_opts *lo)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    (lo->reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) ||
	    (ss->ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, lo->backlog) != 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

/*
 * The listener's bound address, its family and port (host order; 0 for a
 * Unix socket), read once here: perch_listener_addr answers from the copy
 * on any thread, never touching an fd the loop may be closing.
 */
static int bound_address(int fd, struct perch__sock *ls)
{
	struct perch__listening *lx = perch__lx(ls);
	lx->addr_len = sizeof(lx->addr);
	if (getsockname(fd, (struct sockaddr *)&lx->addr, &lx->addr_len) != 0)
		return -errno;
	const struct sockaddr_storage *a = &lx->addr;
	ls->family = (uint8_t)a->ss_family;
	lx->port = a->ss_family == AF_INET    ? ntohs(((const struct sockaddr_in *)a)->sin_port)
		   : a->ss_family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)a)->sin6_port)
					      : 0;
	return 0;
}

int perch__listener_start(struct perch_loop *loop, int fd, const struct perch_conn_opts *o,
			  perch_accept_fn on_accept, void *arg, struct perch_listener **out)
{
	/* Its own fields after its backend state (perch__lx), in the one block its free releases. */
	struct perch_listener *l = calloc(1, perch__lx_offset(loop) + sizeof(struct perch__listening));
	if (!l)
		return -ENOMEM;
	struct perch__sock *ls = &l->sk;
	ls->loop = loop;
	ls->kind = PERCH__SOCK_LISTENER;
	struct perch__listening *lx = perch__lx(ls);
	lx->s = ls;
	int rc = bound_address(fd, ls);
	if (rc != 0) {
		free(l);
		return rc;
	}
	ls->fd = fd;
	lx->on_accept = on_accept;
	lx->accept_arg = arg;
	lx->accept_opts = *o;
	ls->opts = perch__sock_opts_new(loop, o);
	if (!ls->opts) {
		free(l);
		return -ENOMEM;
	}
	if (perch__loop_is_current(loop)) {
		rc = listener_insert(loop, ls);
		if (rc != 0) {
			perch__listener_free(ls);
			return rc;
		}
		*out = l;
		return 0;
	}
	/* Marked before *out is: a loop thread that sees l (through the caller's own handoff) sees it pending. */
	lx->listen_pending = true;
	lx->listen_msg.run = run_posted_listen;
	*out = l;
	perch__inbox_push(loop, &lx->listen_msg);
	return 0;
}

int perch_listen_tcp(struct perch_loop *loop, const char *host, int port,
		     const struct perch_listen_opts *lopts, const struct perch_conn_opts *opts,
		     perch_accept_fn on_accept, void *arg, struct perch_listener **out)
{
	struct sockaddr_storage ss;
	socklen_t len;
	struct perch_conn_opts o;
	struct perch_listen_opts lo;
	if (!loop || !on_accept || !out || perch__addr_parse(host, port, &ss, &len) != 0 ||
	    perch__conn_opts_resolve(opts, &o) != 0 || perch__listen_opts_resolve(lopts, &lo) != 0)
		return -EINVAL;
	int fd = tcp_listen_socket(&ss, len, &lo);
	if (fd < 0)
		return fd;
	int rc = perch__listener_start(loop, fd, &o, on_accept, arg, out);
	if (rc != 0)
		close(fd);
	return rc;
}

int perch_listen(struct perch_loop *loop, const char *host, int port,
		 const struct perch_conn_opts *opts, perch_accept_fn on_accept, void *arg,
		 struct perch_listener **out)
{
	return perch_listen_tcp(loop, host, port, NULL, opts, on_accept, arg, out);
}

int perch_listener_port(const struct perch_listener *l)
{
	return l ? perch__lx(&l->sk)->port : -EINVAL;
}

static void run_posted_listener_close(struct perch_loop *loop, struct perch__msg *m)
{
	perch__sock_start_close(perch__container_of(m, struct perch__listening, close_msg)->s);
}

int perch_listener_close(struct perch_listener *l)
{
	if (!l)
		return -EINVAL;
	struct perch__sock *ls = &l->sk;
	if (perch__loop_is_current(ls->loop)) {
		perch__sock_start_close(ls);
		return 0;
	}
	struct perch__listening *lx = perch__lx(ls);
	lx->close_msg.run = run_posted_listener_close;
	perch__inbox_push(ls->loop, &lx->close_msg);
	return 0;
}

