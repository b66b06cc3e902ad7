/* tests/test_uring_turn_sends.c: io_uring sends: every flush a turn makes waits in the submission queue and leaves with the others in the loop's next io_uring_enter. */
#include "config.h"

#include "cmocka_prelude.h"

#include "loop_util.h"
#include "uring_internal.h"

enum { CONNS = 8, MSG = 64 };

static const uint8_t msg[MSG] = "a turn's sends leave in one io_uring_enter";

struct fx;

/*
 * One loopback TCP connection (a multishot receive: no re-arm SQE after
 * each completion, as a Unix socket's single-shot one would add), the
 * socket at its other end, and what the test saw of it.
 */
struct sender {
	struct fx *f;
	struct perch_conn *c;
	int peer;
	struct perch_recv_listener rl;
	struct perch_flush_listener fl;
	int write_rc, flush_rc, flushed; /* flushed: on_flush_done ran, with flush_result */
	int flush_result;
	int ready_turn;                  /* the turn whose completions made its read ready */
	unsigned queued_before, queued_after; /* SQEs waiting around its flush */
};

/* An io_uring loop run on the test's thread, turn by turn, so a turn is one perch_loop_run_once. */
struct fx {
	struct perch_loop *loop;
	struct sender s[CONNS];
	int turn, ready;
	unsigned queued_mark, queued_end;
};

static unsigned queued(struct fx *f)
{
	return io_uring_sq_ready(&st_of(f->loop)->ring);
}

static void adopted(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct sender *s = arg;
	s->c = result == 0 ? c : NULL;
	s->write_rc = result;
}

static uint64_t no_cookie_f(struct perch_flush_listener *l, struct perch_conn *c) { return 0; }

static void flush_done(struct perch_flush_listener *l, struct perch_conn *c, uint64_t cookie, int result)
{
	struct sender *s = (struct sender *)((char *)l - offsetof(struct sender, fl));
	s->flush_result = result;
	s->flushed++;
}

static int setup(void **state)
{
	struct fx *f = *state = calloc(1, sizeof(*f));
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	if (!f || perch_loop_new(&o, &f->loop) != 0)
		return -1;
	int port, lfd = lu_plain_listener(CONNS, &port);
	if (lfd < 0)
		return -1;
	for (int i = 0; i < CONNS; i++) {
		struct sender *s = &f->s[i];
		s->f = f;
		s->write_rc = 1;
		s->fl = (struct perch_flush_listener){ .on_parking = no_cookie_f, .on_flush_done = flush_done };
		s->peer = lu_plain_connect(port);
		int fd = s->peer < 0 ? -1 : accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0 || perch_conn_adopt(f->loop, fd, NULL, adopted, s) != 0)
			return -1;
		for (double end = perch__now_ms() + LU_TIMEOUT_MS; s->write_rc == 1 && perch__now_ms() < end;)
			perch_loop_run_once(f->loop, 10);
		if (!s->c)
			return -1;
	}
	close(lfd);
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	for (int i = 0; i < CONNS; i++) {
		perch_conn_release(f->s[i].c);
		close(f->s[i].peer);
	}
	perch_loop_free(f->loop);
	free(f);
	return 0;
}

/* Stages the message and flushes it, noting the submission queue around the flush. */
static void stage_and_flush(struct sender *s)
{
	s->queued_before = queued(s->f);
	s->write_rc = perch_conn_write(s->c, msg, MSG);
	s->flush_rc = perch_conn_try_flush_or_park(s->c, &s->fl);
	s->queued_after = queued(s->f);
}

/* Runs turns until every flush completed; then every peer reads its message. */
static void every_flush_completes_and_arrives(struct fx *f)
{
	for (int i = 0; i < CONNS; i++) {
		struct sender *s = &f->s[i];
		for (double end = perch__now_ms() + LU_TIMEOUT_MS; !s->flushed && perch__now_ms() < end;)
			assert_true(perch_loop_run_once(f->loop, 10) >= 0);
		assert_int_equal(s->write_rc, 0);
		assert_int_equal(s->flush_rc, PERCH_PENDING);
		assert_int_equal(s->flushed, 1);
		assert_int_equal(s->flush_result, 0);
		uint8_t got[MSG];
		assert_true(lu_read_all(s->peer, got, MSG));
		assert_memory_equal(got, msg, MSG);
	}
}

