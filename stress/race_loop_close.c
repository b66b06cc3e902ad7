/* stress/race_loop_close.c: end-to-end races on real loopback connections: an off-loop read or flush against close. */
/*
 * Each race here is judged by stress/harness.c: it fails unless its two
 * halves overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS), and its judges fail any round that did
 * not deliver exactly once. Mutants 21 and 22 in stress/mutants/ make them fail.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../tests/loop_util.h"
#include "race_conn.h"

/*
 * Close is final, so each round needs a fresh connection. They come from a
 * pool filled in batches (connects on the loop, their accepted peers kept
 * open until the batch is used up), so a round costs one close, not a
 * handshake. The loop runs on its own thread: both actors are off it.
 *
 * Judging is in two parts. Right after the round: what the actors saw.
 * When the batch is used up: the loop's part, once it has finished with
 * every connection of the batch (each socket left the table, each send got
 * its send_done), so a late or second delivery from the loop is counted
 * against its round. Waiting for the loop each round would cost a wake
 * round trip per round (about 250 us here); per batch it is one wait.
 */
#define POOL 512

/*
 * An outside witness of the shutdowns the loop makes, not the library's
 * word for them: the stress binary links with -Wl,--wrap=shutdown, so the
 * library's shutdown(2) comes here first. close_fn marks a connection's fd
 * on the loop thread just before its close starts, and the shutdown, also
 * on the loop thread, notes whether it came before or after that mark.
 * Marks are cleared when a batch is refilled: an fd number is reused only
 * once the loop finished with the batch before.
 */
#define LC_FDS 65536
enum { SHUT_NONE, SHUT_BEFORE_CLOSE, SHUT_AFTER_CLOSE };
static uint32_t lc_closing[LC_FDS];
static uint32_t lc_shut[LC_FDS];
static uint32_t lc_shut_count[LC_FDS];

int __real_shutdown(int fd, int how);

int __wrap_shutdown(int fd, int how)
{
	if (fd >= 0 && fd < LC_FDS) {
		perch__store_u32(&lc_shut[fd], perch__load_u32(&lc_closing[fd]) ? SHUT_AFTER_CLOSE
										: SHUT_BEFORE_CLOSE);
		perch__faa_u32(&lc_shut_count[fd], 1);
	}
	return __real_shutdown(fd, how);
}

uint32_t race_shutdowns_made(int fd)
{
	return fd >= 0 && fd < LC_FDS ? perch__load_u32(&lc_shut_count[fd]) : 0;
}

static int lc_fd(struct perch_conn *c)
{
	int fd = ((struct perch__sock *)c->transport)->fd;
	return fd >= 0 && fd < LC_FDS ? fd : 0;
}
#define FINALIZE_WAIT_MS 2000
#define ZC_WRITE 256 /* a referenced write's bytes: zerocopy_min is 1 on the zero-copy race's pool */

typedef __typeof__(((struct perch_loop *)0)->stats) lc_stats_t;

struct lc_state {
	struct lu_loop l;
	struct perch_listener *ls;
	int port;
	struct perch_conn *pool[POOL];
	uint32_t connected;            /* pool entries filled by the connect callbacks */
	struct perch_conn *peers[POOL];
	uint32_t accepted;
	uint32_t next;                 /* the pool entry the next round takes */
	double finish_by;              /* lu_now_ms by which the loop must have finished with the batch */
	struct perch_conn *c;          /* this round's connection */
	uint32_t at;                   /* its pool index */
	struct task_reader readers[POOL];    /* each round's listener lives until its batch is judged */
	struct counting_flusher flushers[POOL];
	int rcs[POOL];
	uint64_t rounds[POOL];
	bool flush_race;
	bool pipe_race;                /* the round reads or flushes through a pipe adapter */
	bool shut_race;                /* the round shuts the write side down */
	bool order_race;               /* the round flushes, and shuts down once it may */
	int shut_rc;                   /* the shutdown's, in the order race (s->rc is the flush's) */
	bool saw_in_flight;            /* the shutdown was refused while the kernel held the flush */
	uint32_t peer_by_port[65536];  /* the order race's judge: peers[] index + 1 by remote port */
	struct perch_pipe_reader *preaders[POOL];
	struct perch_pipe_writer *pwriters[POOL];
	struct perch_vtask_handle tasks[POOL];
	bool broken[POOL];             /* judged broken already: leaked, not judged again */
	struct race *race;             /* for the batch judgement (set by the judge) */
	struct perch_read_result res;
	int rc;
	struct perch_conn_opts copts;  /* the pool's connections' */
	lc_stats_t stats;              /* the loop's, copied on its thread */
	bool zc_race;                  /* the round flushes a referenced write, sent zero-copy */
	struct lc_ref {
		uint32_t releases;
		uint32_t *deliveries;      /* the round's flusher's */
		uint32_t after_delivery;   /* the release came after the flush was signalled */
		uint8_t bytes[ZC_WRITE];
	} refs[POOL];
};

