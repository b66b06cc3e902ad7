/* lib/uring_bufs.c: the provided-buffer ring: a warm ring of buffers that grows under a burst and shrinks once quiet. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uring_internal.h"

/* A new window of RING_SHRINK_POLLS polls in which the ring must stay quiet to shrink. */
static void shrink_window_restart(struct uring *u)
{
	u->polls_since_check = 0;
	u->ring_low = u->ring_free;
	u->parks_at_check = u->loop->stats.enobufs_parks;
}

/*
 * The ring ran dry, or connections wait for more buffers than it has,
 * while buffers wait on the spare stack: the busiest moment needs more,
 * so the target doubles (perch__uring_ring_maybe_shrink halves it once quiet again)
 * and the ring is topped up. Returns how many buffers went in.
 */
uint32_t perch__uring_ring_grow(struct uring *u)
{
	if (u->nspare == 0 || u->ring_target == u->nbufs)
		return 0;
	uint32_t before = u->ring_free;
	/* From what it holds: after a shrink the ring may hold more than its target. */
	uint32_t from = u->ring_free > u->ring_target ? u->ring_free : u->ring_target;
	u->ring_target = from * 2 < u->nbufs ? from * 2 : u->nbufs;
	u->loop->stats.ring_target = u->ring_target;
	perch__uring_ring_refill(u);
	shrink_window_restart(u); /* a ring that just grew is not quiet */
	perch__pool_trim_arm(&u->trim); /* so that it is taken back once idle */
	return u->ring_free - before;
}

/*
 * A ring that grew for a burst goes back towards RING_TARGET_MIN once the
 * burst is over: when, for RING_SHRINK_POLLS polls, it never had fewer
 * than half its buffers free and no connection waited, the target halves.
 * Nothing is taken out: the extra buffers leave as the kernel uses them,
 * since returns then go to the spare stack until the ring is back at its
 * target.
 */
void perch__uring_ring_maybe_shrink(struct uring *u)
{
	if (++u->polls_since_check < RING_SHRINK_POLLS)
		return;
	/*
	 * Quiet: never below half its buffers free (perch's count, which may
	 * lag the kernel's: so also no ENOBUFS, the kernel's own word), no
	 * connection parked, and the last halving done (no leftover beyond
	 * the target to make it look idle).
	 */
	if (u->ring_target > RING_TARGET_MIN && u->ring_low >= u->ring_target / 2 &&
	    u->ring_free <= u->ring_target && u->loop->stats.enobufs_parks == u->parks_at_check &&
	    !perch__parked_first(u->loop)) {
		u->ring_target /= 2;
		u->loop->stats.ring_target = u->ring_target;
	}
	shrink_window_restart(u);
}

/*
 * Whether the kernel cannot be taking a buffer from the ring now and every
 * one it took has been counted: with DEFER_TASKRUN it selects buffers only
 * inside this thread's io_uring_enter, and with every CQE seen ring_free
 * is the entries it has not taken, the last ones before the tail. Not
 * always exactly: a receive punted to an io-wq worker commits its buffer
 * before its CQE exists. ring_trim leaves RING_TARGET_MIN entries at the
 * head end, far more than such receives in flight, so it never takes one.
 */
static bool ring_settled(struct uring *u)
{
	return u->defer_taskrun && !u->broken && u->nbacklog == 0 && io_uring_cq_ready(&u->ring) == 0 &&
	       !(IO_URING_READ_ONCE(*u->ring.sq.kflags) & IORING_SQ_CQ_OVERFLOW);
}

/*
 * A ring the kernel took nothing from for a whole interval keeps what a
 * burst grew it to, and an idle loop polls no more, so the poll-counted
 * halving never comes: its free entries past RING_TARGET_MIN are taken
 * out from the tail end, and their pages given back.
 */
static void ring_trim(struct uring *u)
{
	if (u->ring_free <= RING_TARGET_MIN || perch__parked_first(u->loop) || !ring_settled(u))
		return;
	uint32_t k = u->ring_free - RING_TARGET_MIN;
	uint32_t *cold = perch__pool_trim_room_for_cold(&u->trim, u->spare, &u->nspare, k);
	uint16_t tail = u->br->tail; /* ours: the kernel only reads it */
	for (uint32_t j = 0; j < k; j++)
		cold[j] = u->br->bufs[(uint16_t)(tail - 1 - j) & u->mask].bid;
	io_uring_smp_store_release(&u->br->tail, (uint16_t)(tail - k));
	u->ring_free -= k;
	u->ring_target = RING_TARGET_MIN;
	u->loop->stats.ring_target = u->ring_target;
	u->loop->stats.bufs_given_back += perch__pool_trim_give_back(&u->trim, cold, k);
}

