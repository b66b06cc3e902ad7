/* tests/test_linger.c: lingering close on io_uring and on epoll: the answer read whole and the end, the byte and time bounds, misuse. */
#include "config.h"

#include "cmocka_prelude.h"

#include <signal.h>

#include "both_backends.h"
#include "fake_transport.h"
#include "loop_util.h"

static enum perch_backend backend;

/* A loop, a listener, a plain client and the accepted connection (the test's reference). */
struct pair {
	struct lu_loop l;
	struct perch_listener *ls;
	struct lu_catcher k;
	int client;
	int fds; /* the process's fds with the client's and without the server's end */
};

/* A pair on a loop that lets linger_max connections linger at once (0: the default). */
static void pair_open_max(struct pair *p, uint32_t linger_max)
{
	memset(p, 0, sizeof(*p));
	struct perch_loop_opts o = { .backend = backend, .linger_max = linger_max };
	assert_int_equal(lu_start(&p->l, &o), 0);
	sem_init(&p->k.got, 0, 0);
	assert_int_equal(perch_listen(p->l.loop, "127.0.0.1", 0, NULL, lu_catch_accept, &p->k, &p->ls), 0);
	p->fds = lu_count_fds() + 1; /* counted before the connect: the accept may come before a count after it */
	p->client = lu_plain_connect_to(p->ls);
	assert_true(p->client >= 0);
	assert_int_equal(lu_sem_wait(&p->k.got, LU_TIMEOUT_MS), 0);
}

static void pair_open(struct pair *p)
{
	pair_open_max(p, 0);
}

static void pair_close(struct pair *p)
{
	close(p->client);
	assert_int_equal(perch_listener_close(p->ls), 0);
	assert_int_equal(lu_stop(&p->l), 0);
	sem_destroy(&p->k.got);
}

/* The server's end is closed: the process is back to its fds before the accept. Bounded. */
static bool server_end_closed(const struct pair *p)
{
	for (int i = 0; i < LU_TIMEOUT_MS / 10; i++, usleep(10 * 1000))
		if (lu_count_fds() == p->fds)
			return true;
	return false;
}

/* The request the server answers without reading it whole, and its answer, flushed. */
static void answer_unread_request(struct pair *p)
{
	static const char req[] = "a request the server will not read to its end";
	assert_true(lu_write_all(p->client, (const uint8_t *)req, sizeof(req)));
	assert_int_equal(perch_conn_write(p->k.c, "ANSWER", 6), 0);
	assert_int_equal(lu_flush(p->k.c), 0);
}

