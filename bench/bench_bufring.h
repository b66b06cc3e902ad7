/* bench/bench_bufring.h: a provided-buffer ring for the free-standing io_uring benches (liburing 2.3 has no setup helper). */
#ifndef PERCH_BENCH_BUFRING_H
#define PERCH_BENCH_BUFRING_H

#include <liburing.h>
#include <stdint.h>

struct bu_bufring {
	struct io_uring_buf_ring *br;
	char *mem;                   /* count buffers of size bytes, faulted in */
	uint32_t count, size;
};

/*
 * Maps a ring of `count` buffers (a power of 2) of `size` bytes, registers
 * it as buffer group `bgid` with `flags` (the kernel's IOU_PBUF_RING_*),
 * and fills it. 0 or -errno.
 */
int bu_bufring_setup(struct io_uring *ring, struct bu_bufring *b, uint32_t count, uint32_t size, int bgid,
		     uint16_t flags);

/* Writes buffer `bid`, whole, `offset` entries past the ring's tail; io_uring_buf_ring_advance publishes it. */
void bu_bufring_add(struct bu_bufring *b, uint32_t bid, int offset);

#endif
