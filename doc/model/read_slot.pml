/*
 * read_slot.pml - the read waiter slot (DESIGN.md, "The read waiter slot";
 * lib/conn.c: try_read_or_park, perch_conn_try_read, wake_reader).
 *
 * Checks exactly-once delivery and no lost wake for perch_conn's read_waiter
 * word, under sequential consistency (every statement below is one atomic step
 * of an interleaving; see read_slot_tso.pml for x86 store buffering).
 *
 * Actors, all running at once and in every interleaving:
 *   Reader(1)             one try_read_or_park with listener L1;
 *   Reader(2)             racing it: either one try_read_or_park with listener
 *                         L2, or one perch_conn_try_read (claim, look, give the
 *                         claim back, never parks);
 *   Completer(BYTES)      the loop queues received bytes, then wakes;
 *   Completer(CLOSE)      peer FIN / error / perch_conn_close: sets its flag,
 *                         then wakes;
 *   Completer(CANCEL)     perch_conn_cancel_read: sets rd_cancel, then wakes.
 *
 * A completion whose CAS on a published listener fails returns, as
 * wake_reader() does: only another completion can have taken the listener
 * back, and it delivers (and shows this completion's state, published before).
 * DESIGN.md's wording retries instead; read_slot_listener_retry.pml checks
 * that form too.
 *
 * Every CAS / exchange is one atomic{} block; every plain load or store is one
 * statement.  Ghost variables (slot_owner, readied, result, deliveries) only
 * record what happened; the protocol never reads them.
 *
 * @all-reached: check.sh requires pan to report no unreached state other than
 * assert(false), i.e. every branch of the protocol (each lost CAS and retry
 * included) runs in some interleaving - the model's proof that its races ran.
 *
 * Mutants: a *_broken_*.pml file #defines one MUT_* name and #includes this
 * file; each MUT_* block below is the one change that mutant makes.
 */

/* values of read_waiter */
#define EMPTY         0
#define CLAIM         1
#define CLAIM_MARKED  2
#define L1            3            /* listener of Reader(1) */
#define L2            4            /* listener of Reader(2) */
#define LISTENER(r)   ((r) + 2)
#define READER_OF(l)  ((l) - 2)

/* what a read returned */
#define R_NONE     0
#define R_EBUSY    1               /* refused, touched nothing             */
#define R_SYNC     2               /* served synchronously (the delivery)  */
#define R_PENDING  3               /* parked: on_recv_ready will deliver   */
#define R_EAGAIN   4               /* perch_conn_try_read found nothing    */

/* completer kinds */
#define BYTES   1
#define CLOSE   2
#define CANCEL  3

/* ---- the connection ---- */
byte read_waiter = EMPTY;
bool data_avail;                   /* bytes queued, not yet examined */
bool closed;
bool canceled;

/* ---- ghosts, indexed by reader 1..2 ---- */
byte slot_owner;                   /* reader whose claim/park holds the slot, 0 = none */
bool readied[3];                   /* on_parking ran for this read            */
byte result[3];                    /* what try_read_or_park returned          */
byte deliveries[3];                /* on_recv_ready calls for this read       */

#define STATE_READY (data_avail || closed || canceled)

/* listener->on_recv_ready(): the asynchronous delivery. */
inline on_recv_ready(l)
{
	d_step {
		assert(l == L1 || l == L2);
		assert(readied[READER_OF(l)]);     /* readied before it could be woken   */
		assert(result[READER_OF(l)] != R_SYNC && result[READER_OF(l)] != R_EBUSY);
		assert(STATE_READY);               /* a wake always has something to show */
		deliveries[READER_OF(l)]++;
		assert(deliveries[READER_OF(l)] == 1)
	}
}

