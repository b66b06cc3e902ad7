/* tests/test_epoll.c: what only the epoll backend has: the read budget, its guards, the inline pause, interest kept only while waited on. */
#include "config.h"

#include "cmocka_prelude.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>

#include "loop_util.h"

/*
 * Every test here is deterministic: the loop thread is held while the
 * peer's bytes (and FIN) reach the connection's receive queue, so what
 * the first turn finds is fixed, and what the loop did is read from its
 * counters (loop->stats, on the loop thread), never from timing.
 */

enum { BUDGET = 64 * 1024, BUF = 16 * 1024, QUEUED = 192 * 1024 };

struct fx {
	struct lu_loop l;
	struct perch_listener *ls;
	struct perch_conn *c;     /* the accepted conn (our reference) */
	struct perch__sock *s;
	int peer;                 /* the plain client socket */
	sem_t got, held, go;
	uint8_t *out, *in;
};

static void fx_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct fx *f = arg;
	f->c = c;
	sem_post(&f->got);
}

/* An epoll loop with `budget`, a listener whose accepted socket has a roomy SO_RCVBUF, one peer. */
static void fx_open(struct fx *f, uint32_t budget, const struct perch_conn_opts *copts)
{
	memset(f, 0, sizeof(*f));
	sem_init(&f->got, 0, 0);
	sem_init(&f->held, 0, 0);
	sem_init(&f->go, 0, 0);
	struct perch_loop_opts lo = { .backend = PERCH_BACKEND_EPOLL, .read_budget = budget,
				      .buf_size = BUF };
	assert_int_equal(lu_start(&f->l, &lo), 0);
	assert_string_equal(perch_loop_backend_name(f->l.loop), "epoll");
	assert_int_equal(perch_listen(f->l.loop, "127.0.0.1", 0, copts, fx_accept, f, &f->ls), 0);
	int big = 1024 * 1024;
	assert_int_equal(setsockopt(f->ls->sk.fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big)), 0);
	f->peer = lu_plain_connect(perch_listener_port(f->ls));
	assert_true(f->peer >= 0);
	assert_int_equal(setsockopt(f->peer, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big)), 0);
	assert_int_equal(lu_sem_wait(&f->got, LU_TIMEOUT_MS), 0);
	f->s = f->c->transport;
	f->out = malloc(8 * 1024 * 1024);
	f->in = malloc(8 * 1024 * 1024);
	lu_fill(f->out, 8 * 1024 * 1024);
}

static void fx_close(struct fx *f)
{
	perch_conn_release(f->c);
	if (f->peer >= 0)
		close(f->peer);
	assert_int_equal(lu_stop(&f->l), 0);
	sem_destroy(&f->got);
	sem_destroy(&f->held);
	sem_destroy(&f->go);
	free(f->out);
	free(f->in);
}

static void fx_block(void *p)
{
	struct fx *f = p;
	sem_post(&f->held);
	lu_sem_wait(&f->go, LU_TIMEOUT_MS);
}

/* Holds the loop thread inside a posted call until fx_release. */
static void fx_hold(struct fx *f)
{
	assert_int_equal(perch_loop_post(f->l.loop, fx_block, f), 0);
	assert_int_equal(lu_sem_wait(&f->held, LU_TIMEOUT_MS), 0);
}

static void fx_release(struct fx *f)
{
	sem_post(&f->go);
}

/*
 * The peer writes pattern bytes [from, from + n) and waits until the
 * kernel moved all of them into the conn's receive queue (nothing left in
 * its own send queue): no later arrival can wake the loop for them.
 */
static void peer_queue(struct fx *f, size_t from, size_t n)
{
	assert_true(lu_write_all(f->peer, f->out + from, n));
	int outq = -1;
	for (int i = 0; i < LU_TIMEOUT_MS && outq != 0; i++) {
		ioctl(f->peer, SIOCOUTQ, &outq);
		if (outq)
			usleep(1000);
	}
	assert_int_equal(outq, 0);
	int inq = 0;
	ioctl(f->s->fd, FIONREAD, &inq);
	assert_true((size_t)inq >= n);
}

struct probe {
	struct fx *f;
	uint64_t turns, yields, turn_max, waits, unconsumed, mods;
	uint32_t events;
	bool paused;
};