static bool judge_late(struct race *r, struct lc_state *s, uint32_t i);

static void map_peers(struct lc_state *s);

static void lc_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct lc_state *s = arg;
	uint32_t i = perch__load_u32(&s->accepted);
	s->peers[i] = c;
	perch__store_u32(&s->accepted, i + 1);
}

static void lc_connected(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct lc_state *s = arg;
	if (result != 0) {
		fprintf(stderr, "race_loop_close: connect failed: %d\n", result);
		abort();
	}
	uint32_t i = perch__load_u32(&s->connected);
	s->pool[i] = c;
	perch__store_u32(&s->connected, i + 1);
}

static void wait_count(uint32_t *counter, uint32_t want)
{
	unsigned spins = 0;
	while (perch__load_u32(counter) < want)
		race_spin_pause(&spins);
}

static void release_peers(struct lc_state *s)
{
	for (uint32_t i = 0; i < perch__load_u32(&s->accepted); i++)
		perch_conn_release(s->peers[i]);
	perch__store_u32(&s->accepted, 0);
}

/* The loop's part of each round of the batch: see judge_late. */
static void judge_batch(struct lc_state *s)
{
	if (s->order_race && s->race)
		map_peers(s);
	s->finish_by = lu_now_ms() + FINALIZE_WAIT_MS;
	for (uint32_t i = 0; i < s->next && s->race; i++) {
		if (!judge_late(s->race, s, i))
			continue; /* leaked on purpose: freeing it could race the loop */
		perch_pipe_reader_free(s->preaders[i]);
		perch_pipe_writer_free(s->pwriters[i]);
		s->preaders[i] = NULL;
		s->pwriters[i] = NULL;
		perch_conn_release(s->pool[i]);
	}
}

static void refill(struct lc_state *s)
{
	judge_batch(s);
	release_peers(s);
	perch__store_u32(&s->connected, 0);
	for (int i = 0; i < POOL; i++)
		if (perch_connect(s->l.loop, "127.0.0.1", s->port, &s->copts, lc_connected, s) != 0)
			abort();
	wait_count(&s->connected, POOL);
	wait_count(&s->accepted, POOL);
	for (int i = 0; i < POOL; i++) {
		perch__store_u32(&lc_closing[lc_fd(s->pool[i])], 0);
		perch__store_u32(&lc_shut[lc_fd(s->pool[i])], SHUT_NONE);
	}
	s->next = 0;
}

/* A loop of `lopts` (NULL: PERCH_BACKEND picks the backend) with a listener, its pool to be filled. */
static struct lc_state *lc_start(const struct perch_loop_opts *lopts)
{
	struct lc_state *s = calloc(1, sizeof(*s));
	if (lu_start(&s->l, lopts) != 0 ||
	    perch_listen(s->l.loop, "127.0.0.1", 0, NULL, lc_accept, s, &s->ls) != 0) {
		fprintf(stderr, "race_loop_close: no loop or listener\n");
		abort();
	}
	s->port = perch_listener_port(s->ls);
	s->next = POOL;
	/* PERCH_BACKEND picks the backend: ./dev test runs these races on each. */
	fprintf(stderr, "race_loop_close: on %s\n", perch_loop_backend_name(s->l.loop));
	return s;
}

static void *lc_create(void)
{
	return lc_start(NULL);
}

/* The zero-copy race's: the pool's connections send every referenced write zero-copy where the loop can. */
static void *lc_create_zc(void)
{
	/* io_uring whatever PERCH_BACKEND says: only it sends zero-copy. */
	struct lc_state *s = lc_start(&(struct perch_loop_opts){ .backend = PERCH_BACKEND_URING });
	s->copts.zerocopy_min = 1;
	return s;
}

static void lc_copy_stats(void *arg)
{
	struct lc_state *s = arg;
	s->stats = s->l.loop->stats;
}

