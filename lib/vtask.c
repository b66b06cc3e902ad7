/* lib/vtask.c: the versioned value task: version, phase and result in one word, one continuation, futex waits. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <time.h>

#include <perch/vtask.h>

#include "atomic.h"
#include "invariant.h"
#include "vtask_internal.h"

/*
 * vt->state, the one word every call races through:
 *
 *   bits 63..32  result (int32), valid once the phase is COMPLETED
 *   bits 31..3   version (29 bits; 0 = never readied, skipped on wrap)
 *   bit  2       before completion: a blocking waiter sleeps on the low
 *                half (futex); once COMPLETED: a registrant the completion
 *                overtook is still writing the continuation (LATE_REG)
 *   bits 1..0    phase: PENDING, REGISTERING (a registrant is writing the
 *                continuation), REGISTERED (continuation published), COMPLETED
 *
 * A completion is one CAS from (version, PENDING|REGISTERED|REGISTERING)
 * to (version, COMPLETED, result): a completion for another version fails
 * it, so it can neither complete a newer version nor overwrite its result.
 * Nothing is written after that CAS: the futex wake only names the
 * address, and the continuation was read before it.
 *
 * A registration writes the continuation only while it holds REGISTERING,
 * so a registration that is refused (a second one, or one for an older
 * version) touches nothing. A completion that overtakes a registration
 * leaves LATE_REG, which the registrant clears once its stores are done
 * (its one write after the completing CAS); ready() waits out both (a few
 * stores) so the next version's continuation is never written beside
 * them.
 *
 * The owner alone moves a word that is COMPLETED without LATE_REG, or
 * never readied: nothing else writes such a state. So the owner readies it
 * with a store, and a park that readies it may write its continuation and
 * make it REGISTERED at once (perch__vtask_ready_registered): no
 * read-modify-write here.
 */
#define PH_PENDING    PERCH__VT_PH_PENDING
#define PH_REGISTERED PERCH__VT_PH_REGISTERED
#define PH_COMPLETED  PERCH__VT_PH_COMPLETED
#define PH_REGISTERING PERCH__VT_PH_REGISTERING
#define PH_MASK       PERCH__VT_PH_MASK
#define WAITER        PERCH__VT_WAITER
#define LATE_REG      PERCH__VT_LATE_REG /* the waiter's bit: a waiter is only ever set before completion */
#define VER_SHIFT     PERCH__VT_VER_SHIFT
#define VER_MASK      PERCH__VT_VER_MASK

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the futex word is the state's low half");

static uint32_t st_phase(uint64_t s) { return (uint32_t)s & PH_MASK; }
static uint32_t st_version(uint64_t s) { return ((uint32_t)s >> VER_SHIFT) & VER_MASK; }
static int32_t st_result(uint64_t s) { return (int32_t)(uint32_t)(s >> 32); }

static uint64_t st_make(uint32_t version, uint32_t low_bits, int32_t result)
{
	return (uint64_t)(uint32_t)result << 32 | (uint64_t)(version << VER_SHIFT) | low_bits;
}

static uint64_t st_with_phase(uint64_t s, uint32_t phase)
{
	return (s & ~(uint64_t)PH_MASK) | phase;
}

static uint32_t *futex_word(struct perch_vtask *vt)
{
	return (uint32_t *)&vt->state;
}

/* The state if `token` names its version, else 0 (which never names one). */
static uint64_t state_of(struct perch_vtask *vt, uint32_t token)
{
	uint64_t s = perch__load_u64(&vt->state);
	return token != 0 && st_version(s) == token ? s : 0;
}

int perch_vtask_init(struct perch_vtask *vt)
{
	if (!vt)
		return -EINVAL;
	vt->state = st_make(0, PH_PENDING, 0);
	vt->cont_fn = NULL;
	vt->cont_arg = NULL;
	return 0;
}

/*
 * Whether only the owner may change the word: its version completed, or
 * none was readied yet. Every other writer (a completion, a registration,
 * a blocking waiter) needs a current version not complete, so the owner
 * may store over such a state instead of exchanging it.
 */
static bool owner_alone(uint64_t s)
{
	return (st_phase(s) == PH_COMPLETED || st_version(s) == 0) && !perch__vt_late_registrant(s);
}

/* A registrant of the current version is still writing the continuation. */
static bool registrant_writing(uint64_t s)
{
	return st_phase(s) == PH_REGISTERING || perch__vt_late_registrant(s);
}

/* Only the owner changes the version. */
static uint32_t version_after(uint64_t s)
{
	uint32_t next = (st_version(s) + 1) & VER_MASK;
	return next ? next : 1;
}

uint32_t perch_vtask_ready(struct perch_vtask *vt)
{
	if (!vt)
		return 0;
	for (unsigned spins = 0;;) {
		uint64_t old = perch__load_u64(&vt->state);
		if (registrant_writing(old)) {
			/* A registrant of the old version is between its claim and its publish: let it finish. */
			perch__spin_wait(&spins);
			continue;
		}
		uint32_t next = version_after(old);
		if (owner_alone(old)) {
			perch__store_u64(&vt->state, st_make(next, PH_PENDING, 0));
			return next;
		}
		if (!perch__cas_u64(&vt->state, old, st_make(next, PH_PENDING, 0)))
			continue;
		if (old & WAITER)
			perch__futex_wake_all(futex_word(vt)); /* their version is gone: they return -ESTALE */
		return next;
	}
}