/* Sends n bytes (blocking); returns how many went before an error (a reset) stopped it. */
static size_t send_bytes(int fd, size_t n)
{
	static uint8_t chunk[16 * 1024];
	size_t sent = 0;
	while (sent < n) {
		size_t want = n - sent < sizeof(chunk) ? n - sent : sizeof(chunk);
		ssize_t w = send(fd, chunk, want, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		sent += (size_t)w;
	}
	return sent;
}

/* Reads to the end: the bytes in buf (up to size), their count, and how it ended (0: a FIN, else -errno). */
static size_t read_to_end(int fd, char *buf, size_t size, int *end)
{
	size_t got = 0;
	for (;;) {
		char tmp[4096];
		ssize_t r = recv(fd, tmp, sizeof(tmp), 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			*end = r == 0 ? 0 : -errno;
			return got;
		}
		size_t keep = got + (size_t)r <= size ? (size_t)r : size - got;
		memcpy(buf + got, tmp, keep);
		got += keep;
	}
}

/*
 * The answer, then a client that goes on sending 256 KiB before it ends
 * its side: it sends every byte, reads the answer whole and then the end
 * of the stream, not a reset; and the server's end closes after.
 */
static void a_client_still_sending_reads_the_answer_and_the_end(void **state)
{
	struct pair p;
	pair_open(&p);
	answer_unread_request(&p);
	assert_int_equal(perch_conn_close_lingering(p.k.c, NULL), 0);
	enum { MORE = 256 * 1024 };
	assert_int_equal(send_bytes(p.client, MORE), MORE);
	assert_int_equal(shutdown(p.client, SHUT_WR), 0);
	char buf[16];
	int end = 1;
	size_t got = read_to_end(p.client, buf, sizeof(buf), &end);
	assert_int_equal(got, 6);
	assert_memory_equal(buf, "ANSWER", 6);
	assert_int_equal(end, 0);
	assert_true(server_end_closed(&p));
	/*
	 * No reset came after the end either: a server that closed at once
	 * answers bytes that reach it closed with one, which the sends may
	 * not see when the socket buffers took them all.
	 */
	usleep(50 * 1000);
	int err = 0;
	socklen_t len = sizeof(err);
	assert_int_equal(getsockopt(p.client, SOL_SOCKET, SO_ERROR, &err, &len), 0);
	assert_int_equal(err, 0);
	pair_close(&p);
}

/* Past max_bytes dropped, the linger closes anyway: a client that never stops sending is cut off. */
static void a_client_sending_past_the_byte_bound_is_cut_off(void **state)
{
	struct pair p;
	pair_open(&p);
	answer_unread_request(&p);
	struct perch_linger_opts o = { .max_bytes = 64 * 1024, .timeout_ms = 60 * 1000 };
	assert_int_equal(perch_conn_close_lingering(p.k.c, &o), 0);
	enum { LOTS = 64 * 1024 * 1024 };
	assert_true(send_bytes(p.client, LOTS) < LOTS); /* a reset stopped it */
	assert_true(server_end_closed(&p));
	pair_close(&p);
}

/* A client that neither sends nor ends its side: closed once timeout_ms passed, after the answer and the end. */
static void a_silent_client_is_closed_after_the_timeout(void **state)
{
	struct pair p;
	pair_open(&p);
	answer_unread_request(&p);
	struct perch_linger_opts o = { .timeout_ms = 200 };
	assert_int_equal(perch_conn_close_lingering(p.k.c, &o), 0);
	char buf[16];
	int end = 1;
	assert_int_equal(read_to_end(p.client, buf, sizeof(buf), &end), 6); /* the end comes with the shutdown */
	assert_int_equal(end, 0);
	assert_true(server_end_closed(&p));
	pair_close(&p);
}

/* A linger still running when the loop is freed: the free closes it and releases its reference. */
static void the_loops_free_ends_a_linger_still_running(void **state)
{
	int base = lu_count_fds();
	struct pair p;
	pair_open(&p);
	answer_unread_request(&p);
	struct perch_linger_opts o = { .timeout_ms = 60 * 1000 };
	assert_int_equal(perch_conn_close_lingering(p.k.c, &o), 0);
	assert_int_equal(perch_listener_close(p.ls), 0);
	assert_int_equal(lu_stop(&p.l), 0);
	assert_int_equal(lu_count_fds(), base + 1); /* the loop's and the server's end gone; the client left */
	close(p.client);
	sem_destroy(&p.k.got);
}

static void free_reader_on_the_loop(void *arg)
{
	perch_pipe_reader_free(arg);
}

/*
 * A pipe reader freed after the linger started, against the contract:
 * its cancel wakes the linger's read (on the freeing thread, or inline on
 * the loop's). The linger ends (a cancel after its first read is another
 * reader breaking in), on the loop thread, once: neither a hang in the
 * reader's free nor a use after free. Both threads.
 */
static void a_pipe_reader_freed_after_the_start_ends_the_linger(void **state)
{
	for (int on_loop = 0; on_loop < 2; on_loop++) {
		struct pair p;
		pair_open(&p);
		struct perch_pipe_reader *r;
		assert_int_equal(perch_pipe_reader_new(p.k.c, &r), 0);
		answer_unread_request(&p);
		struct perch_linger_opts o = { .timeout_ms = 60 * 1000 };
		assert_int_equal(perch_conn_close_lingering(p.k.c, &o), 0);
		/* Its first read parked: a listener, not a mark, in the slot. */
		for (int i = 0; i < LU_TIMEOUT_MS && perch__load_uptr(&p.k.c->read_waiter) <= PERCH__SLOT_DELIVERING; i++)
			usleep(1000);
		if (on_loop)
			assert_int_equal(perch_loop_post(p.l.loop, free_reader_on_the_loop, r), 0);
		else
			perch_pipe_reader_free(r);
		assert_true(server_end_closed(&p)); /* long before the timeout */
		pair_close(&p);
	}
}

/*
 * With linger_max 1, a second lingering close while the first client
 * still lingers (silent, a minute's timeout) closes at once: its server
 * end goes long before the timeout, and the loop counts it refused. The
 * first goes on lingering: its client still sends 64 KiB whole and reads
 * the answer and the end.
 */
static void past_linger_max_a_lingering_close_closes_at_once(void **state)
{
	struct pair p;
	pair_open_max(&p, 1);
	answer_unread_request(&p);
	struct perch_linger_opts o = { .timeout_ms = 60 * 1000 };
	assert_int_equal(perch_conn_close_lingering(p.k.c, &o), 0);

	int first = p.client;
	p.client = lu_plain_connect_to(p.ls);
	assert_true(p.client >= 0);
	assert_int_equal(lu_sem_wait(&p.k.got, LU_TIMEOUT_MS), 0);
	p.fds = lu_count_fds() - 1; /* the second's server end is there now; it is the one to go */
	answer_unread_request(&p);
	assert_int_equal(perch_conn_close_lingering(p.k.c, &o), 0);
	assert_true(server_end_closed(&p));
	struct perch_loop_stats st = lu_stats(&p.l);
	assert_int_equal(st.lingering, 1);
	assert_int_equal(st.lingers_refused, 1);

	enum { MORE = 64 * 1024 };
	assert_int_equal(send_bytes(first, MORE), MORE);
	assert_int_equal(shutdown(first, SHUT_WR), 0);
	char buf[16];
	int end = 1;
	assert_int_equal(read_to_end(first, buf, sizeof(buf), &end), 6);
	assert_memory_equal(buf, "ANSWER", 6);
	assert_int_equal(end, 0);
	p.fds--;
	assert_true(server_end_closed(&p));
	assert_int_equal(lu_stats(&p.l).lingering, 0);
	close(first);
	pair_close(&p);
}

/* Misuse, each its own errno, and nothing changed by it: the connection still answers and lingers after. */
static void misuse_is_refused_and_changes_nothing(void **state)
{
	struct pair p;
	pair_open(&p);
	assert_int_equal(perch_conn_close_lingering(NULL, NULL), -EINVAL);
	struct perch_linger_opts too_long = { .timeout_ms = PERCH_TIMER_MAX_MS + 1 };
	assert_int_equal(perch_conn_close_lingering(p.k.c, &too_long), -EINVAL);
	assert_int_equal(perch_conn_write(p.k.c, "ANSWER", 6), 0);
	assert_int_equal(perch_conn_close_lingering(p.k.c, NULL), -EBUSY); /* staged, not flushed */
	assert_int_equal(lu_flush(p.k.c), 0);
	perch__conn_ref(p.k.c); /* to call it again (against the contract): refused */
	assert_int_equal(perch_conn_close_lingering(p.k.c, NULL), 0);
	assert_int_equal(perch_conn_close_lingering(p.k.c, NULL), -EALREADY);
	perch_conn_release(p.k.c);
	assert_int_equal(shutdown(p.client, SHUT_WR), 0);
	char buf[16];
	int end = 1;
	assert_int_equal(read_to_end(p.client, buf, sizeof(buf), &end), 6);
	assert_memory_equal(buf, "ANSWER", 6);
	assert_true(server_end_closed(&p));
	pair_close(&p);

	/* Closed: -EPIPE, the reference still the caller's. */
	pair_open(&p);
	perch_conn_close(p.k.c);
	assert_int_equal(perch_conn_close_lingering(p.k.c, NULL), -EPIPE);
	perch_conn_release(p.k.c);
	pair_close(&p);

	/* No socket of its own (a transport that is not a loop's): -EOPNOTSUPP. */
	struct fake_transport t = { .sent = NULL };
	struct perch_conn *c = perch__conn_new(&fake_ops, &t);
	assert_non_null(c);
	assert_int_equal(perch_conn_close_lingering(c, NULL), -EOPNOTSUPP);
	perch_conn_release(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_client_still_sending_reads_the_answer_and_the_end),
		cmocka_unit_test(a_client_sending_past_the_byte_bound_is_cut_off),
		cmocka_unit_test(a_silent_client_is_closed_after_the_timeout),
		cmocka_unit_test(the_loops_free_ends_a_linger_still_running),
		cmocka_unit_test(a_pipe_reader_freed_after_the_start_ends_the_linger),
		cmocka_unit_test(past_linger_max_a_lingering_close_closes_at_once),
		cmocka_unit_test(misuse_is_refused_and_changes_nothing),
	};
	signal(SIGPIPE, SIG_IGN);
	return RUN_ON_BOTH_BACKENDS("lingering close", tests, backend);
}