/* A zero-copy race that sent nothing zero-copy proved nothing: a kernel without SEND_ZC fails it. */
static void lc_judge_zc_sends(struct lc_state *s)
{
	if (!s->race || lu_on_loop(&s->l, lc_copy_stats, s) != 0)
		return;
	lc_stats_t st = s->stats;
	fprintf(stderr, "race_loop_close: %llu zero-copy sends, %llu notifications\n",
		(unsigned long long)st.zerocopy_sends, (unsigned long long)st.zerocopy_notifs);
	if (st.zerocopy_sends == 0)
		race_fail(s->race, 0, "no send went zero-copy (the kernel %s SEND_ZC)",
			  st.zerocopy_available ? "has" : "lacks");
}

static void lc_destroy(void *p)
{
	struct lc_state *s = p;
	judge_batch(s);
	if (s->zc_race)
		lc_judge_zc_sends(s);
	for (uint32_t i = s->next; i < POOL; i++)
		perch_conn_release(s->pool[i]);
	release_peers(s);
	lu_stop(&s->l);
	free(s);
}

/*
 * Does a little work, then readies the task, as an adapter's on_parking
 * would: the claim is held meanwhile, which is the window a close can mark.
 * (Typed after task_reader_parking, whatever on_parking returns.)
 */
static __typeof__(task_reader_parking(NULL, NULL)) lc_reader_parking(struct perch_recv_listener *l,
								     struct perch_conn *c)
{
	race_busy_work();
	return task_reader_parking(l, c);
}

static void lc_setup(void *p, uint64_t round)
{
	struct lc_state *s = p;
	if (s->next == POOL)
		refill(s);
	s->at = s->next++;
	s->c = s->pool[s->at];
	task_reader_reset(&s->readers[s->at]);
	s->readers[s->at].l.on_parking = lc_reader_parking;
	s->flushers[s->at] = (struct counting_flusher)COUNTING_FLUSHER;
	s->rounds[s->at] = round;
	s->broken[s->at] = false;
	memset(&s->res, 0, sizeof(s->res));
	s->rc = 0;
}

static void lc_setup_staged(void *p, uint64_t round)
{
	struct lc_state *s = p;
	lc_setup(p, round);
	s->flush_race = true;
	perch_conn_write(s->c, "x", 1);
}

static void lc_ref_released(void *arg, const void *data, size_t len)
{
	struct lc_ref *ref = arg;
	perch__store_u32(&ref->after_delivery, perch__load_u32(ref->deliveries) > 0);
	perch__faa_u32(&ref->releases, 1);
}

static void lc_setup_zc(void *p, uint64_t round)
{
	struct lc_state *s = p;
	lc_setup(p, round);
	s->flush_race = s->zc_race = true;
	struct lc_ref *ref = &s->refs[s->at];
	perch__store_u32(&ref->releases, 0);
	perch__store_u32(&ref->after_delivery, 0);
	ref->deliveries = &s->flushers[s->at].deliveries;
	if (perch_conn_write_ref(s->c, ref->bytes, ZC_WRITE, lc_ref_released, ref) != 0)
		abort();
}

static void lc_setup_pipe_reader(void *p, uint64_t round)
{
	struct lc_state *s = p;
	lc_setup(p, round);
	s->pipe_race = true;
	if (perch_pipe_reader_new(s->c, &s->preaders[s->at]) != 0)
		abort();
}

static void lc_setup_pipe_writer(void *p, uint64_t round)
{
	struct lc_state *s = p;
	lc_setup(p, round);
	s->pipe_race = s->flush_race = true;
	if (perch_pipe_writer_new(s->c, &s->pwriters[s->at]) != 0 ||
	    perch_pipe_write(s->pwriters[s->at], "x", 1) != 0)
		abort();
}

static void lc_setup_shut(void *p, uint64_t round)
{
	struct lc_state *s = p;
	lc_setup(p, round);
	s->shut_race = true;
}

#define ORDER_BYTES 64
#define ORDER_SPIN_MS 2000

/* Byte i of round `round`'s message: a FIN before any of them, or a byte of another round, shows. */
static uint8_t order_byte(uint64_t round, size_t i)
{
	return (uint8_t)(round * 131u + i * 7u + 1u);
}

