/* bench/bench_bufring.c: a provided-buffer ring for the free-standing io_uring benches. */
#include "bench_bufring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void bu_bufring_add(struct bu_bufring *b, uint32_t bid, int offset)
{
	io_uring_buf_ring_add(b->br, b->mem + (size_t)bid * b->size, b->size, (unsigned short)bid,
			      io_uring_buf_ring_mask(b->count), offset);
}

int bu_bufring_setup(struct io_uring *ring, struct bu_bufring *b, uint32_t count, uint32_t size, int bgid,
		     uint16_t flags)
{
	b->count = count;
	b->size = size;
	if (posix_memalign((void **)&b->br, 4096, count * sizeof(struct io_uring_buf)) != 0 ||
	    posix_memalign((void **)&b->mem, 4096, (size_t)count * size) != 0)
		return -ENOMEM;
	memset(b->mem, 0, (size_t)count * size); /* faulted in before anything is measured */
	io_uring_buf_ring_init(b->br);
	/* The kernel's `flags` is the field liburing 2.3 names `pad`. */
	struct io_uring_buf_reg reg = { .ring_addr = (unsigned long)b->br, .ring_entries = count, .bgid = (uint16_t)bgid,
					.pad = flags };
	int rc = io_uring_register_buf_ring(ring, &reg, 0);
	if (rc != 0)
		return rc;
	for (uint32_t i = 0; i < count; i++)
		bu_bufring_add(b, i, (int)i);
	io_uring_buf_ring_advance(b->br, (int)count);
	return 0;
}
