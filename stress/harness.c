/* stress/harness.c: barrier, jitter or the scheduler, overlap counting and verdicts for the race suite. */
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
#ifdef PERCH_SCHED
#include "sched.h"
#endif

#define DEFAULT_ROUNDS 200000u
#define MIN_SPAN_CYCLES 128u   /* the jitter spreads starts over about two racing calls */
#define MAX_SPAN_CYCLES (1u << 20)
#define SPINS_BEFORE_YIELD 2000u
#define SCHED_SPINS_BEFORE_YIELD 64u  /* scheduled: the actors wait for each other, not for a jitter */
#define DEFAULT_BOUND 2u               /* the exhaustive search's preemptions */
#define EXHAUSTIVE_MAX_SCHEDULES 5000000u
#define EXTEND_MAX_FACTOR 4u       /* a race short of its overlap floor may run up to 4x its rounds */
#define EXTEND_MAX_SECONDS 90.0
#define FAILURES_SHOWN 5

/* A sense-reversing barrier whose waiters yield: pthread_barrier would sleep in the kernel each round. */
struct spin_barrier {
	uint32_t count;
	uint32_t sense;
	uint32_t parties;
};

enum race_mode {
	MODE_FREE,        /* real parallel threads, jittered apart */
	MODE_PCT,         /* scheduled: PCT rounds */
	MODE_EXHAUSTIVE,  /* scheduled: every schedule within the preemption bound, one a round */
};

