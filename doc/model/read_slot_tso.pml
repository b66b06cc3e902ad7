/*
 * read_slot_tso.pml - the read waiter slot on x86-TSO: the fence a completion
 * needs between making its state visible and looking at the slot.
 *
 * read_slot.pml assumes sequential consistency.  On x86 a plain store goes to
 * the storing CPU's store buffer and a later load of another address may be
 * served before that store reaches memory (store->load reordering).  Both sides
 * of the slot are a Dekker pair:
 *
 *     read:        CAS slot EMPTY->CLAIM ;  load data_avail/closed   (re-check)
 *     completion:  store data_avail=1     ;  load slot                 (wake)
 *
 * The read's side is a locked instruction (a CAS drains the store buffer, so it
 * is a full barrier on x86).  The completion's side is a plain store then a
 * plain load: without a store->load fence (ck_pr_fence_store_load(), mfence)
 * the completion can see EMPTY while the read's re-check still sees no data,
 * and the read parks with the wake spent.  This model keeps the fence;
 * read_slot_tso_broken_nofence.pml removes it and must fail.
 *
 * Store buffers are modelled only where they can change an outcome: the
 * completers' flag stores.  Every other shared write in the protocol is a
 * locked read-modify-write (CAS / exchange on the slot), which x86 executes
 * against memory after draining the buffer.  A buffered flag store is
 * committed by the Drainer at any moment, and at the latest when its owner
 * runs a locked instruction or a fence.
 *
 * Actors: Reader (one read, listener L), Completer(BYTES), Completer(CLOSE),
 * Drainer (the store buffers emptying into memory).
 */

#define EMPTY         0
#define CLAIM         1
#define CLAIM_MARKED  2
#define L             3

#define R_NONE     0
#define R_SYNC     2
#define R_PENDING  3

#define BYTES   0
#define CLOSE   1

/* ---- memory ---- */
byte read_waiter = EMPTY;
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

	readied = true;

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
	byte w;
	bool ok;

	/* make the new state visible: a plain store, into the store buffer */
	sb[k] = true;

#ifndef MUT_NO_FENCE
	/* ck_pr_fence_store_load(): the store reaches memory before the load below */
	d_step { COMMIT(k) };
#endif

	do
	:: w = read_waiter;                /* a plain load, from memory */
		if
		:: w == EMPTY -> break
		:: w == CLAIM_MARKED -> break
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
				:: read_waiter == L -> read_waiter = EMPTY; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok ->
				d_step {
					assert(readied && result != R_SYNC);
					deliveries++;
					assert(deliveries == 1)
				}
				break
			:: else
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
