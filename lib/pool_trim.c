/* lib/pool_trim.c: the receive pool's free buffers that stayed unused for an interval give their pages back. */
#include "config.h"

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
	perch_timer_init(&pt->timer, loop, tick, arg);
}

void perch__pool_trim_arm(struct perch__pool_trim *pt)
{
	perch__timer_arm_at(&pt->timer, perch__now_ms() + PERCH__POOL_TRIM_MS, PERCH__POOL_TRIM_MS);
}

/*
 * The whole pages inside buffer `id` go back. The advice cannot fail on
 * memory the pool owns; if it did, the pages would only stay backed.
 */
static void give_back(struct perch__pool_trim *pt, uint32_t id)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)(pt->bufs + (size_t)id * pt->buf_size);
	uintptr_t first = (start + page - 1) & ~(page - 1), end = (start + pt->buf_size) & ~(page - 1);
	if (end > first)
		(void)madvise((void *)first, end - first, MADV_DONTNEED);
}

uint32_t perch__pool_trim_stack(struct perch__pool_trim *pt, const uint32_t *ids, uint32_t n)
{
	PERCH_ASSERT(pt->trimmed <= pt->low && pt->low <= n);
	uint32_t given = pt->low - pt->trimmed;
	for (uint32_t i = pt->trimmed; i < pt->low; i++)
		give_back(pt, ids[i]);
	pt->trimmed = pt->low;
	pt->low = n;
	if (n > pt->trimmed)
		perch__pool_trim_arm(pt);
	return given;
}

void perch__pool_trim_insert_cold(struct perch__pool_trim *pt, uint32_t *ids, uint32_t *n, const uint32_t *cold,
				  uint32_t k)
{
	uint32_t at = pt->trimmed;
	memmove(ids + at + k, ids + at, (*n - at) * sizeof(*ids));
	for (uint32_t i = 0; i < k; i++) {
		ids[at + i] = cold[i];
		give_back(pt, cold[i]);
	}
	*n += k;
	pt->trimmed += k;
	pt->low += k;
}
