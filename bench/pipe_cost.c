/* bench/pipe_cost.c: instructions per parked read-and-deliver and per echo round trip: raw conn, pipes, and a naive two-task adapter.
 *
 * One thread plays both the caller and the reactor over an in-process
 * transport with a fixed pool of segments (no kernel, no malloc per
 * segment), so callgrind's instruction counts are the library's own and
 * repeat exactly. Each run measures one variant:
 *
 *   make -C BUILD bench/pipe_cost
 *   valgrind --tool=callgrind --toggle-collect=workload --callgrind-out-file=/tmp/cg.%p \
 *       BUILD/bench/pipe_cost read pipes 100000
 *
 * and the instructions per operation are the file's "totals" divided by
 * the count. bench/pipe_cost.sh runs every variant and prints the table.
 *
 *   read:  park a read, a segment arrives, the caller's continuation reads
 *          the result and consumes it.
 *   echo:  the same, then the continuation writes the bytes back and
 *          flushes; the flush parks, the send completes, and the flush's
 *          continuation consumes the request.
 *
 * Staging (an optional fourth argument): malloc, the default, where the
 * conn core mallocs each staging buffer and frees it when the send is done
 * (a transport without a pool), or pooled, where the transport lends them
 * back as the loop's pool does on the loop thread.
 *
 * Variants: raw (perch_conn_read/flush and the conn's own value task),
 * pipes (the pipe adapters, parked on the conn's slot), naive (an adapter
 * that awaits the conn's own value task and then completes its own: two
 * continuation registrations per park, the design the pipes avoid).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <perch.h>

#include "conn_internal.h"

#define MSG_LEN 64
#define POOL 4

/* ---- the in-process transport: a fixed pool of segments, one send at a time ---- */

struct bench_transport {
	struct perch_seg segs[POOL];
	uint8_t data[POOL][MSG_LEN];
	struct perch_seg *free_segs;
	struct perch__txbuf *sent;
	struct perch__txbuf *spent;    /* the staging pool, with bt_pooled_ops */
};

static void bt_send(struct perch_conn *c, struct perch__txbuf *chain)
{
	((struct bench_transport *)c->transport)->sent = chain;
}

static void bt_release_seg(struct perch_seg *seg)
{
	struct bench_transport *t = seg->owner;
	seg->next = t->free_segs;
	t->free_segs = seg;
}

static const struct perch__transport_ops bt_ops = { .send = bt_send, .release_seg = bt_release_seg };

/* A staging pool as the loop keeps one (its own thread only, so no atomics). */
static struct perch__txbuf *bt_txbuf_get(struct perch_conn *c)
{
	struct bench_transport *t = c->transport;
	struct perch__txbuf *b = t->spent;
	if (b)
		t->spent = b->next;
	return b;
}

static bool bt_txbuf_put(struct perch_conn *c, struct perch__txbuf *b)
{
	struct bench_transport *t = c->transport;
	b->next = t->spent;
	t->spent = b;
	return true;
}

static const struct perch__transport_ops bt_pooled_ops = {
	.send = bt_send, .release_seg = bt_release_seg,
	.txbuf_get = bt_txbuf_get, .txbuf_put = bt_txbuf_put,
};

static void bt_init(struct bench_transport *t)
{
	memset(t, 0, sizeof(*t));
	for (int i = 0; i < POOL; i++) {
		t->segs[i].data = t->data[i];
		t->segs[i].owner = t;
		memset(t->data[i], 'a' + i, MSG_LEN);
		bt_release_seg(&t->segs[i]);
	}
}

/* The reactor's half: a message arrives. */
static void bt_arrive(struct perch_conn *c)
{
	struct bench_transport *t = c->transport;
	struct perch_seg *seg = t->free_segs;
	t->free_segs = seg->next;
	seg->next = NULL;
	seg->len = MSG_LEN;
	perch__conn_recv_arrived(c, seg);
}

/* The reactor's half: the kernel took the send. */
static void bt_sent(struct perch_conn *c)
{
	struct bench_transport *t = c->transport;
	struct perch__txbuf *chain = t->sent;
	t->sent = NULL;
	perch__conn_send_done(c, chain, 0);
}

