/* lib/vtask_internal.h: the value task's state word, for the adapters' one-load "still waiting?" check. */
#ifndef PERCH_LIB_VTASK_INTERNAL_H
#define PERCH_LIB_VTASK_INTERNAL_H

#include <perch/vtask.h>

#include "atomic.h"

/* result:32 | version:29 | waiter or late registrant:1 | phase:2 (lib/vtask.c says why). */
#define PERCH__VT_PH_PENDING     0u
#define PERCH__VT_PH_REGISTERED  1u
#define PERCH__VT_PH_COMPLETED   2u
#define PERCH__VT_PH_REGISTERING 3u
#define PERCH__VT_PH_MASK        3u
#define PERCH__VT_WAITER         4u
#define PERCH__VT_LATE_REG       4u  /* the same bit once COMPLETED: a registrant the completion overtook still writes */
#define PERCH__VT_VER_SHIFT      3
#define PERCH__VT_VER_MASK       0x1fffffffu

/*
 * True while version `token` of the task is current and not complete:
 * perch_vtask_status() == PERCH_PENDING, in one load, inline (the pipe
 * reader asks it on every read).
 */
static inline bool perch__vtask_pending(const struct perch_vtask *vt, uint32_t token)
{
	uint32_t low = (uint32_t)perch__load_u64(&vt->state);
	/* Usually complete: the phase alone answers. */
	return (low & PERCH__VT_PH_MASK) != PERCH__VT_PH_COMPLETED &&
	       ((low >> PERCH__VT_VER_SHIFT) & PERCH__VT_VER_MASK) == token;
}

/* Whether the task's current version was readied and is not complete yet: one load. */
static inline bool perch__vtask_current_pending(const struct perch_vtask *vt)
{
	uint32_t low = (uint32_t)perch__load_u64(&vt->state);
	return (low & PERCH__VT_PH_MASK) != PERCH__VT_PH_COMPLETED &&
	       ((low >> PERCH__VT_VER_SHIFT) & PERCH__VT_VER_MASK) != 0;
}

/* The task's current version: 0 until its first perch_vtask_ready (the pipe writer's cancel looks it up). */
static inline uint32_t perch__vtask_version(const struct perch_vtask *vt)
{
	return ((uint32_t)perch__load_u64(&vt->state) >> PERCH__VT_VER_SHIFT) & PERCH__VT_VER_MASK;
}

/*
 * A park's ready with its continuation registered at once (the pipe
 * reader's read_or_wait): called where the park readies its task, under
 * the park's claim, before the token reaches another thread. When the
 * word is the owner's alone (its version completed, or none readied), it
 * writes the continuation and readies the word straight to REGISTERED,
 * with stores, and sets *registered. Otherwise it is perch_vtask_ready
 * and clears *registered: register after the park. Returns the token.
 * Owner's thread only.
 */
uint32_t perch__vtask_ready_registered(struct perch_vtask *vt, perch_vtask_fn fn, void *arg,
				       bool *registered);

/*
 * Completes, without running its continuation, a version readied by
 * perch__vtask_ready_registered whose park was served instead of
 * published: nobody else holds its token, so nobody would. A later ready
 * that moved the word on first leaves nothing to do. Owner's thread.
 */
void perch__vtask_retire(struct perch_vtask *vt, uint32_t token);

/* In a state word: completed, and a registrant the completion overtook is still writing. */
static inline bool perch__vt_late_registrant(uint64_t s)
{
	return (s & PERCH__VT_PH_MASK) == PERCH__VT_PH_COMPLETED && (s & PERCH__VT_LATE_REG);
}

/* Whether a registrant the completion overtook is still writing the task: a free must wait. */
static inline bool perch__vtask_registrant_late(const struct perch_vtask *vt)
{
	return perch__vt_late_registrant(perch__load_u64(&vt->state));
}

#endif /* PERCH_LIB_VTASK_INTERNAL_H */
