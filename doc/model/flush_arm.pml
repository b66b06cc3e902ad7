/*
 * flush_arm.pml - the flush arm (DESIGN.md, "The flush arm"; lib/conn.c:
 * try_flush_or_park, flush_closed_while_arming, complete_flush).
 *
 * Checks that every flush that returns PENDING is signalled exactly once, to
 * its own listener and with its own park's cookie, that a flush that returned
 * synchronously is never signalled, and that a flush starting right after a
 * completion let go of the guard (while that completion is still delivering)
 * is neither refused nor signalled in the old one's place, nor has its cookie
 * handed to the old one.  Sequential consistency: every statement is one step
 * of an interleaving (see flush_arm_tso.pml for x86 store buffering).
 *
 * Actors, all running at once and in every interleaving:
 *   Writer    flush #1 (FA), then, as soon as it sees flush_busy == 0, flush
 *             #2 (FB); each flush has bytes staged or not.  Both flushes use
 *             the writer's one listener W (as perch_conn_flush uses the
 *             connection's self_flusher every time): only the cookie tells
 *             the two parks apart;
 *   Intruder  one flush from another thread (FC, listener C), at any moment:
 *             it is either refused with -EBUSY or becomes a flush like the
 *             others;
 *   Reactor   the loop: takes submitted sends from the inbox and completes
 *             them (perch__conn_send_done); a send that reaches a closed
 *             connection may be dropped (never submitted, no completion) or
 *             completed with an error.  lib/conn_internal.h promises every
 *             send a completion; allowing the drop checks the protocol under
 *             the weaker assumption, so it holds for either backend policy;
 *   Closer    conn close: sets closed, then runs the same completion.
 *
 * Cookies: on_parking returns the park's cookie, here the flush's number
 * (FA, FB, FC).  Step 4 stores it in flush_cookie (a plain store) before the
 * listener and the arm; complete_flush loads it after taking the listener and
 * before releasing the guard, then signals with it.
 *
 * Every CAS / exchange is one atomic{} block; every plain load or store is one
 * statement.  Ghosts (busy_owner, armed_by, took, handing, readied, result, signals)
 * only record what happened; the protocol never reads them.
 *
 * @all-reached: check.sh requires pan to report no unreached state other than
 * assert(false), i.e. every branch of the protocol (each lost CAS and retry
 * included) runs in some interleaving - the model's proof that its races ran.
 * One branch exists only as such a witness: a flush stores its cookie while
 * the completion of an older park has loaded that park's cookie but not yet
 * signalled (the race the order "load the cookie, then release the guard" is
 * there for).  `handing` counts such completions (a ghost).
 *
 * Mutants: a *_broken_*.pml file #defines one MUT_* name and #includes this
 * file; each MUT_* block below is the one change that mutant makes.
 */

/* flushes (and their cookies) */
#define NONE 0
#define FA   1                     /* flush #1 of the writer     */
#define FB   2                     /* flush #2 of the writer     */
#define FC   3                     /* the intruder's flush       */

/* listeners: the value stored in flush_listener */
#define LW   4                     /* the writer's, for FA and FB */
#define LC   5                     /* the intruder's              */
#define LISTENER_OF(f) ((f) == FC -> LC : LW)

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
byte flush_cookie;                 /* the parked flush's, stored before the arm */
bit  closed;
chan inbox = [3] of { bit };       /* sends handed to the loop */

/* ---- ghosts, indexed by flush 1..3 ---- */
byte busy_owner;                   /* flush holding the guard, NONE if free  */
byte armed_by;                     /* flush whose arm flush_armed holds      */
bool readied[4];                   /* on_parking ran                         */
byte result[4];
byte signals[4];                   /* on_flush_done calls                    */
byte handing;                      /* completions that loaded a cookie and have not signalled yet */
bool writer_done;
bool intruder_done;

/* listener->on_flush_done(l, c, cookie, result): the signal of flush `took` */
inline on_flush_done(l, cookie, took)
{
	atomic {
		handing--;
		assert(l != NONE);                 /* never a signal to nobody           */
		assert(took != NONE && l == LISTENER_OF(took));   /* to the flush's listener */
		assert(cookie == took);            /* with that park's cookie, no other's */
		assert(readied[took]);
		assert(result[took] == F_NONE || result[took] == F_PENDING);
		signals[took]++;
		assert(signals[took] == 1)
	}
}

/* store flush_busy = 0, and record what the flush returns (ghost) */
inline release_guard(me, r)
{
	d_step { flush_busy = 0; busy_owner = NONE; result[me] = r }
}

/*
 * The completion: send done (Reactor) or close (Closer, after closed = 1).
 * Disarm, take the listener, load the cookie, release the guard, then signal.
 */