proctype Reader(byte me)
{
	bool ok, parks = true;

	if
	:: me == 2 -> parks = false        /* perch_conn_try_read */
	:: true
	fi;

#ifdef MUT_READY_BEFORE_CLAIM
	/* mutant: the listener is readied before the guard that may refuse the read */
	readied[me] = true;
#endif

	/* 1. claim: CAS EMPTY -> CLAIM */
	atomic {
		if
		:: read_waiter == EMPTY -> read_waiter = CLAIM; slot_owner = me; ok = true
		:: else ->
			/* refused: another read really holds the slot at this instant */
			assert(slot_owner != 0 && slot_owner != me);
			ok = false
		fi
	}
	if
	:: !ok ->
		/* -EBUSY, having touched nothing: not the slot, not its own listener */
		d_step {
			assert(!readied[me]);
			result[me] = R_EBUSY
		}
		goto out
	:: else
	fi;

	if
	:: !parks ->
		/* perch_conn_try_read: look under the claim, then give it back (an
		   exchange: a mark set meanwhile is cleared, nobody is parked on it) */
		if
		:: STATE_READY -> result[me] = R_SYNC
		:: else -> result[me] = R_EAGAIN
		fi;
		atomic {
			assert(read_waiter == CLAIM || read_waiter == CLAIM_MARKED);
			read_waiter = EMPTY; slot_owner = 0
		}
		goto out
	:: else
	fi;

	/* 2. re-check under the claim */
	if
	:: STATE_READY ->
#ifdef MUT_RECHECK_KEEPS_SLOT
		/* mutant: served at once, but the claim (or its mark) stays in the slot */
		skip;
#else
		/* exchange to EMPTY; the old value is CLAIM or CLAIM_MARKED */
		atomic {
			assert(read_waiter == CLAIM || read_waiter == CLAIM_MARKED);
			read_waiter = EMPTY; slot_owner = 0
		}
#endif
		result[me] = R_SYNC;
		goto out
	:: else
	fi;

	/* 3. ready the listener (its value task starts a new version) */
#ifndef MUT_READY_BEFORE_CLAIM
	readied[me] = true;
#endif

	/* 4. publish: CAS CLAIM -> listener */
	atomic {
		if
		:: read_waiter == CLAIM -> read_waiter = LISTENER(me); ok = true
		:: else -> ok = false
		fi
	}
	if
	:: !ok ->
#ifdef MUT_MARK_RETURNS_PENDING
		/* mutant: a lost publish is taken as parked anyway */
		result[me] = R_PENDING
#else
		/* a completion marked the claim during step 3: take the slot back, serve */
		atomic {
			assert(read_waiter == CLAIM_MARKED);
			read_waiter = EMPTY; slot_owner = 0
		}
		assert(STATE_READY);               /* the mark means there is something */
		result[me] = R_SYNC
#endif
	:: else ->
		/* 5. parked */
		result[me] = R_PENDING
	fi;
out:
	skip
}

proctype Completer(byte kind)
{
	byte w;
	bool ok;

	/* make the new state visible first */
	if
	:: kind == BYTES  -> data_avail = true
	:: kind == CLOSE  -> closed = true
	:: kind == CANCEL -> canceled = true
	fi;

	/* then wake */
	do
	:: w = read_waiter;
		if
		:: w == EMPTY -> break             /* nothing parked: the next read will see it */
		:: w == CLAIM_MARKED -> break      /* the claiming read will serve            */
		:: w == CLAIM ->
#ifdef MUT_NO_MARK
			/* mutant: a claim is left unmarked */
			break
#else
			atomic {
				if
				:: read_waiter == CLAIM -> read_waiter = CLAIM_MARKED; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok -> break
			:: else                        /* the claim moved on: look again */
			fi
#endif
		:: w == L1 || w == L2 ->
#ifdef MUT_TAKE_BY_STORE
			/* mutant: the park is taken back with a plain store, not a CAS */
			read_waiter = EMPTY;
			slot_owner = 0;
			on_recv_ready(w);
			break
#else
			atomic {
				if
				:: read_waiter == w -> read_waiter = EMPTY; slot_owner = 0; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok -> on_recv_ready(w); break   /* only the side whose CAS won delivers */
#ifdef LISTENER_RETRY
			:: else                            /* DESIGN.md's form: look again */
#else
			:: else -> break                   /* lib/conn.c: the side that took it delivers */
#endif
			fi
#endif
		fi
	od
}

init {
	byte r = 1;

	atomic {
		run Reader(1);
		run Reader(2);
		run Completer(BYTES);
		run Completer(CLOSE);
		run Completer(CANCEL)
	}

	/* every actor has returned */
	(_nr_pr == 1);

	/* no lost wake: nothing is left parked or claimed */
	assert(read_waiter == EMPTY);

	/* exactly once, per read */
	do
	:: r <= 2 ->
		if
		:: result[r] == R_EBUSY   -> assert(!readied[r] && deliveries[r] == 0)
		:: result[r] == R_SYNC || result[r] == R_EAGAIN -> assert(deliveries[r] == 0)
		:: result[r] == R_PENDING -> assert(readied[r] && deliveries[r] == 1)
		:: else -> assert(false)
		fi;
		r++
	:: else -> break
	od;

	/* two reads at once: at most one of them was refused, never both */
	assert(!(result[1] == R_EBUSY && result[2] == R_EBUSY))
}