static void lc_setup_order(void *p, uint64_t round)
{
	struct lc_state *s = p;
	uint8_t msg[ORDER_BYTES];
	lc_setup(p, round);
	s->order_race = true;
	s->shut_rc = 1;
	s->saw_in_flight = false;
	for (size_t i = 0; i < ORDER_BYTES; i++)
		msg[i] = order_byte(round, i);
	if (perch_conn_write(s->c, msg, sizeof(msg)) != 0)
		abort();
	/* The writer flushes, then (its next call) shuts down: the race is the loop's send against it. */
	s->rc = perch_conn_try_flush_or_park(s->c, &s->flushers[s->at].l);
}

/* The other side of the race: the loop completing the send (it signals the flusher). */
static void wait_for_the_send(void *p, uint64_t round)
{
	struct lc_state *s = p;
	double deadline = lu_now_ms() + ORDER_SPIN_MS;
	for (unsigned n = 0; !perch__load_u32(&s->flushers[s->at].deliveries); n++)
		if ((n & 1023) == 1023 && lu_now_ms() > deadline)
			break;
}

/*
 * A proxy passing an end on as soon as it may, the writer's next call after
 * its flush: it retries while the kernel holds the flush (-EBUSY), for at
 * most ORDER_SPIN_MS.
 */
static void shutdown_once_it_may(void *p, uint64_t round)
{
	struct lc_state *s = p;
	double deadline = lu_now_ms() + ORDER_SPIN_MS;
	int rc;
	for (unsigned n = 0; (rc = perch_conn_shutdown(s->c)) == -EBUSY; n++) {
		if (perch__load_u32(&s->c->flush_armed))
			s->saw_in_flight = true;
		if ((n & 1023) == 1023 && lu_now_ms() > deadline)
			break;
	}
	s->shut_rc = rc;
}

static void shutdown_off_loop(void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->rc = perch_conn_shutdown(s->c);
}

static void close_fn(void *c)
{
	perch__store_u32(&lc_closing[lc_fd(c)], 1);
	perch_conn_close(c);
}

/*
 * The close runs on the loop, where a posted shutdown may find the socket
 * closing: the window is the loop's wake, not the few instructions between
 * the core's check and its post.
 */
static void close_on_loop(void *p, uint64_t round)
{
	struct lc_state *s = p;
	if (perch_loop_post(s->l.loop, close_fn, s->c) != 0)
		abort();
}

static void pipe_read_off_loop(void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->rc = perch_pipe_read(s->preaders[s->at], &s->res, &s->tasks[s->at]);
}

static void pipe_flush_off_loop(void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->rc = perch_pipe_flush(s->pwriters[s->at], &s->tasks[s->at]);
}

static void read_off_loop(void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->rc = perch_conn_try_read_or_park(s->c, &s->readers[s->at].l, &s->res);
}

static void flush_off_loop(void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->rc = perch_conn_try_flush_or_park(s->c, &s->flushers[s->at].l);
}

static void close_off_loop(void *p, uint64_t round)
{
	perch_conn_close(((struct lc_state *)p)->c);
}

#define ZC_CLOSE_WAIT_SPINS 256

/*
 * The zero-copy race's close: every other round it first waits (a bounded
 * spin that gives the CPU away) for the flush's signal, so the close often
 * comes between the send's completion and its notification, the window
 * the hold is for; the other rounds close at once, against the flush.
 */
static void close_at_once_or_once_sent(void *p, uint64_t round)
{
	struct lc_state *s = p;
	unsigned spins = 0;
	bool wait = round & 1;
	for (int i = 0; wait && i < ZC_CLOSE_WAIT_SPINS; i++) {
		if (perch__load_u32(&s->flushers[s->at].deliveries))
			break;
		race_spin_pause(&spins);
	}
	perch_conn_close(s->c);
}

/*
 * A referenced write's memory goes back exactly once, whoever ended its
 * use: the flush refused, the close cancelling the send, or the kernel's
 * notification after the send, which may come after the socket is gone.
 * A plain send's chain is released before its flush is signalled; a
 * zero-copy send's only once its notification came, after the signal: a
 * send that completed (0) and a release after that signal is the zero-copy
 * hold at work (the named window). A close's -EPIPE signal can come before
 * a cancelled plain send gives its chain back, so those rounds do not count.
 */
