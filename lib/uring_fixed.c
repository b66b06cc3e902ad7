/* lib/uring_fixed.c: registered files: a connection's socket in the ring's file table, so its operations skip the fd lookup. */
#include "config.h"

#include <errno.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "uring_internal.h"

/*
 * The table's size: a socket goes at the index of its fd, so the table
 * covers the fds this process may open (the soft RLIMIT_NOFILE when the
 * loop starts), at most FIXED_MAX. A socket opened past it, after the
 * limit was raised, keeps its plain fd.
 */
#define FIXED_MAX 65536u

static uint32_t table_size(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > FIXED_MAX)
		return FIXED_MAX;
	return (uint32_t)rl.rlim_cur;
}

/*
 * An empty (sparse) table of n. The syscall itself: liburing's helper
 * raises the process's RLIMIT_NOFILE when the kernel says EMFILE.
 */
static bool register_sparse(struct uring *u, uint32_t n)
{
	struct io_uring_rsrc_register reg = { .nr = n, .flags = IORING_RSRC_REGISTER_SPARSE };
	return syscall(__NR_io_uring_register, u->ring.ring_fd, IORING_REGISTER_FILES2, &reg, sizeof(reg)) == 0;
}

/*
 * At init, before the ring is enabled. Only from Linux 6.13: before it a
 * removed file was let go only once every operation issued through the
 * table before the removal had completed, oldest first, so one idle
 * connection's receive would hold every later-closed socket open (no FIN,
 * no reset) for as long as it waits. Before 5.19 the kernel refuses a
 * sparse table anyway. Without one the loop uses plain fds, as before.
 */
void perch__uring_fixed_probe(struct uring *u, bool off)
{
	uint32_t n = table_size();
	if (!off && n > 0 && perch__uring_kernel_at_least(6, 13) && register_sparse(u, n))
		u->fixed_n = n;
	u->loop->stats.fixed_files = u->fixed_n > 0;
}

/*
 * The send at which a socket enters the table. An entry and its removal
 * cost about 400 ns; each send through the table saves 20 to 45 ns
 * (doc/loop.md, "Registered files"): about 9 sends repay them. Entering
 * once a connection has sent that much, and not before, is the
 * ski-rental rule: never more than twice the cost of knowing the
 * connection's length in advance. A connection that answers a few times
 * and goes pays nothing.
 */
#define FIXED_AT_SEND 8u
_Static_assert(FIXED_AT_SEND >= 1 && FIXED_AT_SEND - 1 <= (F_SENDS_MASK >> F_SENDS_SHIFT),
	       "the sends before the entry are counted in F_SENDS_MASK's bits");

/*
 * Puts s's fd in the table at its own index, from the SQE queued here
 * ahead of the send's: the kernel runs it at the turn's enter, so it
 * costs no syscall of its own. s's operations go through the table once
 * its completion says it took (perch__uring_on_fixed_set): none relies on
 * the order of the SQEs. Called before each send's SQE is taken.
 */
void perch__uring_fixed_enter(struct uring *u, struct perch__sock *s)
{
	struct usock *us = us_of(s);
	if (u->fixed_n == 0 || (us->flags & F_FIX_TRIED))
		return;
	if ((us->flags & F_SENDS_MASK) < ((FIXED_AT_SEND - 1) << F_SENDS_SHIFT)) {
		us->flags += 1u << F_SENDS_SHIFT;
		return;
	}
	us->flags = (us->flags & ~F_SENDS_MASK) | F_FIX_TRIED;
	if ((uint32_t)s->fd >= u->fixed_n)
		return;
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return;
	/* The kernel reads the fd at the enter: s->fd stays put until s is finalized, after this completes. */
	io_uring_prep_files_update(sqe, &s->fd, 1, s->fd);
	io_uring_sqe_set_data64(sqe, UD(OP_FIXED_SET, s));
	us->flags |= F_FIXING;
	us->inflight++;
}

void perch__uring_on_fixed_set(struct perch__sock *s, int res)
{
	struct usock *us = us_of(s);
	us->flags &= ~F_FIXING;
	if (res != 1) {
		s->loop->stats.fixed_refused++; /* not in the table: plain fds, as before */
		return;
	}
	s->loop->stats.fixed_sockets++;
	if (!s->closing)
		us->flags |= F_FIXED; /* closing: the clear is queued behind the set already */
}

/*
 * At the close, before the fd's: the table's reference goes, so the
 * close is the socket's last and the peer sees its end (or its reset)
 * then. Queued behind the set when that has not completed yet, so the
 * kernel runs the two in order. Counted in flight, so the fd is closed
 * (and its number reused) only after the entry is gone.
 */
bool perch__uring_fixed_leave(struct uring *u, struct perch__sock *s)
{
	static int none = -1;
	struct usock *us = us_of(s);
	PERCH_ASSERT(us->flags & (F_FIXING | F_FIXED)); /* only an entry asked for, or made, has one to remove */
	struct io_uring_sqe *sqe = perch__uring_sqe_get(u);
	if (!sqe)
		return false; /* the ring is broken: its exit drops the table */
	io_uring_prep_files_update(sqe, &none, 1, s->fd);
	io_uring_sqe_set_data64(sqe, UD(OP_FIXED_CLEAR, s));
	us->flags &= ~F_FIXED;
	us->inflight++;
	return true;
}

/*
 * The entry would stay in the table, holding the socket open past its
 * close: it is shut both ways, so the peer sees the end all the same
 * (a reset the close would have sent is lost). The next socket given the
 * same fd number replaces the entry, and the socket goes then.
 */
void perch__uring_on_fixed_clear(struct perch__sock *s, int res)
{
	if (res == 1)
		return;
	s->loop->stats.fixed_refused++;
	/* On an open socket only ENOTCONN can refuse it: the connection was over, and the peer saw its end. */
	int rc = shutdown(s->fd, SHUT_RDWR);
	PERCH_ASSERT(rc == 0 || errno == ENOTCONN);
	(void)rc;
}
