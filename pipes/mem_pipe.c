/* pipes/mem_pipe.c: the in-memory pipe: a connection fed by its own writer, with pause/resume backpressure. */
#include "config.h"

#include <stdlib.h>

#include "atomic.h"
#include "pipe_internal.h"

#define DEFAULT_PAUSE (64u * 1024u)

/*
 * The reader side is a connection core with no socket: the writer is its
 * one producer (perch__conn_recv_arrived), the reader its consumer, so a
 * read parks and is delivered through the same slot as over TCP. A
 * flushed buffer becomes a segment without a copy.
 *
 * Backpressure is a one-slot arm like the connection's flush: the writer
 * readies the flush task, publishes its token in `waiting`, then looks at
 * `unread`; the reader lowers `unread`, then looks at `waiting`. Each side
 * publishes with a read-modify-write and fences before it looks, so one of
 * them always sees the other, and whoever takes the token back (an
 * exchange) completes that version, exactly once. The token travels in the
 * word itself, so the winner never reads it after giving the slot up. The
 * task lives here, with the connection, not in the writer: a reader that
 * won the exchange may complete it after the writer was freed.
 */
struct perch__mem_pipe {
	struct perch_vtask vt;            /* the waiting flush's task */
	size_t pause, resume;
	uint64_t unread;                  /* flushed and not yet consumed */
	uint32_t waiting;                 /* the waiting flush's token, 0 when none waits */
	uint32_t cancel;                  /* a cancel for the next flush */
	uint32_t reader_done;
};

struct mem_seg {
	struct perch_seg seg;
	struct perch__txbuf *buf;         /* the writer's buffer, lent without a copy */
};

static void mem_room_made(struct perch__mem_pipe *mp, uint64_t n);

/* Nothing flushes through the connection core (the writer publishes itself): refuse, as closed. */
static void mem_send(struct perch_conn *c, struct perch__txbuf *chain)
{
	perch__conn_free_chain(chain);
}

static void mem_release_seg(struct perch_seg *seg)
{
	struct mem_seg *ms = (struct mem_seg *)seg;
	perch__conn_free_chain(ms->buf);
	free(ms);
}

/* Byte-exact: a reader that keeps part of a segment still makes room for what it consumed. */
static void mem_consumed(struct perch_conn *c, uint64_t n)
{
	mem_room_made(c->transport, n);
}

static void mem_destroy(struct perch_conn *c)
{
	free(c->transport);
}

static const struct perch__transport_ops mem_ops = {
	.send = mem_send,
	.release_seg = mem_release_seg,
	.destroy = mem_destroy,
	.consumed = mem_consumed,
};

struct perch__mem_pipe *perch__mem_pipe_of(struct perch_conn *c)
{
	return c->ops == &mem_ops ? c->transport : NULL;
}

/* The pipe of a writer these functions are called for: an in-memory pipe's. */
static struct perch__mem_pipe *writer_pipe(struct perch_pipe_writer *w)
{
	struct perch__mem_pipe *mp = perch__mem_pipe_of(w->c);
	PERCH_ASSERT(mp != NULL);
	return mp;
}

static bool has_room(struct perch__mem_pipe *mp)
{
	return perch__load_u64(&mp->unread) <= mp->resume || perch__load_u32(&mp->reader_done);
}

bool perch__mem_wake_flush(struct perch__mem_pipe *mp, int result)
{
	uint32_t token;
	if (!perch__load_u32(&mp->waiting) || (token = perch__xchg_u32(&mp->waiting, 0)) == 0)
		return false;
	perch_vtask_complete(&mp->vt, token, result);
	return true;
}

void perch__mem_cancel_flush(struct perch_pipe_writer *w)
{
	/* Marked first, so a flush about to publish sees it after it does (wait_for_room). */
	struct perch__mem_pipe *mp = writer_pipe(w);
	perch__xchg_u32(&mp->cancel, 1);
	perch__fence_rmw_then_load();
	if (perch__mem_wake_flush(mp, -ECANCELED))
		perch__xchg_u32(&mp->cancel, 0);
}

/* The reader consumed `n` bytes (its thread, inside advance). */
static void mem_room_made(struct perch__mem_pipe *mp, uint64_t n)
{
	perch__faa_u64(&mp->unread, (uint64_t)0 - n);
	perch__fence_rmw_then_load();
	if (has_room(mp))
		perch__mem_wake_flush(mp, perch__load_u32(&mp->reader_done) ? -EPIPE : 0);
}

int perch__mem_write_refusal(struct perch__mem_pipe *mp)
{
	if (perch__load_u32(&mp->reader_done))
		return -EPIPE;
	return perch__load_u32(&mp->waiting) ? -EBUSY : 0;
}

static void free_spares(struct mem_seg *spares)
{
	while (spares) {
		struct mem_seg *next = (struct mem_seg *)spares->seg.next;
		free(spares);
		spares = next;
	}
}

/*
 * Lends each committed buffer to the reader as a segment. Every segment is
 * allocated first, so running out of memory lends nothing; the queue's own
 * node can still fail (-ENOMEM), and the buffers from that one on are
 * dropped. Takes the chain either way.
 */