static void judge_zc_late(struct race *r, struct lc_state *s, uint32_t i)
{
	struct lc_ref *ref = &s->refs[i];
	double deadline = lu_now_ms() + FINALIZE_WAIT_MS;
	while (perch__load_u32(&ref->releases) == 0 && lu_now_ms() < deadline)
		usleep(100);
	uint32_t n = perch__load_u32(&ref->releases);
	if (n != 1)
		race_fail(r, s->rounds[i], "the referenced write was released %u times", n);
	else if (s->rcs[i] == PERCH_PENDING && s->flushers[i].last_result == 0 &&
		 perch__load_u32(&ref->after_delivery))
		race_branch(r, 4);
}

/*
 * The loop has finished with a connection when only the users' references
 * are left (the caller's, and a pipe adapter's): the socket left the table
 * and every send handed over got its send_done. False when that had not
 * happened by *deadline (lu_now_ms), the batch's: each connection found
 * finished renews it, so a slow loop (or a slow judge) gets
 * FINALIZE_WAIT_MS from the last progress; the first connection the loop
 * never finished sets it to 0, so the batch's others the loop never
 * finished fail at once, not after FINALIZE_WAIT_MS each.
 */
static bool loop_finished(struct race *r, struct perch_conn *c, uint32_t users, uint64_t round,
			  double *deadline)
{
	unsigned spins = 0;
	while (perch__load_u32(&c->refs) != users) {
		race_spin_pause(&spins);
		if (lu_now_ms() > *deadline) {
			race_fail(r, round, "the loop never finished with the connection (%u references left)",
				  perch__load_u32(&c->refs));
			*deadline = 0;
			return false;
		}
	}
	if (*deadline > 0)
		*deadline = lu_now_ms() + FINALIZE_WAIT_MS;
	return true;
}

/*
 * Waits (bounded) for a parked pipe read's or flush's task: the close or
 * the loop completes it. Returns its result, or a round failure.
 */
static bool pipe_task_completes(struct race *r, struct perch_vtask_handle h, uint64_t round,
				int64_t *result)
{
	int rc = perch_vtask_wait(h, FINALIZE_WAIT_MS, result);
	if (rc == 0)
		return true;
	race_fail(r, round, "the parked read or flush never completed (%d)", rc);
	return false;
}

/* The task still holds the result it completed with, and a pipe read still says closed. */
static bool judge_pipe_late(struct race *r, struct lc_state *s, uint32_t i)
{
	uint64_t round = s->rounds[i];
	int64_t result = 0;
	if (s->rcs[i] == PERCH_PENDING && perch_vtask_result(s->tasks[i], &result) != 0) {
		race_fail(r, round, "the task was readied again once the loop finished");
		return true;
	}
	if (s->flush_race)
		return true;
	struct perch_read_result after;
	struct perch_vtask_handle h;
	if (perch_pipe_read(s->preaders[i], &after, &h) != 0 || !after.closed || after.error)
		race_fail(r, round, "once the loop finished, the pipe read does not say closed");
	else
		perch_pipe_advance_to(s->preaders[i], 0, 0);
	return true;
}

/*
 * Once the loop is done (the posted shutdown's reference came back, so it
 * ran), by the witness: a refused shutdown made no shutdown(2); an accepted
 * one shut the socket before its close started, or made none (it found the
 * socket closing: the named window). Never a shutdown(2) after the close
 * started: the fd may be closed, or another connection's by then.
 */
static bool judge_shut_late(struct race *r, struct lc_state *s, uint32_t i)
{
	uint64_t round = s->rounds[i];
	uint32_t shut = perch__load_u32(&lc_shut[lc_fd(s->pool[i])]);
	if (shut == SHUT_AFTER_CLOSE)
		race_fail(r, round, "shutdown(2) after the close started (rc %d)", s->rcs[i]);
	else if (s->rcs[i] == -EPIPE && shut != SHUT_NONE)
		race_fail(r, round, "refused with -EPIPE, yet the loop shut the socket");
	else if (s->rcs[i] == 0)
		race_branch(r, shut == SHUT_BEFORE_CLOSE ? 1 : 2);
	return true;
}

/* The peers of this batch by their remote port: the pool's connections' local ports. */
static void map_peers(struct lc_state *s)
{
	memset(s->peer_by_port, 0, sizeof(s->peer_by_port));
	for (uint32_t j = 0; j < perch__load_u32(&s->accepted); j++) {
		struct sockaddr_in a;
		socklen_t len = sizeof(a);
		if (getpeername(lc_fd(s->peers[j]), (struct sockaddr *)&a, &len) == 0)
			s->peer_by_port[ntohs(a.sin_port)] = j + 1;
	}
}

