/* pipes/pipe_internal.h: the pipe adapters' state, shared by the reader, the writer and the in-memory pipe. */
#ifndef PERCH_PIPES_PIPE_INTERNAL_H
#define PERCH_PIPES_PIPE_INTERNAL_H

#include <perch/pipe.h>

#include "conn_internal.h"

struct perch__mem_pipe;

#define READER_COMPLETED 1u
#define READER_FREEING   2u   /* a free is under way: a free from a continuation it runs is ignored */

/*
 * The reader parks on the connection through `listener`, whose on_parking
 * readies the one value task its caller awaits. A wake that brings nothing
 * new parks again from inside on_recv_ready, and on_parking then hands
 * back the version the caller already holds (told so by the delivering
 * thread, reader.c).
 */
struct perch_pipe_reader {
	struct perch_recv_listener listener;
	struct perch_conn *c;             /* a socket's, a TLS session's, or an in-memory pipe's */
	struct perch_vtask vt;
	uint32_t parked_token;            /* the version of the last read that parked (reading thread) */
	uint32_t state;                   /* READER_COMPLETED | READER_FREEING */
};

/*
 * The writer stages on the connection (zero-copy) and parks its flush on
 * it, or on the in-memory pipe. A flush the kernel holds outlives a cancel
 * (which completes the caller's task at once), so the writer may be freed
 * while still armed: `life` counts the arms not yet signalled (in steps of
 * WRITER_ARMED) and carries WRITER_FREED; whichever of free and the last
 * signal comes second frees the writer.
 */
#define WRITER_FREED   1u
#define WRITER_ARMED   2u
#define WRITER_FREEING 0x80000000u  /* a free is under way: a free from a continuation it runs is ignored */
#define WRITER_ARMS    0x7ffffffeu  /* the count of arms */

/* Why a writer call leaves the fast path: one load answers both. */
#define WRITER_GATE_COMPLETED 1u
#define WRITER_GATE_MEM       2u     /* set at creation: the writer writes an in-memory pipe */

struct perch_pipe_writer {
	struct perch_flush_listener listener;
	struct perch_conn *c;             /* a socket's, a TLS session's, or an in-memory pipe's */
	struct perch_vtask vt;            /* over a connection; the in-memory pipe has its own */
	uint32_t cancel;                  /* a cancel for the next flush */
	uint32_t gate;                    /* WRITER_GATE_*: 0 lets a call take the connection's fast path */
	uint32_t life;
	uint32_t room;                    /* what the last get_buffer lent (a buffer's, < 4 GiB) and
					   * advance has not committed */
	size_t high_water;                /* perch_pipe_writer_above_high_water's mark */
};

/* ---- the in-memory pipe, for the reader and writer (pipes/mem_pipe.c) ---- */

/* Why a write is refused now: -EBUSY (a flush waits for room), -EPIPE (the reader completed), or 0. */
int perch__mem_write_refusal(struct perch__mem_pipe *mp);
/* Hands the committed bytes to the reader; waits for room past the pause threshold. */
int perch__mem_flush(struct perch_pipe_writer *w, struct perch_vtask_handle *task);
/* Completes the waiting flush with `result` if one waits. Returns whether one did. */
bool perch__mem_wake_flush(struct perch__mem_pipe *mp, int result);
/* A cancel for the waiting flush, or for the next one. */
void perch__mem_cancel_flush(struct perch_pipe_writer *w);
/* The writer completed: its committed bytes, then the end of the stream; a waiting flush gets -EPIPE. */
void perch__mem_writer_completed(struct perch_pipe_writer *w);
/* The reader completed: a waiting flush and every later one fail with -EPIPE. */
void perch__mem_reader_completed(struct perch__mem_pipe *mp);
/* The in-memory pipe `c` carries, or NULL when c is another transport's. */
struct perch__mem_pipe *perch__mem_pipe_of(struct perch_conn *c);

/* Readers and writers made over `c` (the in-memory pipe makes its own conn). */
int perch__pipe_reader_init(struct perch_pipe_reader **out, struct perch_conn *c);
int perch__pipe_writer_init(struct perch_pipe_writer **out, struct perch_conn *c, bool mem);

#endif /* PERCH_PIPES_PIPE_INTERNAL_H */
