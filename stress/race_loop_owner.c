/* stress/race_loop_owner.c: two threads start a new loop at the same moment: exactly one owns it. */
/*
 * Judged by stress/harness.c: the race fails unless its two halves
 * overlapped in at least 1,000 of 200,000 rounds (the overlap floor, scaled
 * with PERCH_STRESS_ROUNDS) and, in every round, exactly one turn ran and
 * the other was refused with -EEXIST. Mutant 62 (the claim as a load, then
 * a store) makes it fail: both threads own the loop and both run it.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>

#include <perch.h>

#include "harness.h"

struct owner_state {
	struct perch_loop *loop;
	int rc[2];
	uint64_t order, began[2];      /* which turn began first (a ticket each) */
};

static void *owner_create(void)
{
	return calloc(1, sizeof(struct owner_state));
}

static void owner_destroy(void *p)
{
	struct owner_state *s = p;
	perch_loop_free(s->loop);
	free(s);
}

/*
 * A fresh loop each round: epoll (no ring bound to a thread) with a tiny
 * buffer pool, so cheap to make. The last round's loop is freed here, on
 * the harness's thread, which may not be the one that ran it: safe for
 * this loop alone (no socket, nothing posted, no thread binding), and the
 * round's barrier orders the free after the owner's last touch.
 */
static void owner_setup(void *p, uint64_t round)
{
	struct owner_state *s = p;
	const struct perch_loop_opts opts = { .backend = PERCH_BACKEND_EPOLL, .buf_count = 2, .buf_size = 4096 };
	perch_loop_free(s->loop);
	s->loop = NULL;
	if (perch_loop_new(&opts, &s->loop) != 0)
		abort();
	s->rc[0] = s->rc[1] = 1;
}

static void first_turn(void *p, uint64_t round)
{
	struct owner_state *s = p;
	int me = race_current_actor();
	s->began[me] = __atomic_fetch_add(&s->order, 1, __ATOMIC_SEQ_CST);
	s->rc[me] = perch_loop_run_once(s->loop, 0);
}

static bool one_owner(struct race *r, void *p, uint64_t round)
{
	struct owner_state *s = p;
	int ran = (s->rc[0] >= 0) + (s->rc[1] >= 0);
	int refused = (s->rc[0] == -EEXIST) + (s->rc[1] == -EEXIST);
	int owner = s->rc[0] >= 0 ? 0 : 1;
	race_branch(r, owner);
	/* The narrow window: the refused turn began first, so the whole claim fell inside it. */
	if (s->began[1 - owner] < s->began[owner])
		race_branch(r, 2);
	if (ran == 1 && refused == 1)
		return true;
	race_fail(r, round, "turns %d and %d: %d ran, %d refused", s->rc[0], s->rc[1], ran, refused);
	return false;
}

const struct race_def race_loop_owner_claim = {
	.name = "loop_owner: two threads start a new loop at once; one owns it",
	.actors = 2,
	.exhaustive = true,
	.create = owner_create,
	.destroy = owner_destroy,
	.setup = owner_setup,
	.actor = { first_turn, first_turn },
	.judge = one_owner,
	.branch_names = { "actor 0 owns it", "actor 1 owns it", "the refused turn began first" },
};