/* Once a second while buffers may keep pages: an idle ring shrinks, the spare stack's cold bottom gives them back. */
static void pool_tick(struct perch_timer *t, void *arg)
{
	struct uring *u = arg;
	if (u->taken == u->taken_at_tick)
		ring_trim(u);
	u->taken_at_tick = u->taken;
	u->loop->stats.bufs_given_back += perch__pool_trim_stack(&u->trim, u->spare, u->nspare);
	if (u->ring_free > RING_TARGET_MIN)
		perch__pool_trim_arm(&u->trim);
}

/* liburing 2.3 has no io_uring_setup_buf_ring: map the ring ourselves and register it. */
int perch__uring_bufs_setup(struct perch_loop *loop, struct uring *u, uint32_t count, uint32_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	u->nbufs = count;
	u->buf_size = size;
	u->mask = (uint32_t)io_uring_buf_ring_mask(count);
	u->br_bytes = ((count * sizeof(struct io_uring_buf)) + (size_t)page - 1) & ~((size_t)page - 1);
	/* The process's own allocations: no kernel limit but the address space's, so plainly memory. */
	loop->be_refused_at = "the receive buffers' allocation";
	if (posix_memalign((void **)&u->br, (size_t)page, u->br_bytes) != 0)
		return -ENOMEM;
	if (posix_memalign((void **)&u->bufs, (size_t)page, (size_t)count * size) != 0)
		return -ENOMEM;
	u->segs = calloc(count, sizeof(*u->segs));
	u->spare = malloc(count * sizeof(*u->spare));
	u->ring_pos = calloc(count, sizeof(*u->ring_pos));
	if (!u->segs || !u->spare || !u->ring_pos)
		return -ENOMEM;
	loop->be_refused_at = NULL;
	memset(u->br, 0, u->br_bytes);
	io_uring_buf_ring_init(u->br);
	struct io_uring_buf_reg reg = {
		.ring_addr = (unsigned long)u->br,
		.ring_entries = count,
		.bgid = BGID,
	};
	int rc = io_uring_register_buf_ring(&u->ring, &reg, 0);
	if (rc != 0) {
		loop->be_refused_at = "io_uring_register_buf_ring";
		/* Charged after the ring itself, to the same limit. */
		if (rc == -ENOMEM)
			perch__uring_explain_enomem(loop, perch__uring_ring_lock_bytes(loop->opts.sq_entries) +
								  perch__uring_buf_ring_lock_bytes(count));
		return rc;
	}
	/* Low ids on top of the spare stack, so the ring starts with 0, 1, 2... */
	for (uint32_t i = 0; i < count; i++)
		u->spare[i] = count - 1 - i;
	u->nspare = count;
	u->ring_target = count < RING_TARGET_MIN ? count : RING_TARGET_MIN;
	u->loop = loop;
	loop->stats.ring_target = u->ring_target;
	perch__uring_ring_refill(u);
	shrink_window_restart(u);
	perch__pool_trim_init(&u->trim, loop, u->bufs, size, u->nspare, pool_tick, u); /* the spares: never written */
	return 0;
}

/*
 * Whether multishot recvs take bundles: the kernel has them (as perch
 * reads them, from Linux 6.16: before 6.15 a receive that ended could
 * post its completion after a later one's on the same buffer ring, and
 * before 6.16 a bundle could hold a short buffer before its last; stable
 * kernels that took both fixes are not told apart), and the ring
 * runs with DEFER_TASKRUN, so the kernel takes buffers and posts their
 * completions only inside this thread's io_uring_enter, one receive after
 * another: completions come in the order their buffers left the ring, and
 * a bundle's buffers after its first are still where they went in when
 * its completion is read (perch__uring_on_recv).
 */
void perch__uring_bundles_probe(struct uring *u, bool off)
{
	u->bundles = !off && u->defer_taskrun && (u->ring.features & IORING_FEAT_RECVSEND_BUNDLE) &&
		     perch__uring_kernel_at_least(6, 16);
	u->loop->stats.recv_bundles = u->bundles;
}
