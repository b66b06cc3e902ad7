/* lib/vtask.c: the versioned value task; one continuation, registered and completed through one word. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <perch/vtask.h>

#include "atomic.h"

/*
 * vt->state is the one word registration and completion race through:
 *   0               nothing yet
 *   a function      a continuation is registered (its argument written first)
 *   VT_COMPLETED    the version completed (its result written first)
 * Function pointers are at least 2-aligned, so the odd mark never collides.
 */
#define VT_COMPLETED ((uintptr_t)1)

/* ---- futex operations for ck_ec ---- */

static int vt_gettime(const struct ck_ec_ops *ops, struct timespec *out)
{
	(void)ops;
	return clock_gettime(CLOCK_MONOTONIC, out);
}

static void vt_wait32(const struct ck_ec_wait_state *ws, const uint32_t *addr,
		      uint32_t expected, const struct timespec *deadline)
{
	(void)ws;
	/* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, as ck_ec gives. */
	syscall(SYS_futex, addr, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected,
		deadline, NULL, FUTEX_BITSET_MATCH_ANY);
}

static void vt_wake32(const struct ck_ec_ops *ops, const uint32_t *addr)
{
	(void)ops;
	syscall(SYS_futex, addr, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
}

static const struct ck_ec_ops vt_ec_ops = {
	.gettime = vt_gettime,
	.wait32 = vt_wait32,
	.wake32 = vt_wake32,
};

/* Several threads may complete different versions over time: not single-producer. */
static const struct ck_ec_mode vt_ec_mode = {
	.ops = &vt_ec_ops,
	.single_producer = false,
};

/* ---- engine ---- */

static bool token_is_current(const struct perch_vtask *vt, uint32_t token)
{
	return perch__load_u32(&vt->version) == token;
}

int perch_vtask_init(struct perch_vtask *vt)
{
	if (!vt)
		return -EINVAL;
	vt->version = 0;
	vt->pad_ = 0;
	vt->state = 0;
	vt->cont_arg = NULL;
	vt->result = 0;
	ck_ec32_init(&vt->done_ec, 0);
	return 0;
}

uint32_t perch_vtask_ready(struct perch_vtask *vt)
{
	/* The owner alone calls this, with nothing left to complete the old version. */
	perch__xchg_uptr(&vt->state, 0);
	vt->cont_arg = NULL;
	return perch__faa_u32(&vt->version, 1) + 1;
}

int perch_vtask_complete(struct perch_vtask *vt, int64_t result)
{
	if (!vt)
		return -EINVAL;
	/* One producer completes a version; a second complete must not clobber the result. */
	if (perch__load_uptr(&vt->state) == VT_COMPLETED)
		return -EALREADY;
	/* The result is stored before the mark; the exchange releases it. */
	perch__store_i64(&vt->result, result);
	uintptr_t seen = perch__xchg_uptr(&vt->state, VT_COMPLETED);
	if (seen == VT_COMPLETED)
		return -EALREADY;
	ck_ec32_inc(&vt->done_ec, &vt_ec_mode);
	if (seen != 0) {
		/* The exchange acquired the registration, so cont_arg is the one stored before it. */
		perch_vtask_fn fn = (perch_vtask_fn)seen;
		fn(vt->cont_arg, result);
	}
	return 0;
}

int perch_vtask_on_complete(struct perch_vtask_handle h, perch_vtask_fn fn, void *arg)
{
	struct perch_vtask *vt = h.task;
	if (!vt || !fn)
		return -EINVAL;
	if (!token_is_current(vt, h.token))
		return -ESTALE;
	uintptr_t seen = perch__load_uptr(&vt->state);
	if (seen == VT_COMPLETED)
		return 0;
	if (seen != 0)
		return -EBUSY;
	/* The argument is written before the CAS that publishes the continuation. */
	vt->cont_arg = arg;
	if (perch__cas_uptr(&vt->state, 0, (uintptr_t)fn))
		return PERCH_PENDING;
	/* Only a completion changes a 0 we did not change: go on inline. */
	return 0;
}

int perch_vtask_status(struct perch_vtask_handle h)
{
	if (!h.task)
		return -EINVAL;
	if (!token_is_current(h.task, h.token))
		return -ESTALE;
	return perch__load_uptr(&h.task->state) == VT_COMPLETED ? 0 : PERCH_PENDING;
}

int perch_vtask_result(struct perch_vtask_handle h, int64_t *result)
{
	int rc = perch_vtask_status(h);
	if (rc != 0)
		return rc;
	if (!result)
		return -EINVAL;
	*result = perch__load_i64(&h.task->result);
	return 0;
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

int perch_vtask_wait(struct perch_vtask_handle h, int timeout_ms, int64_t *result)
{
	struct timespec deadline;
	int64_t scratch;
	if (!h.task)
		return -EINVAL;
	if (!result)
		result = &scratch;
	if (timeout_ms >= 0)
		deadline_after(&deadline, timeout_ms);
	for (;;) {
		/* Read the count before the state: a completion after this read bumps it. */
		uint32_t seen = ck_ec32_value(&h.task->done_ec);
		int rc = perch_vtask_result(h, result);
		if (rc != PERCH_PENDING)
			return rc;
		if (ck_ec32_wait(&h.task->done_ec, &vt_ec_mode, seen,
				 timeout_ms >= 0 ? &deadline : NULL) != 0)
			return perch_vtask_result(h, result) == 0 ? 0 : -ETIMEDOUT;
	}
}
