/* perch/sock.h: sockets beyond TCP host and port: Unix domain stream sockets, adopted fds, socket activation, addresses, the fd and a Unix peer's credentials. */
#ifndef PERCH_SOCK_H
#define PERCH_SOCK_H

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <perch/common.h>
#include <perch/conn.h>
#include <perch/loop.h>
#include <perch/timer.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * ---- Unix domain stream sockets (unix(7)). Any thread. ----
 *
 * A name is a path ("/run/app.sock", at most 107 bytes) or, with a
 * leading '@', a name in Linux's abstract namespace ("@app": no file, gone
 * with its last socket, reachable by any process of the same network
 * namespace, so no permission applies). A connection over a Unix socket
 * behaves as one over TCP (reads, flushes, pipes, backpressure, shutdown,
 * close), with these differences: TCP_NODELAY does not apply
 * (perch_conn_opts.nagle is ignored); io_uring receives single-shot
 * whatever recv_mode says (doc/loop.md, "Unix domain sockets");
 * perch_conn_abort closes without a
 * reset (the kernel has none for Unix sockets: the peer reads the end of
 * the stream, or -ECONNRESET if bytes it had sent were still unread);
 * perch_listener_port says 0.
 */

/*
 * Listens on the Unix socket `name` (see above) with `lopts` (NULL:
 * defaults; backlog, mode and unlink_stale apply, reuseport is ignored).
 * Accepted connections get `opts` and go to on_accept on the loop thread,
 * as perch_listen's. perch_listener_close leaves the socket file in place
 * (removing it could remove a newer server's): remove it yourself, or
 * start the next server with unlink_stale.
 * Returns 0 with *out set (valid until perch_listener_close); -EINVAL for
 * a NULL loop, on_accept or out, a NULL or empty name or a bare "@", bad
 * opts or lopts (a mode above 07777 or for an abstract name);
 * -ENAMETOOLONG for a path longer than 107 bytes or an abstract name
 * of more than 107 after its '@'; -EADDRINUSE when the
 * name is taken (a file at the path, unless stale and unlink_stale said to
 * remove it; an abstract name another socket holds); -EACCES when the
 * directory does not let this process create the file (or, with
 * unlink_stale, read it to lock it); -EAGAIN when, with unlink_stale,
 * the directory's lock stays held; -ENOTSOCK when the file was replaced
 * before its mode was set (perch_listen_opts.mode); bind's,
 * chmod's or listen's other errors (-ENOENT for a missing directory, ...);
 * -ENOMEM.
 * The loop's insert is as perch_listen's (at once inside one of its turns,
 * queued outside them).
 */
PERCH_API int perch_listen_unix(struct perch_loop *loop, const char *name,
				const struct perch_listen_opts *lopts,
				const struct perch_conn_opts *opts, perch_accept_fn on_accept,
				void *arg, struct perch_listener **out);

/*
 * Connects to the Unix socket `name` on `loop`; on_connected runs exactly
 * once on the loop thread, as perch_connect's: the connection, or NULL and
 * the connect's error: -ENOENT (no such file), -ECONNREFUSED (a file with
 * no listener), -EACCES (no write permission on the file), -ETIMEDOUT
 * (opts->connect_timeout_ms), -ECANCELED (the loop freed first), ...
 * A listener whose accept queue is full: io_uring waits for room,
 * epoll reports -EAGAIN at once (a Unix connect cannot wait without
 * blocking the loop). Returns 0 when the connect started; -EINVAL for a
 * NULL loop or on_connected, a NULL or empty name or a bare "@", bad
 * opts; -ENAMETOOLONG; -ENOMEM; socket()'s error.
 */
PERCH_API int perch_connect_unix(struct perch_loop *loop, const char *name,
				 const struct perch_conn_opts *opts, perch_connect_fn on_connected,
				 void *arg);

/* A Unix peer's credentials when it connected (SO_PEERCRED, unix(7)). */
struct perch_peer_cred {
	pid_t pid;
	uid_t uid;
	gid_t gid;
};

/*
 * The credentials of the process at the other end of a Unix connection,
 * as the kernel recorded them at connect (or socketpair) time. Any thread,
 * while the caller holds a reference and has not closed it. Returns 0;
 * -EINVAL for NULL arguments; -ENOTSOCK for a connection that is not over
 * a socket of a loop (an in-memory pipe); -ENOPROTOOPT for one that is not
 * a Unix socket (TCP: no credentials); -EPIPE once closed, on any thread,
 * even by a close racing this call (the answer is given only when it was
 * this connection's, never another socket's that took the fd number).
 */
PERCH_API int perch_conn_peer_cred(const struct perch_conn *c, struct perch_peer_cred *out);