static struct perch_conn *peer_of(struct lc_state *s, struct perch_conn *c)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	if (getsockname(lc_fd(c), (struct sockaddr *)&a, &len) != 0)
		return NULL;
	uint32_t j = s->peer_by_port[ntohs(a.sin_port)];
	return j ? s->peers[j - 1] : NULL;
}

/*
 * The peer reads the round's ORDER_BYTES bytes, in order, then the end;
 * the flush was delivered once, with 0. Bounded: a lost FIN fails.
 */
static bool judge_order_late(struct race *r, struct lc_state *s, uint32_t i)
{
	uint64_t round = s->rounds[i];
	struct perch_conn *peer = peer_of(s, s->pool[i]);
	size_t got = 0;
	bool ended = false;
	double deadline = lu_now_ms() + FINALIZE_WAIT_MS;
	while (peer && !ended && lu_now_ms() < deadline) {
		struct perch_read_result res;
		if (perch_conn_try_read(peer, &res) != 0) {
			usleep(100);
			continue;
		}
		size_t off = res.first_off, n = 0;
		for (struct perch_seg *g = res.first; g && n < res.len; g = g->next, off = 0)
			for (; off < g->len && n < res.len; off++, n++)
				if (got + n >= ORDER_BYTES || g->data[off] != order_byte(round, got + n))
					race_fail(r, round, "the peer's byte %zu is wrong", got + n);
		got += n;
		ended = res.completed || res.error || res.closed;
		if (ended && (!res.completed || got != ORDER_BYTES))
			race_fail(r, round, "the peer saw %zu bytes, then completed=%d error=%d closed=%d",
				  got, res.completed, res.error, res.closed);
		perch_conn_advance(peer, res.len, res.len);
	}
	if (!ended)
		race_fail(r, round, "no end reached the peer (%zu bytes, peer %s)", got,
			  peer ? "found" : "not found");
	if (perch__load_u32(&s->flushers[i].deliveries) != 1 || s->flushers[i].last_result != 0)
		race_fail(r, round, "the flush was delivered %u times (last %d)",
			  s->flushers[i].deliveries, s->flushers[i].last_result);
	return ended;
}

/* Once the loop is done: still exactly one delivery; a read sees only "closed". */
static bool judge_late(struct race *r, struct lc_state *s, uint32_t i)
{
	uint64_t round = s->rounds[i];
	if (s->broken[i])
		return false;   /* a lost delivery would keep a pipe reader's free waiting */
	if (s->order_race)
		return judge_order_late(r, s, i); /* still open: the loop has not finished with it */
	/* The caller's reference, and a pipe adapter's. */
	uint32_t users = 1 + (s->preaders[i] != NULL) + (s->pwriters[i] != NULL);
	if (!loop_finished(r, s->pool[i], users, round, &s->finish_by))
		return false;
	if (s->shut_race)
		return judge_shut_late(r, s, i);
	if (s->pipe_race)
		return judge_pipe_late(r, s, i);
	if (s->flush_race) {
		struct counting_flusher *f = &s->flushers[i];
		uint32_t want = s->rcs[i] == PERCH_PENDING ? 1 : 0;
		if (f->deliveries != want)
			race_fail(r, round, "flush (rc %d) delivered %u times once the loop finished",
				  s->rcs[i], f->deliveries);
		else if (want)
			race_branch(r, f->last_result == 0 ? 2 : 1);
		if (s->zc_race)
			judge_zc_late(r, s, i);
		return true;
	}
	struct perch_read_result after;
	uint32_t want = s->rcs[i] == PERCH_PENDING ? 1 : 0;
	if (s->readers[i].deliveries != want || perch_conn_try_read(s->pool[i], &after) != 0 ||
	    !after.closed || after.completed || after.error)
		race_fail(r, round, "once the loop finished: %u deliveries, completed=%d error=%d",
			  s->readers[i].deliveries, after.completed, after.error);
	return true;
}

static bool judge_read_vs_close(struct race *r, void *p, uint64_t round)
{
	struct lc_state *s = p;
	struct task_reader *rd = &s->readers[s->at];
	s->race = r;
	s->rcs[s->at] = s->rc;
	if (s->rc == 0) {
		race_branch(r, 0);
		if (rd->deliveries != 0 || !s->res.closed) {
			race_fail(r, round, "served at once (closed=%d) and delivered %u times", s->res.closed,
				  rd->deliveries);
			return false;
		}
		return true;
	}
	if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "read returned %d", s->rc);
		return false;
	}
	race_branch(r, rd->delivered_by == 1 ? 1 : 2);
	if (rd->deliveries != 1 || !task_reader_woke(rd)) {
		race_fail(r, round, "parked read delivered %u times", rd->deliveries);
		return false;
	}
	return true;
}

