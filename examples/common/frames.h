/* examples/common/frames.h: hands each message of a pipe read to a parser as contiguous bytes, copying only messages that span segments. */
#ifndef PERCH_EXAMPLES_FRAMES_H
#define PERCH_EXAMPLES_FRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <perch.h>

/*
 * Parses one message at the start of p[0..len) and answers it. Returns the
 * message's length (> 0) once answered, 0 when it needs more bytes (it will
 * be called again from the same start with more), or -1 to stop: no later
 * message is looked at and the connection closes once answers are flushed.
 */
typedef ssize_t (*frame_fn)(void *arg, const char *p, size_t len);

/*
 * A connection's copy of a message that spans segments: the bytes it
 * holds are already consumed from the pipe. Zero-initialise it.
 */
struct frame_buf {
	char *p;
	size_t len, cap;
};

/*
 * Runs fn over every complete message of `r`, in order. A message inside
 * one segment is parsed where it lies; one that spans segments is copied
 * into `acc` (and stays there across reads until it is complete). Returns
 * the bytes of `r` to mark consumed: everything before a partial message
 * left in the segments. Sets *stop when fn stopped (or memory ran out).
 */
size_t frames_each(struct frame_buf *acc, const struct perch_read_result *r, frame_fn fn, void *arg,
		   bool *stop);

/* Frees what `acc` holds. */
void frame_buf_free(struct frame_buf *acc);

#endif /* PERCH_EXAMPLES_FRAMES_H */