/*
 * ---- Adoption: sockets made elsewhere. Any thread. ----
 *
 * A stream socket (TCP or Unix) connected or listening already: one end
 * of a socketpair(2), an fd a parent process passed, one a service
 * manager passed (perch_listen_fds). On success the fd is perch's: it is
 * made non-blocking (O_NONBLOCK, which a process sharing the open file
 * sees too) and closed with the connection or listener; do not use or
 * close it after. On error it is untouched and still the caller's.
 */

/*
 * Takes the connected stream socket `fd` into `loop` as a connection:
 * on_adopted runs exactly once on the loop thread, at its next turn (never
 * from inside this call), with the connection (the callback owns one
 * reference; receiving has started) and 0, or NULL and -ENOMEM (no room
 * in the loop) or -ECANCELED (the loop freed first); the fd is closed
 * then. `opts` as perch_connect's (connect_timeout_ms is unused).
 * Returns 0; -EINVAL for a NULL loop or on_adopted, a negative fd, bad
 * opts, or a listening socket (adopt it with perch_listener_adopt);
 * -EBADF for an fd that is not open; -ENOTSOCK for one that is not a
 * socket; -EPROTOTYPE for a socket that is not a stream (datagrams);
 * -EAFNOSUPPORT for a family other than IPv4, IPv6 and Unix; -ENOTCONN for
 * a stream socket not connected; -ENOMEM.
 */
PERCH_API int perch_conn_adopt(struct perch_loop *loop, int fd, const struct perch_conn_opts *opts,
			       perch_connect_fn on_adopted, void *arg);

/*
 * Takes the listening stream socket `fd` into `loop` as a listener, as
 * perch_listen returns one (accepted connections get `opts` and go to
 * on_accept on the loop thread). Returns 0 with *out set; -EINVAL for a
 * NULL loop, on_accept or out, a negative fd, bad opts, or a socket that
 * is not listening; -EBADF, -ENOTSOCK, -EPROTOTYPE, -EAFNOSUPPORT as
 * perch_conn_adopt; -ENOMEM; the loop's insert as perch_listen's.
 */
PERCH_API int perch_listener_adopt(struct perch_loop *loop, int fd,
				   const struct perch_conn_opts *opts, perch_accept_fn on_accept,
				   void *arg, struct perch_listener **out);

/* The first fd a service manager passes (sd_listen_fds(3)'s SD_LISTEN_FDS_START). */
#define PERCH_LISTEN_FDS_START 3

/*
 * Socket activation, by the protocol of sd_listen_fds(3) (no libsystemd):
 * a service manager passes n listening sockets as fds
 * PERCH_LISTEN_FDS_START .. PERCH_LISTEN_FDS_START + n - 1 and sets
 * LISTEN_PID (the pid they are meant for), LISTEN_FDS (n) and, optionally,
 * LISTEN_FDNAMES (n names joined by ':'). Returns n, having set
 * FD_CLOEXEC on each (adopt each with perch_listener_adopt, or
 * perch_conn_adopt for a connection passed with Accept=yes); 0 when
 * LISTEN_PID or LISTEN_FDS is not set or LISTEN_PID is another process's
 * (a variable inherited from a parent); -EINVAL when they are not
 * decimal numbers, or LISTEN_FDNAMES has more or fewer names than n;
 * fcntl's error (-EBADF: an fd that is not open); -ENOMEM. With
 * `names` (may be NULL), *names gets a NULL-terminated array of the n
 * names ("unknown" each when LISTEN_FDNAMES is not set; NULL when n <= 0),
 * freed with perch_listen_fds_names_free. With unset_environment the three
 * variables are removed (also on error), so a child process started later
 * does not take the fds for its own. An error after the fds were found
 * (names that do not match, -ENOMEM) leaves them open, FD_CLOEXEC set on
 * each; with unset_environment their count is then gone too, as with
 * sd_listen_fds(3): read the names, or fail, at start-up. Not thread-safe (getenv/unsetenv):
 * call it at start-up, before threads that read the environment.
 */
PERCH_API int perch_listen_fds(bool unset_environment, char ***names);

/* Frees what perch_listen_fds put in *names. NULL is ignored. */
PERCH_API void perch_listen_fds_names_free(char **names);

/*
 * ---- Addresses and the fd. Any thread, while the caller holds a
 * reference to the connection (or the listener is not closed). ----
 */

/*
 * The connection's own address (getsockname) or its peer's (getpeername)
 * into *ss, its size in *len: for TCP the IP address and port; for a Unix
 * socket the name bound (a Unix client that never bound has none: *len
 * covers the family only). Returns 0; -EINVAL for NULL arguments;
 * -ENOTSOCK for a connection that is not a loop's socket; -EPIPE once
 * closed (as perch_conn_peer_cred: a racing close too); getpeername's
 * -ENOTCONN once the peer is gone. *ss and *len are untouched on error.
 */
PERCH_API int perch_conn_local_addr(const struct perch_conn *c, struct sockaddr_storage *ss,
				    socklen_t *len);
PERCH_API int perch_conn_peer_addr(const struct perch_conn *c, struct sockaddr_storage *ss,
				   socklen_t *len);

