/* examples/resp/resp.c: RESP2 over pipes: the commands of a read run under one lock, their replies flushed once. */
#include "resp.h"

#include <pthread.h>
#include <stdlib.h>

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

/* A reply buffer grown past this is freed after its read. */
#define REPLY_BUF_KEEP (256u << 10)

/* Per loop thread: the parsed command (~21 KB) and the replies of one read. */
static __thread struct resp_cmd cmd;
static __thread struct resp_buf out;

static void resp_thread_fini(void)
{
	free(out.p);
	out = (struct resp_buf){ 0 };
}

static ssize_t resp_frame(void *arg, const char *p, size_t len)
{
	struct resp_app *app = arg;
	int rc = resp_parse(p, len, &limits, &cmd);
	if (rc == RESP_NEED_MORE)
		return 0;
	if (rc == RESP_ERROR) {
		resp_reply_error(&out, cmd.error);
		return -1;
	}
	return resp_execute(app->store, &cmd, &out) == 0 ? (ssize_t)cmd.consumed : -1;
}

static int resp_data(void *state, void *arg, const struct perch_read_result *r,
		     struct perch_pipe_writer *w, size_t *consumed)
{
	struct resp_conn *rc = state;
	struct resp_app *app = arg;
	bool stop;
	/* One lock a read, not a command: 16 pipelined commands cost one acquisition. */
	pthread_mutex_lock(&app->lock);
	*consumed = frames_each(&rc->acc, r, resp_frame, app, &stop);
	pthread_mutex_unlock(&app->lock);
	if (out.len && perch_pipe_write(w, out.p, out.len) != 0)
		stop = true;
	out.len = 0;
	if (out.cap > REPLY_BUF_KEEP)
		resp_thread_fini(); /* a large GET's reply: do not keep its memory for the small ones */
	return stop;
}

static void resp_fini(void *state)
{
	frame_buf_free(&((struct resp_conn *)state)->acc);
}

static const struct serve_proto resp_proto = {
	.state_size = sizeof(struct resp_conn),
	.on_data = resp_data,
	.fini = resp_fini,
	.thread_fini = resp_thread_fini,
};

int resp_start(const struct serve_opts *o, struct serve **out_srv)
{
	struct resp_app *app = calloc(1, sizeof(*app));
	if (!app || !(app->store = resp_store_new())) {
		free(app);
		return -ENOMEM;
	}
	pthread_mutex_init(&app->lock, NULL);
	int rc = serve_start(o, &resp_proto, app, out_srv);
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