static int publish(struct perch_conn *c, struct perch__txbuf *chain)
{
	struct perch__mem_pipe *mp = c->transport;
	struct mem_seg *spares = NULL;
	for (struct perch__txbuf *b = chain; b; b = b->next) {
		struct mem_seg *ms = calloc(1, sizeof(*ms));
		if (!ms) {
			free_spares(spares);
			perch__conn_free_chain(chain);
			return -ENOMEM;
		}
		ms->seg.next = (struct perch_seg *)spares;   /* seg is the first member */
		spares = ms;
	}
	for (struct perch__txbuf *b = chain, *next; b; b = next) {
		next = b->next;
		struct mem_seg *ms = spares;
		spares = (struct mem_seg *)ms->seg.next;
		b->next = NULL;
		ms->buf = b;
		ms->seg.next = NULL;
		ms->seg.data = b->bytes;
		ms->seg.len = b->len;
		perch__faa_u64(&mp->unread, b->len);
		if (perch__conn_recv_arrived(c, &ms->seg) != 0) {
			perch__faa_u64(&mp->unread, (uint64_t)0 - b->len);
			free(ms);
			b->next = next;
			perch__conn_free_chain(b);
			free_spares(spares);
			return -ENOMEM;
		}
	}
	return 0;
}

/*
 * Parks the flush until the reader makes room, or serves it if room (or a
 * cancel, or the reader's end) came meanwhile.
 */
static int wait_for_room(struct perch__mem_pipe *mp, struct perch_vtask_handle *task)
{
	uint32_t token = perch_vtask_ready(&mp->vt);
	task->task = &mp->vt;
	task->token = token;
	perch__xchg_u32(&mp->waiting, token);
	perch__fence_rmw_then_load();
	bool canceled = perch__load_u32(&mp->cancel) != 0;
	if (!has_room(mp) && !canceled)
		return PERCH_PENDING;
	/* Take the wait back, unless the reader (or a cancel) did: it completes the task. */
	if (perch__xchg_u32(&mp->waiting, 0) == 0)
		return PERCH_PENDING;
	if (canceled && perch__xchg_u32(&mp->cancel, 0))
		return -ECANCELED;
	return perch__load_u32(&mp->reader_done) ? -EPIPE : 0;
}

int perch__mem_flush(struct perch_pipe_writer *w, struct perch_vtask_handle *task)
{
	struct perch__mem_pipe *mp = writer_pipe(w);
	int refused = perch__mem_write_refusal(mp);
	if (refused == -EPIPE) {
		size_t len;
		perch__conn_free_chain(perch__conn_take_staged(w->c, &len));
	}
	if (refused)
		return refused;
	if (perch__xchg_u32(&mp->cancel, 0))
		return -ECANCELED;
	size_t len;
	struct perch_conn *c = w->c;
	struct perch__txbuf *chain = perch__conn_take_staged(c, &len);
	/*
	 * The delivery may run the reader's continuation here, which may free
	 * both ends (the writer `w` included): the pipe lives on this hold.
	 */
	perch__conn_ref(c);
	int rc = chain ? publish(c, chain) : 0;
	/*
	 * Published, then looked: a reader that completed meanwhile discards
	 * what it did not see. Room first, then the reader's end: complete()
	 * marks the end before its discard makes room, so room that the
	 * discard made is never taken for a consume.
	 */
	perch__fence_rmw_then_load();
	bool room = perch__load_u64(&mp->unread) < mp->pause;
	if (rc == 0 && perch__load_u32(&mp->reader_done))
		rc = -EPIPE;
	else if (rc == 0 && !room)
		rc = wait_for_room(mp, task);
	perch__conn_unref(c);
	return rc;
}

void perch__mem_writer_completed(struct perch_pipe_writer *w)
{
	size_t len;
	struct perch__txbuf *chain = perch__conn_take_staged(w->c, &len);
	struct perch__mem_pipe *mp = writer_pipe(w);
	if (chain && perch__load_u32(&mp->reader_done))
		perch__conn_free_chain(chain);
	else if (chain)
		publish(w->c, chain);
	perch__mem_wake_flush(mp, -EPIPE);
	perch__conn_peer_closed(w->c);
}

void perch__mem_reader_completed(struct perch__mem_pipe *mp)
{
	perch__xchg_u32(&mp->reader_done, 1);
	perch__fence_rmw_then_load();
	perch__mem_wake_flush(mp, -EPIPE);
}

int perch_pipe_new(const struct perch_pipe_opts *opts, struct perch_pipe_reader **reader,
		   struct perch_pipe_writer **writer)
{
	static const struct perch_pipe_opts defaults;
	if (!reader || !writer)
		return -EINVAL;
	opts = opts ? opts : &defaults;
	size_t pause = opts->pause_bytes ? opts->pause_bytes : DEFAULT_PAUSE;
	size_t resume = opts->resume_bytes ? opts->resume_bytes : pause / 2;
	if (resume >= pause)
		return -EINVAL;
	struct perch__mem_pipe *mp = calloc(1, sizeof(*mp));
	if (!mp)
		return -ENOMEM;
	mp->pause = pause;
	mp->resume = resume;
	perch_vtask_init(&mp->vt);
	struct perch_conn *c = perch__conn_new(&mem_ops, mp);
	if (!c) {
		free(mp);
		return -ENOMEM;
	}
	struct perch_pipe_reader *r = NULL;
	struct perch_pipe_writer *w = NULL;
	int rc = perch__pipe_reader_init(&r, c);
	if (rc == 0 && (rc = perch__pipe_writer_init(&w, c, true)) != 0)
		perch_pipe_reader_free(r);
	if (rc == 0) {
		*reader = r;
		*writer = w;
	}
	perch__conn_unref(c);   /* each end holds its own */
	return rc;
}
