/* stress/harness.c: barrier, jitter, overlap timing and verdicts for the race suite. */
#include "config.h"

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#include "atomic.h"
#include "harness.h"

#define DEFAULT_ROUNDS 200000u
#define MIN_SPAN_CYCLES 128u   /* the jitter spreads starts over about two racing calls */
#define MAX_SPAN_CYCLES (1u << 20)
#define SPINS_BEFORE_YIELD 2000u
#define EXTEND_MAX_FACTOR 4u       /* a race short of its overlap floor may run up to 4x its rounds */
#define EXTEND_MAX_SECONDS 90.0
#define FAILURES_SHOWN 5

/* A sense-reversing barrier whose waiters yield: pthread_barrier would sleep in the kernel each round. */
struct spin_barrier {
	uint32_t count;
	uint32_t sense;
	uint32_t parties;
};

struct race {
	const struct race_def *def;
	void *state;
	uint64_t rounds;                 /* asked for (PERCH_STRESS_ROUNDS) */
	uint64_t first_round, end_round; /* the batch the actors are running */
	uint64_t rounds_run;             /* so far; fewer than asked when stopped early */
	struct spin_barrier barrier;
	/*
	 * Overlap is judged on one shared sequence, not on clocks: TSCs of two
	 * vCPUs can be tens of microseconds apart (seen here). Each racing half
	 * takes a ticket when it starts and one when it ends.
	 */
	uint64_t seq;
	uint64_t start_seq[RACE_MAX_ACTORS];
	uint64_t end_seq[RACE_MAX_ACTORS];
	uint64_t start_tsc[RACE_MAX_ACTORS];  /* this core's clock: durations only */
	bool windowed[RACE_MAX_ACTORS];   /* the actor timed itself this round */
	uint64_t took[RACE_MAX_ACTORS];   /* cycles each actor's half took this round */
	uint64_t span;                    /* the jitter window, in cycles */
	uint64_t branches[RACE_MAX_BRANCHES];
	uint64_t overlaps;
	uint64_t failures;
	bool fail_fast;                  /* PERCH_STRESS_FAILFAST: stop at the first broken round */
	uint32_t stop;                   /* set by the main actor's judge, read after the next barrier */
};

struct actor_arg {
	struct race *race;
	int index;
	uint64_t rng;
};

void race_spin_pause(unsigned *spins)
{
	if (++*spins < SPINS_BEFORE_YIELD) {
		perch__cpu_relax();
		return;
	}
	*spins = 0;
	sched_yield();
}

/* Waits for every actor. */
static void barrier_wait(struct spin_barrier *b, uint32_t *local_sense)
{
	uint32_t sense = *local_sense = !*local_sense;
	if (perch__faa_u32(&b->count, 1) == b->parties - 1) {
		perch__store_u32(&b->count, 0);
		perch__store_u32(&b->sense, sense);
		return;
	}
	unsigned spins = 0;
	while (perch__load_u32(&b->sense) != sense)
		race_spin_pause(&spins);
}

