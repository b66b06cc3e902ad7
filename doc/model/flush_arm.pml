/*
 * flush_arm.pml - the flush arm (DESIGN.md, "The flush arm"; lib/conn.c:
 * try_flush_or_park, flush_closed_while_arming, complete_flush).
 *
 * Checks that every flush that returns PENDING is signalled exactly once, to
 * its own listener, that a flush that returned synchronously is never
 * signalled, and that a flush starting right after a completion let go of the
 * guard (while that completion is still delivering) is neither refused nor
 * signalled in the old one's place.  Sequential consistency: every statement is
 * one step of an interleaving (see flush_arm_tso.pml for x86 store buffering).
 *
 * Actors, all running at once and in every interleaving:
 *   Writer    flush #1 (listener A), then, as soon as it sees flush_busy == 0,
 *             flush #2 (listener B); each flush has bytes staged or not;
 *   Intruder  one flush from another thread (listener C), at any moment: it is
 *             either refused with -EBUSY or becomes a flush like the others;
 *   Reactor   the loop: takes submitted sends from the inbox and completes
 *             them (perch__conn_send_done); a send that reaches a closed
 *             connection may be dropped (never submitted, no completion) or
 *             completed with an error.  lib/conn_internal.h promises every
 *             send a completion; allowing the drop checks the protocol under
 *             the weaker assumption, so it holds for either backend policy;
 *   Closer    conn close: sets closed, then runs the same completion.
 *
 * Every CAS / exchange is one atomic{} block; every plain load or store is one
 * statement.  Ghosts (busy_owner, published, readied, result, signals) only
 * record what happened.
 *
 * @all-reached: check.sh requires pan to report no unreached state other than
 * assert(false), i.e. every branch of the protocol (each lost CAS and retry
 * included) runs in some interleaving - the model's proof that its races ran.
 *
 * Mutants: a *_broken_*.pml file #defines one MUT_* name and #includes this
 * file; each MUT_* block below is the one change that mutant makes.
 */

#define NONE 0
#define LA   1                     /* flush #1 of the writer     */
#define LB   2                     /* flush #2 of the writer     */
#define LC   3                     /* the intruder's flush       */

/* what a flush returned */
#define F_NONE     0
#define F_EBUSY    1
#define F_DONE     2               /* nothing staged              */
#define F_EPIPE    3               /* closed, returned at once    */
#define F_PENDING  4               /* on_flush_done will signal   */

/* ---- the connection ---- */
bit  flush_busy;
bit  flush_armed;
byte flush_listener = NONE;
bit  closed;
chan inbox = [3] of { byte };      /* sends handed to the loop */

/* ---- ghosts, indexed by listener 1..3 ---- */
byte busy_owner;                   /* flush holding the guard, NONE if free */
bool readied[4];                   /* on_parking ran                        */
bool published[4];                 /* its arm was published                 */
byte result[4];
byte signals[4];                   /* on_flush_done calls                   */
bool writer_done;
bool intruder_done;

inline on_flush_done(l)
{
	d_step {
		assert(l != NONE);                 /* never a signal to nobody          */
		assert(readied[l] && published[l]);
		assert(result[l] != F_EBUSY && result[l] != F_DONE && result[l] != F_EPIPE);
		signals[l]++;
		assert(signals[l] == 1)
	}
}

inline release_guard()
{
	d_step { flush_busy = 0; busy_owner = NONE }
}

/*
 * The completion: send done (Reactor) or close (Closer, after closed = 1).
 * Disarm, take the listener, release the guard, then signal.
 */
inline complete_flush(old, l)
{
#ifdef MUT_RELEASE_BEFORE_DISARM
	/* mutant: the guard is let go before the disarm */
	release_guard();
#endif
	atomic { old = flush_armed; flush_armed = 0 }
	if
	:: old == 0 -> skip                /* someone else disarmed it (or nothing armed) */
	:: else ->
		atomic { l = flush_listener; flush_listener = NONE };
		assert(l != NONE);                 /* the arm always publishes a stored listener */
#ifndef MUT_RELEASE_BEFORE_DISARM
		d_step {
			assert(busy_owner == l);   /* the guard released is the signalled flush's */
			flush_busy = 0; busy_owner = NONE
		}
#endif
		on_flush_done(l)
	fi
}