static void mark_queue(void *arg)
{
	struct fx *f = arg;
	f->queued_mark = queued(f);
}

static void flush_posted(void *arg)
{
	stage_and_flush(arg);
}

static void measure_queue(void *arg)
{
	struct fx *f = arg;
	f->queued_end = queued(f);
}

/*
 * Eight posted callbacks, one flush each, all run in one turn's drain:
 * after the last, all eight sends still wait in the queue (none entered
 * the kernel between callbacks), for the poll's enter.
 */
static void the_flushes_of_one_turns_posted_work_wait_for_its_enter(void **state)
{
	struct fx *f = *state;
	assert_int_equal(perch_loop_post(f->loop, mark_queue, f), 0);
	for (int i = 0; i < CONNS; i++)
		assert_int_equal(perch_loop_post(f->loop, flush_posted, &f->s[i]), 0);
	assert_int_equal(perch_loop_post(f->loop, measure_queue, f), 0);
	assert_true(perch_loop_run_once(f->loop, 0) >= CONNS + 2);
	assert_int_equal(f->queued_end - f->queued_mark, CONNS);
	every_flush_completes_and_arrives(f);
}

static uint64_t no_cookie_r(struct perch_recv_listener *l, struct perch_conn *c) { return 0; }

/* A request arrived: answered and flushed from the completion's dispatch. */
static void request_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	struct sender *s = (struct sender *)((char *)l - offsetof(struct sender, rl));
	struct perch_read_result r;
	s->ready_turn = s->f->turn;
	s->f->ready++;
	if (perch_conn_try_read(c, &r) == 0)
		perch_conn_advance(c, r.len, r.len);
	stage_and_flush(s);
}

/*
 * The eight peers write a request each before the turn; the completions'
 * dispatch answers and flushes each. Within each turn, the queue grows by
 * one send per answer, from the first answer to the last: no answer's
 * send entered the kernel before the turn's end.
 */
static void the_flushes_of_one_turns_completions_wait_for_the_next_enter(void **state)
{
	struct fx *f = *state;
	for (int i = 0; i < CONNS; i++) {
		struct sender *s = &f->s[i];
		struct perch_read_result r;
		s->rl = (struct perch_recv_listener){ .on_parking = no_cookie_r, .on_recv_ready = request_ready };
		assert_int_equal(perch_conn_try_read_or_park(s->c, &s->rl, &r), PERCH_PENDING);
	}
	for (int i = 0; i < CONNS; i++)
		assert_true(lu_write_all(f->s[i].peer, (const uint8_t *)"ping", 4));
	usleep(20 * 1000); /* every request is in before the turn */
	for (double end = perch__now_ms() + LU_TIMEOUT_MS; f->ready < CONNS && perch__now_ms() < end;) {
		f->turn++;
		assert_true(perch_loop_run_once(f->loop, 10) >= 0);
	}
	assert_int_equal(f->ready, CONNS);
	int most = 0;
	for (int t = 1; t <= f->turn; t++) {
		int n = 0;
		unsigned first = 0, last = 0;
		for (int i = 0; i < CONNS; i++) {
			struct sender *s = &f->s[i];
			if (s->ready_turn != t)
				continue;
			first = n == 0 || s->queued_before < first ? s->queued_before : first;
			last = s->queued_after > last ? s->queued_after : last;
			n++;
		}
		if (n > 0)
			assert_int_equal(last - first, n);
		most = n > most ? n : most;
	}
	assert_true(most >= 2); /* at least one turn answered several: else nothing was shown */
	every_flush_completes_and_arrives(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(the_flushes_of_one_turns_posted_work_wait_for_its_enter, setup, teardown),
		cmocka_unit_test_setup_teardown(the_flushes_of_one_turns_completions_wait_for_the_next_enter, setup,
						teardown),
	};
	struct perch_loop *probe = NULL;
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING };
	if (perch_loop_new(&o, &probe) != 0) {
		printf("test_uring_turn_sends: skipped: io_uring is refused here\n");
		return 77;
	}
	perch_loop_free(probe);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
