/* stress/sched.c: the controlled scheduler: PCT and bounded-exhaustive schedules over the race's real threads, one running at a time. */
#include "config.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "atomic.h"
#include "harness.h"
#include "sched.h"

/*
 * The scheduler's own words are touched with __atomic builtins directly:
 * lib/atomic.h's operations are the scheduling points themselves.
 */
#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

#define MAX_THREADS RACE_MAX_ACTORS
#define TRACE_MAX 4096          /* operations kept for a failure's schedule */
#define STEP_LIMIT 2000000u     /* a round that takes more steps is livelocked */
#define XSTEPS_MAX 8192         /* an exhaustive round's decisions */
#define BLOCKED_WAIT_MS 2000    /* every thread blocked: how long a thread outside the race may take to wake one */
#define ROUNDS_STOPPED UINT32_MAX

enum tstate { T_READY, T_BLOCKED, T_DONE };
enum kind { K_START, K_POINT, K_YIELD, K_BLOCK, K_EXIT };

/* One decision of an exhaustive round, kept to replay it and to find the next schedule. */
struct xstep {
	const char *where;   /* the point (a string literal: one address per call site) */
	int8_t cur;          /* the thread at the point (-1 at the start) */
	uint8_t kind;
	uint8_t enabled;     /* bit per thread */
	int8_t chosen;
	uint8_t tried;       /* the choices already explored from here */
	uint16_t preempted;  /* preemptions before this decision */
};

struct trace_entry {
	const char *where;
	int8_t actor;
};

static struct {
	enum sched_strategy strategy;
	int n;
	uint64_t seed;
	unsigned bound;
	uint64_t round;
	uint64_t rng;
	/* handoff */
	int turn;                       /* the thread that may run, -1 none */
	uint32_t go[MAX_THREADS];       /* futex words, bumped when the turn passes to the thread */
	uint32_t begun;                 /* futex word: the round set up last, + 1; ROUNDS_STOPPED at the end */
	uint32_t ended;                 /* futex word: the round whose last half ended, + 1 */
	int st[MAX_THREADS];            /* enum tstate */
	uint32_t *blocked_on[MAX_THREADS];
	const char *pending[MAX_THREADS]; /* the operation each thread waits to run */
	bool started[MAX_THREADS];      /* the thread's first operation of the round ran */
	uint64_t steps;
	unsigned spin_before_sleep;
	/* PCT */
	int prio[MAX_THREADS];
	int lowest;
	int changes;
	uint64_t change_at[3];
	uint64_t k_est;                 /* the longest round so far, in steps: PCT's k */
	/* exhaustive */
	struct xstep x[XSTEPS_MAX];
	size_t xlen, xprefix;
	uint16_t preempted;
	uint64_t schedules;
	/* the round's schedule */
	struct trace_entry trace[TRACE_MAX];
	uint64_t traced;
} S;

static __thread int me = -1; /* this thread's index while the scheduler controls it */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void futex_wait(uint32_t *addr, uint32_t seen)
{
	syscall(SYS_futex, addr, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, seen, NULL, NULL, 0);
}

static void futex_wake(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
}