/* ---- one variant: how it reads, writes and flushes ---- */

struct bench;
struct variant {
	int (*read)(struct bench *b, struct perch_read_result *out, struct perch_vtask_handle *h);
	int (*advance)(struct bench *b, size_t n);
	int (*write)(struct bench *b, const void *data, size_t len);
	int (*flush)(struct bench *b, struct perch_vtask_handle *h);
};

struct bench {
	struct bench_transport t;
	struct perch_conn *c;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	const struct variant *v;
	bool echo;
	uint64_t done;
	/* the naive adapter: its own tasks, completed from continuations on the conn's */
	struct perch_vtask naive_read_vt, naive_flush_vt;
	uint32_t naive_read_token, naive_flush_token;
	struct perch_read_result naive_res;
	bool naive_has_res;
};

static int raw_read(struct bench *b, struct perch_read_result *out, struct perch_vtask_handle *h)
{
	return perch_conn_read(b->c, out, h);
}

static int raw_advance(struct bench *b, size_t n)
{
	return perch_conn_advance(b->c, n, n);
}

static int raw_write(struct bench *b, const void *data, size_t len)
{
	return perch_conn_write(b->c, data, len);
}

static int raw_flush(struct bench *b, struct perch_vtask_handle *h)
{
	return perch_conn_flush(b->c, h);
}

static int pipe_read(struct bench *b, struct perch_read_result *out, struct perch_vtask_handle *h)
{
	return perch_pipe_read(b->r, out, h);
}

static int pipe_advance(struct bench *b, size_t n)
{
	return perch_pipe_advance_to(b->r, n, n);
}

static int pipe_write(struct bench *b, const void *data, size_t len)
{
	return perch_pipe_write(b->w, data, len);
}

static int pipe_flush(struct bench *b, struct perch_vtask_handle *h)
{
	return perch_pipe_flush(b->w, h);
}

/* The naive reader: awaits the conn's task, then reads and completes its own. */
static void naive_read_woke(void *arg, int64_t result)
{
	struct bench *b = arg;
	b->naive_has_res = perch_conn_try_read(b->c, &b->naive_res) == 0;
	perch_vtask_complete(&b->naive_read_vt, b->naive_read_token, 0);
}

static int naive_read(struct bench *b, struct perch_read_result *out, struct perch_vtask_handle *h)
{
	if (b->naive_has_res) {
		b->naive_has_res = false;
		*out = b->naive_res;
		return 0;
	}
	struct perch_vtask_handle inner;
	int rc = perch_conn_read(b->c, out, &inner);
	if (rc != PERCH_PENDING)
		return rc;
	b->naive_read_token = perch_vtask_ready(&b->naive_read_vt);
	*h = (struct perch_vtask_handle){ &b->naive_read_vt, b->naive_read_token };
	if (perch_vtask_on_complete(inner, naive_read_woke, b) == 0)
		naive_read_woke(b, 0);
	return PERCH_PENDING;
}

static void naive_flush_woke(void *arg, int64_t result)
{
	struct bench *b = arg;
	perch_vtask_complete(&b->naive_flush_vt, b->naive_flush_token, result);
}

static int naive_flush(struct bench *b, struct perch_vtask_handle *h)
{
	struct perch_vtask_handle inner;
	int rc = perch_conn_flush(b->c, &inner);
	if (rc != PERCH_PENDING)
		return rc;
	b->naive_flush_token = perch_vtask_ready(&b->naive_flush_vt);
	*h = (struct perch_vtask_handle){ &b->naive_flush_vt, b->naive_flush_token };
	int64_t result = 0;
	if (perch_vtask_on_complete(inner, naive_flush_woke, b) == 0 &&
	    perch_vtask_result(inner, &result) == 0)
		naive_flush_woke(b, result);
	return PERCH_PENDING;
}

static const struct variant raw = { raw_read, raw_advance, raw_write, raw_flush };
static const struct variant pipes = { pipe_read, pipe_advance, pipe_write, pipe_flush };
static const struct variant naive = { naive_read, raw_advance, raw_write, naive_flush };

/* ---- the caller: continuations, as a protocol stack would write them ---- */

