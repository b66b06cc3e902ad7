/* perch/common.h: return conventions and export macro shared by every perch header. */
#ifndef PERCH_COMMON_H
#define PERCH_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Public calls that can fail return 0 (done, result available now),
 * PERCH_PENDING (the operation parked; its completion arrives later,
 * exactly once), or a negative errno: -EINVAL (bad argument), -EBUSY (an
 * overlapping read or flush; the one already parked is untouched), -EPIPE
 * (closed), -EAGAIN (nothing new to read), -ESTALE (a value-task token of
 * another version), -EALREADY (a version completed twice), -ERANGE (a
 * value-task result outside int32_t), -ENOMEM, -ETIMEDOUT, -ECANCELED (a
 * parked read or flush canceled, a connect outlived by its loop, a timer
 * started while its loop is being freed), -EEXIST (a loop run, or a timer
 * started or stopped, from a thread other than the one that owns the
 * loop), -EOPNOTSUPP (perch_conn_shutdown on a connection without a write
 * side of its own). Results from the kernel pass through as they come: a flush's
 * or a read's -ECONNRESET, -EPIPE or -ETIMEDOUT, a connect's -ECONNREFUSED.
 * No call sets errno. The few that cannot fail say what they return instead
 * (perch_vtask_ready: a token, 0 for a NULL task; perch_conn_release: void;
 * perch_conn_is_closed: true for NULL).
 */
#define PERCH_PENDING 1

#if defined(__GNUC__)
#define PERCH_API __attribute__((visibility("default")))
#else
#define PERCH_API
#endif

#ifdef __cplusplus
}
#endif

#endif /* PERCH_COMMON_H */