static int cpus_available(void)
{
	cpu_set_t set;
	return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

void sched_start(enum sched_strategy strategy, int threads, uint64_t seed, unsigned bound)
{
	memset(&S, 0, sizeof(S));
	S.strategy = strategy;
	S.n = threads;
	S.seed = seed;
	S.bound = bound;
	S.turn = -1;
	S.k_est = 0;
	/* With a CPU to spare a waiter spins a little before it sleeps; on one it sleeps at once. */
	S.spin_before_sleep = cpus_available() > 1 ? 2000 : 0;
}

uint64_t sched_schedules(void)
{
	return S.schedules;
}

uint64_t sched_round(void)
{
	return S.round;
}

uint64_t sched_longest_round(void)
{
	return S.k_est;
}

/* ---- handoff ---- */

static void give_turn(int t)
{
	STORE(&S.turn, t);
	if (t >= 0) {
		__atomic_fetch_add(&S.go[t], 1, __ATOMIC_SEQ_CST);
		futex_wake(&S.go[t]);
	}
}

static void wait_turn(int t)
{
	for (unsigned spins = 0;;) {
		uint32_t g = LOAD(&S.go[t]);
		if (LOAD(&S.turn) == t)
			return;
		if (spins++ < S.spin_before_sleep) {
			__builtin_ia32_pause();
			continue;
		}
		futex_wait(&S.go[t], g);
	}
}

/* ---- the round's schedule ---- */

/* Keeps the last TRACE_MAX operations of the round. */
static void trace(int actor)
{
	S.trace[S.traced % TRACE_MAX] = (struct trace_entry){ S.pending[actor], (int8_t)actor };
	S.traced++;
}

/* A call site from the source tree's top: the last "lib/", "pipes/", "stress/" or "tests/" in the compiler's path. */
static const char *site(const char *where)
{
	static const char *const tops[] = { "lib/", "pipes/", "stress/", "tests/" };
	const char *best = where;
	for (const char *p = where; *p && *p != ' '; p++) {
		if (p != where && p[-1] != '/')
			continue;
		for (size_t i = 0; i < sizeof(tops) / sizeof(tops[0]); i++)
			if (strncmp(p, tops[i], strlen(tops[i])) == 0)
				best = p;
	}
	return best;
}

void sched_print_schedule(FILE *f)
{
	uint64_t first = S.traced > TRACE_MAX ? S.traced - TRACE_MAX : 0;
	fprintf(f, "    schedule of round %llu (%s", (unsigned long long)S.round,
		S.strategy == SCHED_PCT ? "PCT" : "exhaustive");
	if (S.strategy == SCHED_PCT)
		fprintf(f, ", %d change point%s", S.changes, S.changes == 1 ? "" : "s");
	else
		fprintf(f, ", %u preemption%s", S.preempted, S.preempted == 1 ? "" : "s");
	fprintf(f, "), %llu operations in the order they ran:\n", (unsigned long long)S.traced);
	if (first)
		fprintf(f, "      (the first %llu not kept)\n", (unsigned long long)first);
	int last = -1;
	for (uint64_t i = first; i < S.traced; i++) {
		const struct trace_entry *e = &S.trace[i % TRACE_MAX];
		const char *at = site(e->where), *op = strstr(at, " perch__");
		int at_len = op ? (int)(op - at) : (int)strlen(at);
		fprintf(f, "      %5llu  actor %d%s  %-34.*s %s\n", (unsigned long long)i, e->actor,
			e->actor != last && i != first ? " <-" : "   ", at_len, at, op ? op + 8 : "");
		last = e->actor;
	}
}

/* ---- strategies ---- */

static unsigned enabled_mask(void)
{
	unsigned m = 0;
	for (int t = 0; t < S.n; t++)
		if (LOAD(&S.st[t]) == T_READY)
			m |= 1u << t;
	return m;
}

static int lowest_bit_except(unsigned mask, int except)
{
	for (int t = 0; t < S.n; t++)
		if ((mask & (1u << t)) && t != except)
			return t;
	return -1;
}

/*
 * PCT: the enabled thread of highest priority. A change point drops the
 * running thread below every other, as PCT's change priorities are below
 * every initial one; so does a yield, or a spinning thread would never
 * let the one it waits for run.
 */
static int pct_choose(int cur, enum kind k, unsigned enabled)
{
	for (int j = 0; j < S.changes && cur >= 0; j++)
		if (S.steps == S.change_at[j])
			S.prio[cur] = --S.lowest;
	if (k == K_YIELD && (enabled & ~(1u << cur)))
		S.prio[cur] = --S.lowest;
	int best = -1;
	for (int t = 0; t < S.n; t++)
		if ((enabled & (1u << t)) && (best < 0 || S.prio[t] > S.prio[best]))
			best = t;
	return best;
}

static bool is_free_switch(enum kind k)
{
	return k != K_POINT;
}

/* The exhaustive search: replay the prefix, then never preempt. */
static int x_choose(int cur, enum kind k, unsigned enabled)
{
	size_t i = S.xlen;
	if (i >= XSTEPS_MAX)
		race_sched_error("the round is too long for the exhaustive search");
	struct xstep *x = &S.x[i];
	int chosen;
	const char *where = cur >= 0 ? S.pending[cur] : "(start)";
	if (i < S.xprefix) {
		if (x->cur != cur || x->kind != k || x->enabled != enabled || x->where != where)
			race_sched_error("the replayed schedule diverged: the race is not deterministic under the scheduler");
		chosen = x->chosen;
	} else {
		if (k == K_POINT)
			chosen = cur;
		else
			chosen = lowest_bit_except(enabled, k == K_YIELD ? cur : -1);
		if (chosen < 0)
			chosen = cur;
		*x = (struct xstep){ .where = where, .cur = (int8_t)cur, .kind = (uint8_t)k, .enabled = (uint8_t)enabled,
				     .chosen = (int8_t)chosen, .tried = (uint8_t)(1u << chosen),
				     .preempted = S.preempted };
	}
	if (!is_free_switch(k) && chosen != cur)
		S.preempted++;
	S.xlen++;
	return chosen;
}

/* The next exhaustive schedule: the deepest decision with a choice not yet tried within the bound. */
static bool x_next(void)
{
	for (size_t i = S.xlen; i-- > 0;) {
		struct xstep *x = &S.x[i];
		for (int u = 0; u < S.n; u++) {
			unsigned bit = 1u << u;
			if (!(x->enabled & bit) || (x->tried & bit))
				continue;
			/* A spinning thread gives way: it never runs again while another can. */
			if (x->kind == K_YIELD && u == x->cur)
				continue;
			unsigned cost = !is_free_switch(x->kind) && u != x->cur;
			if (x->preempted + cost > S.bound)
				continue;
			x->tried |= (uint8_t)bit;
			x->chosen = (int8_t)u;
			S.xprefix = i + 1;
			return true;
		}
	}
	return false;
}

/* ---- decisions ---- */

/* Every thread is blocked: one outside the race (the loop's) may still wake one; give it a while. */
static unsigned wait_for_a_wake(void)
{
	for (int ms = 0; ms < BLOCKED_WAIT_MS; ms++) {
		unsigned enabled = enabled_mask();
		if (enabled)
			return enabled;
		usleep(1000);
	}
	race_sched_fatal("deadlock: every thread of the race waits on a futex no one wakes");
}

static bool any_blocked(void)
{
	for (int t = 0; t < S.n; t++)
		if (LOAD(&S.st[t]) == T_BLOCKED)
			return true;
	return false;
}

/*
 * The thread `cur` (-1: the round's start) reached a point of kind `k`:
 * choose who runs next, hand it the turn, and, unless `cur` has finished,
 * wait until the turn comes back.
 */
static void decide(int cur, enum kind k)
{
	unsigned enabled = enabled_mask();
	if (!enabled && any_blocked())
		enabled = wait_for_a_wake();
	if (!enabled) {
		/* Every thread finished: the round is over, and the main actor may judge it. */
		give_turn(-1);
		STORE(&S.ended, (uint32_t)(S.round + 1));
		futex_wake(&S.ended);
		return;
	}
	if (++S.steps > STEP_LIMIT)
		race_sched_fatal("livelock: the round ran 2,000,000 scheduling points");
	int next = S.strategy == SCHED_PCT ? pct_choose(cur, k, enabled) : x_choose(cur, k, enabled);
	trace(next);
	if (next != cur)
		give_turn(next);
	else if (k == K_YIELD)
		sched_yield(); /* nobody else can run: a thread outside the race must */
	if (k != K_EXIT && k != K_START && next != cur)
		wait_turn(cur);
}

void sched_round_begin(uint64_t round)
{
	S.round = round;
	S.rng = S.seed ^ (round * 0xd1b54a32d192ed03ull);
	S.turn = -1;
	S.steps = 0;
	S.traced = 0;
	S.xlen = 0;
	S.preempted = 0;
	for (int t = 0; t < S.n; t++) {
		S.st[t] = T_READY;
		S.blocked_on[t] = NULL;
		S.pending[t] = "(its half begins)";
		S.started[t] = false;
	}
	if (S.strategy != SCHED_PCT)
		return;
	/* Priorities 1 .. n in a random order; change points and yields go below 0. */
	S.changes = 1 + (int)(round % 3);
	S.lowest = 0;
	for (int t = 0; t < S.n; t++)
		S.prio[t] = 1 + t;
	for (int t = S.n - 1; t > 0; t--) {
		int j = (int)(splitmix(&S.rng) % (uint64_t)(t + 1));
		int p = S.prio[t];
		S.prio[t] = S.prio[j];
		S.prio[j] = p;
	}
	/* Uniform over the longest round so far (the first round guesses 32). */
	uint64_t k = S.k_est ? S.k_est : 32;
	for (int j = 0; j < S.changes; j++)
		S.change_at[j] = 1 + splitmix(&S.rng) % k;
}

/* The round is set up: the actors waiting in sched_enter may go on. */
static void publish_round(uint64_t round)
{
	STORE(&S.begun, (uint32_t)(round + 1));
	futex_wake(&S.begun);
}

/* Waits until *word holds `want` (or ROUNDS_STOPPED); returns what it holds. */
static uint32_t wait_word(uint32_t *word, uint32_t want)
{
	for (;;) {
		uint32_t v = LOAD(word);
		if (v == want || v == ROUNDS_STOPPED)
			return v;
		futex_wait(word, v);
	}
}

void sched_stop(void)
{
	STORE(&S.begun, ROUNDS_STOPPED);
	futex_wake(&S.begun);
}

void sched_wait_round_end(uint64_t round)
{
	wait_word(&S.ended, (uint32_t)(round + 1));
}

bool sched_enter(int index, uint64_t round)
{
	if (index == 0)
		publish_round(round);
	else if (wait_word(&S.begun, (uint32_t)(round + 1)) == ROUNDS_STOPPED)
		return false;
	me = index;
	/*
	 * Every actor is ready from sched_round_begin on, so the main actor
	 * makes the first choice at once; an actor still on its way here finds
	 * its turn waiting.
	 */
	if (index == 0)
		decide(-1, K_START);
	wait_turn(index);
	return true;
}

void sched_exit(int index)
{
	STORE(&S.st[index], T_DONE);
	S.pending[index] = "(its half ended)";
	me = -1;
	decide(index, K_EXIT);
}

bool sched_round_end(void)
{
	if (S.steps > S.k_est)
		S.k_est = S.steps;
	if (S.strategy != SCHED_EXHAUSTIVE)
		return true;
	S.schedules++;
	return x_next();
}

/* ---- the points lib/atomic.h calls ---- */

/* A controlled thread at a point: the scheduler decides; its first step of the round starts its window. */
static void at_point(const char *where, enum kind k)
{
	S.pending[me] = where;
	decide(me, k);
	if (!S.started[me]) {
		S.started[me] = true;
		race_sched_first_step(me);
	}
}

void perch__sched_point(const char *where)
{
	if (me >= 0)
		at_point(where, K_POINT);
}

void perch__sched_yield(const char *where)
{
	if (me < 0)
		__builtin_ia32_pause();
	else
		at_point(where, K_YIELD);
}

/*
 * The kernel's check and sleep, as one step: blocked until a wake names
 * the address. Blocked first, then the check, so a thread outside the race
 * that changes the word and wakes in between is not missed. A deadline is
 * not modelled: a timed wait nobody wakes is reported as a deadlock.
 */
bool perch__sched_futex_wait(uint32_t *addr, uint32_t seen, const char *where)
{
	if (me < 0)
		return false;
	at_point(where, K_POINT);
	STORE(&S.blocked_on[me], addr);
	STORE(&S.st[me], T_BLOCKED);
	if (LOAD(addr) != seen) {
		int blocked = T_BLOCKED;
		/* Changed already; a waker outside the race may have readied us meanwhile. */
		__atomic_compare_exchange_n(&S.st[me], &blocked, T_READY, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
		STORE(&S.blocked_on[me], NULL);
		return true;
	}
	decide(me, K_BLOCK);
	return true;
}

/* Any thread: the race's threads blocked on `addr` may run again. */
void perch__sched_futex_wake(uint32_t *addr, const char *where)
{
	if (me >= 0)
		at_point(where, K_POINT);
	for (int t = 0; t < S.n; t++) {
		int blocked = T_BLOCKED;
		if (LOAD(&S.blocked_on[t]) == addr &&
		    __atomic_compare_exchange_n(&S.st[t], &blocked, T_READY, false, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST))
			STORE(&S.blocked_on[t], NULL);
	}
}
