/* perch/vtask.h: a reusable, versioned completion source awaited by callback or blocking wait. */
#ifndef PERCH_VTASK_H
#define PERCH_VTASK_H

#include <ck_ec.h>
#include <stdbool.h>
#include <stdint.h>

#include <perch/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Continuation run exactly once when the task completes, on the completing
 * thread. It must not block. `result` is what perch_vtask_complete() was given.
 */
typedef void (*perch_vtask_fn)(void *arg, int64_t result);

/*
 * The C analogue of .NET's ManualResetValueTaskSourceCore. Embedded in the
 * object that completes it (a connection, a pipe reader, a writer). One
 * producer completes each version; one consumer awaits it. Fields are
 * private: use the calls below.
 */
struct perch_vtask {
	uint32_t version;          /* bumped by perch_vtask_ready() */
	uint32_t pad_;
	uintptr_t state;           /* 0, a continuation, or the completed mark */
	void *cont_arg;            /* written before the continuation is published */
	int64_t result;            /* written before the completed mark */
	struct ck_ec32 done_ec;    /* blocking waiters sleep on it (futex) */
};

/* What a caller holds while it awaits one version of a task. */
struct perch_vtask_handle {
	struct perch_vtask *task;
	uint32_t token;
};

/* Initialises a task with no version ready. Returns 0 or -EINVAL. */
PERCH_API int perch_vtask_init(struct perch_vtask *vt);

/*
 * Starts a new version and returns its token. Only the task's owner calls
 * it, when nothing can still complete the previous version (perch calls it
 * from a listener's on_parking). Continuations and results of the previous
 * version are dropped.
 */
PERCH_API uint32_t perch_vtask_ready(struct perch_vtask *vt);

/*
 * Completes the current version with `result` and runs its continuation, if
 * one is registered, on this thread. Returns 0, or -EALREADY when this
 * version was already completed (nothing is run twice), -EINVAL for NULL.
 */
PERCH_API int perch_vtask_complete(struct perch_vtask *vt, int64_t result);

/*
 * Registers the one continuation of this version. Returns PERCH_PENDING
 * when it is registered (it will run exactly once, on the completing
 * thread); 0 when the task is already complete (it will not run: go on
 * inline and read the result); -ESTALE for a token of another version;
 * -EBUSY when a continuation is already registered; -EINVAL for NULLs.
 */
PERCH_API int perch_vtask_on_complete(struct perch_vtask_handle h,
				      perch_vtask_fn fn, void *arg);

/*
 * Returns 0 when the version is complete, PERCH_PENDING while it is not,
 * -ESTALE for a token of another version, -EINVAL for a NULL task.
 */
PERCH_API int perch_vtask_status(struct perch_vtask_handle h);

/*
 * Stores the version's result in *result. Returns 0, PERCH_PENDING (not yet
 * complete; *result untouched), -ESTALE or -EINVAL.
 */
PERCH_API int perch_vtask_result(struct perch_vtask_handle h, int64_t *result);

/*
 * Blocks the calling thread (futex) until the version completes or
 * timeout_ms passes (negative: no limit). Returns 0 and stores the result
 * when complete, -ETIMEDOUT, -ESTALE or -EINVAL. May be combined with a
 * registered continuation; never call it from a loop thread.
 */
PERCH_API int perch_vtask_wait(struct perch_vtask_handle h, int timeout_ms,
			       int64_t *result);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_VTASK_H */