uint32_t perch__vtask_ready_registered(struct perch_vtask *vt, perch_vtask_fn fn, void *arg,
				       bool *registered)
{
	uint64_t old = perch__load_u64(&vt->state);
	*registered = owner_alone(old);
	if (!*registered)
		return perch_vtask_ready(vt);
	/* No completion reads the continuation before the word says REGISTERED. */
	perch__store_ptr(&vt->cont_fn, (void *)fn);
	perch__store_ptr(&vt->cont_arg, arg);
	uint32_t next = version_after(old);
	perch__store_u64(&vt->state, st_make(next, PH_REGISTERED, 0));
	return next;
}

void perch__vtask_retire(struct perch_vtask *vt, uint32_t token)
{
	uint64_t s = state_of(vt, token);
	/* A later ready took the word first (a CAS: the word is not the owner's alone): nothing to do. */
	if (s != 0 && st_phase(s) == PH_REGISTERED)
		perch__cas_u64(&vt->state, s, st_make(token, PH_COMPLETED, 0));
}

int perch_vtask_complete(struct perch_vtask *vt, uint32_t token, int64_t result)
{
	if (!vt)
		return -EINVAL;
	if (result < INT32_MIN || result > INT32_MAX)
		return -ERANGE;
	for (;;) {
		uint64_t s = state_of(vt, token);
		if (s == 0)
			return -ESTALE;
		if (st_phase(s) == PH_COMPLETED)
			return -EALREADY;
		/*
		 * Read before the CAS: once it succeeds the task may be freed, or
		 * readied anew. A registration still REGISTERING is not run: its
		 * registrant finds the task complete (LATE_REG) and goes on inline.
		 */
		perch_vtask_fn fn = NULL;
		void *arg = NULL;
		if (st_phase(s) == PH_REGISTERED) {
			fn = (perch_vtask_fn)perch__load_ptr(&vt->cont_fn);
			arg = perch__load_ptr(&vt->cont_arg);
		}
		uint64_t done = st_make(token, PH_COMPLETED, (int32_t)result);
		if (st_phase(s) == PH_REGISTERING)
			done |= LATE_REG;
		if (!perch__cas_u64(&vt->state, s, done))
			continue; /* a registration or a waiter changed the word: look again */
		if (s & WAITER)
			perch__futex_wake_all(futex_word(vt));
		if (fn)
			fn(arg, result);
		return 0;
	}
}

/* Second step of a registration: REGISTERING -> REGISTERED, unless a completion came first. */
static int publish_registration(struct perch_vtask *vt)
{
	for (;;) {
		/* The version cannot move while REGISTERING: ready() waits it out. */
		uint64_t s = perch__load_u64(&vt->state);
		if (st_phase(s) == PH_COMPLETED) {
			/* Completed meanwhile without running it: done writing, go on inline. */
			PERCH_ASSERT(s & LATE_REG);
			perch__store_u64(&vt->state, s & ~(uint64_t)LATE_REG);
			return 0;
		}
		/* Still REGISTERING; only a waiter's bit may have changed the word. */
		if (perch__cas_u64(&vt->state, s, st_with_phase(s, PH_REGISTERED)))
			return PERCH_PENDING;
	}
}

int perch_vtask_on_complete(struct perch_vtask_handle h, perch_vtask_fn fn, void *arg)
{
	struct perch_vtask *vt = h.task;
	if (!vt || !fn)
		return -EINVAL;
	for (;;) {
		uint64_t s = state_of(vt, h.token);
		if (s == 0)
			return -ESTALE;
		if (st_phase(s) == PH_COMPLETED)
			return 0;
		if (st_phase(s) != PH_PENDING)
			return -EBUSY;
		/* Claim first: only the holder of REGISTERING writes the continuation. */
		if (!perch__cas_u64(&vt->state, s, st_with_phase(s, PH_REGISTERING)))
			continue;
		perch__store_ptr(&vt->cont_fn, (void *)fn);
		perch__store_ptr(&vt->cont_arg, arg);
		return publish_registration(vt);
	}
}

int perch_vtask_status(struct perch_vtask_handle h)
{
	if (!h.task)
		return -EINVAL;
	uint64_t s = state_of(h.task, h.token);
	if (s == 0)
		return -ESTALE;
	return st_phase(s) == PH_COMPLETED ? 0 : PERCH_PENDING;
}

int perch_vtask_result(struct perch_vtask_handle h, int64_t *result)
{
	if (!h.task || !result)
		return -EINVAL;
	uint64_t s = state_of(h.task, h.token);
	if (s == 0)
		return -ESTALE;
	if (st_phase(s) != PH_COMPLETED)
		return PERCH_PENDING;
	*result = st_result(s);
	return 0;
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static bool deadline_passed(const struct timespec *deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > deadline->tv_sec ||
	       (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

int perch_vtask_wait(struct perch_vtask_handle h, int timeout_ms, int64_t *result)
{
	struct timespec deadline;
	int64_t scratch;
	if (!h.task)
		return -EINVAL;
	if (!result)
		result = &scratch;
	if (timeout_ms >= 0)
		deadline_after(&deadline, timeout_ms);
	for (;;) {
		uint64_t s = state_of(h.task, h.token);
		if (s == 0)
			return -ESTALE;
		if (st_phase(s) == PH_COMPLETED) {
			*result = st_result(s);
			return 0;
		}
		if (timeout_ms >= 0 && deadline_passed(&deadline))
			return -ETIMEDOUT;
		/* Announce the sleeper in the word itself, so the completing CAS sees it and wakes. */
		if (!(s & WAITER) && !perch__cas_u64(&h.task->state, s, s | WAITER))
			continue;
		perch__futex_wait(futex_word(h.task), (uint32_t)(s | WAITER),
				 timeout_ms >= 0 ? &deadline : NULL);
	}
}
