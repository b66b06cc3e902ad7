/* perch/pipe.h: pipe reader and writer (System.IO.Pipelines style) over a connection or in memory. */
#ifndef PERCH_PIPE_H
#define PERCH_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <perch/common.h>
#include <perch/conn.h>
#include <perch/vtask.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A pipe reader hands out received bytes without copying them; a pipe
 * writer stages bytes and flushes them. Both park directly on the
 * connection (or the in-memory pipe) through its listener slot, so a read
 * or flush that waits costs one continuation registration: the caller's,
 * on the adapter's own value task. doc/pipes.md builds a protocol on them.
 *
 * One reader and one writer at a time; each may be used from any thread,
 * and the reader and writer from different threads. A waiting read or
 * flush hands back a value-task handle: register a continuation
 * (perch_vtask_on_complete) or block (perch_vtask_wait, never on a loop
 * thread). A read or flush never runs its caller's continuation inline;
 * the calls that take a waiting operation back (cancel, complete, free,
 * perch_conn_close) complete its task on the calling thread, so its
 * continuation runs inside them.
 */
struct perch_pipe_reader;
struct perch_pipe_writer;

/* Options of an in-memory pipe; zeroed (or NULL) means every default. */
struct perch_pipe_opts {
	size_t pause_bytes;        /* unread bytes at which a flush waits; 0: 64 KiB */
	size_t resume_bytes;       /* a waiting flush completes at or below this; 0: pause_bytes / 2; < pause_bytes */
};
/*
 * Unread counts to the byte: consuming part of a buffer makes room. A
 * reader that keeps more than resume_bytes unconsumed while it waits for
 * more (a message larger than that) keeps the writer waiting for good:
 * pause_bytes must exceed the largest message a layer holds back.
 */

/* ---- Creating and freeing ---- */

/*
 * A reader over `c`. It takes its own reference on the connection (the
 * caller keeps its own). Returns 0 with *out set, -EINVAL, -ENOMEM.
 */
PERCH_API int perch_pipe_reader_new(struct perch_conn *c, struct perch_pipe_reader **out);

/*
 * A writer over `c`: a flush hands the staged bytes to the loop and, when
 * it waits, completes once the kernel took every byte (the socket's buffer
 * is the backpressure). Takes its own reference. Returns 0, -EINVAL, -ENOMEM.
 */
PERCH_API int perch_pipe_writer_new(struct perch_conn *c, struct perch_pipe_writer **out);

/*
 * An in-memory pipe: what the writer flushes, the reader reads, with the
 * same calls as over a connection, so layers (framing, TLS, compression)
 * stack and tests need no sockets. A flush waits while pause_bytes or more
 * are unread and completes when the reader consumed down to resume_bytes.
 * Returns 0 with both ends set, -EINVAL (bad thresholds), -ENOMEM.
 */
PERCH_API int perch_pipe_new(const struct perch_pipe_opts *opts, struct perch_pipe_reader **reader,
			     struct perch_pipe_writer **writer);

/*
 * Completes the reader (if not yet) and frees it, dropping its reference on
 * the connection. A read still parked is taken back: its task completes
 * with -ECANCELED and its continuation runs inside this call, where a free
 * of the same reader is ignored. From inside a continuation of its own is
 * fine too, but not while another thread is still inside a call on the
 * reader (a read the slot refused, say). NULL is ignored.
 */
PERCH_API void perch_pipe_reader_free(struct perch_pipe_reader *r);

/*
 * Completes the writer (if not yet) and frees it. A flush the kernel still
 * holds (after a cancel completed its task) keeps the writer's memory until
 * it completes. A flush waiting in memory completes with -EPIPE inside this
 * call (its bytes already reached the reader), where a free of the same
 * writer is ignored. NULL is ignored.
 */
PERCH_API void perch_pipe_writer_free(struct perch_pipe_writer *w);

/* ---- Reading ---- */

/*
 * Reads what is there, or waits. Returns 0 with *out filled: the bytes not
 * yet consumed (`out->len`, zero-copy segments from `out->first` at
 * `out->first_off`), `completed` once the writer (or peer) finished and
 * every byte is in the result, `canceled` after perch_pipe_cancel_pending_read,
 * `error` or `closed` for a failed or closed connection. Returns
 * PERCH_PENDING with *task set when nothing new is there: the task
 * completes with 0 when a result is ready, and the next perch_pipe_read
 * (or perch_pipe_try_read) returns it at once; with -ECANCELED when the
 * reader was completed meanwhile. Returns -EBUSY while a read is parked
 * (it is untouched), -EINVAL for NULLs or a completed reader. Do not read
 * again before the task completed: in the instant its delivery is under
 * way a second read is not refused and may take the first one's place.
 * Call perch_pipe_advance_to once after each result (reading again
 * without it returns the same bytes).
 */