inline complete_flush(old, l, cookie, took)
{
#ifdef MUT_RELEASE_BEFORE_DISARM
	/* mutant: the guard is let go before the disarm */
	d_step { flush_busy = 0; busy_owner = NONE };
#endif
	atomic {
		old = flush_armed; flush_armed = 0;
		if
		:: old -> took = armed_by; armed_by = NONE
		:: else
		fi
	}
	if
	:: old == 0 -> skip                /* someone else disarmed it (or nothing armed) */
	:: else ->
		atomic {
			l = flush_listener; flush_listener = NONE;
			assert(l != NONE)          /* the arm always publishes a stored listener */
		};
#ifndef MUT_COOKIE_AFTER_GUARD
		d_step { cookie = flush_cookie; handing++ };  /* before the guard lets a new flush store its own */
#endif
#ifndef MUT_RELEASE_BEFORE_DISARM
		d_step {
			assert(busy_owner == took);    /* the guard released is the signalled flush's */
			flush_busy = 0; busy_owner = NONE
		};
#endif
#ifdef MUT_COOKIE_AFTER_GUARD
		/* mutant: the cookie is loaded after the guard is released */
		d_step { cookie = flush_cookie; handing++ };
#endif
		on_flush_done(l, cookie, took)
	fi
}

/* the arm: an exchange in lib/conn.c (its old value is ignored there: it is
   always 0, as the guard is held); under SC any store will do (flush_arm_tso.pml
   shows why it must be locked on x86) */
inline arm(me)
{
	atomic { assert(flush_armed == 0); flush_armed = 1; armed_by = me }
}

/* try_flush_or_park(conn, LISTENER_OF(me)) with `staged` bytes staged or not */
inline try_flush(me, staged, ok, old, l)
{
	/* 1. take the guard */
	atomic {
		if
		:: flush_busy == 0 -> flush_busy = 1; busy_owner = me; ok = 1
		:: else ->
			/* refused only while another flush really holds the guard;
			   -EBUSY, and its listener untouched */
			assert(busy_owner != NONE && busy_owner != me);
			assert(!readied[me]);
			result[me] = F_EBUSY;
			ok = 0
		fi
	}
	if
	:: !ok -> skip
	:: ok && !staged ->
		/* 2. nothing staged */
		release_guard(me, F_DONE)
	:: ok && staged && closed ->
		/* 3. closed: drop what is staged */
		release_guard(me, F_EPIPE)
	:: ok && staged && !closed ->
		/* 4. ready (on_parking returns the cookie), store the cookie, store the
		   listener, publish the arm */
		atomic {
			readied[me] = 1; flush_cookie = me;
			if
			:: handing > 0 -> skip     /* witness: an older park's completion has its cookie, not yet signalled */
			:: else -> skip
			fi
		}
#ifdef MUT_LISTENER_AFTER_ARM
		/* mutant: the arm is published before the listener it publishes */
		arm(me);
		flush_listener = LISTENER_OF(me);
#else
		flush_listener = LISTENER_OF(me);
		arm(me);
#endif
		/* 4b. re-check closed */
		if
		:: closed ->
#ifdef MUT_SKIP_RECHECK
			/* mutant: no re-check, the send goes to the loop regardless */
			d_step { inbox ! 1; result[me] = F_PENDING }
#elif defined(MUT_RECHECK_BY_STORE)
			/* mutant: the re-check takes the arm back with a plain store */
			d_step { flush_armed = 0; armed_by = NONE };
			flush_listener = NONE;
			release_guard(me, F_EPIPE)
#else
			atomic {
				old = flush_armed; flush_armed = 0;
				if
				:: old -> assert(armed_by == me); armed_by = NONE
				:: else
				fi
			}
			if
			:: old == 1 ->
				/* took our own arm back: -EPIPE now, the listener is not signalled */
				atomic {
					l = flush_listener; flush_listener = NONE;
					assert(l == LISTENER_OF(me))
				};
				release_guard(me, F_EPIPE)
			:: else ->
				/* the close disarmed us and signals */
				result[me] = F_PENDING
			fi
#endif
		:: else ->
			/* 5. hand the bytes to the loop (an MPSC push) */
			d_step { inbox ! 1; result[me] = F_PENDING }
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
	try_flush(FA, staged, ok, old, l);

	/* as soon as the guard is free (possibly while flush #1 is still being signalled) */
	(flush_busy == 0);
	if
	:: staged = 1
	:: staged = 0
	fi;
	try_flush(FB, staged, ok, old, l);
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
	try_flush(FC, staged, ok, old, l);
	intruder_done = 1
}

proctype Reactor()
{
	byte l, cookie, took;
	bit old, send;

	do
	:: inbox ? send ->
		if
		:: closed -> skip              /* loop policy A: drop a send on a closed conn */
		:: true -> complete_flush(old, l, cookie, took)   /* send done (or its error) */
		fi
	:: atomic { writer_done && intruder_done && len(inbox) == 0 } -> break
	od
}

proctype Closer()
{
	byte l, cookie, took;
	bit old;

	closed = 1;
	complete_flush(old, l, cookie, took)
}

init {
	byte f = FA;

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
	:: f <= FC ->
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
	assert(result[FB] != F_EBUSY || result[FC] != F_EBUSY)
}
