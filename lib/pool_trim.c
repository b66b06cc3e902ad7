/* lib/pool_trim.c: the receive pool's free buffers that stayed unused for an interval give their pages back. */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "invariant.h"
#include "pool_trim.h"

void perch__pool_trim_init(struct perch__pool_trim *pt, struct perch_loop *loop, uint8_t *bufs, uint32_t buf_size,
			   uint32_t n, perch_timer_fn tick, void *arg)
{
	pt->bufs = bufs;
	pt->buf_size = buf_size;
	pt->low = pt->trimmed = n;
	/* A buffer smaller than a page holds no whole page to give back: no tick then. */
	pt->off = buf_size < (uint32_t)sysconf(_SC_PAGESIZE);
	perch_timer_init(&pt->timer, loop, tick, arg);
}

void perch__pool_trim_arm(struct perch__pool_trim *pt)
{
	/* Not on a loop being freed: its timers are being unbound (a release may land in its last turns). */
	if (pt->off || pt->timer.list || !pt->timer.loop || pt->timer.loop->freeing)
		return;
	perch__timer_arm_at(&pt->timer, perch__now_ms() + PERCH__POOL_TRIM_MS, PERCH__POOL_TRIM_MS);
}

static int by_id(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/*
 * The whole pages inside buffers ids[0..n) go back: sorted, so that
 * adjacent buffers go in one call (one per buffer took 150 ms for 8,192
 * of them; a loop's tick must not stall it). The advice cannot fail on
 * memory the pool owns; if it did, the pages would only stay backed.
 * Their order does not matter: every one is cold. Returns n.
 */
uint32_t perch__pool_trim_give_back(struct perch__pool_trim *pt, uint32_t *ids, uint32_t n)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	qsort(ids, n, sizeof(*ids), by_id);
	for (uint32_t i = 0; i < n;) {
		uint32_t j = i + 1;
		while (j < n && ids[j] == ids[j - 1] + 1)
			j++;
		uintptr_t start = (uintptr_t)(pt->bufs + (size_t)ids[i] * pt->buf_size);
		uintptr_t end = start + (size_t)(j - i) * pt->buf_size;
		uintptr_t first = (start + page - 1) & ~(page - 1), last = end & ~(page - 1);
		if (last > first)
			(void)madvise((void *)first, last - first, MADV_DONTNEED);
		i = j;
	}
	return n;
}

uint32_t perch__pool_trim_stack(struct perch__pool_trim *pt, uint32_t *ids, uint32_t n)
{
	PERCH_ASSERT(pt->trimmed <= pt->low && pt->low <= n);
	uint32_t given = perch__pool_trim_give_back(pt, ids + pt->trimmed, pt->low - pt->trimmed);
	pt->trimmed = pt->low;
	pt->low = n;
	if (n > pt->trimmed)
		perch__pool_trim_arm(pt);
	return given;
}

uint32_t *perch__pool_trim_room_for_cold(struct perch__pool_trim *pt, uint32_t *ids, uint32_t *n, uint32_t k)
{
	uint32_t at = pt->trimmed;
	memmove(ids + at + k, ids + at, (*n - at) * sizeof(*ids));
	*n += k;
	pt->trimmed += k;
	pt->low += k;
	return ids + at;
}