static uint64_t next_random(uint64_t *s)
{
	/* xorshift64*: cheap, and different per actor. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/*
 * Spins a random while in [0, span) cycles of this core's clock from
 * `from`: span follows how long the racing calls take (twice their running
 * average), so the two halves overlap often whether the build is plain or
 * sanitized.
 */
static void jitter_from(uint64_t from, uint64_t span, uint64_t *rng)
{
	uint64_t start = from + next_random(rng) % span;
	while (__rdtsc() < start)
		perch__cpu_relax();
}

static void open_window(struct race *r, int actor)
{
	r->start_tsc[actor] = __rdtsc();
	r->start_seq[actor] = perch__faa_u64(&r->seq, 1);
}

static void close_window(struct race *r, int actor)
{
	r->end_seq[actor] = perch__faa_u64(&r->seq, 1);
	r->took[actor] = __rdtsc() - r->start_tsc[actor];
}

static __thread struct race *current_race;
static __thread int current_actor = -1;

int race_current_actor(void)
{
	return current_actor;
}

void race_window_open(void)
{
	current_race->windowed[current_actor] = true;
	open_window(current_race, current_actor);
}

void race_window_close(void)
{
	close_window(current_race, current_actor);
}

void race_busy_work(void)
{
	static __thread uint64_t rng = 0x9e3779b97f4a7c15ull;
	uint64_t span = current_race ? current_race->span : MIN_SPAN_CYCLES;
	/* Half the span: a callback inside a timed half must not feed the span it is drawn from. */
	jitter_from(__rdtsc(), span / 2 + 1, &rng);
}

void race_branch(struct race *r, int i)
{
	if (i >= 0 && i < RACE_MAX_BRANCHES)
		r->branches[i]++;
}

void race_fail(struct race *r, uint64_t round, const char *fmt, ...)
{
	if (r->failures++ < FAILURES_SHOWN) {
		va_list ap;
		fprintf(stderr, "  %s: round %" PRIu64 ": ", r->def->name, round);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
}

/* Twice the running average of the slower half, clamped. */
static void update_span(struct race *r)
{
	uint64_t slow = 0;
	for (int i = 0; i < r->def->actors; i++)
		if (r->took[i] > slow)
			slow = r->took[i];
	uint64_t avg = (r->span / 2 * 7 + slow) / 8;
	uint64_t span = 2 * avg;
	r->span = span < MIN_SPAN_CYCLES ? MIN_SPAN_CYCLES : span > MAX_SPAN_CYCLES ? MAX_SPAN_CYCLES : span;
}

static void judge_round(struct race *r, uint64_t round)
{
	update_span(r);
	/* Overlap: the timed halves of actors 0 and 1 intersect. */
	uint64_t lo = r->start_seq[0] > r->start_seq[1] ? r->start_seq[0] : r->start_seq[1];
	uint64_t hi = r->end_seq[0] < r->end_seq[1] ? r->end_seq[0] : r->end_seq[1];
	if (lo < hi)
		r->overlaps++;
	if (!r->def->judge(r, r->state, round) && r->failures == 0)
		race_fail(r, round, "judged broken");
	if (r->fail_fast && r->failures)
		perch__store_u32(&r->stop, 1);
}

static void *actor_main(void *p)
{
	struct actor_arg *a = p;
	struct race *r = a->race;
	uint32_t sense = 0;
	current_race = r;
	current_actor = a->index;
	for (uint64_t round = r->first_round; round < r->end_round; round++) {
		if (a->index == 0)
			r->def->setup(r->state, round);
		barrier_wait(&r->barrier, &sense);
		/* Set before the main actor reached this barrier: every actor sees it in the same round. */
		if (perch__load_u32(&r->stop)) {
			if (a->index == 0)
				r->end_round = round;
			break;
		}
		/* Both saw the barrier open within a cache-line transfer; now jitter apart. */
		jitter_from(__rdtsc(), r->span, &a->rng);
		r->windowed[a->index] = false;
		/* Unless the actor timed its racing part itself, the whole half is the window. */
		uint64_t seq_before = perch__faa_u64(&r->seq, 1), tsc_before = __rdtsc();
		r->def->actor[a->index](r->state, round);
		if (!r->windowed[a->index]) {
			r->start_seq[a->index] = seq_before;
			r->start_tsc[a->index] = tsc_before;
			close_window(r, a->index);
		}
		barrier_wait(&r->barrier, &sense);
		if (a->index == 0)
			judge_round(r, round);
	}
	return NULL;
}

static uint64_t rounds_from_env(void)
{
	static bool warned;
	const char *s = getenv("PERCH_STRESS_ROUNDS");
	if (!s || !*s)
		return DEFAULT_ROUNDS;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (*end || v == 0) {
		if (warned)
			return DEFAULT_ROUNDS;
		warned = true;
		fprintf(stderr, "PERCH_STRESS_ROUNDS=%s is not a positive count; using %u\n", s,
			DEFAULT_ROUNDS);
		return DEFAULT_ROUNDS;
	}
	return v;
}

/* The overlap floor scales down with fewer rounds (1,000 of 200,000), never below 50. */
static uint64_t overlap_floor(const struct race_def *def, uint64_t rounds)
{
	uint64_t floor = def->min_overlaps ? def->min_overlaps : 1000;
	if (rounds < DEFAULT_ROUNDS) {
		floor = floor * rounds / DEFAULT_ROUNDS;
		if (floor < 50)
			floor = 50;
	}
	return floor;
}

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void print_outcome(const struct race_def *def, const struct race_outcome *o, uint64_t floor)
{
	printf("%-44s %8" PRIu64 " rounds %7" PRIu64 " overlaps (floor %" PRIu64 ") %5" PRIu64
	       " failures %6.2fs  %s\n",
	       def->name, o->rounds, o->overlaps, floor, o->failures, o->seconds,
	       o->passed ? "PASS" : "FAIL");
	for (int i = 0; i < RACE_MAX_BRANCHES && def->branch_names[i]; i++)
		printf("    %-40s %10" PRIu64 "%s\n", def->branch_names[i], o->branches[i],
		       def->window_branch == i + 1 ? "   (the named window: the floor applies)" : "");
	fflush(stdout);
}

/* Runs rounds [rounds_run, rounds_run + n) on fresh actor threads. */
static void run_batch(struct race *r, struct actor_arg *args, uint64_t n)
{
	pthread_t th[RACE_MAX_ACTORS];
	r->first_round = r->rounds_run;
	r->end_round = r->rounds_run + n;
	for (int i = 1; i < r->def->actors; i++) {
		if (pthread_create(&th[i], NULL, actor_main, &args[i]) != 0) {
			perror("pthread_create");
			exit(2);
		}
	}
	actor_main(&args[0]);
	for (int i = 1; i < r->def->actors; i++)
		pthread_join(th[i], NULL);
	r->rounds_run = r->end_round;
}

/* Whether the race's named window (a branch), if it has one, reached the floor. */
static bool window_ran(const struct race *r, uint64_t floor)
{
	int b = r->def->window_branch;
	return b == 0 || r->branches[b - 1] >= floor;
}

struct race_outcome race_run(const struct race_def *def)
{
	struct race r;
	struct actor_arg args[RACE_MAX_ACTORS];
	memset(&r, 0, sizeof(r));
	r.def = def;
	r.rounds = rounds_from_env();
	r.fail_fast = getenv("PERCH_STRESS_FAILFAST") && *getenv("PERCH_STRESS_FAILFAST") == '1';
	r.barrier.parties = (uint32_t)def->actors;
	r.span = MIN_SPAN_CYCLES;
	r.state = def->create();
	for (int i = 0; i < def->actors; i++)
		args[i] = (struct actor_arg){ &r, i, 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) ^ (uint64_t)time(NULL) };
	uint64_t floor = overlap_floor(def, r.rounds);
	double t0 = now_seconds();
	run_batch(&r, args, r.rounds);
	/*
	 * On a busy machine the actors may seldom run at the same time. Rather
	 * than judge the race unrun, give it more rounds, bounded in count and
	 * time; the floor itself does not move.
	 */
	while ((r.overlaps < floor || !window_ran(&r, floor)) && r.failures == 0 && !r.stop &&
	       r.rounds_run < r.rounds * EXTEND_MAX_FACTOR && now_seconds() - t0 < EXTEND_MAX_SECONDS)
		run_batch(&r, args, r.rounds / 4 + 1);
	def->destroy(r.state);
	if (getenv("PERCH_STRESS_DEBUG"))
		fprintf(stderr, "  %s: span %" PRIu64 " cycles, last halves %" PRIu64 "/%" PRIu64 " cycles\n",
			def->name, r.span, r.took[0], r.took[1]);

	struct race_outcome o = { .rounds = r.rounds_run, .overlaps = r.overlaps, .failures = r.failures };
	memcpy(o.branches, r.branches, sizeof(o.branches));
	o.seconds = now_seconds() - t0;
	o.passed = r.failures == 0 && r.overlaps >= floor && window_ran(&r, floor);
	if (r.overlaps < floor && r.failures == 0)
		fprintf(stderr, "  %s: only %" PRIu64 " overlapping rounds, the race did not run enough (floor %" PRIu64 ")\n",
			def->name, r.overlaps, floor);
	if (!window_ran(&r, floor) && r.failures == 0)
		fprintf(stderr, "  %s: its window (%s) ran only %" PRIu64 " times (floor %" PRIu64 ")\n",
			def->name, def->branch_names[def->window_branch - 1],
			r.branches[def->window_branch - 1], floor);
	print_outcome(def, &o, floor);
	return o;
}

int race_main(int argc, char **argv, const struct race_def *const *defs, int n)
{
	const char *only = argc > 1 ? argv[1] : NULL;
	int failed = 0, ran = 0;
	struct race_outcome out[64];
	const struct race_def *which[64];
	for (int i = 0; i < n && ran < 64; i++) {
		if (only && !strstr(defs[i]->name, only))
			continue;
		which[ran] = defs[i];
		out[ran] = race_run(defs[i]);
		failed += !out[ran].passed;
		ran++;
		/* Fail-fast runs (the mutant gate) need one failing race, not all of them. */
		if (failed && getenv("PERCH_STRESS_FAILFAST") && *getenv("PERCH_STRESS_FAILFAST") == '1')
			break;
	}
	printf("\n%-44s %9s %9s %9s  %s\n", "test", "rounds", "overlaps", "failures", "verdict");
	for (int i = 0; i < ran; i++)
		printf("%-44s %9" PRIu64 " %9" PRIu64 " %9" PRIu64 "  %s\n", which[i]->name,
		       out[i].rounds, out[i].overlaps, out[i].failures, out[i].passed ? "PASS" : "FAIL");
	if (ran == 0) {
		fprintf(stderr, "no race matches '%s'\n", only ? only : "");
		return 2;
	}
	return failed ? 1 : 0;
}
