/* tests/test_server.c: perch_server: options refused, loops sharing a port, idle timeouts, the graceful stop's three ends and its report. */
#include "config.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmocka_prelude.h"
#include "server_util.h"

/*
 * The test protocol: lines in, "ok LINE\n" out; a read that leaves part of
 * a line pending answers "+" (so a client knows the server holds it).
 * While the server stops, a session with no line pending ends.
 */
struct line_sess {
	struct perch_session *s;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	bool reading, partial, close_after_flush, linger;
};

static atomic_int fini_calls, started;
static atomic_int accessors_wrong; /* sessions whose reader, writer or app said otherwise than their start */

/* --wrap=pthread_create: with creates_left >= 0, that many more creates work, then EAGAIN. */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
static atomic_int creates_left = -1;
static int refused_port;               /* a client connects here just before the refusal */

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
	int left = atomic_load(&creates_left);
	if (left == 0) {
		/*
		 * A loop already running would take one of these clients and start
		 * a session (32 of them: the kernel spreads them over every loop's
		 * SO_REUSEPORT listener, running or not): give it 2 s.
		 */
		int fd[32];
		for (int i = 0; i < 32; i++)
			fd[i] = su_connect(refused_port);
		for (int i = 0; i < 200 && atomic_load(&started) == 0; i++)
			usleep(10 * 1000);
		for (int i = 0; i < 32; i++)
			if (fd[i] >= 0)
				close(fd[i]);
		return EAGAIN;
	}
	if (left > 0)
		atomic_fetch_sub(&creates_left, 1);
	return __real_pthread_create(t, a, fn, arg);
}
/* --wrap=pthread_cond_init: while cond_init_fails is set, ENOMEM. */
int __real_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
static atomic_bool cond_init_fails;

int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a)
{
	return atomic_load(&cond_init_fails) ? ENOMEM : __real_pthread_cond_init(c, a);
}

#define BIG_ANSWER (4u << 20) /* "big\n" answers "ok big\n" and this many bytes more */
static const char big_chunk[4096];
static _Atomic(struct perch_loop *) loop_of[128]; /* the loop of the session started n-th */

static void ls_run(struct line_sess *ls);

static void ls_read_ready(void *arg, int64_t result)
{
	struct line_sess *ls = arg;
	ls->reading = false;
	if (result < 0)
		perch_session_end(ls->s, PERCH_SESSION_CLOSE);
	else
		ls_run(ls);
}

static void ls_flushed(void *arg, int64_t result)
{
	struct line_sess *ls = arg;
	if (result < 0 || ls->close_after_flush || (!ls->partial && perch_session_stopping(ls->s))) {
		perch_session_end(ls->s, result == 0 && ls->linger ? PERCH_SESSION_LINGER : PERCH_SESSION_CLOSE);
		return;
	}
	perch_session_touch(ls->s);
	ls_run(ls);
}

/* Answers every whole line of the result; returns the bytes consumed. */
static size_t ls_answer(struct line_sess *ls, const struct perch_read_result *res)
{
	size_t off = 0, nl;
	while ((nl = perch_segs_find(res, off, "\n", 1)) != PERCH_SEGS_NOT_FOUND) {
		char line[64];
		size_t n = nl - off < sizeof(line) ? nl - off : sizeof(line);
		perch_segs_copy(res, off, line, n);
		perch_pipe_write(ls->w, "ok ", 3);
		perch_pipe_write(ls->w, line, n);
		perch_pipe_write(ls->w, "\n", 1);
		ls->linger |= n == 3 && memcmp(line, "bye", 3) == 0;
		if (n == 3 && memcmp(line, "big", 3) == 0)
			for (size_t i = 0; i < BIG_ANSWER / sizeof(big_chunk); i++)
				perch_pipe_write(ls->w, big_chunk, sizeof(big_chunk));
		off = nl + 1;
	}
	if (off < res->len)
		perch_pipe_write(ls->w, "+", 1);
	return off;
}

