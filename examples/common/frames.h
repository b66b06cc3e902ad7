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
 * be called again from the same start with more), -1 to stop: no later
 * message is looked at and the connection closes once answers are flushed;
 * or FRAMES_YIELD to answer no more of this read (a bound on the work one
 * read may ask for): the bytes from p on stay unconsumed for the next read.
 * A yield must come before fn looks at p, and never for a read's first
 * message, so that a message is never copied and then left unanswered.
 */
typedef ssize_t (*frame_fn)(void *arg, const char *p, size_t len);

#define FRAMES_YIELD ((ssize_t)-2)

/* How frames_each ended. */
enum frames_end {
	FRAMES_ALL,      /* every complete message answered; a partial one may wait */
	FRAMES_STOPPED,  /* fn stopped (or memory ran out): close once answers are flushed */
	FRAMES_YIELDED,  /* fn yielded: complete messages may follow what was consumed */
};

/*
 * A connection's copy of a message that spans segments: the bytes it
 * holds are already consumed from the pipe. Zero-initialise it.
 */
struct frame_buf {
	char *p;
	size_t len, cap;
};

/*
 * Runs fn over every complete message of `r`, in order, until it stops or
 * yields. A message inside one segment is parsed where it lies; one that
 * spans segments is copied into `acc` (and stays there across reads until
 * it is complete). Returns the bytes of `r` to mark consumed: everything
 * before a partial message left in the segments, or before the message fn
 * yielded at. Sets *end to say why it ended.
 */
size_t frames_each(struct frame_buf *acc, const struct perch_read_result *r, frame_fn fn, void *arg,
		   enum frames_end *end);

/* Frees what `acc` holds. */
void frame_buf_free(struct frame_buf *acc);

#endif /* PERCH_EXAMPLES_FRAMES_H */
