/* lib/pool_trim.h: a free stack of receive buffers whose bottom, left untouched for an interval, gives its pages back to the kernel. */
#ifndef PERCH_LIB_POOL_TRIM_H
#define PERCH_LIB_POOL_TRIM_H

#include <stdbool.h>
#include <stdint.h>

#include "loop_internal.h"

#define PERCH__POOL_TRIM_MS 1000 /* a free buffer unused this long gives its pages back */

/*
 * The backends keep their free buffers on a stack, the one returned last
 * on top and reused first. So the entries below the fewest the stack held
 * over an interval were not touched in it: they are cold, and their pages
 * go back (MADV_DONTNEED). Such a buffer is used again as it is: the
 * kernel backs it with zeroed pages as the next receive writes it. The
 * timer is armed only while the stack holds buffers whose pages may still
 * be backed, so a quiet loop that gave them back has no timer.
 */
struct perch__pool_trim {
	struct perch_timer timer;
	uint8_t *bufs;               /* the pool: buffer id i at bufs + i * buf_size */
	uint32_t buf_size;
	uint32_t low;                /* the fewest entries the stack held since the last tick */
	uint32_t trimmed;            /* its bottom entries whose pages went back, untouched since */
	bool off;                    /* buffers smaller than a page: nothing to give back */
};

/* At setup: a stack of n buffers never written (no pages yet), and the tick that calls perch__pool_trim_stack. */
void perch__pool_trim_init(struct perch__pool_trim *pt, struct perch_loop *loop, uint8_t *bufs, uint32_t buf_size,
			   uint32_t n, perch_timer_fn tick, void *arg);

/* The stack now holds n entries, after a pop. */
static inline void perch__pool_trim_popped(struct perch__pool_trim *pt, uint32_t n)
{
	if (n < pt->low)
		pt->low = n;
	if (n < pt->trimmed)
		pt->trimmed = n;
}

/* Arms the tick unless it is armed (or the pool is off, or its loop being freed). */
void perch__pool_trim_arm(struct perch__pool_trim *pt);

/* The stack now holds n entries, after a push: its new top may keep pages, so the tick is armed. */
static inline void perch__pool_trim_pushed(struct perch__pool_trim *pt, uint32_t n)
{
	if (n > pt->trimmed && !pt->timer.list && !pt->off)
		perch__pool_trim_arm(pt);
}

/*
 * The tick: gives back the pages of the entries ids[trimmed..low) that
 * stayed below the interval's low (sorting them: all cold, their order
 * does not matter), starts the next interval, and re-arms while any entry
 * may keep pages. Returns how many buffers it gave back.
 */
uint32_t perch__pool_trim_stack(struct perch__pool_trim *pt, uint32_t *ids, uint32_t n);

/* Gives back the whole pages inside buffers ids[0..n), sorting the ids (their order goes). Returns n. */
uint32_t perch__pool_trim_give_back(struct perch__pool_trim *pt, uint32_t *ids, uint32_t n);

/*
 * Room for k buffers known to be idle (taken out of io_uring's ring) at
 * the bottom of the stack ids[0..*n), above the ones already given back,
 * counted as given back: the caller writes their ids there and gives
 * their pages back (perch__pool_trim_give_back) before anything pops them.
 */
uint32_t *perch__pool_trim_room_for_cold(struct perch__pool_trim *pt, uint32_t *ids, uint32_t *n, uint32_t k);

#endif /* PERCH_LIB_POOL_TRIM_H */
