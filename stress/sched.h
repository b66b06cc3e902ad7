/* stress/sched.h: the controlled scheduler of the scheduled race suite: one race thread runs at a time, chosen at every scheduling point. */
#ifndef PERCH_STRESS_SCHED_H
#define PERCH_STRESS_SCHED_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/*
 * In the scheduled build (-DPERCH_SCHED) every lib/atomic.h operation, spin
 * pause and futex call of a controlled thread reaches stress/sched.c first.
 * The race's actors stay real threads, but only the one holding the turn
 * runs; at each point the strategy says who runs the next operation.
 *
 * A round: the main actor (index 0) sets it up and calls
 * sched_round_begin; every actor runs its half between sched_enter and
 * sched_exit; the main actor waits in sched_wait_round_end, then judges.
 * No barrier is needed: an actor waits in sched_enter until the round is
 * published, and for its turn. Everything here runs on the race's
 * threads; one race at a time.
 */

enum sched_strategy {
	SCHED_PCT,         /* random priorities, c = 1..3 random priority-change points a round */
	SCHED_EXHAUSTIVE,  /* every schedule with at most `bound` preemptions, one per round */
};

/* Starts a race: `threads` actors, the run's seed mixed with the race's name. */
void sched_start(enum sched_strategy strategy, int threads, uint64_t seed, unsigned bound);

/* Main actor, before the round's barrier: the round's priorities and change points, or its prefix. */
void sched_round_begin(uint64_t round);

/*
 * Actor `index`: waits until the main actor published round `round`, then
 * for its first turn. False when the rounds were stopped (sched_stop).
 */
bool sched_enter(int index, uint64_t round);

/* Actor `index`, after its half: hands the turn on; the round ends with the last. */
void sched_exit(int index);

/* Main actor, after its half: waits until every half of `round` ended. */
void sched_wait_round_end(uint64_t round);

/* Main actor: no more rounds; actors waiting in sched_enter return false. */
void sched_stop(void);

/*
 * Main actor, after the round: the exhaustive search moves to its next
 * schedule; false once every schedule within the bound was run.
 */
bool sched_round_end(void);

/* Schedules run by the exhaustive search so far. */
uint64_t sched_schedules(void);

/* The round being run. */
uint64_t sched_round(void);

/* The longest round so far, in scheduling points: PCT's k. */
uint64_t sched_longest_round(void);

/* Prints the last round's schedule: each operation in the order it ran, with its actor and file:line. */
void sched_print_schedule(FILE *f);

/* A round that cannot go on because the code under test is broken (a deadlock, a livelock): the harness fails the race and exits. */
void race_sched_fatal(const char *why) __attribute__((noreturn));

/* The scheduler cannot run the race as asked (a replay diverged, a round too long): an error, not a catch; exits with 3. */
void race_sched_error(const char *why) __attribute__((noreturn));

/*
 * Called on an actor's thread when its first operation of the round is
 * about to run (its first scheduling point, once it holds the turn): the
 * harness starts the actor's window there, so a thread preempted before
 * it did anything does not count as overlapping.
 */
void race_sched_first_step(int index);

#endif /* PERCH_STRESS_SCHED_H */