static void ls_run(struct line_sess *ls)
{
	for (;;) {
		struct perch_read_result res;
		int rc = perch_pipe_read_or_wait(ls->r, &res, ls_read_ready, ls);
		if (rc == PERCH_PENDING) {
			ls->reading = true;
			return;
		}
		if (rc != 0 || res.error || res.closed || res.canceled) {
			perch_session_end(ls->s, PERCH_SESSION_CLOSE);
			return;
		}
		size_t used = ls_answer(ls, &res);
		perch_pipe_advance_to(ls->r, used, res.len);
		ls->partial = used < res.len;
		ls->close_after_flush = res.completed || ls->linger || (!ls->partial && perch_session_stopping(ls->s));
		rc = perch_pipe_flush_or_wait(ls->w, ls_flushed, ls);
		if (rc == PERCH_PENDING)
			return;
		if (rc < 0 || ls->close_after_flush) {
			perch_session_end(ls->s, rc == 0 && ls->linger ? PERCH_SESSION_LINGER : PERCH_SESSION_CLOSE);
			return;
		}
		if (used > 0)
			perch_session_touch(ls->s); /* an answer's flush completed at once */
	}
}

static void ls_start(struct perch_session *s, struct perch_pipe_reader *r, struct perch_pipe_writer *w,
		     void *app)
{
	struct line_sess *ls = perch_session_state(s);
	*ls = (struct line_sess){ .s = s, .r = r, .w = w };
	if (perch_session_reader(s) != r || perch_session_writer(s) != w || perch_session_app(s) != app ||
	    perch_session_tls(s) != NULL)
		atomic_fetch_add(&accessors_wrong, 1);
	int n = atomic_fetch_add(&started, 1);
	if (n < 128)
		atomic_store(&loop_of[n], perch_session_loop(s));
	ls_run(ls);
}

/* A session waiting for a new line ends now; one holding part of a line answers it first. */
static void ls_stop(struct perch_session *s, void *app)
{
	struct line_sess *ls = perch_session_state(s);
	if (ls->reading && !ls->partial)
		perch_conn_close(perch_session_conn(s));
}

static void ls_fini(struct perch_session *s, void *app)
{
	if (perch_session_reader(s) || perch_session_writer(s)) /* freed by now: saying them would hand out freed memory */
		atomic_fetch_add(&accessors_wrong, 1);
	atomic_fetch_add(&fini_calls, 1);
}

static struct perch_server_opts line_opts(void)
{
	atomic_store(&fini_calls, 0);
	atomic_store(&started, 0);
	return (struct perch_server_opts){ .state_size = sizeof(struct line_sess), .start = ls_start,
					   .stop = ls_stop, .fini = ls_fini };
}

static void round_trip(int fd, const char *line)
{
	char want[80], got[80];
	snprintf(want, sizeof(want), "ok %s", line);
	assert_true(su_send_str(fd, line));
	assert_true(su_recv_all(fd, got, strlen(want)));
	assert_memory_equal(got, want, strlen(want));
}

/* True when the next read ends in a reset. */
static bool reads_reset(int fd)
{
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	return r < 0 && errno == ECONNRESET;
}

