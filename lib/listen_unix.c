/* lib/listen_unix.c: listening on a Unix domain socket: the name bound, its file's mode, a stale file replaced on request. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <perch/sock.h>

#include "loop_internal.h"

/*
 * Whether the file at the path is a socket no one listens on: unix(7)
 * says a connect to it is refused (ECONNREFUSED) then. Anything else (it
 * answered, its backlog is full, no permission, not a socket) keeps it.
 */
static bool socket_file_is_stale(const struct sockaddr_storage *ss, socklen_t len)
{
	const char *path = ((const struct sockaddr_un *)ss)->sun_path;
	struct stat st;
	if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode))
		return false;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return false;
	bool stale = connect(fd, (const struct sockaddr *)ss, len) != 0 && errno == ECONNREFUSED;
	close(fd);
	return stale;
}

/* bind, once more after removing a stale socket file when lo->unlink_stale says so. 0 or -errno. */
static int bind_name(int fd, const struct sockaddr_storage *ss, socklen_t len, bool abstract,
		     const struct perch_listen_opts *lo)
{
	if (bind(fd, (const struct sockaddr *)ss, len) == 0)
		return 0;
	int err = -errno;
	if (err != -EADDRINUSE || abstract || !lo->unlink_stale || !socket_file_is_stale(ss, len))
		return err;
	/* Another server may have removed it first (ENOENT): the bind decides. */
	if (unlink(((const struct sockaddr_un *)ss)->sun_path) != 0 && errno != ENOENT)
		return -errno;
	return bind(fd, (const struct sockaddr *)ss, len) == 0 ? 0 : -errno;
}

#define LOCK_TRIES 500       /* the directory's lock: about half a second, */
#define LOCK_RETRY_US 1000   /* a try each millisecond */

/*
 * Starters on a path hold their directory's flock(2) from the bind (and
 * a stale file's probe) until listen(2): between one's bind and its
 * listen, its new file refuses connects too, and another's probe would
 * find it stale and remove it. Returns the locked directory's fd (closing
 * it unlocks), -EAGAIN when it stays held, or open's -errno.
 */
static int lock_directory_of(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *slash = strrchr(path, '/');
	size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
	if (n == 0)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)n, path);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	/* Held for a bind and a listen: a wait past the bound means a holder that never lets go (a forked child). */
	for (int tries = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; tries++) {
		int err = errno;
		if ((err != EWOULDBLOCK && err != EINTR) || tries == LOCK_TRIES) {
			close(fd);
			return err == EWOULDBLOCK ? -EAGAIN : -err;
		}
		usleep(LOCK_RETRY_US);
	}
	return fd;
}

/*
 * The mode of the socket file just bound, set through an O_PATH handle
 * (and /proc): whoever can write the directory may have put a symlink in
 * its place since, and chmod(2) would follow it. -ENOTSOCK for a file
 * there that is no socket (a symlink is opened as itself); chmod's -errno.
 */
static int set_socket_file_mode(const char *path, mode_t mode)
{
	int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	char self[32];
	int rc = fstat(fd, &st) != 0 ? -errno : !S_ISSOCK(st.st_mode) ? -ENOTSOCK : 0;
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	if (rc == 0 && chmod(self, mode) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Bound, its mode set, listening: 0 or -errno (its file removed then). */
static int bind_and_listen(int fd, const struct sockaddr_storage *ss, socklen_t len, bool abstract,
			   const struct perch_listen_opts *lo)
{
	const char *path = ((const struct sockaddr_un *)ss)->sun_path;
	int err = bind_name(fd, ss, len, abstract, lo);
	if (err != 0)
		return err;
	if (lo->mode)
		err = set_socket_file_mode(path, lo->mode);
	if (err == 0 && listen(fd, lo->backlog) != 0)
		err = -errno;
	if (err != 0 && !abstract)
		unlink(path); /* bound here, so ours: a failed listen leaves no file behind */
	return err;
}

/* A listening Unix socket, its file's mode set before listen(2) lets a connect in. */
static int unix_listen_socket(const struct sockaddr_storage *ss, socklen_t len, bool abstract,
			      const struct perch_listen_opts *lo)
{
	/* A starter that will not remove a file takes the lock if it can: only the removers need it. */
	int lock = abstract ? -1 : lock_directory_of(((const struct sockaddr_un *)ss)->sun_path);
	if (lock < 0 && !abstract && lo->unlink_stale)
		return lock;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int err = fd < 0 ? -errno : bind_and_listen(fd, ss, len, abstract, lo);
	if (lock >= 0)
		close(lock);
	if (err != 0) {
		if (fd >= 0)
			close(fd);
		return err;
	}
	return fd;
}

int perch_listen_unix(struct perch_loop *loop, const char *name,
		      const struct perch_listen_opts *lopts, const struct perch_conn_opts *opts,
		      perch_accept_fn on_accept, void *arg, struct perch_listener **out)
{
	struct sockaddr_storage ss;
	socklen_t len;
	bool abstract;
	struct perch_conn_opts o;
	struct perch_listen_opts lo;
	if (!loop || !on_accept || !out || perch__conn_opts_resolve(opts, &o) != 0 ||
	    perch__listen_opts_resolve(lopts, &lo) != 0)
		return -EINVAL;
	int rc = perch__unix_addr_parse(name, &ss, &len, &abstract);
	if (rc != 0)
		return rc;
	if (abstract && lo.mode)
		return -EINVAL;
	int fd = unix_listen_socket(&ss, len, abstract, &lo);
	if (fd < 0)
		return fd;
	rc = perch__listener_start(loop, fd, &o, on_accept, arg, out);
	if (rc != 0) {
		if (!abstract)
			unlink(((struct sockaddr_un *)&ss)->sun_path);
		close(fd);
	}
	return rc;
}
