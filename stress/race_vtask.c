/* stress/race_vtask.c: value-task races: registration vs completion, a late completion vs the next version, two registrations, a registered ready over a late registrant or a completion. */
/*
 * Every race here is judged by stress/harness.c: it fails unless its two
 * halves overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS) and every round delivered exactly once.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>

#include "atomic.h"
#include "harness.h"
#include "vtask_internal.h"

#include <perch/vtask.h>

struct tagged_arg {
	uint64_t round;
	uint32_t runs;
	int64_t result;
	uint64_t seen_round;
};

struct vt_state {
	struct perch_vtask vt;
	struct perch_vtask_handle h;
	struct tagged_arg args[2];     /* alternate per round: a stale argument is the other one */
	struct tagged_arg *arg;        /* this round's */
	uint32_t bad_args;             /* a continuation ran with an argument not its own */
	int rc;
};

static struct vt_state *the_state;

static void *vt_create(void)
{
	struct vt_state *s = calloc(1, sizeof(*s));
	perch_vtask_init(&s->vt);
	the_state = s;
	return s;
}

static void vt_destroy(void *p)
{
	free(p);
}

static void vt_setup(void *p, uint64_t round)
{
	struct vt_state *s = p;
	s->h = (struct perch_vtask_handle){ &s->vt, perch_vtask_ready(&s->vt) };
	s->arg = &s->args[round & 1];
	*s->arg = (struct tagged_arg){ .round = round };
	s->rc = 0;
}

static void continuation(void *arg, int64_t result)
{
	struct tagged_arg *a = arg;
	if (a != the_state->arg) {
		perch__faa_u32(&the_state->bad_args, 1);
		return;
	}
	perch__faa_u32(&a->runs, 1);
	a->result = result;
	a->seen_round = a->round;
}

static void register_continuation(void *p, uint64_t round)
{
	struct vt_state *s = p;
	s->rc = perch_vtask_on_complete(s->h, continuation, s->arg);
}

static void complete_task(void *p, uint64_t round)
{
	struct vt_state *s = p;
	perch_vtask_complete(&s->vt, s->h.token, (int64_t)round);
}

/* Exactly one run: registered and run once with its own argument, or told to go on inline and never run. */
static bool judge_vtask(struct race *r, void *p, uint64_t round)
{
	struct vt_state *s = p;
	int64_t result = -1;
	bool ok = perch_vtask_result(s->h, &result) == 0 && result == (int64_t)round;
	if (s->rc == PERCH_PENDING) {
		race_branch(r, 0);
		ok = ok && s->arg->runs == 1 && s->arg->result == (int64_t)round;
	} else if (s->rc == 0) {
		race_branch(r, 1);
		ok = ok && s->arg->runs == 0;
	} else {
		ok = false;
	}
	if (s->bad_args) {
		ok = false;
		s->bad_args = 0;
		race_fail(r, round, "continuation ran with another argument");
	}
	if (!ok)
		race_fail(r, round, "registration rc %d, runs %u, result %lld", s->rc, s->arg->runs,
			  (long long)result);
	return ok;
}

/* ---- a completion for the previous version lands while the owner readies the next ---- */

struct stale_state {
	struct perch_vtask vt;
	uint32_t old_token, new_token;
	int rc;
};

static void *stale_create(void)
{
	struct stale_state *s = calloc(1, sizeof(*s));
	perch_vtask_init(&s->vt);
	return s;
}

static void stale_setup(void *p, uint64_t round)
{
	struct stale_state *s = p;
	s->old_token = perch_vtask_ready(&s->vt);
	s->new_token = 0;
	s->rc = 0;
}

static void owner_readies_next(void *p, uint64_t round)
{
	struct stale_state *s = p;
	s->new_token = perch_vtask_ready(&s->vt);
}

static void late_completion(void *p, uint64_t round)
{
	struct stale_state *s = p;
	s->rc = perch_vtask_complete(&s->vt, s->old_token, 7);
}

/* The new version is pending whatever the order, and completes with its own result. */
static bool judge_stale(struct race *r, void *p, uint64_t round)
{
	struct stale_state *s = p;
	struct perch_vtask_handle cur = { &s->vt, s->new_token };
	race_branch(r, s->rc == 0 ? 0 : 1);
	bool ok = (s->rc == 0 || s->rc == -ESTALE) && perch_vtask_status(cur) == PERCH_PENDING;
	int64_t result = -1;
	ok = ok && perch_vtask_complete(&s->vt, s->new_token, 8) == 0 &&
	     perch_vtask_result(cur, &result) == 0 && result == 8;
	if (!ok)
		race_fail(r, round, "late completion rc %d; new version's result %lld", s->rc,
			  (long long)result);
	return ok;
}

