/* lib/vtask_internal.h: the value task's state word, for the adapters' one-load "still waiting?" check. */
#ifndef PERCH_LIB_VTASK_INTERNAL_H
#define PERCH_LIB_VTASK_INTERNAL_H

#include <perch/vtask.h>

#include "atomic.h"

/* result:32 | version:29 | waiter:1 | phase:2 (lib/vtask.c says why). */
#define PERCH__VT_PH_PENDING     0u
#define PERCH__VT_PH_REGISTERED  1u
#define PERCH__VT_PH_COMPLETED   2u
#define PERCH__VT_PH_REGISTERING 3u
#define PERCH__VT_PH_MASK        3u
#define PERCH__VT_WAITER         4u
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
 * A registration made before its version exists, for an owner about to
 * park (the pipes' read_or_wait and flush_or_wait): no read-modify-write.
 * perch__vtask_preset writes the continuation and returns true when the
 * current version completed or none was readied, so that nothing else
 * reads or writes the continuation; else it touches nothing and returns
 * false (register after the park). perch__vtask_ready_preset, the owner's
 * next step after a true, readies the next version with that
 * continuation registered and returns its token, which must reach no
 * other thread before this returns. Owner's thread only, both.
 */
bool perch__vtask_preset(struct perch_vtask *vt, perch_vtask_fn fn, void *arg);
uint32_t perch__vtask_ready_preset(struct perch_vtask *vt);

#endif /* PERCH_LIB_VTASK_INTERNAL_H */
