/* perch/conn.h: a connection whose parked read and parked flush are each one exactly-once slot. */
#ifndef PERCH_CONN_H
#define PERCH_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <perch/common.h>
#include <perch/vtask.h>

#ifdef __cplusplus
extern "C" {
#endif

struct perch_conn;

/*
 * One received buffer, filled by the kernel and queued on the connection
 * without a copy. `data[0..len)` are the bytes. A result's segments are
 * valid until the reader's next advance: the advance gives consumed ones
 * back, and one that examined everything may move a short unconsumed tail
 * into a segment of the connection's own (doc/loop.md, "Receive memory").
 */
struct perch_seg {
	struct perch_seg *next;    /* next received segment, NULL at the end */
	uint8_t *data;
	uint32_t len;
	uint32_t buf_id;           /* the backend's buffer id; UINT32_MAX: the connection's own copy;
				    * UINT32_MAX - 1: the loop's own memory (received while its pool was empty,
				    * or a waiting tail moved out of the pool) */
	void *owner;               /* whose buffer it is (the transport's: a loop's is the loop; NULL: own) */
};

/*
 * What a read sees: every received byte not yet consumed, as segments
 * (`first` starting at `first_off`), and the state of the stream.
 * Bytes come first: consume `len` bytes before acting on `completed`,
 * `error` or `closed`.
 */
struct perch_read_result {
	struct perch_seg *first;   /* NULL when len == 0 */
	size_t first_off;          /* bytes of `first` already consumed */
	size_t len;                /* unconsumed bytes, across segments */
	int error;                 /* 0, or the peer's error (-ECONNRESET, ...) */
	bool completed;            /* the peer finished and every byte is in this result */
	bool canceled;             /* perch_conn_cancel_read() woke this read */
	bool closed;               /* the connection was closed locally */
};

/*
 * A reader that parks on the connection.
 *
 * on_parking runs on the reading thread, past every guard, when the read is
 * about to park, and returns a cookie (an adapter returns its value-task
 * token). If a completion lands while it runs, the read is served at once
 * instead and no delivery follows (the readied task is simply not awaited);
 * otherwise it parks.
 * Otherwise on_recv_ready runs exactly once for this park, on whichever
 * thread delivered (the loop, or the thread that closed or canceled), and
 * hands the park's cookie back: a delivery of an older park can therefore
 * never be mistaken for the current one. A wake may bring nothing the
 * reader has not seen (two completions can both target one park); read
 * again, and park again, from inside on_recv_ready if so. Neither callback
 * may block. A listener must stay valid until its delivery has begun.
 */
struct perch_recv_listener {
	uint64_t (*on_parking)(struct perch_recv_listener *self, struct perch_conn *c);
	void (*on_recv_ready)(struct perch_recv_listener *self, struct perch_conn *c,
			      uint64_t cookie);
};

/*
 * A writer that parks a flush on the connection. on_parking as above (it
 * runs only when the flush arms); then exactly once per park on_flush_done
 * with the park's cookie and 0 (every flushed byte taken by the kernel) or
 * a negative errno (-EPIPE closed, or the send's error). When on_flush_done
 * runs, the flush guard is already released: it may stage and flush again
 * from inside itself.
 */
struct perch_flush_listener {
	uint64_t (*on_parking)(struct perch_flush_listener *self, struct perch_conn *c);
	void (*on_flush_done)(struct perch_flush_listener *self, struct perch_conn *c,
			      uint64_t cookie, int result);
};

/* ---- Reading: one reader at a time, from any thread. ---- */

/*
 * Serves the read now, or parks `listener` in the connection's read slot.
 * Returns 0 with *out filled (bytes not yet examined, or a final state);
 * PERCH_PENDING when parked (listener->on_recv_ready will run exactly once;
 * then call perch_conn_try_read); -EBUSY when another read owns the slot or
 * a delivery is being handed over (nothing of it, nor of `listener`, is
 * touched); -EINVAL for NULLs.
 */
PERCH_API int perch_conn_try_read_or_park(struct perch_conn *c,
					  struct perch_recv_listener *listener,
					  struct perch_read_result *out);

/*
 * Takes a snapshot without parking. Returns 0 with *out filled, -EAGAIN
 * when nothing new is there, -EBUSY while a read is parked (or its
 * delivery is being handed over), -EINVAL.
 */
PERCH_API int perch_conn_try_read(struct perch_conn *c, struct perch_read_result *out);

/*
 * The connection's own read: perch_conn_try_read_or_park with the
 * connection as its listener. On PERCH_PENDING, *task is the value task
 * that completes (with 0) when the read is ready; then call
 * perch_conn_try_read, which may still return -EAGAIN: a wake can bring
 * nothing new (then call perch_conn_read again, which parks anew). The
 * first perch_conn_read or perch_conn_flush makes the connection's two
 * tasks (48 bytes; a connection read through pipes never has them), and
 * returns -ENOMEM, touching nothing, when it cannot.
 */
PERCH_API int perch_conn_read(struct perch_conn *c, struct perch_read_result *out,
			      struct perch_vtask_handle *task);

/*
 * Marks bytes consumed (their buffers go back to the loop) and examined
 * (the next read parks until bytes beyond them arrive), both counted from
 * the start of the last result. Call it once per result: a second call, or
 * one before any read, returns -EINVAL. Returns 0, or -EINVAL when consumed >
 * examined, examined goes past the unconsumed bytes, or examined moves
 * back before an earlier examined position; -EBUSY while a read is parked
 * or its delivery is being handed over.
 */
PERCH_API int perch_conn_advance(struct perch_conn *c, size_t consumed, size_t examined);

/*
 * Wakes the parked read with a canceled result, or, when none is parked,
 * makes the next read return at once canceled. Returns 0 or -EINVAL.
 */
PERCH_API int perch_conn_cancel_read(struct perch_conn *c);

/* ---- Writing: one writer at a time, from any thread. ---- */

/*
 * Copies `len` bytes into the staging buffers. Returns 0, -EBUSY while a
 * flush is in progress (nothing is staged), -EPIPE when closed, -ENOMEM,
 * -EINVAL.
 */
PERCH_API int perch_conn_write(struct perch_conn *c, const void *data, size_t len);

/*
 * Runs exactly once when perch no longer needs the bytes of a referenced
 * write (perch_conn_write_ref, perch_pipe_write_ref): after the kernel
 * took them, or once they were dropped unsent (the connection closed, a
 * flush failed or was refused, the connection's last reference went).
 *
 * A zero-copy send (perch_conn_opts.zerocopy_min) lends the pages to the
 * kernel past the send: then it runs when the kernel's notification says
 * it let go of them, which may be after the flush completed and after
 * the connection closed. A peer that stops reading keeps them lent after
 * the close, until it reads or ends; perch_conn_abort (instead of the
 * close), or the loop's free, resets such a connection (its unsent bytes
 * dropped) and releases them.
 *
 * It runs on the thread that ended their use: the loop's after a send (a
 * close that cancels the send and a notification included) and in the
 * loop's free (the thread calling perch_loop_free when that is not the
 * loop's); an in-memory pipe's reader's once it consumed them; for bytes
 * dropped unsent, the thread whose call dropped them: a call that drops
 * staged bytes itself (perch_pipe_writer_complete, a flush refused once
 * the write side ended), else the one that let go of the connection's
 * last reference, which may be the loop's (it holds one until the socket
 * is finalized). It must not block, nor write to or flush this connection.
 */
typedef void (*perch_release_fn)(void *arg, const void *data, size_t len);

/*
 * Stages `len` bytes at `data` without copying them: the send reads them
 * where they are. The memory is the caller's; it must stay unchanged and
 * alive until release(arg, data, len) runs (exactly once). In order with
 * copied writes, and counted in perch_conn_staged. The writer's call, as
 * perch_conn_write. Returns 0; -EINVAL (NULL c, data or release, len 0 or
 * above UINT32_MAX); -EBUSY while a flush is in progress; -EPIPE when the
 * write side ended; -ENOMEM. On an error nothing was staged and release
 * will not run.
 */
PERCH_API int perch_conn_write_ref(struct perch_conn *c, const void *data, size_t len,
				   perch_release_fn release, void *arg);

/*
 * Bytes written (or forwarded) since the last flush took the staged ones:
 * what the connection holds for the writer and the kernel has not been
 * handed yet. The writer's call (not at the same time as its writes); 0
 * for NULL.
 */
PERCH_API size_t perch_conn_staged(const struct perch_conn *c);

/*
 * Ends the last read of `src` as perch_conn_advance does, and stages the
 * consumed bytes on `dst` (`src` itself for an echo) as perch_conn_write
 * would, without copying: received buffers of 1 KiB or more covered whole
 * are lent to `dst`, smaller pieces copied. The caller must be `src`'s
 * reader and `dst`'s writer. A lent buffer counts as unconsumed on `src`
 * until `dst`'s send of it completes, and `src`'s loop must outlive it
 * (doc/pipes.md, "Passing bytes on without a copy").
 * Returns 0; -EINVAL for NULLs or an advance perch_conn_advance refuses;
 * -EBUSY while `src` has a read parked or `dst` a flush in progress;
 * -EPIPE when `dst`'s write side ended; -ENOMEM. On error nothing was
 * consumed nor staged.
 */
PERCH_API int perch_conn_forward(struct perch_conn *src, size_t consumed, size_t examined,
				 struct perch_conn *dst);

/*
 * Hands the staged bytes to the loop, or parks `listener` until the kernel
 * took them all. Returns 0 when nothing was staged (an earlier flush's
 * result stays readable); PERCH_PENDING when parked; -EBUSY while another
 * flush is in progress (it is untouched); -EPIPE when closed (staged bytes
 * are dropped; the listener is not signalled, though on_parking may have
 * run when the close landed while the flush was arming); -EINVAL. The guard
 * is released just before on_flush_done runs: a flush from another thread
 * in that moment parks. A listener that readies one task for every park
 * must refuse that flush itself (perch_conn_flush and the pipe writer do).
 */
PERCH_API int perch_conn_try_flush_or_park(struct perch_conn *c,
					   struct perch_flush_listener *listener);

/*
 * The connection's own flush: on PERCH_PENDING *task completes with 0 or a
 * negative errno once the kernel took every byte. Returns as
 * perch_conn_try_flush_or_park, and -EBUSY also while the last flush's task
 * is still being signalled (the guard is released just before, so that its
 * continuation can flush again: from there the task is already complete),
 * and -ENOMEM as perch_conn_read.
 */
PERCH_API int perch_conn_flush(struct perch_conn *c, struct perch_vtask_handle *task);

/*
 * Ends the write side: the peer reads every byte flushed so far, then the
 * end of the stream (a TCP FIN), while reading goes on both ways; a proxy
 * passes one side's end on to the other with it. Call it as the writer,
 * once the last flush completed with 0 (after a failed one the stream is
 * cut short: perch_conn_abort instead): -EBUSY while the kernel holds a flush's bytes
 * (also after a pipe flush's cancel, until its send completes) or bytes
 * are staged (flush them first; nothing changes). Returns 0, also
 * when already shut; -EPIPE when closed; -EOPNOTSUPP for a connection
 * that has no write side of its own (an in-memory pipe's: complete its
 * writer instead); -EINVAL for NULL. Afterwards writes, forwards to it and
 * stage calls return -EPIPE (a buffer got before it cannot be committed
 * after it); the connection must still be closed or released.
 */
PERCH_API int perch_conn_shutdown(struct perch_conn *c);

/* ---- Lifecycle, any thread. ---- */

/*
 * Closes the connection: a parked read gets a closed result and a parked
 * flush -EPIPE, each exactly once, delivered on the calling thread inside
 * this call (a continuation that releases the connection there must not
 * release it again afterwards); later reads return closed at once, later
 * writes and flushes of staged bytes -EPIPE. Idempotent. Returns 0 or
 * -EINVAL. The socket itself is closed by the loop, at once or at a later
 * turn (on io_uring once the operations in flight on it completed): the
 * peer sees the end only while the loop turns on, or at perch_loop_free.
 */
PERCH_API int perch_conn_close(struct perch_conn *c);

/*
 * Closes as perch_conn_close does, but the peer sees its stream fail, not
 * end: the socket is closed with a reset (SO_LINGER 0), so the peer reads
 * what it already received, then ECONNRESET instead of the end of the
 * stream; bytes not yet delivered to it are lost. (After this side's FIN,
 * perch_conn_shutdown, the peer's reads still end cleanly: only its
 * writes fail.) For a stream cut short, where a FIN would say it
 * ended cleanly: a proxy passing a failure on, a protocol error. After a
 * close it changes nothing (the close's FIN is on its way). A connection
 * with no socket of its own (an in-memory pipe's) is simply closed. Any
 * thread. Returns 0 or -EINVAL.
 */
PERCH_API int perch_conn_abort(struct perch_conn *c);

/*
 * Drops the caller's reference (closing first when still open). The memory
 * goes when the last in-flight operation has completed.
 */
PERCH_API void perch_conn_release(struct perch_conn *c);

/* True once the connection is closed locally or failed. */
PERCH_API bool perch_conn_is_closed(const struct perch_conn *c);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_CONN_H */
