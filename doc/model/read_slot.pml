/*
 * read_slot.pml - the read waiter slot (DESIGN.md, "The read waiter slot";
 * lib/conn.c: try_read_or_park, perch_conn_try_read, wake_reader).
 *
 * Checks exactly-once delivery, no lost wake, and that every delivery carries
 * the cookie of the park it delivers, for perch_conn's read_waiter word, under
 * sequential consistency (every statement below is one atomic step of an
 * interleaving; see read_slot_tso.pml for x86 store buffering).
 *
 * Actors, all running at once and in every interleaving:
 *   Reader(1)             the reader, three calls in a row, each at any moment:
 *                         op 1 try_read_or_park(L1); op 2 perch_conn_try_read
 *                         (a poll: claim, look, give the claim back); op 3
 *                         try_read_or_park(L1) again, a new park with a new
 *                         cookie.  Op 2 and op 3 may land the instant the slot
 *                         goes EMPTY after a delivery of op 1, before that
 *                         delivery's on_recv_ready has run: the same steps as
 *                         a re-park from inside on_recv_ready, or from the
 *                         reader's own thread after a successful poll;
 *   Reader(2)             racing it (op 4): either one try_read_or_park with
 *                         listener L2, or one perch_conn_try_read;
 *   Completer(BYTES)      the loop queues received bytes, then wakes;
 *   Completer(CLOSE)      peer FIN / error / perch_conn_close: sets its flag,
 *                         then wakes;
 *   Completer(CANCEL)     perch_conn_cancel_read: sets rd_cancel, then wakes.
 *
 * The reader consumes what it is shown: fill_result takes the cancel (an
 * exchange of rd_cancel) and the reader examines every byte it got (the
 * advance to the end is folded into the read's own claim), so a later read
 * parks again until something new comes.  A close is final: every read after
 * it is served at once.
 *
 * Cookies: on_parking returns the park's cookie, here the op's number (each op
 * parks at most once, so it is the park's ordinal).  The read stores it in
 * read_cookie (a plain store) before the publish CAS.  A completion that finds
 * a listener CASes it to DELIVERING, loads read_cookie, exchanges the slot to
 * EMPTY and then calls on_recv_ready(l, cookie).  A claim CASes only from
 * EMPTY, so no read can claim (and store a newer cookie) while DELIVERING.
 *
 * A completion whose CAS on a published listener fails returns, as
 * wake_reader() does: only another completion can have taken the listener
 * back, and it delivers (and shows this completion's state, published before).
 * DESIGN.md's wording retries instead; read_slot_listener_retry.pml checks
 * that form too.  A completion that loads DELIVERING returns as well.
 *
 * Every CAS / exchange is one atomic{} block; every plain load or store is one
 * statement.  Ghost variables (holder, parked, took, readied, result,
 * deliveries) only record what happened; the protocol never reads them, and
 * their updates ride in the step they record.
 *
 * Not asserted, because the protocol does not promise it once reads consume:
 * that a wake brings something new.  A completion that loaded the slot before
 * the reader consumed its state (on a read served at once) can still take the
 * reader's next park and deliver it with nothing new (conn.h says so).  A
 * stale mark (a completion that loaded an earlier claim marks this one) is
 * cleared and the read looks again, so a read served at once always has
 * something to show (asserted in fill_result's callers below).
 *
 * @all-reached: check.sh requires pan to report no unreached state other than
 * assert(false), i.e. every branch of the protocol (each lost CAS and retry
 * included) runs in some interleaving - the model's proof that its races ran.
 * Three branches exist only as such witnesses: a claim refused while
 * DELIVERING; an on_recv_ready that runs after a newer park already stored
 * its cookie in read_cookie (the race the DELIVERING step is there for); and
 * a read that lost its publish to a stale mark, found nothing new and
 * published again.
 *
 * Mutants: a *_broken_*.pml file #defines one MUT_* name and #includes this
 * file; each MUT_* block below is the one change that mutant makes.
 */

/* values of read_waiter */
#define EMPTY         0
#define CLAIM         1
#define CLAIM_MARKED  2
#define DELIVERING    3
#define L1            4            /* listener of Reader(1) */
#define L2            5            /* listener of Reader(2) */