static bool judge_flush_vs_close(struct race *r, void *p, uint64_t round)
{
	struct lc_state *s = p;
	struct counting_flusher *f = &s->flushers[s->at];
	s->race = r;
	s->rcs[s->at] = s->rc;
	if (s->rc == -EPIPE) {
		race_branch(r, 0);
		if (f->deliveries != 0) {
			race_fail(r, round, "refused with -EPIPE and delivered %u times", f->deliveries);
			return false;
		}
		return true;
	}
	if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "flush returned %d", s->rc);
		return false;
	}
	/*
	 * Delivered by close (-EPIPE) or by the loop's send completion (0),
	 * which may still be running: only the count is read now; which one
	 * delivered is counted when the batch is judged.
	 */
	uint32_t d = perch__load_u32(&f->deliveries);
	if (d == 0)
		race_branch(r, 3);
	if (d > 1) {
		race_fail(r, round, "parked flush delivered %u times", d);
		return false;
	}
	return true;
}

static bool judge_pipe_read_once(struct race *r, struct lc_state *s, uint64_t round);
static bool judge_pipe_flush_once(struct race *r, struct lc_state *s, uint64_t round);

/* A broken round's adapter and connection are leaked, never judged or freed again. */
static bool judge_pipe_read_vs_close(struct race *r, void *p, uint64_t round)
{
	struct lc_state *s = p;
	bool ok = judge_pipe_read_once(r, s, round);
	s->broken[s->at] = !ok;
	return ok;
}

static bool judge_pipe_flush_vs_close(struct race *r, void *p, uint64_t round)
{
	struct lc_state *s = p;
	bool ok = judge_pipe_flush_once(r, s, round);
	s->broken[s->at] = !ok;
	return ok;
}

static bool judge_pipe_read_once(struct race *r, struct lc_state *s, uint64_t round)
{
	struct perch_pipe_reader *rd = s->preaders[s->at];
	int64_t result = -1;
	s->race = r;
	s->rcs[s->at] = s->rc;
	if (s->rc == 0) {
		race_branch(r, 0);
	} else if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "pipe read returned %d", s->rc);
		return false;
	} else {
		race_branch(r, 1);
		if (!pipe_task_completes(r, s->tasks[s->at], round, &result))
			return false;
		if (result != 0 || perch_pipe_read(rd, &s->res, &s->tasks[s->at]) != 0) {
			race_fail(r, round, "completed with %lld, and no result to read", (long long)result);
			return false;
		}
	}
	if (!s->res.closed || s->res.completed || s->res.error) {
		race_fail(r, round, "the read does not report the close (closed=%d completed=%d error=%d)",
			  s->res.closed, s->res.completed, s->res.error);
		return false;
	}
	return perch_pipe_advance_to(rd, 0, 0) == 0;
}

static bool judge_pipe_flush_once(struct race *r, struct lc_state *s, uint64_t round)
{
	int64_t result = 1;
	s->race = r;
	s->rcs[s->at] = s->rc;
	if (s->rc == -EPIPE) {
		race_branch(r, 0);
		return true;
	}
	if (s->rc != PERCH_PENDING) {
		race_fail(r, round, "pipe flush returned %d", s->rc);
		return false;
	}
	if (!pipe_task_completes(r, s->tasks[s->at], round, &result))
		return false;
	race_branch(r, result == 0 ? 2 : 1);
	if (result != 0 && result != -EPIPE) {
		race_fail(r, round, "flush completed with %lld", (long long)result);
		return false;
	}
	return true;
}

static bool judge_order(struct race *r, void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->race = r;
	s->rcs[s->at] = s->rc;
	if (s->rc != PERCH_PENDING || s->shut_rc != 0) {
		race_fail(r, round, "flush %d, then shutdown %d (want a parked flush, then 0)", s->rc,
			  s->shut_rc);
		s->broken[s->at] = true;
		return false;
	}
	race_branch(r, s->saw_in_flight ? 1 : 0);
	return true;
}

