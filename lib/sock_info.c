/* lib/sock_info.c: what a caller may read of a connection's or listener's socket: its fd, addresses and peer's credentials. */
#include "config.h"

#include <errno.h>
#include <sys/socket.h>

#include <perch/sock.h>

#include "atomic.h"
#include "loop_internal.h"

/*
 * A connection's socket fd, or -ENOTSOCK (not a loop's) or -EPIPE (closed:
 * the loop closes the fd soon after, and the number may be reused).
 */
static int open_fd(const struct perch_conn *c)
{
	const struct perch__sock *s = perch__conn_sock(c);
	if (!s)
		return -ENOTSOCK;
	if (perch__load_u32(&c->rx_flags) & PERCH__RX_CLOSED)
		return -EPIPE;
	return s->fd;
}

/*
 * After a syscall on open_fd's number: -EPIPE if the connection closed
 * meanwhile (a close on another thread), since the number may then name
 * another socket; else `rc`. The loop closes the fd only after the flag
 * is set, so a clear flag here proves the answer was this socket's.
 */
static int still_open(const struct perch_conn *c, int rc)
{
	return perch__load_u32(&c->rx_flags) & PERCH__RX_CLOSED ? -EPIPE : rc;
}

int perch_conn_peer_cred(const struct perch_conn *c, struct perch_peer_cred *out)
{
	if (!c || !out)
		return -EINVAL;
	int fd = open_fd(c);
	if (fd < 0)
		return fd;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
		return still_open(c, -errno);
	if (ss.ss_family != AF_UNIX)
		return still_open(c, -ENOPROTOOPT);
	struct ucred uc;
	socklen_t ulen = sizeof(uc);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ulen) != 0)
		return still_open(c, -errno);
	int rc = still_open(c, 0);
	if (rc == 0)
		*out = (struct perch_peer_cred){ .pid = uc.pid, .uid = uc.uid, .gid = uc.gid };
	return rc;
}

int perch_conn_fd(const struct perch_conn *c)
{
	return c ? open_fd(c) : -EINVAL;
}

/* getsockname or getpeername of a connection's socket into *ss, *len. */
static int conn_addr(const struct perch_conn *c, struct sockaddr_storage *ss, socklen_t *len,
		     int (*get)(int, struct sockaddr *, socklen_t *))
{
	if (!c || !ss || !len)
		return -EINVAL;
	int fd = open_fd(c);
	if (fd < 0)
		return fd;
	struct sockaddr_storage got;
	socklen_t got_len = sizeof(got);
	int rc = still_open(c, get(fd, (struct sockaddr *)&got, &got_len) == 0 ? 0 : -errno);
	if (rc == 0) {
		*ss = got;
		*len = got_len;
	}
	return rc;
}

int perch_conn_local_addr(const struct perch_conn *c, struct sockaddr_storage *ss, socklen_t *len)
{
	return conn_addr(c, ss, len, getsockname);
}

int perch_conn_peer_addr(const struct perch_conn *c, struct sockaddr_storage *ss, socklen_t *len)
{
	return conn_addr(c, ss, len, getpeername);
}

int perch_listener_addr(const struct perch_listener *l, struct sockaddr_storage *ss, socklen_t *len)
{
	if (!l || !ss || !len)
		return -EINVAL;
	/* A queued insert that failed closed the fd (doc/loop.md, "A listen out of memory"). */
	const struct perch__listening *lx = perch__lx(&l->sk);
	if (perch__load_u32(&lx->dropped))
		return -EBADF;
	*ss = lx->addr;
	*len = lx->addr_len;
	return 0;
}