PERCH_API int perch_pipe_read(struct perch_pipe_reader *r, struct perch_read_result *out,
			      struct perch_vtask_handle *task);

/*
 * perch_pipe_read and the continuation's registration in one call:
 * returns 0 with *out filled when a result is there; PERCH_PENDING when
 * the read waits, and on_ready(arg, result) will run exactly once, on the
 * completing thread (a loop's, or the one that cancels or completes the
 * reader), with 0 when a result is ready (call this again from it: it
 * returns the result at once) or -ECANCELED when the reader was
 * completed; or perch_pipe_read's errors. A read that became ready while
 * on_ready was being registered is read again here, in a loop: on_ready
 * never runs inside this call, and nothing recurses. Advance after each
 * result, as after perch_pipe_read.
 */
PERCH_API int perch_pipe_read_or_wait(struct perch_pipe_reader *r, struct perch_read_result *out,
				      perch_vtask_fn on_ready, void *arg);

/* As perch_pipe_read, but never waits: -EAGAIN when nothing new is there. */
PERCH_API int perch_pipe_try_read(struct perch_pipe_reader *r, struct perch_read_result *out);

/*
 * Marks bytes of the last result consumed (their buffers go back at once)
 * and examined (the next read waits for bytes beyond them instead of
 * returning the same ones), both counted from the start of that result.
 * Returns 0; -EINVAL with no result to advance (advance without read, or
 * twice), consumed > examined, examined past the result, or examined
 * before an earlier examined position; -EBUSY while a read is waiting.
 */
PERCH_API int perch_pipe_advance_to(struct perch_pipe_reader *r, size_t consumed, size_t examined);

/*
 * Wakes the waiting read with a canceled result, or makes the next read
 * return canceled at once. Any thread. Returns 0 or -EINVAL.
 */
PERCH_API int perch_pipe_cancel_pending_read(struct perch_pipe_reader *r);

/*
 * The reader is done: a waiting read is taken back (its task completes with
 * -ECANCELED), every received buffer goes back, and later reads return
 * -EINVAL. On an in-memory pipe the writer's flushes then fail with -EPIPE.
 * Idempotent. Returns 0 or -EINVAL.
 */
PERCH_API int perch_pipe_reader_complete(struct perch_pipe_reader *r);

/* ---- Writing ---- */

/*
 * Room to write at least `size_hint` bytes (at least 1 when 0) without a
 * copy: *buf and *len describe all of it; commit what you wrote with
 * perch_pipe_advance. Returns 0, -EBUSY while a flush is waiting (nothing
 * is staged then), -EPIPE when the other end is gone, -EINVAL (NULLs, a
 * completed writer, a hint over 4 GiB), -ENOMEM.
 */
PERCH_API int perch_pipe_get_buffer(struct perch_pipe_writer *w, size_t size_hint, uint8_t **buf,
				    size_t *len);

/*
 * Commits `n` bytes written into the buffer the last get_buffer lent
 * (several advances add up, to at most what it lent; a write in between
 * ends the loan). Returns 0, -EINVAL (more than lent, no buffer lent,
 * completed), -EBUSY while a flush is in progress.
 */
PERCH_API int perch_pipe_advance(struct perch_pipe_writer *w, size_t n);

/* Copies `len` bytes in (get_buffer + advance). Returns as perch_pipe_get_buffer. */
PERCH_API int perch_pipe_write(struct perch_pipe_writer *w, const void *data, size_t len);

/*
 * Stages the caller's `len` bytes at `data` without a copy, as
 * perch_conn_write_ref does on the connection beneath (release runs
 * exactly once when they are no longer needed; see perch_release_fn): a
 * large answer sent from where it lies. Over an in-memory pipe the reader
 * reads them where they are, and release runs once it consumed them (or
 * the pipe is freed). Returns as perch_pipe_write; -EINVAL also for a NULL
 * release or len 0 or above UINT32_MAX. On an error nothing was staged and
 * release will not run.
 */