static bool judge_shutdown_vs_close(struct race *r, void *p, uint64_t round)
{
	struct lc_state *s = p;
	s->race = r;
	s->rcs[s->at] = s->rc;
	if (s->rc == -EPIPE) {
		race_branch(r, 0);
		return true;
	}
	if (s->rc != 0) {
		race_fail(r, round, "shutdown returned %d", s->rc);
		return false;
	}
	return true;
}

const struct race_def race_loop_shutdown_vs_close = {
	.name = "loop_close: an off-loop shutdown races a close on the loop; never a shutdown after it",
	.actors = 2, .outside_thread = true, .create = lc_create, .destroy = lc_destroy, .setup = lc_setup_shut,
	.actor = { shutdown_off_loop, close_on_loop }, .judge = judge_shutdown_vs_close,
	.branch_names = { "refused at once (-EPIPE)", "shut before the close",
			  "posted, found the socket closing (no shutdown(2))" },
	.window_branch = 3,
};

const struct race_def race_loop_shutdown_vs_flush = {
	.name = "loop_close: a shutdown retried while the kernel holds the flush; the end comes last",
	.actors = 2, .outside_thread = true, .create = lc_create, .destroy = lc_destroy, .setup = lc_setup_order,
	.actor = { shutdown_once_it_may, wait_for_the_send }, .judge = judge_order,
	.branch_names = { "shut once the flush had completed",
			  "refused while the kernel held the flush, then shut" },
	.window_branch = 2,
	.free_only = "its window is a real loop's thread completing the send, which no scheduler "
		     "drives (on one core it ran 95 times in 80,000 scheduled rounds); "
		     "'flush_arm: a shutdown retried while the send is out' is the same window "
		     "with the fake transport as the kernel, scheduled and exhaustive",
};

const struct race_def race_loop_pipe_read_vs_close = {
	.name = "loop_close: a pipe read off the loop races close, completes, says closed",
	.actors = 2, .outside_thread = true, .create = lc_create, .destroy = lc_destroy, .setup = lc_setup_pipe_reader,
	.actor = { pipe_read_off_loop, close_off_loop }, .judge = judge_pipe_read_vs_close,
	.branch_names = { "served at once (closed)", "parked, completed by the close" },
};

const struct race_def race_loop_pipe_flush_vs_close = {
	.name = "loop_close: a pipe flush off the loop races close and completes",
	.actors = 2, .outside_thread = true, .create = lc_create, .destroy = lc_destroy, .setup = lc_setup_pipe_writer,
	.actor = { pipe_flush_off_loop, close_off_loop }, .judge = judge_pipe_flush_vs_close,
	.branch_names = { "refused at once (-EPIPE)", "parked, completed -EPIPE",
			  "parked, the send completed first (0)" },
};

const struct race_def race_loop_read_vs_close = {
	.name = "loop_close: off-loop read races close",
	.actors = 2, .outside_thread = true, .create = lc_create, .destroy = lc_destroy, .setup = lc_setup,
	.actor = { read_off_loop, close_off_loop }, .judge = judge_read_vs_close,
	.branch_names = { "served at once (closed)", "parked, close delivered",
			  "parked, delivered on the reader's thread" },
};

/* judge_flush_vs_close's branches (and judge_late's), shared by the flush races. */
#define LOOP_FLUSH_VS_CLOSE_BRANCHES                                                              \
	"refused at once (-EPIPE)", "parked, close signalled -EPIPE", "parked, the send completed first", \
		"parked, unsignalled when the round ended"

const struct race_def race_loop_flush_vs_close = {
	.name = "loop_close: off-loop flush races close",
	.actors = 2, .outside_thread = true, .create = lc_create, .destroy = lc_destroy, .setup = lc_setup_staged,
	.actor = { flush_off_loop, close_off_loop }, .judge = judge_flush_vs_close,
	.branch_names = { LOOP_FLUSH_VS_CLOSE_BRANCHES },
};

const struct race_def race_loop_zc_flush_vs_close = {
	.name = "loop_zerocopy: a zero-copy write's flush races close; released once",
	.actors = 2, .outside_thread = true, .create = lc_create_zc, .destroy = lc_destroy, .setup = lc_setup_zc,
	.actor = { flush_off_loop, close_at_once_or_once_sent }, .judge = judge_flush_vs_close,
	.branch_names = { LOOP_FLUSH_VS_CLOSE_BRANCHES,
			  "sent, released after the flush's signal (held for the notification)" },
	.window_branch = 5,
};