/* ops: Reader(1) makes ops 1..3, Reader(2) op 4.  An op's cookie is its number. */
#define NOPS          5
#define LISTENER_OF(op) ((op) == 4 -> L2 : L1)
#define DLV           9            /* holder: a completion is delivering */

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
byte read_cookie;                  /* the parked read's cookie, stored before the publish */
bit  rx_total;                     /* bytes ever queued (one send's worth)  */
bit  rx_closed;                    /* FIN / error / close: final            */
bit  rd_cancel;                    /* a cancel not yet reported             */
bit  rd_examined;                  /* reader-private: bytes it has seen     */

/* ---- ghosts ---- */
byte holder;                       /* op whose claim/park holds the slot, DLV, or 0 */
byte parked;                       /* op of the last published park          */
bool readied[NOPS];                /* on_parking ran for this op             */
byte result[NOPS];                 /* what the op returned                   */
byte deliveries[NOPS];             /* on_recv_ready calls for this op's park */

#define READY (rx_total != rd_examined || rx_closed || rd_cancel)

/* listener->on_recv_ready(l, c, cookie): the asynchronous delivery of park `took` */
inline on_recv_ready(l, cookie, took)
{
	atomic {
		if
		:: read_cookie != cookie -> skip   /* witness: a newer park already stored its cookie */
		:: else -> skip
		fi;
		assert(took >= 1 && took <= 4);
		assert(l == LISTENER_OF(took));    /* to the listener that parked        */
		assert(cookie == took);            /* with that park's cookie, no other's */
		assert(readied[took]);             /* readied before it could be woken    */
		assert(result[took] == R_PENDING);  /* a park, not a read served at once */
		deliveries[took]++;
		assert(deliveries[took] == 1)
	}
}

/*
 * 1. the claim: CAS EMPTY -> CLAIM.  When it fails the op returns -EBUSY at
 * once, having touched nothing: not the slot, not its own listener.
 */
inline claim(op, ok)
{
	atomic {
		if
		:: read_waiter == EMPTY -> read_waiter = CLAIM; holder = op; ok = true
		:: read_waiter == DELIVERING ->
			/* refused while a completion hands a park over */
			assert(holder == DLV);
			assert(!readied[op]); result[op] = R_EBUSY; ok = false
		:: else ->
			/* refused: another read's claim, or a park, really holds the slot */
			assert(holder >= 1 && holder <= 4 && holder != op);
			assert(result[holder] == R_NONE || result[holder] == R_PENDING);
			assert(!readied[op]); result[op] = R_EBUSY; ok = false
		fi
	}
}

/* give the claim back (an exchange: a mark set meanwhile is cleared) and return r */
inline release_claim(op, r)
{
	atomic {
		assert(read_waiter == CLAIM || read_waiter == CLAIM_MARKED);
		assert(holder == op);
		read_waiter = EMPTY; holder = 0;
		result[op] = r
	}
}

/* fill_result under the claim: take the bytes (examined to the end) and the cancel */
inline fill_result()
{
	assert(READY);                     /* a read served at once has something to show */
	rd_examined = rx_total;
	rd_cancel = 0                      /* an exchange in lib/conn.c */
}

/* try_read_or_park(conn, LISTENER_OF(op)) */
inline read_or_park(op, ok)
{
#ifdef MUT_READY_BEFORE_CLAIM
	/* mutant: the listener is readied before the guard that may refuse the read */
	readied[op] = true;
#endif
	claim(op, ok);
	if
	:: !ok -> skip
	:: ok && READY ->
		/* 2. re-check under the claim: serve at once */
		fill_result();
#ifdef MUT_RECHECK_KEEPS_SLOT
		/* mutant: served at once, but the claim (or its mark) stays in the slot */
		result[op] = R_SYNC
#else
		release_claim(op, R_SYNC)
#endif
	:: ok && !READY ->
		/* 3. ready the listener: on_parking (a ghost) returns the cookie, stored
		   under the claim with a plain store */
#ifndef MUT_READY_BEFORE_CLAIM
		d_step { readied[op] = true; read_cookie = op };
#else
		read_cookie = op;
#endif
		/* 4. publish: CAS CLAIM -> listener; 5. parked.  A lost publish (the
		   claim was marked) clears the mark and looks again: the mark may be
		   stale, left by a completion that loaded an earlier claim */
		do
		:: atomic {
			if
			:: read_waiter == CLAIM ->
				read_waiter = LISTENER_OF(op); parked = op; ok = true;
				result[op] = R_PENDING
			:: else ->
				assert(read_waiter == CLAIM_MARKED);   /* only a mark changes a claim */
				ok = false
			fi
		   }
		   if
		   :: ok -> break
		   :: else ->
#ifdef MUT_MARK_RETURNS_PENDING
			/* mutant: a lost publish is taken as parked anyway */
			result[op] = R_PENDING;
			break
#elif defined(MUT_STALE_MARK_SERVED)
			/* mutant (perch's first version): a lost publish serves at once,
			   even when the mark was stale and nothing is new */
			fill_result();
			release_claim(op, R_SYNC);
			break
#else
			/* clear the mark (an exchange: only this claim's owner changes a mark) */
			atomic { assert(read_waiter == CLAIM_MARKED); read_waiter = CLAIM };
			if
			:: READY ->
				fill_result();
				release_claim(op, R_SYNC);
				break
			:: else ->
				/* witness: a stale mark; nothing new, so publish again */
				skip
			fi
#endif
		   fi
		od
	fi
}