PERCH_API int perch_pipe_write_ref(struct perch_pipe_writer *w, const void *data, size_t len,
				   perch_release_fn release, void *arg);

/* A writer's high-water mark until perch_pipe_writer_set_high_water: 64 KiB. */
#define PERCH_PIPE_HIGH_WATER_DEFAULT (64u * 1024)

/*
 * Bytes committed and not yet flushed (perch_conn_staged of the connection
 * beneath); 0 for NULL. A writer call, like the ones below.
 */
PERCH_API size_t perch_pipe_writer_staged(const struct perch_pipe_writer *w);

/*
 * Sets the staged bytes at which perch_pipe_writer_above_high_water says
 * stop: a protocol answering many requests of one read stops parsing
 * there, flushes, and goes on once the flush completed, so a peer that
 * pipelines requests and never reads the answers costs this much staged
 * memory and no more (the socket's own buffer aside). 0 restores
 * PERCH_PIPE_HIGH_WATER_DEFAULT. Nothing is refused by it: one answer may
 * take the staged bytes past the mark. Returns 0, or -EINVAL for NULL.
 */
PERCH_API int perch_pipe_writer_set_high_water(struct perch_pipe_writer *w, size_t bytes);

/* Whether the staged bytes reached the high-water mark: stop answering and flush. false for NULL. */
PERCH_API bool perch_pipe_writer_above_high_water(const struct perch_pipe_writer *w);

/*
 * Advances `r` as perch_pipe_advance_to(r, consumed, examined) and writes
 * the consumed bytes to `w` (a proxy's forward, an echo) without copying
 * them where it can: see perch_conn_forward, which this is over the
 * connections beneath, for which buffers are lent and what a lent buffer
 * holds up. `r` and `w` may be over one connection, or different ones, or
 * in-memory pipes. Returns 0, or as perch_pipe_advance_to and
 * perch_pipe_write refuse (the writer's -EBUSY and -EPIPE first); on any
 * error nothing was consumed nor written.
 */
PERCH_API int perch_pipe_forward(struct perch_pipe_reader *r, size_t consumed, size_t examined,
				 struct perch_pipe_writer *w);

/*
 * Sends what was committed. Returns 0 when done now (nothing committed, or,
 * in memory, the reader has room); PERCH_PENDING with *task set, completing
 * with 0, -EPIPE (closed, or the reader completed), -ECANCELED
 * (perch_pipe_cancel_pending_flush) or the send's error; -EBUSY while a
 * flush is waiting (untouched); -EPIPE when closed (committed bytes are
 * dropped); -ECANCELED when a cancel was pending (nothing is sent: the
 * bytes stay committed for the next flush); -EINVAL.
 */
PERCH_API int perch_pipe_flush(struct perch_pipe_writer *w, struct perch_vtask_handle *task);

/*
 * perch_pipe_flush and the continuation's registration in one call:
 * returns 0 when the flush is done now (nothing was staged, the reader
 * has room, or it completed while on_flushed was being registered), a
 * negative errno when it failed now (perch_pipe_flush's, or the waited
 * flush's result when it completed meanwhile), or PERCH_PENDING when
 * on_flushed(arg, result) will run exactly once, on the completing
 * thread, with 0 or the flush's error. on_flushed never runs inside this
 * call.
 */
PERCH_API int perch_pipe_flush_or_wait(struct perch_pipe_writer *w, perch_vtask_fn on_flushed, void *arg);

/*
 * Completes the waiting flush with -ECANCELED now (over a connection the
 * kernel keeps the bytes it holds, and writes stay refused until it took
 * them), or makes the next flush return -ECANCELED. Any thread. A cancel
 * under way keeps the writer until it returns, so a free from the flush's
 * continuation (which the cancel's completion may run) is safe; a cancel
 * begun after perch_pipe_writer_free is not. Returns 0 or -EINVAL.
 */
PERCH_API int perch_pipe_cancel_pending_flush(struct perch_pipe_writer *w);

/*
 * The writer is done. Over a connection, bytes committed and not flushed
 * are dropped and the connection stays open (perch_conn_close ends it); in
 * memory, they are handed to the reader, which then sees `completed`, and
 * a flush still waiting completes with -EPIPE. Later writes and flushes
 * return -EINVAL. A writer call: not at the same time as its others.
 * Idempotent. Returns 0 or -EINVAL.
 */
PERCH_API int perch_pipe_writer_complete(struct perch_pipe_writer *w);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_PIPE_H */
