/* tests/test_unix.c: Unix domain sockets on io_uring and on epoll: paths, abstract names, stale files, modes, errors, peer credentials. */
#include "config.h"

#include "cmocka_prelude.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "both_backends.h"
#include "fake_transport.h"
#include "loop_util.h"

static enum perch_backend backend;

/* A directory of the test's own under /tmp, and names in it. */
static char dir[64];

static int make_dir(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/perch-unix-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static const char *in_dir(const char *name)
{
	static char path[128];
	snprintf(path, sizeof(path), "%s/%s-%s", dir, backend == PERCH_BACKEND_EPOLL ? "epoll" : "uring", name);
	return path;
}

static void loop_start(struct lu_loop *l)
{
	struct perch_loop_opts o = { .backend = backend };
	assert_int_equal(lu_start(l, &o), 0);
}

static void drop_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	perch_conn_release(c);
}

static struct perch_conn *connect_unix(struct lu_loop *l, const char *name, int *result)
{
	struct lu_connect k = { .c = NULL, .result = 1 };
	sem_init(&k.done, 0, 0);
	assert_int_equal(perch_connect_unix(l->loop, name, NULL, lu_connected, &k), 0);
	assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
	sem_destroy(&k.done);
	*result = k.result;
	return k.c;
}

/* The sockaddr of a path (not abstract) that fits. */
static struct sockaddr_un path_addr(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	assert_true(strlen(path) < sizeof(a.sun_path));
	memcpy(a.sun_path, path, strlen(path) + 1);
	return a;
}

/* A socket file at `path` that nothing listens on: what a server that died leaves. */
static void leave_dead_socket_file(const char *path)
{
	struct sockaddr_un a = path_addr(path);
	int dead = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(dead, (struct sockaddr *)&a, sizeof(a)), 0);
	close(dead);
}