static void read_ready(void *arg, int64_t result);

static void fail(const char *what, int rc)
{
	fprintf(stderr, "pipe_cost: %s returned %d\n", what, rc);
	exit(1);
}

static void flush_done(void *arg, int64_t result)
{
	struct bench *b = arg;
	if (result != 0)
		fail("the flush", (int)result);
	b->done++;
}

/* Writes the message back and flushes it; the send completes when the reactor says so. */
static void echo_back(struct bench *b, const struct perch_read_result *res)
{
	struct perch_vtask_handle h;
	int rc = b->v->write(b, res->first->data + res->first_off, res->len);
	if (rc != 0)
		fail("write", rc);
	if ((rc = b->v->advance(b, res->len)) != 0)
		fail("advance", rc);
	rc = b->v->flush(b, &h);
	if (rc != PERCH_PENDING)
		fail("flush", rc);
	if ((rc = perch_vtask_on_complete(h, flush_done, b)) != PERCH_PENDING)
		fail("flush registration", rc);
}

static void read_ready(void *arg, int64_t result)
{
	struct bench *b = arg;
	struct perch_read_result res;
	struct perch_vtask_handle h;
	int rc = b->v->read(b, &res, &h);
	if (rc == PERCH_PENDING) /* the raw conn's wake can bring nothing new: wait again */
		rc = perch_vtask_on_complete(h, read_ready, b) == PERCH_PENDING ? PERCH_PENDING : -1;
	if (rc == PERCH_PENDING)
		return;
	if (rc != 0 || res.len != MSG_LEN)
		fail("the woken read", rc);
	if (b->echo) {
		echo_back(b, &res);
		return;
	}
	if ((rc = b->v->advance(b, res.len)) != 0)
		fail("advance", rc);
	b->done++;
}

static void park_read(struct bench *b)
{
	struct perch_read_result res;
	struct perch_vtask_handle h;
	int rc = b->v->read(b, &res, &h);
	if (rc != PERCH_PENDING)
		fail("the read (expected to park)", rc);
	if ((rc = perch_vtask_on_complete(h, read_ready, b)) != PERCH_PENDING)
		fail("registration", rc);
}

/* What callgrind counts (--toggle-collect=workload): n operations, nothing else. */
__attribute__((noinline)) void workload(struct bench *b, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		park_read(b);
		bt_arrive(b->c);
		if (b->echo)
			bt_sent(b->c);
	}
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc > 5 || (strcmp(argv[1], "read") && strcmp(argv[1], "echo")) ||
	    (argc == 5 && strcmp(argv[4], "malloc") && strcmp(argv[4], "pooled"))) {
		fprintf(stderr, "usage: pipe_cost read|echo raw|pipes|naive COUNT [malloc|pooled]\n");
		return 2;
	}
	bool pooled = argc == 5 && !strcmp(argv[4], "pooled");
	static struct bench b;
	b.echo = strcmp(argv[1], "echo") == 0;
	b.v = !strcmp(argv[2], "raw") ? &raw : !strcmp(argv[2], "pipes") ? &pipes
		: !strcmp(argv[2], "naive") ? &naive : NULL;
	uint64_t n = strtoull(argv[3], NULL, 10);
	if (!b.v || n == 0) {
		fprintf(stderr, "pipe_cost: unknown variant or zero count\n");
		return 2;
	}
	bt_init(&b.t);
	b.c = perch__conn_new(pooled ? &bt_pooled_ops : &bt_ops, &b.t);
	perch_vtask_init(&b.naive_read_vt);
	perch_vtask_init(&b.naive_flush_vt);
	if (!b.c || perch_pipe_reader_new(b.c, &b.r) != 0 || perch_pipe_writer_new(b.c, &b.w) != 0)
		fail("setup", -ENOMEM);
	workload(&b, n);
	if (b.done != n)
		fail("the count of completed operations", (int)b.done);
	printf("%s %s: %llu operations done\n", argv[1], argv[2], (unsigned long long)n);
	perch_pipe_reader_free(b.r);
	perch_pipe_writer_free(b.w);
	perch_conn_release(b.c);
	perch__conn_free_chain(b.t.spent);
	return 0;
}
