/* lib/adopt.c: sockets made elsewhere (a socketpair end, an fd from a parent process or a service manager) taken into a loop. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <perch/sock.h>

#include "loop_internal.h"

/*
 * Whether fd is a stream socket of a family the loop serves, listening
 * or not as `listening` says. Each way it is not has its own errno:
 * -EBADF (not open), -ENOTSOCK, -EPROTOTYPE (not a stream), -EAFNOSUPPORT,
 * -EINVAL (listening when a connection was asked for, or the reverse),
 * -ENOTCONN (a connection that is not connected). Reads only.
 */
static int stream_socket_check(int fd, bool listening, sa_family_t *family)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return -errno;
	if (!S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
	int type = 0, acceptconn = 0;
	socklen_t len = sizeof(type);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
		return -errno;
	if (type != SOCK_STREAM)
		return -EPROTOTYPE;
	struct sockaddr_storage ss;
	socklen_t slen = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &slen) != 0)
		return -errno;
	if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6 && ss.ss_family != AF_UNIX)
		return -EAFNOSUPPORT;
	len = sizeof(acceptconn);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acceptconn, &len) != 0)
		return -errno;
	if ((acceptconn != 0) != listening)
		return -EINVAL;
	slen = sizeof(ss);
	if (!listening && getpeername(fd, (struct sockaddr *)&ss, &slen) != 0)
		return -errno; /* ENOTCONN */
	*family = ss.ss_family;
	return 0;
}

/*
 * epoll reads, writes and accepts until EAGAIN (io_uring does not mind):
 * an adopted fd is made non-blocking. Its flags before go in *was, to be
 * put back if the adoption fails after all.
 */
static int set_nonblocking(int fd, int *was)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0))
		return -errno;
	*was = fl;
	return 0;
}

/*
 * The caller's flags again, after a failed adoption. F_SETFL on an fd
 * fstat just accepted fails only if another thread closed it meanwhile,
 * and then there is nothing left to restore: the adoption's own error is
 * the one reported.
 */
static void restore_flags(int fd, int was)
{
	int rc = fcntl(fd, F_SETFL, was);
	(void)rc;
}

/* Checks fd as stream_socket_check does, then makes it non-blocking. */
static int adoptable(int fd, bool listening, sa_family_t *family, int *was)
{
	int rc = stream_socket_check(fd, listening, family);
	return rc != 0 ? rc : set_nonblocking(fd, was);
}

int perch_conn_adopt(struct perch_loop *loop, int fd, const struct perch_conn_opts *opts,
		     perch_connect_fn on_adopted, void *arg)
{
	struct perch_conn_opts o;
	sa_family_t family;
	int was = 0;
	if (!loop || fd < 0 || !on_adopted || perch__conn_opts_resolve(opts, &o) != 0)
		return -EINVAL;
	int rc = adoptable(fd, false, &family, &was);
	if (rc != 0)
		return rc;
	struct perch__connecting *cx = perch__connecting_new();
	struct perch__sock *s = cx ? perch__conn_sock_new(loop, fd, family, &o, NULL) : NULL;
	if (!s) {
		free(cx);
		restore_flags(fd, was);
		return -ENOMEM;
	}
	perch__conn_adopted_post(s, cx, on_adopted, arg);
	return 0;
}

int perch_listener_adopt(struct perch_loop *loop, int fd, const struct perch_conn_opts *opts,
			 perch_accept_fn on_accept, void *arg, struct perch_listener **out)
{
	struct perch_conn_opts o;
	sa_family_t family;
	int was = 0;
	if (!loop || fd < 0 || !on_accept || !out || perch__conn_opts_resolve(opts, &o) != 0)
		return -EINVAL;
	int rc = adoptable(fd, true, &family, &was);
	if (rc != 0)
		return rc;
	rc = perch__listener_start(loop, fd, &o, on_accept, arg, out);
	if (rc != 0)
		restore_flags(fd, was);
	return rc;
}