/* A plain blocking client of the Unix socket at `path` (not abstract), or -1. */
static int plain_connect_path(const char *path)
{
	struct sockaddr_un a = path_addr(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || lu_connect_addr(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* 256 KiB through an echo listener on `name` and back, from a perch connection of the same loop. */
static void echo_over(const char *name, const struct perch_conn_opts *copts)
{
	struct lu_loop l;
	loop_start(&l);
	struct lu_echo_stats stats = { 0 };
	struct perch_listener *ls;
	assert_int_equal(perch_listen_unix(l.loop, name, NULL, copts, lu_echo_accept, &stats, &ls), 0);
	assert_int_equal(perch_listener_port(ls), 0);
	/* Bound where asked: an abstract name starts with a NUL, a path is the path. */
	struct sockaddr_un bound;
	socklen_t blen = sizeof(bound);
	assert_int_equal(getsockname(ls->sk.fd, (struct sockaddr *)&bound, &blen), 0);
	assert_int_equal(blen, offsetof(struct sockaddr_un, sun_path) + strlen(name) + (name[0] != '@'));
	assert_int_equal(bound.sun_path[0], name[0] == '@' ? 0 : name[0]);
	assert_memory_equal(bound.sun_path + 1, name + 1, strlen(name) - 1);
	int result;
	struct perch_conn *c = connect_unix(&l, name, &result);
	assert_int_equal(result, 0);
	lu_echo_through(c, 256 * 1024);
	for (int i = 0; i < LU_TIMEOUT_MS && perch__load_u32(&stats.ended) < 1; i++)
		usleep(1000);
	assert_int_equal(perch__load_u32(&stats.ended), 1);
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* ---- tests ---- */

static void echo_over_a_unix_socket_path(void **state)
{
	echo_over(in_dir("echo.sock"), NULL);
	struct stat st;
	assert_int_equal(lstat(in_dir("echo.sock"), &st), 0); /* the close leaves the file */
	assert_true(S_ISSOCK(st.st_mode));
}

static void echo_over_a_unix_socket_path_with_singleshot_recv(void **state)
{
	struct perch_conn_opts single = { .recv_mode = PERCH_RECV_SINGLESHOT };
	echo_over(in_dir("echo1.sock"), &single);
}

static void echo_over_an_abstract_name(void **state)
{
	char name[64];
	snprintf(name, sizeof(name), "@perch-test-unix-%d", (int)getpid());
	echo_over(name, NULL);
}

/* An abstract name held by another socket is taken: -EADDRINUSE, as a path is. */
static void an_abstract_name_in_use_is_refused_with_eaddrinuse(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	char name[64];
	snprintf(name, sizeof(name), "@perch-test-taken-%d", (int)getpid());
	struct perch_listener *first, *second = NULL;
	assert_int_equal(perch_listen_unix(l.loop, name, NULL, NULL, drop_accept, NULL, &first), 0);
	assert_int_equal(perch_listen_unix(l.loop, name, NULL, NULL, drop_accept, NULL, &second), -EADDRINUSE);
	assert_null(second);
	assert_int_equal(perch_listener_close(first), 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* A socket file left by a server that died: refused unless unlink_stale, then replaced, and served. */
static void a_stale_socket_file_is_refused_without_the_option_and_replaced_with_it(void **state)
{
	const char *path = in_dir("stale.sock");
	leave_dead_socket_file(path);

	struct lu_loop l;
	loop_start(&l);
	struct perch_listener *ls = NULL;
	int fds = lu_count_fds();
	assert_int_equal(perch_listen_unix(l.loop, path, NULL, NULL, drop_accept, NULL, &ls), -EADDRINUSE);
	assert_null(ls);
	assert_int_equal(lu_count_fds(), fds);
	struct perch_listen_opts replace = { .unlink_stale = true };
	assert_int_equal(perch_listen_unix(l.loop, path, &replace, NULL, drop_accept, NULL, &ls), 0);
	int fd = plain_connect_path(path);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* unlink_stale never takes a live listener's name, nor removes a file that is not a socket. */
static void unlink_stale_leaves_a_live_listener_and_a_regular_file_alone(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	struct perch_listen_opts replace = { .unlink_stale = true };
	const char *live = in_dir("live.sock");
	struct perch_listener *first, *second = NULL;
	assert_int_equal(perch_listen_unix(l.loop, live, NULL, NULL, drop_accept, NULL, &first), 0);
	assert_int_equal(perch_listen_unix(l.loop, live, &replace, NULL, drop_accept, NULL, &second), -EADDRINUSE);
	assert_null(second);
	int fd = plain_connect_path(live); /* the first one still has it */
	assert_true(fd >= 0);
	close(fd);

	const char *plain = in_dir("data.txt");
	int f = open(plain, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	assert_true(f >= 0);
	assert_int_equal(write(f, "keep", 4), 4);
	close(f);
	assert_int_equal(perch_listen_unix(l.loop, plain, &replace, NULL, drop_accept, NULL, &second), -EADDRINUSE);
	struct stat st;
	assert_int_equal(stat(plain, &st), 0);
	assert_true(S_ISREG(st.st_mode) && st.st_size == 4);
	assert_int_equal(perch_listener_close(first), 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* Two servers starting at once on one name: one per round. */
struct starter {
	struct lu_loop *l;
	const char *path;
	uint32_t *go;
	bool replace;
	int rc;
	struct perch_listener *ls;
};

static void *start_listening(void *arg)
{
	struct starter *s = arg;
	/* The plain one sets a mode: its chmod holds its file bound and not yet listening a little longer. */
	struct perch_listen_opts lo = { .unlink_stale = s->replace, .mode = s->replace ? 0 : 0600 };
	while (!perch__load_u32(s->go))
		;
	s->rc = perch_listen_unix(s->l->loop, s->path, &lo, NULL, drop_accept, NULL, &s->ls);
	return NULL;
}

/*
 * unlink_stale probes, removes and binds: a starter doing so must never
 * remove another's new file (bound, refusing connects until its listen)
 * and leave it listening on no name. Even rounds: two replacing starters
 * on a stale file. Odd rounds: a plain starter on a free path, and a
 * replacing one that may find the plain one's file before its listen.
 * Exactly one wins each round, the other hears -EADDRINUSE.
 */
static void two_starters_replacing_one_stale_file_leave_exactly_one_listening(void **state)
{
	enum { ROUNDS = 600 };
	struct lu_loop l;
	loop_start(&l);
	const char *path = in_dir("contested.sock");
	int both = 0, none = 0;
	for (int round = 0; round < ROUNDS; round++) {
		unlink(path);
		bool mixed = round % 2;
		if (!mixed)
			leave_dead_socket_file(path);
		uint32_t go = 0;
		struct starter s[2] = { { &l, path, &go, !mixed, 1, NULL }, { &l, path, &go, true, 1, NULL } };
		pthread_t th[2];
		for (int i = 0; i < 2; i++)
			assert_int_equal(pthread_create(&th[i], NULL, start_listening, &s[i]), 0);
		perch__store_u32(&go, 1);
		for (int i = 0; i < 2; i++)
			pthread_join(th[i], NULL);
		int won = (s[0].rc == 0) + (s[1].rc == 0);
		both += won == 2;
		none += won == 0;
		for (int i = 0; i < 2; i++) {
			if (s[i].rc == 0)
				assert_int_equal(perch_listener_close(s[i].ls), 0);
			else
				assert_int_equal(s[i].rc, -EADDRINUSE);
		}
	}
	assert_int_equal(both, 0);
	assert_int_equal(none, 0);
	unlink(path);
	assert_int_equal(lu_stop(&l), 0);
}

/* 108 bytes do not fit sun_path with its NUL (107 do); an abstract name has no NUL, and the same room. */
static void a_name_too_long_is_refused_with_enametoolong(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	char name[200];
	memset(name, 'a', sizeof(name));
	name[0] = '/';
	name[108] = 0;
	struct perch_listener *ls = NULL;
	assert_int_equal(perch_listen_unix(l.loop, name, NULL, NULL, drop_accept, NULL, &ls), -ENAMETOOLONG);
	assert_int_equal(perch_connect_unix(l.loop, name, NULL, lu_connected, NULL), -ENAMETOOLONG);
	name[0] = '@';
	name[108] = 'a';
	name[109] = 0; /* '@' and 108 bytes: one more than the NUL leaves room for */
	assert_int_equal(perch_listen_unix(l.loop, name, NULL, NULL, drop_accept, NULL, &ls), -ENAMETOOLONG);
	assert_null(ls);
	name[108] = 0; /* '@' and 107 bytes: fits, as unix(7) allows */
	assert_int_equal(perch_listen_unix(l.loop, name, NULL, NULL, drop_accept, NULL, &ls), 0);
	int fd = lu_plain_connect_to(ls); /* its 108-byte address, whole */
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
}

static void bad_names_and_options_are_refused_with_einval(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	struct perch_listener *ls = NULL;
	const char *path = in_dir("bad.sock");
	struct perch_listen_opts mode_too_big = { .mode = 010000 }, mode = { .mode = 0600 };
	struct perch_conn_opts inverted = { .pause_bytes = 10, .resume_bytes = 20 };
	assert_int_equal(perch_listen_unix(l.loop, NULL, NULL, NULL, drop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, "", NULL, NULL, drop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, "@", NULL, NULL, drop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(NULL, path, NULL, NULL, drop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, path, NULL, NULL, NULL, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, path, NULL, NULL, drop_accept, NULL, NULL), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, path, &mode_too_big, NULL, drop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, "@abstract", &mode, NULL, drop_accept, NULL, &ls), -EINVAL);
	assert_int_equal(perch_listen_unix(l.loop, path, NULL, &inverted, drop_accept, NULL, &ls), -EINVAL);
	assert_null(ls);
	assert_int_equal(access(path, F_OK), -1); /* nothing was bound */
	assert_int_equal(perch_connect_unix(l.loop, NULL, NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect_unix(l.loop, "", NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect_unix(l.loop, "@", NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect_unix(NULL, path, NULL, lu_connected, NULL), -EINVAL);
	assert_int_equal(perch_connect_unix(l.loop, path, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(perch_connect_unix(l.loop, path, &inverted, lu_connected, NULL), -EINVAL);
	assert_int_equal(lu_stop(&l), 0);
}

/* A connect finds no file (-ENOENT), or a file nothing listens on (-ECONNREFUSED): reported once. */
static void a_connect_to_a_missing_or_dead_socket_reports_its_error(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	int result;
	assert_null(connect_unix(&l, in_dir("missing.sock"), &result));
	assert_int_equal(result, -ENOENT);
	leave_dead_socket_file(in_dir("dead.sock"));
	assert_null(connect_unix(&l, in_dir("dead.sock"), &result));
	assert_int_equal(result, -ECONNREFUSED);
	assert_int_equal(lu_stop(&l), 0);
}

/*
 * A listener whose accept queue is full: io_uring's connect waits in the
 * kernel until the listener accepts; epoll's non-blocking connect cannot
 * wait and reports -EAGAIN at once (the backends' one difference here).
 */
static void a_connect_to_a_full_accept_queue_waits_on_io_uring_and_is_refused_on_epoll(void **state)
{
	const char *path = in_dir("full.sock");
	struct sockaddr_un a = path_addr(path);
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(lfd, 0), 0);
	int queued[2] = { -1, -1 }, n = 0;
	/* Fill the queue: non-blocking connects until one is refused with EAGAIN. */
	for (; n < 2; n++) {
		queued[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (connect(queued[n], (struct sockaddr *)&a, sizeof(a)) != 0) {
			assert_int_equal(errno, EAGAIN);
			break;
		}
	}
	assert_true(n >= 1 && n < 2);
	struct lu_loop l;
	loop_start(&l);
	struct lu_connect k = { .c = NULL, .result = 1 };
	sem_init(&k.done, 0, 0);
	assert_int_equal(perch_connect_unix(l.loop, path, NULL, lu_connected, &k), 0);
	if (backend == PERCH_BACKEND_EPOLL) {
		assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
		assert_int_equal(k.result, -EAGAIN);
	} else {
		assert_int_equal(lu_sem_wait(&k.done, 200), -ETIMEDOUT); /* still waiting */
		int first = accept(lfd, NULL, NULL); /* room in the queue: the connect goes through */
		assert_true(first >= 0);
		assert_int_equal(lu_sem_wait(&k.done, LU_TIMEOUT_MS), 0);
		assert_int_equal(k.result, 0);
		perch_conn_release(k.c);
		close(first);
	}
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.done);
	for (int i = 0; i <= n && i < 2; i++)
		close(queued[i]);
	close(lfd);
}

static void the_mode_option_sets_the_socket_files_permission_bits(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	struct perch_listener *ls;
	for (unsigned mode = 0600; mode <= 0660; mode += 060) {
		char name[32];
		snprintf(name, sizeof(name), "mode%o.sock", mode);
		struct perch_listen_opts lo = { .mode = mode };
		assert_int_equal(perch_listen_unix(l.loop, in_dir(name), &lo, NULL, drop_accept, NULL, &ls), 0);
		struct stat st;
		assert_int_equal(stat(in_dir(name), &st), 0);
		assert_int_equal(st.st_mode & 07777, mode);
		assert_int_equal(perch_listener_close(ls), 0);
	}
	assert_int_equal(lu_stop(&l), 0);
}

/*
 * What an unprivileged process (nobody) gets: this program executed again
 * with PERCH_TEST_AS_NOBODY=OP:NAME, which drops to nobody and runs OP
 * ("connect" or "listen") on a loop of its own; its exit status is OP's
 * (0 for the expected error). Executed, not just forked: a child forked
 * from this multi-threaded process inherits whatever lock another thread
 * held (the ASan build's allocator, once, for good). Root would pass
 * every permission check.
 */
static int as_nobody(const char *op, const char *name)
{
	char env_op[192], env_backend[32];
	snprintf(env_op, sizeof(env_op), "PERCH_TEST_AS_NOBODY=%s:%s", op, name);
	snprintf(env_backend, sizeof(env_backend), "PERCH_BACKEND=%s",
		 backend == PERCH_BACKEND_EPOLL ? "epoll" : "uring");
	char *const argv[] = { "test_unix", NULL }, *const envp[] = { env_op, env_backend, NULL };
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execve("/proc/self/exe", argv, envp);
		_exit(102);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static int connect_expecting_eacces(struct lu_loop *l, const char *name);
static int listen_expecting_eacces(struct lu_loop *l, const char *name);

/* The executed side of as_nobody: "OP:NAME". Exit status: OP's, or 100 and up when it could not run. */
static int run_as_nobody(const char *spec)
{
	const char *colon = strchr(spec, ':');
	if (!colon || setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
		return 100;
	int (*op)(struct lu_loop *, const char *) = strncmp(spec, "connect:", 8) == 0 ? connect_expecting_eacces
						    : strncmp(spec, "listen:", 7) == 0	 ? listen_expecting_eacces
											 : NULL;
	struct lu_loop l;
	if (!op || lu_start(&l, NULL) != 0)
		return 101;
	int rc = op(&l, colon + 1);
	lu_stop(&l);
	return rc;
}

/* The child's connect: 0 for -EACCES, 1 for a connection, 2 for anything else. */
static int connect_expecting_eacces(struct lu_loop *l, const char *name)
{
	struct lu_connect k = { .c = NULL, .result = 1 };
	sem_init(&k.done, 0, 0);
	if (perch_connect_unix(l->loop, name, NULL, lu_connected, &k) != 0 ||
	    lu_sem_wait(&k.done, LU_TIMEOUT_MS) != 0)
		return 2;
	if (k.c)
		perch_conn_release(k.c);
	return k.result == -EACCES ? 0 : k.result == 0 ? 1 : 2;
}

/* The child's listen: 0 for -EACCES, 1 for a listener, 2 for anything else. */
static int listen_expecting_eacces(struct lu_loop *l, const char *name)
{
	struct perch_listener *ls;
	int rc = perch_listen_unix(l->loop, name, NULL, NULL, drop_accept, NULL, &ls);
	if (rc == 0)
		perch_listener_close(ls);
	return rc == -EACCES ? 0 : rc == 0 ? 1 : 2;
}

/* A socket file of mode 0600 refuses another user's connect (-EACCES); 0666 lets it in (the control). */

static void a_connect_without_write_permission_on_the_socket_file_is_refused_with_eacces(void **state)
{
	if (geteuid() != 0) {
		/* Not root: this process is already the other user of a root-made file; nothing to set up. */
		return;
	}
	assert_int_equal(chmod(dir, 0755), 0); /* nobody may search it */
	struct lu_loop l;
	loop_start(&l);
	struct perch_listener *closed_ls, *open_ls;
	struct perch_listen_opts closed = { .mode = 0600 }, open = { .mode = 0666 };
	assert_int_equal(perch_listen_unix(l.loop, in_dir("closed.sock"), &closed, NULL, drop_accept, NULL,
					   &closed_ls), 0);
	assert_int_equal(perch_listen_unix(l.loop, in_dir("open.sock"), &open, NULL, drop_accept, NULL, &open_ls),
			 0);
	char closed_path[128];
	snprintf(closed_path, sizeof(closed_path), "%s", in_dir("closed.sock"));
	assert_int_equal(as_nobody("connect", closed_path), 0);
	assert_int_equal(as_nobody("connect", in_dir("open.sock")), 1);
	assert_int_equal(perch_listener_close(closed_ls), 0);
	assert_int_equal(perch_listener_close(open_ls), 0);
	assert_int_equal(lu_stop(&l), 0);
}

/* A directory the process may not write to: the listen is refused with -EACCES, and leaves nothing. */
static void a_listen_where_the_process_may_not_create_the_file_is_refused_with_eacces(void **state)
{
	if (geteuid() != 0)
		return; /* as above */
	assert_int_equal(chmod(dir, 0755), 0); /* root's: nobody may search it, not write to it */
	assert_int_equal(as_nobody("listen", in_dir("denied.sock")), 0);
	assert_int_equal(access(in_dir("denied.sock"), F_OK), -1);
}

/* ---- the connection's end over a Unix socket ---- */

/* A perch connection accepted on a Unix path, and the plain client at its other end. */
struct pair {
	struct lu_loop l;
	struct perch_listener *ls;
	struct lu_catcher k;
	int fd;
};

static void pair_open(struct pair *p, const char *name)
{
	memset(p, 0, sizeof(*p));
	sem_init(&p->k.got, 0, 0);
	loop_start(&p->l);
	assert_int_equal(perch_listen_unix(p->l.loop, in_dir(name), NULL, NULL, lu_catch_accept, &p->k, &p->ls), 0);
	p->fd = plain_connect_path(in_dir(name));
	assert_true(p->fd >= 0);
	assert_int_equal(lu_sem_wait(&p->k.got, LU_TIMEOUT_MS), 0);
	struct timeval tv = { .tv_sec = LU_TIMEOUT_MS / 1000 };
	assert_int_equal(setsockopt(p->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
}

static void pair_close(struct pair *p)
{
	perch_conn_release(p->k.c);
	close(p->fd);
	assert_int_equal(perch_listener_close(p->ls), 0);
	assert_int_equal(lu_stop(&p->l), 0);
	sem_destroy(&p->k.got);
}

/* The read after the last byte: 0 (the end) or -errno. */
static int read_end(int fd)
{
	char b;
	ssize_t r;
	while ((r = read(fd, &b, 1)) < 0 && errno == EINTR)
		;
	return r < 0 ? -errno : (int)r;
}

/*
 * Unix sockets have no reset: an abort closes, and the peer reads its
 * bytes and then the end of the stream, as after a close (documented in
 * perch/sock.h).
 */
static void abort_over_a_unix_socket_closes_and_the_peer_reads_the_end(void **state)
{
	struct pair p;
	pair_open(&p, "abort.sock");
	assert_int_equal(perch_conn_write(p.k.c, "bytes", 5), 0);
	assert_int_equal(lu_flush(p.k.c), 0);
	assert_int_equal(perch_conn_abort(p.k.c), 0);
	char got[5];
	assert_true(lu_read_all(p.fd, (uint8_t *)got, 5));
	assert_memory_equal(got, "bytes", 5);
	assert_int_equal(read_end(p.fd), 0);
	pair_close(&p);
}

/*
 * The peer's end reaches the reader after its bytes, as a FIN does over
 * TCP, on every one of many connections: io_uring's multishot armed to
 * wait for readability first lost it about once in 600 (doc/loop.md, "Unix
 * domain sockets"), so one connection would prove little.
 */
static void the_peers_end_right_after_its_bytes_reaches_the_reader_every_time(void **state)
{
	enum { CONNS = 10000 };
	struct pair p;
	pair_open(&p, "fin.sock");
	for (int i = 0; i < CONNS; i++) {
		if (i > 0) { /* the next connection, the previous one's ends closed */
			/* Atomic: the loop stores the next one after our connect, which TSan cannot see order them. */
			perch_conn_release(__atomic_load_n(&p.k.c, __ATOMIC_ACQUIRE));
			close(p.fd);
			p.fd = lu_plain_connect_to(p.ls);
			assert_true(p.fd >= 0);
			assert_int_equal(lu_sem_wait(&p.k.got, LU_TIMEOUT_MS), 0);
		}
		assert_true(lu_write_all(p.fd, (const uint8_t *)"last", 4));
		assert_int_equal(shutdown(p.fd, SHUT_WR), 0);
		uint8_t got[8];
		struct lu_end e = lu_read_to_end(p.k.c, got, 4);
		assert_int_equal(e.got, 4);
		assert_memory_equal(got, "last", 4);
		if (!e.completed)
			fail_msg("connection %d of %d: no end after its bytes", i + 1, CONNS);
	}
	pair_close(&p);
}

/* ---- peer credentials (SO_PEERCRED) ---- */

static void the_peer_credentials_of_a_unix_connection_name_the_connecting_process(void **state)
{
	struct pair p;
	pair_open(&p, "cred.sock");
	struct perch_peer_cred cred = { .pid = 0 };
	assert_int_equal(perch_conn_peer_cred(p.k.c, &cred), 0);
	assert_int_equal(cred.pid, getpid());
	assert_int_equal(cred.uid, geteuid());
	assert_int_equal(cred.gid, getegid());
	assert_int_equal(perch_conn_peer_cred(p.k.c, NULL), -EINVAL);
	assert_int_equal(perch_conn_peer_cred(NULL, &cred), -EINVAL);
	assert_int_equal(perch_conn_close(p.k.c), 0);
	assert_int_equal(perch_conn_peer_cred(p.k.c, &cred), -EPIPE);
	pair_close(&p);
}

/* A child process connects: its pid, not ours, is the peer's. */
static void the_peer_credentials_name_another_process_when_it_connects(void **state)
{
	struct pair p;
	pair_open(&p, "cred2.sock");
	/* Before the fork: the catcher takes the child's next (atomic: the loop may store it meanwhile). */
	struct perch_conn *first = __atomic_load_n(&p.k.c, __ATOMIC_ACQUIRE);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = plain_connect_path(in_dir("cred2.sock"));
		char b;
		_exit(fd >= 0 && read(fd, &b, 1) == 1 ? 0 : 1); /* holds it until the parent answers */
	}
	assert_int_equal(lu_sem_wait(&p.k.got, LU_TIMEOUT_MS), 0);
	struct perch_conn *child = p.k.c;
	struct perch_peer_cred cred;
	assert_int_equal(perch_conn_peer_cred(child, &cred), 0);
	assert_int_equal(cred.pid, pid);
	assert_int_equal(perch_conn_write(child, "x", 1), 0);
	assert_int_equal(lu_flush(child), 0);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	perch_conn_release(child);
	p.k.c = first;
	pair_close(&p);
}

/* Over TCP there are no credentials: -ENOPROTOOPT. */
static void a_tcp_connection_has_no_peer_credentials(void **state)
{
	struct lu_loop l;
	loop_start(&l);
	struct lu_catcher k = { .c = NULL };
	sem_init(&k.got, 0, 0);
	struct perch_listener *ls;
	assert_int_equal(perch_listen(l.loop, "127.0.0.1", 0, NULL, lu_catch_accept, &k, &ls), 0);
	int fd = lu_plain_connect(perch_listener_port(ls));
	assert_true(fd >= 0);
	assert_int_equal(lu_sem_wait(&k.got, LU_TIMEOUT_MS), 0);
	struct perch_peer_cred cred;
	assert_int_equal(perch_conn_peer_cred(k.c, &cred), -ENOPROTOOPT);
	perch_conn_release(k.c);
	close(fd);
	assert_int_equal(perch_listener_close(ls), 0);
	assert_int_equal(lu_stop(&l), 0);
	sem_destroy(&k.got);
}

/* A connection over another transport (the tests' fake one) has no socket: -ENOTSOCK. */
static void a_connection_without_a_socket_has_no_peer_credentials(void **state)
{
	struct fake_transport t = { .sent = NULL };
	struct perch_conn *c = perch__conn_new(&fake_ops, &t);
	assert_non_null(c);
	struct perch_peer_cred cred;
	assert_int_equal(perch_conn_peer_cred(c, &cred), -ENOTSOCK);
	perch_conn_release(c);
}

int main(void)
{
	const char *as_nobody_spec = getenv("PERCH_TEST_AS_NOBODY");
	if (as_nobody_spec)
		return run_as_nobody(as_nobody_spec);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(echo_over_a_unix_socket_path),
		cmocka_unit_test(echo_over_a_unix_socket_path_with_singleshot_recv),
		cmocka_unit_test(echo_over_an_abstract_name),
		cmocka_unit_test(an_abstract_name_in_use_is_refused_with_eaddrinuse),
		cmocka_unit_test(a_stale_socket_file_is_refused_without_the_option_and_replaced_with_it),
		cmocka_unit_test(unlink_stale_leaves_a_live_listener_and_a_regular_file_alone),
		cmocka_unit_test(two_starters_replacing_one_stale_file_leave_exactly_one_listening),
		cmocka_unit_test(a_name_too_long_is_refused_with_enametoolong),
		cmocka_unit_test(bad_names_and_options_are_refused_with_einval),
		cmocka_unit_test(a_connect_to_a_missing_or_dead_socket_reports_its_error),
		cmocka_unit_test(a_connect_to_a_full_accept_queue_waits_on_io_uring_and_is_refused_on_epoll),
		cmocka_unit_test(the_mode_option_sets_the_socket_files_permission_bits),
		cmocka_unit_test(a_connect_without_write_permission_on_the_socket_file_is_refused_with_eacces),
		cmocka_unit_test(a_listen_where_the_process_may_not_create_the_file_is_refused_with_eacces),
		cmocka_unit_test(abort_over_a_unix_socket_closes_and_the_peer_reads_the_end),
		cmocka_unit_test(the_peers_end_right_after_its_bytes_reaches_the_reader_every_time),
		cmocka_unit_test(the_peer_credentials_of_a_unix_connection_name_the_connecting_process),
		cmocka_unit_test(the_peer_credentials_name_another_process_when_it_connects),
		cmocka_unit_test(a_tcp_connection_has_no_peer_credentials),
		cmocka_unit_test(a_connection_without_a_socket_has_no_peer_credentials),
	};
	signal(SIGPIPE, SIG_IGN);
	if (make_dir(NULL) != 0)
		return 1;
	int failed = RUN_ON_BOTH_BACKENDS("unix sockets", tests, backend);
	return remove_dir(NULL) == 0 ? failed : 1;
}