/*
 * The interest the kernel holds for `fd` in this process's epoll sets
 * (there is one loop here): its line in the epoll fd's /proc fdinfo,
 * "tfd: FD events: HEX ...". 0 when no set holds it.
 */
static uint32_t kernel_interest(int fd)
{
	DIR *d = opendir("/proc/self/fd");
	uint32_t events = 0;
	struct dirent *de;
	while (d && (de = readdir(d)) != NULL) {
		char link[300], target[64] = "", path[300];
		snprintf(link, sizeof(link), "/proc/self/fd/%s", de->d_name);
		ssize_t n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0 || strncmp(target, "anon_inode:[eventpoll]", (size_t)n) != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%s", de->d_name);
		FILE *f = fopen(path, "r");
		char line[256];
		int tfd;
		unsigned ev;
		while (f && fgets(line, sizeof(line), f))
			if (sscanf(line, "tfd: %d events: %x", &tfd, &ev) == 2 && tfd == fd)
				events = ev;
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	return events;
}

static void probe_run(void *p)
{
	struct probe *pr = p;
	struct perch_loop *loop = pr->f->l.loop;
	pr->turns = loop->stats.read_turns;
	pr->yields = loop->stats.read_yields;
	pr->turn_max = loop->stats.turn_bytes_max;
	pr->waits = loop->stats.waits;
	pr->mods = loop->stats.interest_changes;
	pr->unconsumed = pr->f->s->unconsumed;
	pr->paused = pr->f->s->rx_paused;
	pr->events = kernel_interest(pr->f->s->fd);
}

static struct probe probe(struct fx *f)
{
	struct probe pr = { .f = f };
	assert_int_equal(lu_on_loop(&f->l, probe_run, &pr), 0);
	return pr;
}

/* Reads `n` bytes and checks them against the pattern from offset 0. */
static struct lu_end read_checked(struct fx *f, size_t n)
{
	struct lu_end e = lu_read(f->c, f->in, n);
	assert_false(e.timed_out);
	assert_int_equal(e.got, n);
	assert_memory_equal(f->in, f->out, n);
	return e;
}

/* ---- the budget ---- */

/* A plain writer thread keeping the peer's socket full. */
struct flood {
	struct fx *f;
	size_t from, len;
	pthread_t th;
};

static void *flood_main(void *p)
{
	struct flood *fl = p;
	lu_write_all(fl->f->peer, fl->f->out + fl->from, fl->len);
	return NULL;
}

/*
 * The peer fills the socket while the loop is held, then keeps it full
 * (a writer blocked on it). Every turn returns after the budget plus at
 * most one buffer; the stream still arrives whole and in order.
 */
static void one_turn_reads_at_most_the_budget_plus_one_buffer_from_a_full_socket(void **state)
{
	enum { TOTAL = 8 * 1024 * 1024 };
	struct perch_conn_opts roomy = { .pause_bytes = 16 * 1024 * 1024 };
	struct fx f;
	fx_open(&f, 0, &roomy);
	fx_hold(&f);
	/* Non-blocking until the kernel takes no more: both queues full. */
	int fl = fcntl(f.peer, F_GETFL);
	fcntl(f.peer, F_SETFL, fl | O_NONBLOCK);
	size_t filled = 0;
	ssize_t w;
	while ((w = write(f.peer, f.out + filled, 65536)) > 0)
		filled += (size_t)w;
	fcntl(f.peer, F_SETFL, fl);
	int inq = 0;
	ioctl(f.s->fd, FIONREAD, &inq);
	print_message("queued before the first turn: %d B in the conn's socket, %zu B written\n", inq, filled);
	assert_true((size_t)inq > BUDGET + BUF); /* more than a turn may take */
	struct flood fd = { .f = &f, .from = filled, .len = TOTAL - filled };
	pthread_create(&fd.th, NULL, flood_main, &fd);
	fx_release(&f);
	read_checked(&f, TOTAL);
	pthread_join(fd.th, NULL);
	struct probe pr = probe(&f);
	print_message("turns %llu, yields %llu, largest turn %llu B\n", (unsigned long long)pr.turns,
		      (unsigned long long)pr.yields, (unsigned long long)pr.turn_max);
	assert_true(pr.yields >= 1);
	assert_true(pr.turn_max >= BUDGET);
	assert_true(pr.turn_max <= BUDGET + BUF);
	fx_close(&f);
}

/*
 * QUEUED bytes sit in the receive queue and nothing more will arrive, so
 * no new edge can wake the conn: after its first turn yields, only the
 * re-arm (the MOD's re-poll) gives it the next ones.
 */
static void a_yielded_connection_gets_its_next_turn_with_no_new_bytes(void **state)
{
	struct fx f;
	fx_open(&f, 0, NULL);
	fx_hold(&f);
	peer_queue(&f, 0, QUEUED);
	fx_release(&f);
	read_checked(&f, QUEUED);
	struct probe pr = probe(&f);
	assert_true(pr.yields >= 2); /* 192 KiB at 64 KiB a turn */
	assert_true(pr.turn_max <= BUDGET + BUF);
	fx_close(&f);
}

/*
 * The bytes and the FIN are queued before the first turn, whose event
 * carries EPOLLRDHUP. The turns that yield must not end the stream: every
 * byte first, then `completed`.
 */
static void a_half_close_after_a_yielded_turn_ends_the_stream_after_every_byte(void **state)
{
	struct fx f;
	fx_open(&f, 0, NULL);
	fx_hold(&f);
	peer_queue(&f, 0, QUEUED);
	shutdown(f.peer, SHUT_WR);
	fx_release(&f);
	struct lu_end e = lu_read_to_end(f.c, f.in, QUEUED);
	assert_false(e.timed_out);
	assert_int_equal(e.got, QUEUED);
	assert_memory_equal(f.in, f.out, QUEUED);
	assert_true(e.completed);
	assert_true(probe(&f).yields >= 1);
	fx_close(&f);
}

/* A plain reader thread draining the peer's side. */
struct drain {
	int fd;
	size_t want, got;
	pthread_t th;
};

static void *drain_main(void *p)
{
	struct drain *d = p;
	uint8_t buf[65536];
	while (d->got < d->want) {
		ssize_t n = read(d->fd, buf, sizeof(buf));
		if (n <= 0)
			break;
		d->got += (size_t)n;
	}
	return NULL;
}

/*
 * A flush waits on EPOLLOUT (the peer reads nothing) when the conn's reads
 * start yielding. The re-arm of a yielded turn must keep EPOLLOUT: once
 * the peer drains, the flush completes.
 */
static void a_yielded_turn_keeps_epollout_for_a_waiting_flush(void **state)
{
	enum { OUT = 8 * 1024 * 1024 };
	struct fx f;
	fx_open(&f, 0, NULL);
	struct counted_flush w = { .fl = { counted_flush_parking, counted_flush_done } };
	sem_init(&w.done, 0, 0);
	assert_int_equal(perch_conn_write(f.c, f.out, OUT), 0);
	assert_int_equal(perch_conn_try_flush_or_park(f.c, &w.fl), PERCH_PENDING);
	/* The socket fills: the send waits for EPOLLOUT. */
	struct probe pr = probe(&f);
	for (int i = 0; i < LU_TIMEOUT_MS && !(pr.events & EPOLLOUT); i++) {
		usleep(1000);
		pr = probe(&f);
	}
	assert_true(pr.events & EPOLLOUT);
	uint64_t yields = pr.yields;
	fx_hold(&f);
	peer_queue(&f, 0, QUEUED);
	fx_release(&f);
	read_checked(&f, QUEUED);
	assert_true(probe(&f).yields >= yields + 2);
	/* Now the peer reads: only an EPOLLOUT event can move the flush on. */
	struct drain d = { .fd = f.peer, .want = OUT };
	pthread_create(&d.th, NULL, drain_main, &d);
	assert_int_equal(lu_sem_wait(&w.done, LU_TIMEOUT_MS), 0);
	assert_int_equal(w.result, 0);
	assert_int_equal(perch__load_u32(&w.deliveries), 1);
	pthread_join(d.th, NULL);
	assert_int_equal(d.got, OUT);
	sem_destroy(&w.done);
	fx_close(&f);
}

/* ---- backpressure and interest ---- */

/*
 * pause_bytes is one buffer: the first buffer read crosses it, and the
 * pause applies inside the turn, so no second buffer is read (a pause left
 * to the end of the turn would read a whole budget into a stalled reader).
 */
static void a_burst_to_a_stalled_reader_stops_at_the_buffer_that_crosses_the_pause(void **state)
{
	struct perch_conn_opts tight = { .pause_bytes = BUF, .resume_bytes = BUF / 4 };
	struct fx f;
	fx_open(&f, 0, &tight);
	fx_hold(&f);
	peer_queue(&f, 0, QUEUED);
	fx_release(&f);
	struct probe pr = probe(&f); /* a later turn: the first one is over */
	for (int i = 0; i < LU_TIMEOUT_MS && !pr.paused; i++) {
		usleep(1000);
		pr = probe(&f);
	}
	print_message("paused with %llu B unconsumed (pause %d, buffer %d)\n",
		      (unsigned long long)pr.unconsumed, BUF, BUF);
	assert_true(pr.paused);
	assert_true(pr.unconsumed >= BUF);
	assert_true(pr.unconsumed < 2 * BUF);
	assert_false(pr.events & EPOLLIN); /* nobody waits for bytes: no interest in them */
	read_checked(&f, QUEUED);
	fx_close(&f);
}

/*
 * A paused conn keeps receiving small segments (the window is still open).
 * With EPOLLIN dropped while paused they wake nothing: the loop waits once
 * (for the probe) however many arrive.
 */
static void segments_arriving_at_a_paused_conn_do_not_wake_the_loop(void **state)
{
	enum { SEGMENTS = 50 };
	struct perch_conn_opts tight = { .pause_bytes = BUF, .resume_bytes = BUF / 4 };
	struct fx f;
	fx_open(&f, 0, &tight);
	int one = 1;
	setsockopt(f.peer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	assert_true(lu_write_all(f.peer, f.out, BUF));
	struct probe pr = probe(&f);
	for (int i = 0; i < LU_TIMEOUT_MS && !pr.paused; i++) {
		usleep(1000);
		pr = probe(&f);
	}
	assert_true(pr.paused);
	uint64_t waits = probe(&f).waits;
	for (int i = 0; i < SEGMENTS; i++) {
		assert_true(lu_write_all(f.peer, f.out + BUF + (size_t)i * 100, 100));
		usleep(2000);
	}
	uint64_t woke = probe(&f).waits - waits;
	print_message("epoll_wait calls while %d segments reached the paused conn: %llu\n", SEGMENTS,
		      (unsigned long long)woke);
	assert_true(woke <= 3);
	read_checked(&f, BUF + SEGMENTS * 100);
	fx_close(&f);
}

/* Small flushes the socket takes at once are written speculatively: no EPOLLOUT, no MOD. */
static void sends_the_socket_takes_at_once_arm_nothing(void **state)
{
	struct fx f;
	fx_open(&f, 0, NULL);
	uint64_t mods = probe(&f).mods;
	uint8_t buf[100];
	for (int i = 0; i < 100; i++) {
		assert_int_equal(perch_conn_write(f.c, f.out + i * 100, 100), 0);
		assert_int_equal(lu_flush(f.c), 0);
		assert_true(lu_read_all(f.peer, buf, 100));
		assert_memory_equal(buf, f.out + i * 100, 100);
	}
	struct probe pr = probe(&f);
	assert_int_equal(pr.mods, mods);
	assert_false(pr.events & EPOLLOUT);
	fx_close(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(one_turn_reads_at_most_the_budget_plus_one_buffer_from_a_full_socket),
		cmocka_unit_test(a_yielded_connection_gets_its_next_turn_with_no_new_bytes),
		cmocka_unit_test(a_half_close_after_a_yielded_turn_ends_the_stream_after_every_byte),
		cmocka_unit_test(a_yielded_turn_keeps_epollout_for_a_waiting_flush),
		cmocka_unit_test(a_burst_to_a_stalled_reader_stops_at_the_buffer_that_crosses_the_pause),
		cmocka_unit_test(segments_arriving_at_a_paused_conn_do_not_wake_the_loop),
		cmocka_unit_test(sends_the_socket_takes_at_once_arm_nothing),
	};
	return cmocka_run_group_tests_name("epoll", tests, NULL, NULL);
}
