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
 * Every public call returns 0 (done, result available now), PERCH_PENDING
 * (the operation parked; its completion arrives later, exactly once), or a
 * negative errno: -EINVAL (bad argument), -EBUSY (an overlapping read or
 * flush; the one already parked is untouched), -EPIPE (closed), -ESTALE
 * (a value-task token from an older version), -ENOMEM, -ETIMEDOUT.
 * No call sets errno.
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