/* try_flush_or_park(conn, listener me) with `staged` bytes staged or not */
inline try_flush(me, staged, ok, old, l)
{
	/* 1. take the guard */
	atomic {
		if
		:: flush_busy == 0 -> flush_busy = 1; busy_owner = me; ok = 1
		:: else ->
			/* refused only while another flush really holds the guard */
			assert(busy_owner != NONE && busy_owner != me);
			ok = 0
		fi
	}
	if
	:: !ok -> d_step { assert(!readied[me]); result[me] = F_EBUSY }
	:: ok && !staged ->
		/* 2. nothing staged */
		release_guard(); result[me] = F_DONE
	:: ok && staged && closed ->
		/* 3. closed: drop what is staged */
		release_guard(); result[me] = F_EPIPE
	:: ok && staged && !closed ->
		/* 4. ready, store the listener, publish the arm */
		readied[me] = 1;
#ifdef MUT_LISTENER_AFTER_ARM
		/* mutant: the arm is published before the listener it publishes */
		d_step { flush_armed = 1; published[me] = 1 };
		flush_listener = me;
#else
		flush_listener = me;
		/* the arm: an exchange in lib/conn.c; under SC any store will do
		   (flush_arm_tso.pml shows why it must be locked on x86) */
		d_step { flush_armed = 1; published[me] = 1 };
#endif
		/* 4b. re-check closed */
		if
		:: closed ->
#ifdef MUT_SKIP_RECHECK
			/* mutant: no re-check, the send goes to the loop regardless */
			inbox ! me;
			result[me] = F_PENDING
#elif defined(MUT_RECHECK_BY_STORE)
			/* mutant: the re-check takes the arm back with a plain store */
			flush_armed = 0;
			flush_listener = NONE;
			release_guard();
			result[me] = F_EPIPE
#else
			atomic { old = flush_armed; flush_armed = 0 }
			if
			:: old == 1 ->
				/* took our own arm back: -EPIPE now, the listener is not signalled */
				atomic { l = flush_listener; flush_listener = NONE };
				assert(l == me);
				release_guard();
				result[me] = F_EPIPE
			:: else ->
				/* the close disarmed us and signals */
				result[me] = F_PENDING
			fi
#endif
		:: else ->
			/* 5. hand the bytes to the loop */
			inbox ! me;
			result[me] = F_PENDING
		fi
	fi
}

proctype Writer()
{
	bit ok, old, staged;
	byte l;

	if
	:: staged = 1
	:: staged = 0
	fi;
	try_flush(LA, staged, ok, old, l);

	/* as soon as the guard is free (possibly while flush #1 is still being signalled) */
	(flush_busy == 0);
	if
	:: staged = 1
	:: staged = 0
	fi;
	try_flush(LB, staged, ok, old, l);
	writer_done = 1
}

proctype Intruder()
{
	bit ok, old, staged;
	byte l;

	if
	:: staged = 1
	:: staged = 0
	fi;
	try_flush(LC, staged, ok, old, l);
	intruder_done = 1
}

proctype Reactor()
{
	byte id, l;
	bit old;

	do
	:: inbox ? id ->
		if
		:: closed -> skip              /* loop policy A: drop a send on a closed conn */
		:: true -> complete_flush(old, l)   /* send done (or its error) */
		fi
	:: atomic { writer_done && intruder_done && len(inbox) == 0 } -> break
	od
}

proctype Closer()
{
	byte l;
	bit old;

	closed = 1;
	complete_flush(old, l)
}

init {
	byte f = LA;

	atomic {
		run Writer();
		run Intruder();
		run Reactor();
		run Closer()
	}

	/* every actor has returned: a lost signal shows up as a blocked Writer
	   (waiting for the guard) or as a PENDING flush with no signal */
	(_nr_pr == 1);

	assert(flush_busy == 0 && flush_armed == 0 && flush_listener == NONE);

	do
	:: f <= LC ->
		if
		:: result[f] == F_PENDING -> assert(readied[f] && signals[f] == 1)
		:: result[f] == F_EBUSY   -> assert(!readied[f] && signals[f] == 0)
		:: result[f] == F_DONE || result[f] == F_EPIPE -> assert(signals[f] == 0)
		:: else -> assert(false)
		fi;
		f++
	:: else -> break
	od;

	/* flush #2 started on a free guard: it is refused only if the intruder
	   took the guard in between (checked at the refusal), never as "armed" */
	assert(result[LB] != F_EBUSY || result[LC] != F_EBUSY)
}