const struct race_def race_vtask_stale_completion = {
	.name = "vtask: late completion races the next version",
	.actors = 2, .exhaustive = true, .create = stale_create, .destroy = vt_destroy, .setup = stale_setup,
	.actor = { owner_readies_next, late_completion }, .judge = judge_stale,
	.branch_names = { "landed before the next version", "refused as stale" },
};

/* ---- two registrations race: the refused one touches nothing ---- */

struct two_reg_state {
	struct perch_vtask vt;
	struct perch_vtask_handle h;
	uint32_t ran[2];               /* runs of each registrant's continuation */
	int rc[2];
};

static void *two_reg_create(void)
{
	struct two_reg_state *s = calloc(1, sizeof(*s));
	perch_vtask_init(&s->vt);
	return s;
}

static void two_reg_setup(void *p, uint64_t round)
{
	struct two_reg_state *s = p;
	s->h = (struct perch_vtask_handle){ &s->vt, perch_vtask_ready(&s->vt) };
	s->ran[0] = s->ran[1] = 0;
	s->rc[0] = s->rc[1] = 0;
}

static void ran_cont(void *arg, int64_t result)
{
	perch__faa_u32(arg, 1);
}

static void register_first(void *p, uint64_t round)
{
	struct two_reg_state *s = p;
	s->rc[0] = perch_vtask_on_complete(s->h, ran_cont, &s->ran[0]);
}

static void register_second(void *p, uint64_t round)
{
	struct two_reg_state *s = p;
	s->rc[1] = perch_vtask_on_complete(s->h, ran_cont, &s->ran[1]);
}

/* One registered, one refused; the completion runs the registered one's continuation only. */
static bool judge_two_reg(struct race *r, void *p, uint64_t round)
{
	struct two_reg_state *s = p;
	int won = s->rc[0] == PERCH_PENDING ? 0 : 1;
	race_branch(r, won);
	bool ok = s->rc[won] == PERCH_PENDING && s->rc[!won] == -EBUSY;
	perch_vtask_complete(&s->vt, s->h.token, 1);
	ok = ok && s->ran[won] == 1 && s->ran[!won] == 0;
	if (!ok)
		race_fail(r, round, "registrations returned %d and %d; continuations ran %u and %u times",
			  s->rc[0], s->rc[1], s->ran[0], s->ran[1]);
	return ok;
}

const struct race_def race_vtask_two_registrations = {
	.name = "vtask: two registrations race",
	.actors = 2, .exhaustive = true, .create = two_reg_create, .destroy = vt_destroy, .setup = two_reg_setup,
	.actor = { register_first, register_second }, .judge = judge_two_reg,
	.branch_names = { "first registered", "second registered" },
};

const struct race_def race_vtask_register_vs_complete = {
	.name = "vtask: registration races completion",
	.actors = 2, .exhaustive = true, .create = vt_create, .destroy = vt_destroy, .setup = vt_setup,
	.actor = { register_continuation, complete_task }, .judge = judge_vtask,
	.branch_names = { "registered, ran once", "found complete, went on inline" },
};

/* ---- the owner readies the next version registered while a registration the completion overtook still writes ---- */

struct preset_state {
	struct perch_vtask vt;
	struct perch_vtask_handle h;   /* the version being completed */
	uint32_t next;                 /* the owner's next version */
	uint32_t late_runs, next_runs; /* the other continuation (late registrant's, or registered), the owner's */
	int64_t late_result, next_result;
	int rc;
	bool not_registered;           /* the owner's ready could not register: it did afterwards */
};

static void *preset_create(void)
{
	struct preset_state *s = calloc(1, sizeof(*s));
	perch_vtask_init(&s->vt);
	return s;
}

static void preset_setup(void *p, uint64_t round)
{
	struct preset_state *s = p;
	s->h = (struct perch_vtask_handle){ &s->vt, perch_vtask_ready(&s->vt) };
	s->next = 0;
	s->late_runs = s->next_runs = 0;
	s->late_result = s->next_result = -1;
	s->rc = 0;
	s->not_registered = false;
}

static void late_cont(void *arg, int64_t result)
{
	struct preset_state *s = arg;
	perch__faa_u32(&s->late_runs, 1);
	s->late_result = result;
}

static void next_cont(void *arg, int64_t result)
{
	struct preset_state *s = arg;
	perch__faa_u32(&s->next_runs, 1);
	s->next_result = result;
}

