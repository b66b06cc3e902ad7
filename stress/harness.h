/* stress/harness.h: the race harness: actors meet at a barrier each round, jitter, race, and are judged after. */
#ifndef PERCH_STRESS_HARNESS_H
#define PERCH_STRESS_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#define RACE_MAX_ACTORS 3
#define RACE_MAX_BRANCHES 8

struct race;

/*
 * One race family. Each round: `setup` on the main actor, a barrier, then
 * every actor waits a random few pauses and runs its half (`actor[i]`,
 * timed, to count overlaps), a barrier, then `judge` on the main actor,
 * which returns false when the round broke the protocol (it says why with
 * race_fail). A round counts as overlapped when the timed halves of actor
 * 0 and actor 1 intersect.
 */
struct race_def {
	const char *name;
	int actors;                                   /* 2 or 3 */
	void *(*create)(void);                        /* per-test state */
	void (*destroy)(void *state);
	void (*setup)(void *state, uint64_t round);
	void (*actor[RACE_MAX_ACTORS])(void *state, uint64_t round);
	bool (*judge)(struct race *r, void *state, uint64_t round);
	const char *branch_names[RACE_MAX_BRANCHES];  /* counted by race_branch */
	uint64_t min_overlaps;                        /* default 1000 */
	/*
	 * 0, or 1 + the index of the branch that is the race's named window
	 * (say, "close landed while on_parking ran"): it must reach the same
	 * floor as the overlaps, so the race proves that window ran.
	 */
	int window_branch;
	/*
	 * The named window is a few instructions wide: real threads meet in
	 * it too seldom to prove it (the free suite counts it, and holds the
	 * overlap floor only); the scheduled suite holds it to the floor.
	 */
	bool window_needs_scheduler;
	/*
	 * Small enough for the scheduled suite to run every schedule with at
	 * most PERCH_RACE_BOUND preemptions (default 2), after its PCT rounds.
	 */
	bool exhaustive;
	/*
	 * Set when a thread outside the race takes part (a loop's, on the real
	 * kernel): the scheduler orders the actors, not that thread, so a
	 * replay repeats the actors' schedule but not the kernel's timing.
	 */
	bool outside_thread;
	/*
	 * Why the scheduled suite skips this race, and which scheduled race
	 * covers its window instead; NULL for a race it runs.
	 */
	const char *free_only;
};

struct race_outcome {
	uint64_t rounds;
	uint64_t overlaps;
	uint64_t failures;
	uint64_t branches[RACE_MAX_BRANCHES];
	double seconds;
	bool passed;
	bool exhausted;     /* exhaustive: every schedule within the bound ran */
	uint64_t longest;   /* scheduled: the longest round, in scheduling points */
	unsigned bound;     /* exhaustive: the preemption bound */
};

/* Counts one round through branch `i` (from judge, on the main actor). */
void race_branch(struct race *r, int i);

/* Records a broken round with a reason (printed for the first few). */
void race_fail(struct race *r, uint64_t round, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Runs the race for PERCH_STRESS_ROUNDS rounds (200,000 by default) and prints its line. */
struct race_outcome race_run(const struct race_def *def);

/*
 * Narrows the calling actor's timed half to the part that races (called
 * from an actor, at most once per round each): a round overlaps when the
 * windows of actors 0 and 1 intersect.
 */
void race_window_open(void);
void race_window_close(void);

/* The index of the actor running on this thread (-1 outside the race's threads). */
int race_current_actor(void);

/* Spins a random while, up to the current jitter span: a callback doing a little work. */
void race_busy_work(void);

/* A yielding spin: pause a few times, then give the CPU away (a 1-core machine must still finish). */
void race_spin_pause(unsigned *spins);

/*
 * Runs every race in `defs`, prints the summary table, returns the exit
 * status. In the scheduled build (stress/perch_stress_sched) each race runs
 * under stress/sched.c: PCT rounds, then the exhaustive search where the
 * race allows it; PERCH_RACE_SEED=N replays a run.
 */
int race_main(int argc, char **argv, const struct race_def *const *defs, int n);

#endif /* PERCH_STRESS_HARNESS_H */
