/*
 * flush_arm_tso.pml - the flush arm on x86-TSO: why step 4 publishes the arm
 * with an exchange (lib/conn.c) and not with a store-release.
 *
 * flush_arm.pml assumes sequential consistency.  Step 4 / 4b and the close
 * form a Dekker pair:
 *
 *     flush:  store flush_listener ; arm flush_armed=1     ; load closed (4b)
 *     close:  fetch-or closed      ; exchange(flush_armed, 0)
 *
 * The close's side is locked instructions only.  lib/conn.c arms with an
 * exchange, a locked instruction, so the listener and the arm are in memory
 * before 4b loads closed: this model.  A store-release arm (what DESIGN.md
 * says) is a plain store on x86 and does not keep the later load of closed
 * behind it: the flush can read closed == 0 while its arm still sits in its
 * store buffer, and the close's exchange then finds flush_armed == 0 and
 * signals nobody.  The flush returns PENDING and is signalled only if the
 * send it hands over still completes; a backend that drops a send reaching a
 * closed connection loses it: flush_arm_tso_broken_arm_by_store.pml, which
 * must fail.  (lib/conn_internal.h's transport contract says every send ends
 * in perch__conn_send_done, which would rescue it; the exchange makes the
 * protocol not depend on that.)
 *
 * Not covered: on aarch64 ck_pr_fas is a bare ldxr/stxr, not a fence; the
 * arm needs ck_pr_fence_atomic_load() before 4b's load there (no-op on x86).
 *
 * Store buffers are modelled only where they can change an outcome: the
 * writer's stores of step 4 (FIFO: flush_cookie, flush_listener, then
 * flush_armed).  The
 * other plain stores (flush_busy = 0) are followed by no load of another
 * protocol address before their thread's next locked instruction or return,
 * so buffering them is the same as performing them later, which the
 * interleavings already cover.  A buffered store is committed by the Drainer
 * at any moment, and at the latest when the writer runs a locked instruction
 * (the arm's exchange, 4b's exchange, the MPSC push onto the inbox).
 *
 * Actors: Writer (one flush, listener A, bytes staged), Reactor (completes the
 * send, or drops it if the connection is closed), Closer, Drainer.
 */

#define NONE 0
#define LA   1
#define COOKIE 7                   /* what the flush's on_parking returns */

#define F_NONE     0
#define F_EPIPE    3
#define F_PENDING  4

/* ---- memory ---- */
bit  flush_busy;
bit  flush_armed;
byte flush_listener = NONE;
byte flush_cookie;
bit  closed;
chan inbox = [1] of { byte };

/* ---- the writer's store buffer (FIFO of at most three entries) ---- */
bool sb_cookie;                    /* flush_cookie = COOKIE pending */
bool sb_listener;                  /* flush_listener = sb_listener_val pending, behind the cookie */
byte sb_listener_val;
bool sb_armed;                     /* flush_armed = 1 pending, behind the listener */

/* ---- ghosts ---- */
bool readied;
byte result;
byte signals;
bool writer_done;
byte done;

/* commit the writer's buffered stores in order (inside a d_step / atomic) */
#define DRAIN_WRITER \
	if \
	:: sb_cookie -> flush_cookie = COOKIE; sb_cookie = false \
	:: else \
	fi; \
	if \
	:: sb_listener -> flush_listener = sb_listener_val; sb_listener = false \
	:: else \
	fi; \
	if \
	:: sb_armed -> flush_armed = 1; sb_armed = false \
	:: else \
	fi

inline complete_flush(old, l, cookie)
{
	atomic { old = flush_armed; flush_armed = 0 }
	if
	:: old == 0 -> skip
	:: else ->
		atomic { l = flush_listener; flush_listener = NONE };
		cookie = flush_cookie;         /* a plain load, before the guard is released */
		flush_busy = 0;
		d_step {
			assert(l == LA && cookie == COOKIE && readied && result != F_EPIPE);
			signals++;
			assert(signals == 1)
		}
	fi
}

proctype Writer()
{
	bit old;
	byte l;

	/* 1. the guard (locked; the buffer is empty here) */
	atomic { assert(flush_busy == 0); flush_busy = 1 };
	/* 2. bytes are staged.  3. closed? */
	if
	:: closed -> flush_busy = 0; result = F_EPIPE; goto out
	:: else
	fi;
	/* 4. ready (on_parking returns the cookie), store the cookie and the
	   listener, publish the arm: plain stores go into the store buffer */
	d_step { readied = true; sb_cookie = true };            /* plain store: buffered */
	d_step { sb_listener_val = LA; sb_listener = true };   /* plain store: buffered */
#ifdef MUT_ARM_BY_STORE
	/* mutant: arm with a store-release: buffered behind the cookie and the listener */
	sb_armed = true;
#else
	/* arm with an exchange: locked, drains the cookie and the listener, then arms in memory */
	d_step { DRAIN_WRITER; flush_armed = 1 };
#endif
	/* 4b. re-check closed (a plain load, from memory) */
	if
	:: closed ->
		atomic { DRAIN_WRITER; old = flush_armed; flush_armed = 0 };
		if
		:: old == 1 ->
			atomic { l = flush_listener; flush_listener = NONE };
			assert(l == LA);
			flush_busy = 0;
			result = F_EPIPE
		:: else ->
			result = F_PENDING
		fi
	:: else ->
		/* 5. hand the send to the loop: an MPSC push, a locked instruction */
		atomic { DRAIN_WRITER; inbox ! LA };
		result = F_PENDING
	fi;
out:
	writer_done = true;
	done++
}

proctype Reactor()
{
	byte id, l, cookie;
	bit old;

	do
	:: inbox ? id ->
		if
		:: closed -> skip              /* the loop drops a send on a closed conn */
		:: true -> complete_flush(old, l, cookie)
		fi
	:: atomic { writer_done && len(inbox) == 0 } -> break
	od;
	done++
}

proctype Closer()
{
	byte l, cookie;
	bit old;

	closed = 1;
	complete_flush(old, l, cookie);
	done++
}

proctype Drainer()
{
end:
	do
	:: d_step { sb_cookie -> flush_cookie = COOKIE; sb_cookie = false }
	:: d_step { !sb_cookie && sb_listener -> flush_listener = sb_listener_val; sb_listener = false }
	:: d_step { !sb_cookie && !sb_listener && sb_armed -> flush_armed = 1; sb_armed = false }
	od
}

init {
	atomic {
		run Writer();
		run Reactor();
		run Closer();
		run Drainer()
	}
	(done == 3);

	d_step { DRAIN_WRITER };

	/* exactly once, no lost signal */
	if
	:: result == F_PENDING -> assert(readied && signals == 1)
	:: result == F_EPIPE   -> assert(signals == 0)
	:: else -> assert(false)
	fi;
	assert(flush_busy == 0 && flush_armed == 0)
}