/* True when the next read is a clean end of stream. */
static bool reads_eof(int fd)
{
	char c;
	ssize_t r;
	while ((r = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
		;
	return r == 0;
}

static void bad_options_are_refused(void **state)
{
	struct perch_server *srv = NULL;
	struct perch_server_opts o = line_opts();
	assert_int_equal(perch_server_start(NULL, &srv), -EINVAL);
	assert_int_equal(perch_server_start(&o, NULL), -EINVAL);
	struct perch_server_opts bad[] = { o, o, o, o, o, o, o, o, o };
	bad[0].start = NULL;
	bad[1].threads = -1;
	bad[2].threads = 1025;
	bad[3].port = 65536;
	bad[4].idle_timeout_ms = PERCH_TIMER_MAX_MS + 1;
	bad[5].idle_end = PERCH_SESSION_LINGER;
	bad[6].host = "localhost";
	bad[7].unix_name = "@perch-server-bad";
	bad[7].threads = 2;
	bad[8].state_size = SIZE_MAX - 8; /* would wrap the session's size */
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(perch_server_start(&bad[i], &srv), -EINVAL);
	assert_null(srv);
	assert_int_equal(perch_server_stop(NULL, 0, NULL), -EINVAL);
	assert_int_equal(perch_server_port(NULL), -EINVAL);
	assert_null(perch_server_loop(NULL, 0));
	assert_int_equal(perch_session_touch(NULL), -EINVAL);
	assert_int_equal(perch_session_end(NULL, PERCH_SESSION_CLOSE), -EINVAL);

	/* A port someone holds is refused; a too long deadline leaves the server running. */
	int port, fd = lu_plain_listener(4, &port);
	o.port = port;
	assert_int_equal(perch_server_start(&o, &srv), -EADDRINUSE);
	close(fd);
	o.port = 0;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	assert_null(perch_server_loop(srv, 1));
	assert_int_equal(perch_server_stop(srv, PERCH_TIMER_MAX_MS + 1, NULL), -EINVAL);
	int c = su_connect(perch_server_port(srv));
	round_trip(c, "still here\n");
	close(c);
	assert_int_equal(perch_server_stop(srv, 0, NULL), 0);
}

/* Two loops share the port (SO_REUSEPORT): every client is served, both loops take some, nothing is left. */
static void two_loops_share_the_port_and_serve_every_client(void **state)
{
	enum { N = 64 };
	struct perch_server_opts o = line_opts();
	o.threads = 2;
	int fds = lu_count_fds();
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	int port = perch_server_port(srv), c[N], on_loop[2] = { 0, 0 };
	for (int i = 0; i < N; i++) {
		c[i] = su_connect(port);
		assert_true(c[i] >= 0);
	}
	for (int i = 0; i < N; i++) {
		char line[16];
		snprintf(line, sizeof(line), "n%d\n", i);
		round_trip(c[i], line);
		close(c[i]);
	}
	assert_int_equal(atomic_load(&started), N);
	for (int i = 0; i < N; i++)
		for (int l = 0; l < 2; l++)
			on_loop[l] += atomic_load(&loop_of[i]) == perch_server_loop(srv, l);
	assert_true(on_loop[0] > 0 && on_loop[1] > 0);
	assert_int_equal(on_loop[0] + on_loop[1], N);
	struct perch_server_report rep;
	assert_int_equal(perch_server_stop(srv, 1000, &rep), 0);
	assert_int_equal(rep.sessions, N);
	assert_int_equal(rep.open_at_stop + rep.finished + rep.aborted, rep.open_at_stop * 2);
	assert_int_equal(atomic_load(&fini_calls), N);
	assert_int_equal(lu_count_fds(), fds);
}

struct stopper {
	pthread_t th;
	struct perch_server *srv;
	unsigned deadline_ms;
	struct perch_server_report rep;
	int rc;
};

static void *stopper_main(void *p)
{
	struct stopper *st = p;
	st->rc = perch_server_stop(st->srv, st->deadline_ms, &st->rep);
	return NULL;
}

/*
 * A stop with three sessions open: one waiting for a line ends at once
 * (a FIN), one holding half a line answers it when the rest comes and
 * ends, one whose line never completes is reset at the deadline. New
 * clients are refused from the start of the stop. The report says so.
 */
static void a_graceful_stop_finishes_requests_then_resets_the_rest(void **state)
{
	struct perch_server_opts o = line_opts();
	int fds = lu_count_fds();
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	int port = perch_server_port(srv), idle = su_connect(port), mid = su_connect(port),
	    stuck = su_connect(port);
	char plus;
	round_trip(idle, "first\n");
	assert_true(su_send_str(mid, "half"));
	assert_true(su_recv_all(mid, &plus, 1) && plus == '+');
	assert_true(su_send_str(stuck, "never ends"));
	assert_true(su_recv_all(stuck, &plus, 1) && plus == '+');

	struct stopper st = { .srv = srv, .deadline_ms = 1500 };
	assert_int_equal(pthread_create(&st.th, NULL, stopper_main, &st), 0);
	assert_true(reads_eof(idle)); /* the stop began: the listener is closed before */
	int late = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_not_equal(lu_connect_fd(late, port), 0);
	close(late);
	char got[32];
	assert_true(su_send_str(mid, " and the rest\n"));
	assert_true(su_recv_all(mid, got, 21));
	assert_memory_equal(got, "ok half and the rest\n", 21);
	assert_true(reads_eof(mid));
	assert_true(reads_reset(stuck));
	pthread_join(st.th, NULL);
	assert_int_equal(st.rc, 0);
	assert_int_equal(st.rep.sessions, 3);
	assert_int_equal(st.rep.open_at_stop, 3);
	assert_int_equal(st.rep.finished, 2);
	assert_int_equal(st.rep.aborted, 1);
	assert_int_equal(st.rep.idle_closed, 0);
	assert_int_equal(atomic_load(&fini_calls), 3);
	close(idle);
	close(mid);
	close(stuck);
	assert_int_equal(lu_count_fds(), fds);
}

/* Idle time runs out: a FIN by default, a reset with idle_end ABORT; counted either way. */
static void an_idle_session_is_closed_as_idle_end_says(void **state)
{
	for (int how = PERCH_SESSION_CLOSE; how <= PERCH_SESSION_ABORT; how += PERCH_SESSION_ABORT) {
		struct perch_server_opts o = line_opts();
		o.idle_timeout_ms = 200;
		o.idle_end = how;
		struct perch_server *srv;
		assert_int_equal(perch_server_start(&o, &srv), 0);
		int silent = su_connect(perch_server_port(srv)), busy = su_connect(perch_server_port(srv));
		round_trip(busy, "one\n");
		if (how == PERCH_SESSION_CLOSE)
			assert_true(reads_eof(silent));
		else
			assert_true(reads_reset(silent));
		assert_true(su_peer_closed(busy)); /* idle after its answer, then cut too */
		struct perch_server_report rep;
		assert_int_equal(perch_server_stop(srv, 0, &rep), 0);
		assert_int_equal(rep.sessions, 2);
		assert_int_equal(rep.idle_closed, 2);
		assert_int_equal(rep.open_at_stop, 0);
		assert_int_equal(atomic_load(&fini_calls), 2);
		close(silent);
		close(busy);
	}
}

/* A protocol that parks nothing: its session is ended by the server at the deadline, fini called once. */
static void idle_start(struct perch_session *s, struct perch_pipe_reader *r, struct perch_pipe_writer *w,
		       void *app)
{
	atomic_fetch_add(&started, 1);
}

static void a_session_with_nothing_parked_is_ended_by_the_server(void **state)
{
	struct perch_server_opts o = line_opts();
	o.start = idle_start;
	o.stop = NULL;
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	int fd = su_connect(perch_server_port(srv));
	for (int i = 0; i < 5000 && atomic_load(&started) == 0; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&started), 1);
	struct perch_server_report rep;
	assert_int_equal(perch_server_stop(srv, 0, &rep), 0);
	assert_true(reads_reset(fd));
	assert_int_equal(rep.open_at_stop, 1);
	assert_int_equal(rep.aborted, 1);
	assert_int_equal(atomic_load(&fini_calls), 1);
	close(fd);
}

struct inside {
	struct perch_server *srv;
	int rc;
	sem_t done;
};

static void stop_from_inside(void *p)
{
	struct inside *in = p;
	in->rc = perch_server_stop(in->srv, 0, NULL);
	sem_post(&in->done);
}

static void a_stop_from_a_loop_thread_is_refused(void **state)
{
	struct perch_server_opts o = line_opts();
	struct inside in = { .rc = 1 };
	sem_init(&in.done, 0, 0);
	assert_int_equal(perch_server_start(&o, &in.srv), 0);
	assert_int_equal(perch_loop_post(perch_server_loop(in.srv, 0), stop_from_inside, &in), 0);
	assert_int_equal(lu_sem_wait(&in.done, 10000), 0);
	assert_int_equal(in.rc, -EDEADLK);
	assert_int_equal(perch_server_stop(in.srv, 0, NULL), 0);
	sem_destroy(&in.done);
}

/* A session says the reader, writer and app its start was given (and no TLS), its fini no pipes; a NULL one says NULL. */
static void a_session_says_its_pipes_and_its_app(void **state)
{
	static int app;
	struct perch_server_opts o = line_opts();
	o.app = &app;
	atomic_store(&accessors_wrong, 0);
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	for (int i = 0; i < 3; i++) {
		int fd = su_connect(perch_server_port(srv));
		assert_true(fd >= 0);
		round_trip(fd, "hello\n");
		close(fd);
	}
	assert_int_equal(perch_server_stop(srv, 1000, NULL), 0);
	assert_int_equal(atomic_load(&started), 3);
	assert_int_equal(atomic_load(&fini_calls), 3);
	assert_int_equal(atomic_load(&accessors_wrong), 0);
	assert_null(perch_session_reader(NULL));
	assert_null(perch_session_writer(NULL));
	assert_null(perch_session_app(NULL));
	assert_null(perch_session_tls(NULL));
}

static void a_unix_socket_server_serves_and_stops(void **state)
{
	char name[64];
	snprintf(name, sizeof(name), "@perch-server-test-%d", (int)getpid());
	struct perch_server_opts o = line_opts();
	o.unix_name = name;
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	assert_int_equal(perch_server_port(srv), 0);
	int fd = su_connect_unix(name);
	assert_true(fd >= 0);
	round_trip(fd, "over unix\n");
	struct perch_server_report rep;
	assert_int_equal(perch_server_stop(srv, 1000, &rep), 0);
	assert_true(reads_eof(fd));
	assert_int_equal(rep.finished, 1);
	close(fd);
}

/*
 * The session's answer to "bye" ends it lingering, and the stop that is
 * under way waits for the linger: the client, still sending after the
 * answer, reads it and then the end, not a reset.
 */
static void a_stop_waits_for_a_lingering_close(void **state)
{
	struct perch_server_opts o = line_opts();
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	int fd = su_connect(perch_server_port(srv)), idle = su_connect(perch_server_port(srv));
	char plus, got[8], junk[1000];
	memset(junk, 'x', sizeof(junk));
	round_trip(idle, "first\n");
	assert_true(su_send_str(fd, "by"));
	assert_true(su_recv_all(fd, &plus, 1) && plus == '+');
	struct stopper st = { .srv = srv, .deadline_ms = 10000 };
	assert_int_equal(pthread_create(&st.th, NULL, stopper_main, &st), 0);
	assert_true(reads_eof(idle)); /* the stop began */
	close(idle);
	assert_true(su_send_str(fd, "e\n"));
	assert_true(su_recv_all(fd, got, 7));
	assert_memory_equal(got, "ok bye\n", 7);
	usleep(100 * 1000); /* a loop that did not wait would be gone by now */
	assert_true(su_send(fd, junk, sizeof(junk)));
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	assert_true(reads_eof(fd));
	pthread_join(st.th, NULL);
	assert_int_equal(st.rep.finished, 2);
	assert_int_equal(st.rep.aborted, 0);
	close(fd);
}

/*
 * The stop begins while a session's flush of a long answer waits for a
 * slow reader: once the reader took it all, the session is between
 * messages and ends then (a FIN), not at the deadline (a reset).
 */
static void a_session_whose_flush_waits_at_the_stop_ends_after_it(void **state)
{
	struct perch_server_opts o = line_opts();
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	int slow = su_connect_rcvbuf(perch_server_port(srv), 4096), idle = su_connect(perch_server_port(srv));
	round_trip(idle, "first\n");
	char *got = malloc(BIG_ANSWER + 7);
	assert_non_null(got);
	assert_true(su_send_str(slow, "big\n"));
	assert_true(su_recv_all(slow, got, 1)); /* the answer is on its way: its flush waits for us */
	struct stopper st = { .srv = srv, .deadline_ms = 10000 };
	assert_int_equal(pthread_create(&st.th, NULL, stopper_main, &st), 0);
	assert_true(reads_eof(idle)); /* the stop began */
	close(idle);
	assert_true(su_recv_all(slow, got + 1, BIG_ANSWER + 6));
	assert_memory_equal(got, "ok big\n", 7);
	assert_true(reads_eof(slow));
	pthread_join(st.th, NULL);
	assert_int_equal(st.rep.open_at_stop, 2);
	assert_int_equal(st.rep.finished, 2);
	assert_int_equal(st.rep.aborted, 0);
	close(slow);
	free(got);
}

/* A stop callback that ends every session at once, its own and the others (ASan watches the walk). */
enum { MANY = 4 };
static struct perch_session *all[MANY];
static int nall;

static void remember_start(struct perch_session *s, struct perch_pipe_reader *r, struct perch_pipe_writer *w,
			   void *app)
{
	if (nall < MANY)
		all[nall++] = s;
	ls_start(s, r, w, app);
}

static void end_everyone(struct perch_session *s, void *app)
{
	for (int i = 0; i < nall; i++)
		perch_session_end(all[i], PERCH_SESSION_CLOSE);
	nall = 0;
}

static void a_stop_callback_may_end_every_session(void **state)
{
	struct perch_server_opts o = line_opts();
	o.start = remember_start;
	o.stop = end_everyone;
	nall = 0;
	struct perch_server *srv;
	assert_int_equal(perch_server_start(&o, &srv), 0);
	int fd[MANY];
	for (int i = 0; i < MANY; i++) {
		fd[i] = su_connect(perch_server_port(srv));
		round_trip(fd[i], "hello\n");
	}
	struct perch_server_report rep;
	assert_int_equal(perch_server_stop(srv, 1000, &rep), 0);
	assert_int_equal(rep.open_at_stop, MANY);
	assert_int_equal(rep.finished, MANY);
	assert_int_equal(atomic_load(&fini_calls), MANY);
	for (int i = 0; i < MANY; i++) {
		assert_true(reads_eof(fd[i]));
		close(fd[i]);
	}
}

/* A port nothing listens on now (bound, read, closed). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/*
 * The second of two threads cannot be made: the start fails with
 * -EAGAIN, the first loop never ran (clients connecting meanwhile
 * started no session), and nothing is left open.
 */
static void a_start_that_cannot_make_a_thread_runs_nothing(void **state)
{
	struct perch_server_opts o = line_opts();
	o.threads = 2;
	o.port = refused_port = free_port();
	int fds = lu_count_fds();
	struct perch_server *srv = NULL;
	atomic_store(&creates_left, 1);
	int rc = perch_server_start(&o, &srv);
	atomic_store(&creates_left, -1);
	assert_int_equal(rc, -EAGAIN);
	assert_null(srv);
	assert_int_equal(atomic_load(&started), 0);
	assert_int_equal(atomic_load(&fini_calls), 0);
	assert_int_equal(lu_count_fds(), fds);
}

/* A start that cannot make its lock's condition variable: -ENOMEM, nothing left; the next start serves. */
static void a_start_out_of_memory_for_its_condition_leaves_nothing(void **state)
{
	struct perch_server_opts o = line_opts();
	o.port = free_port();
	int fds = lu_count_fds();
	struct perch_server *srv = NULL;
	atomic_store(&cond_init_fails, true);
	int rc = perch_server_start(&o, &srv);
	atomic_store(&cond_init_fails, false);
	assert_int_equal(rc, -ENOMEM);
	assert_null(srv);
	assert_int_equal(lu_count_fds(), fds);
	assert_int_equal(perch_server_start(&o, &srv), 0);
	assert_int_equal(perch_server_stop(srv, 1000, NULL), 0);
	assert_int_equal(lu_count_fds(), fds);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bad_options_are_refused),
		cmocka_unit_test(a_session_says_its_pipes_and_its_app),
		cmocka_unit_test(two_loops_share_the_port_and_serve_every_client),
		cmocka_unit_test(a_graceful_stop_finishes_requests_then_resets_the_rest),
		cmocka_unit_test(an_idle_session_is_closed_as_idle_end_says),
		cmocka_unit_test(a_session_with_nothing_parked_is_ended_by_the_server),
		cmocka_unit_test(a_stop_from_a_loop_thread_is_refused),
		cmocka_unit_test(a_unix_socket_server_serves_and_stops),
		cmocka_unit_test(a_stop_waits_for_a_lingering_close),
		cmocka_unit_test(a_stop_callback_may_end_every_session),
		cmocka_unit_test(a_session_whose_flush_waits_at_the_stop_ends_after_it),
		cmocka_unit_test(a_start_that_cannot_make_a_thread_runs_nothing),
		cmocka_unit_test(a_start_out_of_memory_for_its_condition_leaves_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