/* perch_conn_try_read(conn): claim, look, give the claim back; never parks */
inline try_read(op, ok)
{
	claim(op, ok);
	if
	:: !ok -> skip
	:: ok && READY -> fill_result(); release_claim(op, R_SYNC)
	:: ok && !READY -> release_claim(op, R_EAGAIN)
	fi
}

proctype Reader(byte me)
{
	bool ok;

	if
	:: me == 1 ->
		read_or_park(1, ok);
		try_read(2, ok);
		read_or_park(3, ok)
	:: me == 2 -> read_or_park(4, ok)
	:: me == 2 -> try_read(4, ok)
	fi
}

proctype Completer(byte kind)
{
	byte w, cookie, took;
	bool ok;

	/* make the new state visible first (a read-modify-write in lib/conn.c) */
	if
	:: kind == BYTES  -> rx_total = 1
	:: kind == CLOSE  -> rx_closed = 1
	:: kind == CANCEL -> rd_cancel = 1
	fi;

	/* then wake_reader() */
	do
	:: w = read_waiter;
		if
		:: w == EMPTY -> break             /* nothing parked: the next read will see it */
		:: w == CLAIM_MARKED -> break      /* the claiming read will serve            */
		:: w == DELIVERING -> break        /* the side handing the park over delivers */
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
#if defined(MUT_TAKE_BY_STORE)
			/* mutant: the park is taken back with a plain store, not a CAS */
			d_step { read_waiter = DELIVERING; took = parked; holder = DLV };
			cookie = read_cookie;
			atomic { read_waiter = EMPTY; holder = 0 };
			on_recv_ready(w, cookie, took);
			break
#elif defined(MUT_COOKIE_AFTER_RELEASE)
			/* mutant: the park is taken straight to EMPTY, its cookie loaded after */
			atomic {
				if
				:: read_waiter == w ->
					read_waiter = EMPTY; took = parked; holder = 0; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok ->
				cookie = read_cookie;
				on_recv_ready(w, cookie, took);
				break
			:: else -> break
			fi
#else
			/* CAS listener -> DELIVERING: only the side whose CAS won delivers */
			atomic {
				if
				:: read_waiter == w ->
					assert(holder == parked);
					read_waiter = DELIVERING; took = parked; holder = DLV; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok ->
				cookie = read_cookie;      /* no claim can store a newer one now */
				atomic {                   /* exchange to EMPTY: free before the callback */
					assert(read_waiter == DELIVERING && holder == DLV);
					read_waiter = EMPTY; holder = 0
				}
				on_recv_ready(w, cookie, took);
				break
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
	byte op = 1;

	atomic {
		run Reader(1);
		run Reader(2);
		run Completer(BYTES);
		run Completer(CLOSE);
		run Completer(CANCEL)
	}

	/* every actor has returned */
	(_nr_pr == 1);

	/*
	 * No lost wake: nothing is left parked, claimed, marked or mid-delivery.
	 * (The close is final and comes in every run: a park published before it
	 * is delivered, and no read parks after it.)
	 */
	assert(read_waiter == EMPTY && holder == 0);

	/* exactly once, per op */
	do
	:: op <= 4 ->
		if
		:: result[op] == R_EBUSY   -> assert(!readied[op] && deliveries[op] == 0)
		:: result[op] == R_SYNC || result[op] == R_EAGAIN -> assert(deliveries[op] == 0)
		:: result[op] == R_PENDING -> assert(readied[op] && deliveries[op] == 1)
		:: else -> assert(false)
		fi;
		op++
	:: else -> break
	od;

	/* two reads at once: at most one of them was refused, never both */
	assert(!(result[1] == R_EBUSY && result[4] == R_EBUSY))
}