struct race {
	const struct race_def *def;
	enum race_mode mode;
	uint64_t seed;                   /* scheduled: the run's seed (the race mixes in its name) */
	bool exhausted;                  /* exhaustive: every schedule was run */
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

#ifdef PERCH_SCHED
static const unsigned spins_before_yield = SCHED_SPINS_BEFORE_YIELD;
#else
static const unsigned spins_before_yield = SPINS_BEFORE_YIELD;
#endif

/* In the scheduled build perch__cpu_relax is a yield point: a spinning actor gives the turn away. */
void race_spin_pause(unsigned *spins)
{
	if (++*spins < spins_before_yield) {
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

/* A ticket of the shared sequence: the harness's own count, never a scheduling point. */
static uint64_t ticket(struct race *r)
{
	return __atomic_fetch_add(&r->seq, 1, __ATOMIC_SEQ_CST);
}

static void open_window(struct race *r, int actor)
{
	r->start_tsc[actor] = __rdtsc();
	r->start_seq[actor] = ticket(r);
}

static void close_window(struct race *r, int actor)
{
	r->end_seq[actor] = ticket(r);
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
	/* Scheduled, a window's width is the scheduler's to choose: spinning would only cost time. */
	if (current_race && current_race->mode != MODE_FREE)
		return;
	uint64_t span = current_race ? current_race->span : MIN_SPAN_CYCLES;
	/* Half the span: a callback inside a timed half must not feed the span it is drawn from. */
	jitter_from(__rdtsc(), span / 2 + 1, &rng);
}

void race_branch(struct race *r, int i)
{
	if (i >= 0 && i < RACE_MAX_BRANCHES)
		r->branches[i]++;
}

static const char *mode_name(enum race_mode m)
{
	return m == MODE_FREE ? "free" : m == MODE_PCT ? "scheduled, PCT" : "scheduled, exhaustive";
}

/* Scheduled: the first broken round's schedule and the command that replays it. */
static void print_replay(struct race *r)
{
#ifdef PERCH_SCHED
	sched_print_schedule(stderr);
	/* Quoted for the shell: a name's apostrophe becomes '\''. */
	fprintf(stderr, "    replay: PERCH_RACE_SEED=%" PRIu64 " ./dev stress '", r->seed);
	for (const char *c = r->def->name; *c; c++)
		fputs(*c == '\'' ? "'\\''" : (char[]){ *c, 0 }, stderr);
	fprintf(stderr, "'%s\n",
		r->def->outside_thread ? "  (the loop's thread runs free: its timing is not replayed)" : "");
#endif
}

void race_fail(struct race *r, uint64_t round, const char *fmt, ...)
{
	if (r->failures++ < FAILURES_SHOWN) {
		va_list ap;
		fprintf(stderr, "  %s: round %" PRIu64 " (%s): ", r->def->name, round, mode_name(r->mode));
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
		if (r->failures == 1 && r->mode != MODE_FREE)
			print_replay(r);
	}
}

/* A call into the scheduler, in the scheduled build and a scheduled mode only. */
#ifdef PERCH_SCHED
#define SCHED_CALL(r, call) do { if ((r)->mode != MODE_FREE) call; } while (0)
#else
#define SCHED_CALL(r, call) ((void)(r))
#endif

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
	bool more = true;
	SCHED_CALL(r, more = sched_round_end());
	if (!more) {
		r->exhausted = true;
		perch__store_u32(&r->stop, 1);
	}
}

/*
 * One actor's half of a round: its window is the whole half, unless it
 * timed its racing part itself. Scheduled, the whole half starts at its
 * first operation (race_sched_first_step); a half with none starts as it
 * ends.
 */
static void run_half(struct race *r, int actor, uint64_t round)
{
	r->windowed[actor] = false;
	uint64_t seq_before = r->mode == MODE_FREE ? ticket(r) : UINT64_MAX, tsc_before = __rdtsc();
	r->start_seq[actor] = UINT64_MAX;
	r->def->actor[actor](r->state, round);
	if (!r->windowed[actor]) {
		if (r->mode == MODE_FREE) {
			r->start_seq[actor] = seq_before;
			r->start_tsc[actor] = tsc_before;
		} else if (r->start_seq[actor] == UINT64_MAX) {
			r->start_tsc[actor] = __rdtsc();
			r->start_seq[actor] = ticket(r);
		}
		close_window(r, actor);
	}
}

/* Free: the actors meet at a barrier, jitter apart, race, and meet again before the judge. */
static void actor_rounds_free(struct race *r, struct actor_arg *a)
{
	uint32_t sense = 0;
	for (uint64_t round = r->first_round; round < r->end_round; round++) {
		/* A round the judge already stopped is not set up: nothing is left half made. */
		if (a->index == 0 && !perch__load_u32(&r->stop))
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
		run_half(r, a->index, round);
		barrier_wait(&r->barrier, &sense);
		if (a->index == 0)
			judge_round(r, round);
	}
}

#ifdef PERCH_SCHED
/*
 * Scheduled: the scheduler orders the rounds too (no barrier: on one CPU
 * each barrier cost two thread switches a round). The main actor sets a
 * round up, publishes it, and judges it once every half has ended.
 */
static void actor_rounds_scheduled(struct race *r, struct actor_arg *a)
{
	for (uint64_t round = r->first_round; round < r->end_round; round++) {
		if (a->index == 0) {
			if (perch__load_u32(&r->stop)) {
				r->end_round = round;
				sched_stop();
				break;
			}
			r->def->setup(r->state, round);
			sched_round_begin(round);
		}
		if (!sched_enter(a->index, round))
			break;
		run_half(r, a->index, round);
		sched_exit(a->index);
		if (a->index == 0) {
			sched_wait_round_end(round);
			judge_round(r, round);
		}
	}
}
#endif

static void *actor_main(void *p)
{
	struct actor_arg *a = p;
	struct race *r = a->race;
	current_race = r;
	current_actor = a->index;
#ifdef PERCH_SCHED
	if (r->mode != MODE_FREE) {
		actor_rounds_scheduled(r, a);
		return NULL;
	}
#endif
	actor_rounds_free(r, a);
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

static void print_outcome(const struct race_def *def, enum race_mode mode, const struct race_outcome *o,
			  uint64_t floor)
{
	if (mode == MODE_EXHAUSTIVE)
		printf("%-44s %8" PRIu64 " schedules, %s (at most %u preemptions) %7" PRIu64 " overlaps %5" PRIu64
		       " failures %6.2fs  %s\n",
		       def->name, o->rounds, o->exhausted ? "all explored" : "NOT all explored", o->bound,
		       o->overlaps, o->failures, o->seconds, o->passed ? "PASS" : "FAIL");
	else
		printf("%-44s %8" PRIu64 " rounds %7" PRIu64 " overlaps (floor %" PRIu64 ") %5" PRIu64
		       " failures %6.2fs  %s%s",
		       def->name, o->rounds, o->overlaps, floor, o->failures, o->seconds,
		       o->passed ? "PASS" : "FAIL", mode == MODE_PCT ? "  (PCT" : "");
	if (mode == MODE_PCT)
		printf(", k = %" PRIu64 " points)\n", o->longest);
	else if (mode == MODE_FREE)
		printf("\n");
	for (int i = 0; i < RACE_MAX_BRANCHES && def->branch_names[i]; i++)
		printf("    %-40s %10" PRIu64 "%s\n", def->branch_names[i], o->branches[i],
		       def->window_branch != i + 1 ? ""
		       : mode == MODE_FREE && def->window_needs_scheduler
			       ? "   (the named window: its floor applies when scheduled)"
			       : "   (the named window: the floor applies)");
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

/* Whether the race's named window (a branch), if it has one and this mode holds it, reached the floor. */
static bool window_ran(const struct race *r, uint64_t floor)
{
	int b = r->def->window_branch;
	if (r->mode == MODE_FREE && r->def->window_needs_scheduler)
		return true;
	return b == 0 || r->branches[b - 1] >= floor;
}

/* The race being run, for a scheduled round that cannot go on. */
static struct race *running;

/* The summary table's row (also what the mutant gate reads). */
static void print_row(const char *name, const char *suffix, uint64_t rounds, uint64_t overlaps,
		      uint64_t failures, bool passed)
{
	char label[160];
	snprintf(label, sizeof(label), "%s%s", name, suffix);
	printf("%-56s %9" PRIu64 " %9" PRIu64 " %9" PRIu64 "  %s\n", label, rounds, overlaps, failures,
	       passed ? "PASS" : "FAIL");
}

static const char *row_suffix(enum race_mode mode)
{
	return mode == MODE_EXHAUSTIVE ? " (exhaustive)" : "";
}

void race_sched_fatal(const char *why)
{
	struct race *r = running;
	uint64_t round = 0;
	SCHED_CALL(r, round = sched_round());
	fprintf(stderr, "  %s: round %" PRIu64 " (%s): %s\n", r->def->name, round, mode_name(r->mode), why);
	print_replay(r);
	/* Rounds run, the broken one the last, as the summary counts them. */
	print_row(r->def->name, row_suffix(r->mode), round + 1, r->overlaps, r->failures + 1, false);
	fflush(stdout);
	fflush(stderr);
	_exit(1);
}

/* Exit status 3 and no summary row: the mutant gate takes it for an error, never for a catch. */
void race_sched_error(const char *why)
{
	struct race *r = running;
	fprintf(stderr, "  %s (%s): SCHEDULER ERROR: %s\n", r->def->name, mode_name(r->mode), why);
	print_replay(r);
	fflush(stdout);
	fflush(stderr);
	_exit(3);
}

/*
 * The actor's first operation is about to run: its window starts here,
 * unless it times its racing part itself (then race_window_open sets it).
 */
void race_sched_first_step(int index)
{
	struct race *r = running;
	if (!r->windowed[index]) {
		r->start_tsc[index] = __rdtsc();
		r->start_seq[index] = ticket(r);
	}
}

#ifdef PERCH_SCHED
/* FNV-1a: each race's schedules follow from the run's seed and its own name. */
static uint64_t name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}
#endif

static unsigned bound_from_env(void)
{
	const char *s = getenv("PERCH_RACE_BOUND");
	return s && *s ? (unsigned)strtoul(s, NULL, 10) : DEFAULT_BOUND;
}

static struct race_outcome race_run_mode(const struct race_def *def, enum race_mode mode, uint64_t seed)
{
	struct race r;
	struct actor_arg args[RACE_MAX_ACTORS];
	memset(&r, 0, sizeof(r));
	r.def = def;
	r.mode = mode;
	r.seed = seed;
	r.rounds = mode == MODE_EXHAUSTIVE ? EXHAUSTIVE_MAX_SCHEDULES : rounds_from_env();
	r.fail_fast = getenv("PERCH_STRESS_FAILFAST") && *getenv("PERCH_STRESS_FAILFAST") == '1';
	r.barrier.parties = (uint32_t)def->actors;
	r.span = MIN_SPAN_CYCLES;
	r.state = def->create();
	running = &r;
	for (int i = 0; i < def->actors; i++)
		args[i] = (struct actor_arg){ &r, i, 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) ^ (uint64_t)time(NULL) };
#ifdef PERCH_SCHED
	sched_start(mode == MODE_PCT ? SCHED_PCT : SCHED_EXHAUSTIVE, def->actors, seed ^ name_hash(def->name),
		    bound_from_env());
#endif
	uint64_t floor = mode == MODE_EXHAUSTIVE ? 1 : overlap_floor(def, r.rounds);
	double t0 = now_seconds();
	run_batch(&r, args, r.rounds);
	/*
	 * On a busy machine the actors may seldom run at the same time. Rather
	 * than judge the race unrun, give it more rounds, bounded in count and
	 * time; the floor itself does not move.
	 */
	while (mode != MODE_EXHAUSTIVE && (r.overlaps < floor || !window_ran(&r, floor)) && r.failures == 0 &&
	       !r.stop && r.rounds_run < r.rounds * EXTEND_MAX_FACTOR && now_seconds() - t0 < EXTEND_MAX_SECONDS)
		run_batch(&r, args, r.rounds / 4 + 1);
	def->destroy(r.state);
	if (getenv("PERCH_STRESS_DEBUG"))
		fprintf(stderr, "  %s: span %" PRIu64 " cycles, last halves %" PRIu64 "/%" PRIu64 " cycles\n",
			def->name, r.span, r.took[0], r.took[1]);

	struct race_outcome o = { .rounds = r.rounds_run, .overlaps = r.overlaps, .failures = r.failures,
				  .exhausted = r.exhausted, .bound = bound_from_env() };
	SCHED_CALL(&r, o.longest = sched_longest_round());
	memcpy(o.branches, r.branches, sizeof(o.branches));
	o.seconds = now_seconds() - t0;
	/* Exhaustive: every schedule ran, and among them the named window (the floor is one). */
	bool ran_enough = mode == MODE_EXHAUSTIVE ? r.exhausted : r.overlaps >= floor;
	o.passed = r.failures == 0 && ran_enough && window_ran(&r, floor);
	if (mode == MODE_EXHAUSTIVE && !r.exhausted && r.failures == 0 && !r.stop)
		fprintf(stderr, "  %s: the exhaustive search stopped at %" PRIu64 " schedules, not all explored\n",
			def->name, r.rounds_run);
	else if (!ran_enough && r.failures == 0)
		fprintf(stderr, "  %s: only %" PRIu64 " overlapping rounds, the race did not run enough (floor %" PRIu64 ")\n",
			def->name, r.overlaps, floor);
	if (!window_ran(&r, floor) && r.failures == 0)
		fprintf(stderr, "  %s: its window (%s) ran only %" PRIu64 " times (floor %" PRIu64 ")\n",
			def->name, def->branch_names[def->window_branch - 1],
			r.branches[def->window_branch - 1], floor);
	print_outcome(def, mode, &o, floor);
	running = NULL;
	return o;
}

struct race_outcome race_run(const struct race_def *def)
{
	return race_run_mode(def, MODE_FREE, 0);
}

/* PERCH_RACE_SEED, or a fresh one. */
static uint64_t run_seed(void)
{
	const char *s = getenv("PERCH_RACE_SEED");
	if (s && *s) {
		char *end;
		unsigned long long v = strtoull(s, &end, 0);
		if (!*end)
			return v;
		fprintf(stderr, "PERCH_RACE_SEED=%s is not a number; using a fresh seed\n", s);
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t seed = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ __rdtsc() << 7;
	return seed % 1000000000000ull; /* short enough to type */
}

#ifdef PERCH_SCHED
#define SCHEDULED 1
#else
#define SCHEDULED 0
#endif

static bool fail_fast_run(void)
{
	return getenv("PERCH_STRESS_FAILFAST") && *getenv("PERCH_STRESS_FAILFAST") == '1';
}

/*
 * PERCH_STRESS_SHARD=K/N: only every Nth race from the Kth (0-based), so
 * N processes, each pinned to its own CPU, share one suite. false (with a
 * line on stderr) when it is set and not two counts with K < N.
 */
static bool shard_of_run(unsigned *k, unsigned *n)
{
	const char *s = getenv("PERCH_STRESS_SHARD");
	*k = 0;
	*n = 1;
	if (!s || !*s)
		return true;
	char tail;
	if (strspn(s, "0123456789/") == strlen(s) && sscanf(s, "%u/%u%c", k, n, &tail) == 2 && *n > 0 &&
	    *k < *n)
		return true;
	fprintf(stderr, "PERCH_STRESS_SHARD=%s is not K/N with K < N\n", s);
	return false;
}

int race_main(int argc, char **argv, const struct race_def *const *defs, int n)
{
	const char *only = argc > 1 ? argv[1] : NULL;
	int failed = 0, ran = 0, matched = 0;
	unsigned shard, shards;
	if (!shard_of_run(&shard, &shards))
		return 2;
	struct race_outcome out[128];
	const struct race_def *which[128];
	enum race_mode modes[128];
	uint64_t seed = SCHEDULED ? run_seed() : 0;
	/* Lines in the order they happen when stdout and stderr share a CI log. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (SCHEDULED)
		printf("scheduled race suite: one actor runs at a time; seed %" PRIu64
		       " (PERCH_RACE_SEED=%" PRIu64 " replays this run)\n\n", seed, seed);
	if (shards > 1)
		printf("shard %u of %u (PERCH_STRESS_SHARD=%u/%u): races %u, %u + %u, ... of those named\n\n",
		       shard + 1, shards, shard, shards, shard + 1, shard + 1, shards);
	for (int i = 0; i < n && ran < 126; i++) {
		if (only && !strstr(defs[i]->name, only))
			continue;
		if (matched++ % shards != shard)
			continue;
		if (SCHEDULED && defs[i]->free_only) {
			printf("%-44s free only: %s\n\n", defs[i]->name, defs[i]->free_only);
			which[ran] = defs[i];
			modes[ran] = MODE_FREE; /* a row that says it did not run here */
			out[ran++] = (struct race_outcome){ .passed = true };
			continue;
		}
		enum race_mode mode[2] = { SCHEDULED ? MODE_PCT : MODE_FREE, MODE_EXHAUSTIVE };
		int nmodes = SCHEDULED && defs[i]->exhaustive ? 2 : 1;
		for (int m = 0; m < nmodes && !(failed && fail_fast_run()); m++) {
			which[ran] = defs[i];
			modes[ran] = mode[m];
			out[ran] = race_run_mode(defs[i], mode[m], seed);
			failed += !out[ran].passed;
			ran++;
		}
		/* Fail-fast runs (the mutant gate) need one failing race, not all of them. */
		if (failed && fail_fast_run())
			break;
	}
	printf("\n%-56s %9s %9s %9s  %s\n", "test", "rounds", "overlaps", "failures", "verdict");
	for (int i = 0; i < ran; i++) {
		if (SCHEDULED && modes[i] == MODE_FREE)
			printf("%-56s %9s %9s %9s  %s\n", which[i]->name, "-", "-", "-", "FREE ONLY");
		else
			print_row(which[i]->name, row_suffix(modes[i]), out[i].rounds, out[i].overlaps,
				  out[i].failures, out[i].passed);
	}
	if (matched == 0) {
		fprintf(stderr, "no race matches '%s'\n", only ? only : "");
		return 2;
	}
	if (ran == 0)
		printf("(no race of shard %u of %u matches '%s')\n", shard + 1, shards, only ? only : "");
	if (SCHEDULED)
		printf("\nseed %" PRIu64 ": PERCH_RACE_SEED=%" PRIu64 " ./dev stress [NAME] replays this run\n", seed,
		       seed);
	return failed ? 1 : 0;
}
