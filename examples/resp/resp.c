/* examples/resp/resp.c: RESP2 over pipes: the commands of a read run under one lock, their replies staged and flushed once. */
#include "resp.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"
#include "resp_parse.h"
#include "resp_store.h"

/* The key space every loop shares: the store is not thread-safe. */
struct resp_app {
	struct resp_store *store;
	pthread_mutex_t lock;
};

struct resp_conn {
	struct frame_buf acc;
};

/* A bulk string above this is a protocol error, which bounds a connection's copy of a spanning command. */
static const struct resp_limits limits = { .max_bulk = 4u << 20 };

/* Per loop thread: the parsed command (~21 KB). */
static __thread struct resp_cmd cmd;

/* What answering one read needs. */
struct resp_batch {
	struct resp_app *app;
	struct perch_pipe_writer *w; /* where the replies are staged */
	size_t answered;   /* commands answered in this read */
};

/* The most commands answered, and reply bytes staged, in one read since resp_start. */
static size_t largest_batch, largest_replies;

static void note_max(size_t *max, size_t v)
{
	size_t seen = __atomic_load_n(max, __ATOMIC_RELAXED);
	while (v > seen && !__atomic_compare_exchange_n(max, &seen, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
	}
}

static ssize_t resp_frame(void *arg, const char *p, size_t len)
{
	struct resp_batch *b = arg;
	/* Before parsing (frames_each's rule): the rest waits for the next read, after this one's flush. */
	if (b->answered == RESP_MAX_PIPELINED || perch_pipe_writer_above_high_water(b->w))
		return FRAMES_YIELD;
	int rc = resp_parse(p, len, &limits, &cmd);
	if (rc == RESP_NEED_MORE)
		return 0;
	if (rc == RESP_ERROR) {
		resp_reply_error(b->w, cmd.error);
		return -1;
	}
	if (resp_execute(b->app->store, &cmd, b->w) != 0)
		return -1;
	b->answered++;
	return (ssize_t)cmd.consumed;
}

static int resp_data(void *state, void *arg, const struct perch_read_result *r,
		     struct perch_pipe_writer *w, size_t *consumed)
{
	struct resp_conn *rc = state;
	struct resp_batch b = { arg, w, 0 };
	enum frames_end end;
	/* One lock a read, not a command: 16 pipelined commands cost one acquisition. */
	pthread_mutex_lock(&b.app->lock);
	*consumed = frames_each(&rc->acc, r, resp_frame, &b, &end);
	pthread_mutex_unlock(&b.app->lock);
	note_max(&largest_batch, b.answered);
	note_max(&largest_replies, perch_pipe_writer_staged(w));
	return end == FRAMES_STOPPED ? 1 : end == FRAMES_YIELDED ? SERVE_YIELD : 0;
}

static void resp_fini(void *state)
{
	frame_buf_free(&((struct resp_conn *)state)->acc);
}

static const struct serve_proto resp_proto = {
	.state_size = sizeof(struct resp_conn),
	.on_data = resp_data,
	.fini = resp_fini,
};

void resp_largest_batch(size_t *commands, size_t *reply_bytes)
{
	*commands = __atomic_load_n(&largest_batch, __ATOMIC_RELAXED);
	*reply_bytes = __atomic_load_n(&largest_replies, __ATOMIC_RELAXED);
}

int resp_start(const struct serve_opts *o, struct serve **out_srv)
{
	__atomic_store_n(&largest_batch, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&largest_replies, 0, __ATOMIC_RELAXED);
	struct resp_app *app = calloc(1, sizeof(*app));
	if (!app)
		return -ENOMEM;
	int rc = resp_store_new(&app->store);
	if (rc < 0) {
		fprintf(stderr, "resp: no key space: %s%s\n", strerror(-rc),
			rc == -ENOMEM ? "" : " (getrandom, for the hash key)");
		free(app);
		return rc;
	}
	pthread_mutex_init(&app->lock, NULL);
	rc = serve_start(o, &resp_proto, app, out_srv);
	if (rc != 0) {
		resp_store_free(app->store);
		pthread_mutex_destroy(&app->lock);
		free(app);
	}
	return rc;
}

void resp_stop(struct serve *s)
{
	struct resp_app *app = serve_app(s);
	serve_stop(s);
	if (app) {
		resp_store_free(app->store);
		pthread_mutex_destroy(&app->lock);
		free(app);
	}
}
