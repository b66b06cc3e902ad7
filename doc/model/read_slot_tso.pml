/*
 * read_slot_tso.pml - the read waiter slot on x86-TSO: why a completion must
 * publish its state with a read-modify-write (or a store and a store->load
 * fence) before it looks at the slot.
 *
 * read_slot.pml assumes sequential consistency.  On x86 a plain store goes to
 * the storing CPU's store buffer and a later load of another address may be
 * served before that store reaches memory (store->load reordering).  The read
 * and a completion form a Dekker pair:
 *
 *     read:        CAS slot EMPTY->CLAIM ;  load rx_flags/rd_cancel/rx_total
 *     completion:  publish new state     ;  load slot (wake_reader)
 *
 * The read's side is a locked instruction (a CAS drains the store buffer, so it
 * is a full barrier on x86).  lib/conn.c publishes with read-modify-writes too
 * (faa rx_total, fetch-or rx_flags, exchange rd_cancel), so nothing sits in a
 * store buffer when wake_reader loads the slot: this model.  A plain store
 * there (perch__store_*, a release store) lets the completion see EMPTY while
 * the read's re-check still sees nothing, and the read parks with the wake
 * spent: read_slot_tso_broken_publish_by_store.pml, which must fail.
 * (ck_pr_fence_store_load() after a plain store would be as good as the RMW.)
 *
 * Not covered: ck_pr's read-modify-writes are fences only where ck says
 * CK_MD_TSO (x86).  On aarch64 they are bare ldxr/stxr, and the same pair
 * needs ck_pr_fence_atomic_load() after each RMW (a no-op on x86).
 *
 * Store buffers are modelled only where they can change an outcome: the
 * completers' publication.  Every other shared write in the protocol is a
 * locked read-modify-write on the slot, which x86 executes against memory
 * after draining the buffer, except the read's plain store of read_cookie.
 * That store is followed by no load before the read's publish CAS, a locked
 * instruction that drains it, so buffering it is the same as performing it
 * just before the CAS: the model performs it at once.  The completion loads
 * read_cookie only after its CAS took the listener to DELIVERING, so it reads
 * the parked read's cookie.  A buffered store is committed by the Drainer at
 * any moment, and at the latest when its owner runs a locked instruction.
 *
 * Actors: Reader (one read, listener L), Completer(BYTES), Completer(CLOSE),
 * Drainer (the store buffers emptying into memory).
 */

#define EMPTY         0
#define CLAIM         1
#define CLAIM_MARKED  2
#define DELIVERING    3
#define L             4
#define COOKIE        7            /* what the read's on_parking returns */

#define R_NONE     0
#define R_SYNC     2
#define R_PENDING  3

#define BYTES   0
#define CLOSE   1

/* ---- memory ---- */
byte read_waiter = EMPTY;
byte read_cookie;
bool data_avail;
bool closed;

/* ---- one store buffer entry per completer: a flag store not yet in memory ---- */
bool sb[2];

/* ---- ghosts ---- */
bool readied;
byte result;
byte deliveries;
byte done;                         /* actors that returned */

#define STATE_READY (data_avail || closed)

/* commit completer k's buffered store to memory (inside a d_step / atomic) */
#define COMMIT(k) \
	if \
	:: sb[k] && k == BYTES -> data_avail = true; sb[k] = false \
	:: sb[k] && k == CLOSE -> closed = true; sb[k] = false \
	:: else \
	fi

proctype Reader()
{
	bool ok;

	atomic {
		if
		:: read_waiter == EMPTY -> read_waiter = CLAIM; ok = true
		:: else -> ok = false
		fi
	}
	assert(ok);                        /* the only read */

	/* re-check: loads read memory (the reader has no buffered flag stores) */
	if
	:: STATE_READY ->
		atomic { read_waiter = EMPTY };
		result = R_SYNC;
		goto out
	:: else
	fi;

	/* on_parking (a ghost) returns the cookie; a plain store under the claim */
	d_step { readied = true; read_cookie = COOKIE };

	atomic {
		if
		:: read_waiter == CLAIM -> read_waiter = L; ok = true
		:: else -> ok = false
		fi
	}
	if
	:: !ok ->
		atomic { assert(read_waiter == CLAIM_MARKED); read_waiter = EMPTY };
		result = R_SYNC
	:: else ->
		result = R_PENDING
	fi;
out:
	done++
}

proctype Completer(byte k)
{
	byte w, cookie;
	bool ok;

#ifdef MUT_PUBLISH_BY_STORE
	/* mutant: publish with a plain (release) store: it enters the store buffer */
	sb[k] = true;
#else
	/* publish with a read-modify-write: locked, it goes straight to memory */
	d_step { sb[k] = true; COMMIT(k) };
#endif

	do
	:: w = read_waiter;                /* a plain load, from memory */
		if
		:: w == EMPTY -> break
		:: w == CLAIM_MARKED -> break
		:: w == DELIVERING -> break
		:: w == CLAIM ->
			atomic {                   /* locked: drains this CPU's buffer first */
				COMMIT(k);
				if
				:: read_waiter == CLAIM -> read_waiter = CLAIM_MARKED; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok -> break
			:: else
			fi
		:: w == L ->
			atomic {
				COMMIT(k);
				if
				:: read_waiter == L -> read_waiter = DELIVERING; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok ->
				cookie = read_cookie;      /* a plain load, from memory */
				atomic { assert(read_waiter == DELIVERING); read_waiter = EMPTY };
				d_step {
					assert(readied && result != R_SYNC);
					assert(cookie == COOKIE);
					deliveries++;
					assert(deliveries == 1)
				}
				break
			:: else -> break
			fi
		fi
	od;
	done++
}

proctype Drainer()
{
end:
	do
	:: d_step { sb[BYTES] -> COMMIT(BYTES) }
	:: d_step { sb[CLOSE] -> COMMIT(CLOSE) }
	od
}

init {
	atomic {
		run Reader();
		run Completer(BYTES);
		run Completer(CLOSE);
		run Drainer()
	}
	(done == 3);

	/* every store has reached memory by now (or will; it changes nothing) */
	d_step { COMMIT(BYTES); COMMIT(CLOSE) };

	/* no lost wake, exactly once */
	assert(read_waiter == EMPTY);
	if
	:: result == R_SYNC    -> assert(deliveries == 0)
	:: result == R_PENDING -> assert(readied && deliveries == 1)
	:: else -> assert(false)
	fi
}