static void late_registrant(void *p, uint64_t round)
{
	struct preset_state *s = p;
	s->rc = perch_vtask_on_complete(s->h, late_cont, s);
}

/* As a pipe's read_or_wait parks: the next version readied with its continuation, else registered after. */
static void ready_next_registered(struct preset_state *s)
{
	bool registered;
	s->next = perch__vtask_ready_registered(&s->vt, next_cont, s, &registered);
	if (registered)
		return;
	s->not_registered = true;
	perch_vtask_on_complete((struct perch_vtask_handle){ &s->vt, s->next }, next_cont, s);
}

static void complete_then_ready_registered(void *p, uint64_t round)
{
	struct preset_state *s = p;
	perch_vtask_complete(&s->vt, s->h.token, 1);
	ready_next_registered(s);
}

/* The next version's completion runs the owner's continuation once, with its result, and nothing else. */
static bool next_version_runs_the_owners(struct race *r, struct preset_state *s, uint64_t round,
					 bool other_ok)
{
	int rc = perch_vtask_complete(&s->vt, s->next, 2);
	bool ok = other_ok && rc == 0 && s->next_runs == 1 && s->next_result == 2 && s->late_runs <= 1;
	if (!ok)
		race_fail(r, round, "the other call rc %d, its continuation ran %u times (result %lld); the next "
			  "version's completion rc %d ran the owner's %u times (result %lld)", s->rc, s->late_runs,
			  (long long)s->late_result, rc, s->next_runs, (long long)s->next_result);
	return ok;
}

/*
 * The late registration ran on the first completion, went on inline, or
 * came after the next version and was refused; then the next version's
 * completion runs the owner's continuation only.
 */
static bool judge_preset(struct race *r, void *p, uint64_t round)
{
	struct preset_state *s = p;
	bool late_ok = s->rc == PERCH_PENDING ? s->late_runs == 1 && s->late_result == 1
					      : (s->rc == 0 || s->rc == -ESTALE) && s->late_runs == 0;
	if (!next_version_runs_the_owners(r, s, round, late_ok))
		return false;
	race_branch(r, s->not_registered ? 1 : s->rc == PERCH_PENDING ? 0 : s->rc == 0 ? 2 : 3);
	return true;
}

const struct race_def race_vtask_preset_vs_late_registrant = {
	.name = "vtask: a registered ready races a registration the completion overtook",
	.actors = 2, .exhaustive = true, .create = preset_create, .destroy = vt_destroy, .setup = preset_setup,
	.actor = { late_registrant, complete_then_ready_registered }, .judge = judge_preset,
	.branch_names = { "registered before the completion: ran once", "not registered at the ready: the registrant still wrote",
			  "registration found it complete: went on inline",
			  "registration after the next version: refused as stale" },
	.window_branch = 2,
	.window_needs_scheduler = true,
};

/* ---- the owner readies the next version registered while the last one's completion runs ---- */

static void preset_setup_registered(void *p, uint64_t round)
{
	struct preset_state *s = p;
	preset_setup(p, round);
	if (perch_vtask_on_complete(s->h, late_cont, s) != PERCH_PENDING)
		abort();
}

static void complete_last(void *p, uint64_t round)
{
	struct preset_state *s = p;
	s->rc = perch_vtask_complete(&s->vt, s->h.token, 1);
}

static void owner_readies_registered(void *p, uint64_t round)
{
	ready_next_registered(p);
}

/*
 * The last version completed with its own continuation (once, with 1) or
 * was readied over (-ESTALE, never run); the next runs the owner's only.
 */
static bool judge_ready_registered_vs_completion(struct race *r, void *p, uint64_t round)
{
	struct preset_state *s = p;
	bool last_ok = s->rc == 0 ? s->late_runs == 1 && s->late_result == 1
				  : s->rc == -ESTALE && s->late_runs == 0;
	if (!next_version_runs_the_owners(r, s, round, last_ok))
		return false;
	race_branch(r, s->rc == 0 ? (s->not_registered ? 1 : 0) : 2);
	return true;
}

const struct race_def race_vtask_ready_registered_vs_completion = {
	.name = "vtask: a registered ready races the last version's completion",
	.actors = 2, .exhaustive = true, .create = preset_create, .destroy = vt_destroy, .setup = preset_setup_registered,
	.actor = { complete_last, owner_readies_registered }, .judge = judge_ready_registered_vs_completion,
	.branch_names = { "completed first: the ready registered", "completed as the ready looked: registered after",
			  "readied over: the completion refused as stale" },
};
