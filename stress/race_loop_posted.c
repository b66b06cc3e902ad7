/* stress/race_loop_posted.c: a shutdown and a close posted from another thread while the loop takes its posted calls. */
/*
 * The loop here is run by the race's actor 0 (its main actor, whose thread
 * also sets each round up and judges it), so in the scheduled suite the
 * loop's own steps are scheduling points like the poster's: a call posted
 * between two of them is a schedule the suite chooses, not a nanosecond
 * real threads must meet in.
 *
 * Judged by stress/harness.c: at least 1,000 of 200,000 rounds overlap;
 * scheduled, at least 1,000 rounds have the close posted while the loop
 * runs the shutdown (the named window: the loop counts a run that finds a
 * call posted when it ends); and in every round both calls are made:
 * one shutdown(2) on the socket (the stress binary's wrap counts them),
 * the socket closed (its peer's write fails with EPIPE), and the posted
 * calls' references given back (only the adoption's is left). Mutant 484
 * (the calls read, then cleared: a call posted between the two is lost)
 * loses the close; 486 (the shutdown's reference kept) and 487 (a run
 * makes only the first call it took) fail the other checks.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <perch.h>

#include "../lib/atomic.h"
#include "../lib/backend.h"
#include "race_conn.h"

#define DRAIN_TURNS 2000 /* the judge's turns for the loop to finish the round's calls (each up to 1 ms) */

struct lp_state {
	struct perch_loop *loop;
	struct perch_conn *c;      /* this round's connection (the adoption's reference) */
	int fd;                    /* its socket (adopted: perch closes it) */
	int peer;                  /* the other end of its socket pair */
	uint32_t posted;           /* 1 once actor 1 made both calls */
	int shut_rc, close_rc;
	uint32_t shutdowns_before; /* race_shutdowns_made on the adopted fd, at the round's start */
	uint64_t together_seen;    /* loop->stats.posted_together at the round's start */
	uint64_t during_seen;      /* loop->stats.posted_during_run at the round's start */
};

static void lp_adopted(struct perch_loop *loop, struct perch_conn *c, int result, void *arg)
{
	struct lp_state *s = arg;
	if (result != 0) {
		fprintf(stderr, "race_loop_posted: adoption failed: %d\n", result);
		abort();
	}
	s->c = c;
}

static void *lp_create(void)
{
	struct lp_state *s = calloc(1, sizeof(*s));
	const struct perch_loop_opts opts = { .buf_count = 4, .buf_size = 4096 };
	if (!s || perch_loop_new(&opts, &s->loop) != 0) {
		fprintf(stderr, "race_loop_posted: no loop\n");
		abort();
	}
	s->peer = -1;
	/* PERCH_BACKEND picks the backend: ./dev test runs the races on each. */
	fprintf(stderr, "race_loop_posted: on %s\n", perch_loop_backend_name(s->loop));
	return s;
}

/* The last round's connection and peer go; its close was judged made. */
static void lp_release(struct lp_state *s)
{
	if (s->c)
		perch_conn_release(s->c);
	s->c = NULL;
	if (s->peer >= 0)
		close(s->peer);
	s->peer = -1;
}

static void lp_destroy(void *p)
{
	struct lp_state *s = p;
	lp_release(s);
	perch_loop_free(s->loop); /* on the main actor's thread, which ran it */
	free(s);
}

/* Turns the loop until done(s) holds; false when DRAIN_TURNS were not enough. */
static bool turn_until(struct lp_state *s, bool (*done)(struct lp_state *s))
{
	for (int turns = 0; !done(s); turns++)
		if (turns == DRAIN_TURNS || perch_loop_run_once(s->loop, 1) < 0)
			return false;
	return true;
}

static bool adopted(struct lp_state *s)
{
	return s->c != NULL;
}

/* Whether the socket is closed: the peer's write fails with EPIPE (a shutdown alone lets it through). */
static bool close_made(struct lp_state *s)
{
	return send(s->peer, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EPIPE;
}

/* On the main actor, which owns the loop: a fresh adopted connection, settled. */
static void lp_setup(void *p, uint64_t round)
{
	struct lp_state *s = p;
	int sv[2];
	lp_release(s);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ||
	    perch_conn_adopt(s->loop, sv[0], NULL, lp_adopted, s) != 0) {
		perror("race_loop_posted: socketpair or adopt");
		abort();
	}
	s->peer = sv[1];
	if (!turn_until(s, adopted)) {
		fprintf(stderr, "race_loop_posted: the adoption never ran\n");
		abort();
	}
	s->posted = 0;
	s->shut_rc = s->close_rc = 1;
	s->fd = sv[0];
	s->shutdowns_before = race_shutdowns_made(s->fd);
	s->together_seen = s->loop->stats.posted_together;
	s->during_seen = s->loop->stats.posted_during_run;
}

/* Actor 0, the loop: turns until actor 1 has posted both calls, then one more. */
static void run_the_loop(void *p, uint64_t round)
{
	struct lp_state *s = p;
	unsigned spins = 0;
	for (int turns = 0; !perch__load_u32(&s->posted) && turns < DRAIN_TURNS; turns++) {
		if (perch_loop_run_once(s->loop, 0) < 0)
			abort();
		race_spin_pause(&spins);
	}
	if (perch_loop_run_once(s->loop, 0) < 0)
		abort();
}

/* Actor 1, off the loop: a shutdown then a close, each posted to the loop. */
static void shutdown_then_close(void *p, uint64_t round)
{
	struct lp_state *s = p;
	s->shut_rc = perch_conn_shutdown(s->c);
	s->close_rc = perch_conn_close(s->c);
	perch__store_u32(&s->posted, 1);
}

/* The posted calls gave their references back: only the adoption's is left. */
static bool references_back(struct lp_state *s)
{
	return perch__load_u32(&s->c->refs) == 1;
}

static bool lp_judge(struct race *r, void *p, uint64_t round)
{
	struct lp_state *s = p;
	if (s->shut_rc != 0 || s->close_rc != 0) {
		race_fail(r, round, "shutdown returned %d, close %d", s->shut_rc, s->close_rc);
		return false;
	}
	if (!turn_until(s, close_made) || !turn_until(s, references_back)) {
		race_fail(r, round, "after %d turns the %s", DRAIN_TURNS,
			  close_made(s) ? "posted calls still hold references" : "socket is still open");
		s->c = NULL; /* leaked on purpose: the loop may still hold it */
		return false;
	}
	uint32_t shutdowns = race_shutdowns_made(s->fd) - s->shutdowns_before;
	if (shutdowns != 1) {
		race_fail(r, round, "%u shutdown(2) calls, not one", shutdowns);
		return false;
	}
	if (s->loop->stats.posted_during_run != s->during_seen)
		race_branch(r, 2);
	else
		race_branch(r, s->loop->stats.posted_together != s->together_seen ? 1 : 0);
	return true;
}

const struct race_def race_loop_posted_ride = {
	.name = "loop_posted: a shutdown and a close posted while the loop takes its calls",
	.actors = 2,
	.create = lp_create,
	.destroy = lp_destroy,
	.setup = lp_setup,
	.actor = { run_the_loop, shutdown_then_close },
	.judge = lp_judge,
	.branch_names = { "the close came once the shutdown had run", "the close rode the shutdown's message",
			  "the close was posted while the loop ran the shutdown" },
	.window_branch = 3,
	.window_needs_scheduler = true,
};
