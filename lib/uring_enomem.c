/* lib/uring_enomem.c: why io_uring's setup ran out of memory: the locked-memory limit, or memory itself. */
#include "config.h"

#include <linux/capability.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "uring_internal.h"

static size_t page_round(size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	return (n + page - 1) / page * page;
}

static uint32_t pow2_at_least(uint32_t n)
{
	uint32_t p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

/*
 * The kernel's layout, less its headers: the SQEs (64 bytes each, a
 * power of two of them) and the CQ ring (twice as many 16-byte CQEs, and
 * the SQ index array), each a whole number of pages. A lower bound, so a
 * limit below it is surely too small (measured on 6.18: 256 entries need
 * 28 KiB, exactly this).
 */
size_t perch__uring_ring_lock_bytes(uint32_t entries)
{
	size_t sq = pow2_at_least(entries), cq = 2 * sq;
	return page_round(sq * 64) + page_round(cq * 16 + sq * 4);
}

/* A provided-buffer ring of count 16-byte entries, pinned in whole pages. */
size_t perch__uring_buf_ring_lock_bytes(uint32_t count)
{
	return page_round((size_t)count * 16);
}

/* CAP_IPC_LOCK in the effective set exempts the process from RLIMIT_MEMLOCK. */
static bool has_ipc_lock(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &h, d) != 0)
		return false; /* unknown: the limit may apply */
	return (d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK)) != 0;
}

/*
 * Kernels from 5.12 charge io_uring's ring memory to the memory cgroup
 * instead of RLIMIT_MEMLOCK, but not every kernel since: on 6.18 (measured,
 * doc/hostile-peers.md) the rings and a pinned buffer ring are charged to
 * RLIMIT_MEMLOCK again, for a process without CAP_IPC_LOCK, counted for
 * the user across all its processes. So the limit is named the cause only
 * when it is below what this setup alone needs; otherwise it does not
 * apply, or had room for this process, and the line says out of memory,
 * adding the user-wide case it cannot see.
 */
void perch__uring_explain_enomem(struct perch_loop *loop, size_t need)
{
	struct rlimit rl;
	char *why = loop->be_refused_why;
	size_t cap = sizeof(loop->be_refused_why);
	if (has_ipc_lock() || getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
		snprintf(why, cap, "out of memory");
	} else if (need > rl.rlim_cur) {
		snprintf(why, cap,
			 "over the locked-memory limit: the ring needs %zu KiB, RLIMIT_MEMLOCK allows %llu KiB "
			 "(raise it, or grant CAP_IPC_LOCK)",
			 need >> 10, (unsigned long long)rl.rlim_cur >> 10);
	} else {
		snprintf(why, cap,
			 "out of memory (or the %llu KiB of RLIMIT_MEMLOCK this user's processes share is in use)",
			 (unsigned long long)rl.rlim_cur >> 10);
	}
}