/*
 * The address the listener is bound to (the port the kernel picked for
 * port 0, the Unix name), read when the listener was made: any thread,
 * until perch_listener_close. Returns 0; -EINVAL for NULL arguments;
 * -EBADF for a listener whose queued insert failed (its socket is closed).
 */
PERCH_API int perch_listener_addr(const struct perch_listener *l, struct sockaddr_storage *ss,
				  socklen_t *len);

/* Room for any text perch_addr_format writes, its NUL included. */
#define PERCH_ADDR_FORMAT_MAX 440

/*
 * Writes `sa` (of `len` bytes) as text for logs into buf: "127.0.0.1:80",
 * "[::1]:80", "unix:/run/app.sock", "unix:@name" (abstract; a byte that
 * is not printable ASCII, or a backslash, as \xHH), "unix:" (unnamed).
 * Returns its length (the NUL not counted); -EINVAL for NULL or a `len`
 * too short for the family (or, for a Unix one, longer than a
 * sockaddr_storage; a 108-byte path, whose length the kernel gives as
 * 111, is read up to the end of sun_path); -EAFNOSUPPORT for another family; -ENOSPC
 * when it does not fit in `size` bytes (PERCH_ADDR_FORMAT_MAX always does;
 * buf is then untouched). Any thread.
 */
PERCH_API int perch_addr_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t size);

/*
 * The connection's socket fd, for getsockopt(2) and setsockopt(2) of the
 * options perch does not set (SO_KEEPALIVE and TCP_KEEPIDLE, IP_TOS,
 * SO_PRIORITY, SO_SNDBUF and SO_RCVBUF, TCP_USER_TIMEOUT, TCP_INFO,
 * SO_PEERSEC, ...), and for fstat or logging. The loop owns it, so the
 * caller must not: close it, dup it (a copy outlives the connection and
 * keeps the peer's stream open), read, write, send, recv, shutdown or
 * connect on it (bytes perch never sees, an end it does not know of);
 * change its file flags (O_NONBLOCK: epoll reads until EAGAIN); set
 * SO_LINGER (perch_conn_abort's) or TCP_NODELAY (perch_conn_opts.nagle);
 * hand it to epoll, io_uring or another loop; or use the number after
 * perch_conn_close, perch_conn_abort or its last perch_conn_release
 * (the loop closes it, and the number is reused). Returns the fd;
 * -EINVAL for NULL; -ENOTSOCK for a connection that is not a loop's socket
 * (an in-memory pipe's); -EPIPE once closed.
 */
PERCH_API int perch_conn_fd(const struct perch_conn *c);

/*
 * ---- Lingering close (as nginx's lingering_close). ----
 *
 * Closing a socket whose peer's bytes are still unread sends a reset, and
 * a peer's TCP may then drop the last answer it had not yet read (an error
 * reply to a request it is still sending: RFC 9112, section 9.6). A
 * lingering close shuts the write side instead (the peer reads every byte
 * flushed, then the end of the stream), reads and drops what the peer
 * still sends, and closes once the peer ends its side, or a bound is
 * reached (then the close may reset: the peer kept sending).
 */
struct perch_linger_opts {
	size_t max_bytes;          /* the most dropped before closing anyway; 0: 1 MiB */
	unsigned timeout_ms;       /* the longest wait for the peer's end; 0: 5000 ms;
				    * above PERCH_TIMER_MAX_MS (a day): -EINVAL */
};

/*
 * Closes `c` lingering, with `opts` (NULL: the defaults). Call it as its
 * reader and writer, once the last flush completed with 0, with every
 * pipe reader and writer of it freed and no read parked, and with a
 * reference it hands over: on success the linger owns that reference and
 * releases it at the end, on the loop thread; do not use, close or
 * release `c` afterwards. Any thread (from another, the linger starts at
 * the loop's next turn). Returns 0; -EBUSY while bytes are staged or the
 * kernel holds a flush's (perch_conn_shutdown's rule; nothing changes);
 * -EPIPE when closed or failed (a peer's reset); -EALREADY when a
 * lingering close of `c` was already made; -EOPNOTSUPP for a connection
 * that is not a loop's socket (an in-memory pipe's); -EINVAL for NULL or
 * a timeout above the bound; -ENOMEM. On an error the reference is still
 * the caller's. If the contract is broken (a read left parked, a reader
 * freed, a close on another thread), the linger ends at once, on the loop
 * thread, and a parked read gets the closed result it would get from
 * perch_conn_close: its continuation must not release `c` then. There is
 * no report of the end. perch_loop_free ends every linger still running
 * (closing its connection). Past the loop's linger_max lingering at once
 * (perch_loop_opts), the linger ends as it starts: the write side shut,
 * then the close (stats.lingers_refused counts them).
 */
PERCH_API int perch_conn_close_lingering(struct perch_conn *c, const struct perch_linger_opts *opts);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_SOCK_H */
