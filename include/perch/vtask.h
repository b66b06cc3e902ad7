/* perch/vtask.h: a reusable, versioned completion source awaited by callback or blocking wait. */
#ifndef PERCH_VTASK_H
#define PERCH_VTASK_H

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
 * owner readies versions; one producer completes each; one consumer awaits
 * it. Fields are private: use the calls below.
 *
 * Version, phase and result share one 64-bit word, so a completion meant
 * for an older version can never complete (or overwrite the result of) a
 * newer one, and the completer touches nothing after its CAS (a waiter
 * may free the task at once). A registration that the completion overtook
 * still writes the task before its own call returns: free a task only
 * once no call on it is under way.
 */
struct perch_vtask {
	uint64_t state;            /* result:32 | version:29 | waiter:1 | phase:2 */
	void *cont_fn;             /* a perch_vtask_fn, written by its registration alone */
	void *cont_arg;
};

/*
 * What a caller holds while it awaits one version of a task. Token 0 is
 * never valid; versions count modulo 2^29 (skipping 0), so a token is
 * unambiguous for 2^29 - 1 versions after its own.
 */
struct perch_vtask_handle {
	struct perch_vtask *task;
	uint32_t token;
};

/* Initialises a task with no version ready. Returns 0 or -EINVAL. */
PERCH_API int perch_vtask_init(struct perch_vtask *vt);

/*
 * Starts a new version and returns its token (never 0; 0 for a NULL task).
 * Only the task's owner calls it (perch calls it from a listener's
 * on_parking). Whatever still targets the previous version is refused
 * from now on: its completion returns -ESTALE, its continuation is dropped,
 * and its blocking waiters wake with -ESTALE.
 */
PERCH_API uint32_t perch_vtask_ready(struct perch_vtask *vt);

/*
 * Completes version `token` with `result` (which must fit in 32 bits) and
 * runs its continuation, if one is registered, on this thread. Returns 0;
 * -ESTALE when `token` is not the current version (nothing happens);
 * -EALREADY when it was completed already (nothing is run twice); -ERANGE
 * for a result outside int32_t; -EINVAL for NULL.
 */
PERCH_API int perch_vtask_complete(struct perch_vtask *vt, uint32_t token, int64_t result);

/*
 * Registers the one continuation of this version. Returns PERCH_PENDING
 * when it is registered (it will run exactly once, on the completing
 * thread); 0 when the task is already complete, or completed while this
 * call registered (it will not run: go on inline and read the result);
 * -ESTALE for a token of another version; -EBUSY when a continuation is
 * already registered (or being registered); -EINVAL for NULLs. A refused
 * registration touches nothing.
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
 * timeout_ms passes (negative: no limit; 0: just look). Returns 0 and
 * stores the result when complete, -ETIMEDOUT, -ESTALE (also when the
 * owner readies a new version meanwhile) or -EINVAL. May be combined with
 * a registered continuation, but a continuation that starts the next
 * operation (readying a new version) can make the waiter see -ESTALE for a
 * version that did complete. Never call it from a loop thread.
 */
PERCH_API int perch_vtask_wait(struct perch_vtask_handle h, int timeout_ms,
			       int64_t *result);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_VTASK_H */
