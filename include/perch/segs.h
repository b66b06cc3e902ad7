/* perch/segs.h: reading a read result's bytes across its segments: a cursor, find, copy, compare, and a decimal number. */
#ifndef PERCH_SEGS_H
#define PERCH_SEGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <perch/common.h>
#include <perch/conn.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A read result (perch_conn_read, perch_pipe_read) holds its bytes in
 * segments, so a message may start in one and end in the next. These
 * calls treat the result as one run of `len` bytes, offsets counted from
 * its first unconsumed byte, and never copy unless asked to. They read
 * the segments only: any thread that may look at the result (its reader,
 * before the next advance). None allocates; none fails on a result whose
 * segments are empty. They are a parser's inner loop and do not check
 * their pointers: a NULL result, cursor or buffer is the caller's bug
 * (perch_segs_parse_u64, which has an error to return, says -EINVAL).
 */

/* The end of a search that found nothing: perch_segs_find's answer then. */
#define PERCH_SEGS_NOT_FOUND SIZE_MAX

/*
 * A position in a result, for walking it a run of contiguous bytes at a
 * time. Fields are private: use the calls below.
 */
struct perch_cursor {
	const struct perch_seg *seg;  /* the segment holding the byte at pos */
	size_t off;                   /* that byte's offset in seg */
	size_t pos;                   /* bytes from the result's start */
	size_t len;                   /* the result's length */
};

/* Starts `c` at the first byte of `r` (offset 0). */
PERCH_API void perch_cursor_init(struct perch_cursor *c, const struct perch_read_result *r);

/*
 * The contiguous bytes at the cursor: sets *p to them and returns how
 * many, up to the end of their segment or of the result; 0 at the end.
 */
PERCH_API size_t perch_cursor_run(const struct perch_cursor *c, const uint8_t **p);

/* Moves the cursor `n` bytes forward, at most to the end. Returns the bytes moved. */
PERCH_API size_t perch_cursor_advance(struct perch_cursor *c, size_t n);

/* The cursor's offset from the result's start. */
PERCH_API size_t perch_cursor_pos(const struct perch_cursor *c);

/*
 * The offset of the first `delim` (dlen bytes, 1 to 64; a delimiter may
 * span segments) that starts at or after `from`, or PERCH_SEGS_NOT_FOUND
 * (also for dlen 0 or above 64, or from past the end).
 */
PERCH_API size_t perch_segs_find(const struct perch_read_result *r, size_t from, const void *delim,
				 size_t dlen);

/*
 * Copies up to `n` bytes starting at `from` into `dst`. Returns the bytes
 * copied: n, or fewer when the result ends first (0 from past the end).
 */
PERCH_API size_t perch_segs_copy(const struct perch_read_result *r, size_t from, void *dst, size_t n);

/*
 * Whether the `n` bytes at `from` are `lit`'s: false when the result holds
 * fewer than n from there. Case-sensitive; n 0 is true.
 */
PERCH_API bool perch_segs_equal(const struct perch_read_result *r, size_t from, const void *lit, size_t n);

/*
 * Reads the decimal digits at `from` as an unsigned number. Returns 0 with
 * *value and *end (the offset just past the last digit) when a non-digit
 * follows them; -EAGAIN when the digits run to the end of the result, or
 * `from` is the end (more may come: read again); -EINVAL when the byte at
 * `from` is not a digit (or from is past the end, or a NULL); -ERANGE when
 * the number exceeds
 * `max` (a bound the caller sets, UINT64_MAX at most: a length field's
 * limit, say), found as soon as it is passed, so a peer's long run of
 * digits costs no more than max's. Leading zeros are accepted.
 */
PERCH_API int perch_segs_parse_u64(const struct perch_read_result *r, size_t from, uint64_t max,
				   uint64_t *value, size_t *end);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_SEGS_H */
