/* examples/lines/lines.h: a line-based protocol on the pipe adapters (doc/pipes.md builds it step by step). */
#ifndef PERCH_EXAMPLES_LINES_H
#define PERCH_EXAMPLES_LINES_H

#include <perch.h>

#define LINES_MAX 1024                /* a longer line is refused and the session ends */

/*
 * Serves the protocol on a reader and writer until the peer finishes,
 * sends QUIT, or errs; then calls on_end(arg) once (which closes and frees
 * what it owns: the reader and writer are freed before). Commands, one per
 * line:
 *   ECHO text   -> text
 *   UPPER text  -> TEXT
 *   QUIT        -> BYE, then the session ends
 *   anything else -> ERR unknown command
 * Returns 0, or -ENOMEM (nothing started; the caller keeps r and w).
 */
int lines_serve(struct perch_pipe_reader *r, struct perch_pipe_writer *w,
		void (*on_end)(void *arg), void *arg);

#endif /* PERCH_EXAMPLES_LINES_H */
