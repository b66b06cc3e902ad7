/* bench/tls_cost.c: one message written, flushed and read through TLS sessions or plain in-memory pipes, for callgrind (bench/tls_cost.sh). */
/*
 * Usage: tls_cost plain|tls COUNT SIZE CERTDIR
 *
 * On the loop's thread (as a protocol runs), a client writes SIZE bytes
 * and flushes (both engines run inside the flush), the server reads them
 * and advances, and the loop turns until the flush completed: COUNT
 * times, inside workload() (callgrind
 * counts only there: --toggle-collect=workload). "plain" does the same
 * over a bare in-memory pipe, so the difference is what TLS adds: the
 * cipher (libcrypto), OpenSSL's record layer (libssl), and perch's own
 * layer (pipes/tls_*.c), which tls_cost.sh separates by file.
 */
#include "config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <perch.h>

static struct perch_loop *loop;
static struct perch_pipe_reader *r;   /* the server's plaintext (or the bare pipe's) reader */
static struct perch_pipe_writer *w;   /* the client's plaintext (or the bare pipe's) writer */

static void die(const char *what)
{
	fprintf(stderr, "tls_cost: %s\n", what);
	exit(1);
}

struct job {
	const uint8_t *msg;
	size_t size;
	struct perch_vtask_handle h;
	int rc;
};

/*
 * One message, as a protocol answers on the loop's thread: write, flush
 * (over TLS both engines run inside the flush, so the bytes are there at
 * once), read them, advance. A flush completes in a later turn (over TLS
 * its completion is deferred out of the flush call).
 */
static void run_one(void *arg)
{
	struct job *j = arg;
	if (perch_pipe_write(w, j->msg, j->size) != 0)
		die("write");
	j->rc = perch_pipe_flush(w, &j->h);
	if (j->rc != 0 && j->rc != PERCH_PENDING)
		die("flush");
	struct perch_read_result res;
	size_t got = 0;
	while (got < j->size && perch_pipe_try_read(r, &res) == 0) {
		got += res.len;
		perch_pipe_advance_to(r, res.len, res.len);
	}
	if (got != j->size)
		die("the message did not arrive within the flush");
}

/* Posted, and the loop turned until its flush completed: the same turns in both modes. */
static void one(const uint8_t *msg, size_t size)
{
	struct job j = {.msg = msg, .size = size};
	if (perch_loop_post(loop, run_one, &j) != 0)
		die("post");
	perch_loop_run_once(loop, 0);
	for (int turns = 0; j.rc == PERCH_PENDING && perch_vtask_status(j.h) == PERCH_PENDING; turns++) {
		if (turns > 100)
			die("the flush did not complete");
		perch_loop_run_once(loop, 0);
	}
}

__attribute__((noinline)) void workload(const uint8_t *msg, size_t size, long count)
{
	for (long i = 0; i < count; i++)
		one(msg, size);
}

static struct perch_tls_ctx *ctx(int role, const char *dir)
{
	char crt[256], key[256], ca[256], why[256];
	snprintf(crt, sizeof(crt), "%s/server.pem", dir);
	snprintf(key, sizeof(key), "%s/server.key", dir);
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	struct perch_tls_ctx_opts o = {.role = role};
	if (role == PERCH_TLS_SERVER) {
		o.cert_file = crt;
		o.key_file = key;
	} else {
		o.ca_file = ca;
	}
	struct perch_tls_ctx *c;
	if (perch_tls_ctx_new(&o, &c, why, sizeof(why)) != 0)
		die(why);
	return c;
}

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "plain") != 0 && strcmp(argv[1], "tls") != 0))
		die("usage: tls_cost plain|tls COUNT SIZE CERTDIR");
	long count = atol(argv[2]);
	size_t size = (size_t)atol(argv[3]);
	if (count <= 0 || size == 0 || size > 65536)
		die("COUNT > 0, SIZE 1..65536");
	if (perch_loop_new(NULL, &loop) != 0)
		die("loop");
	struct perch_tls *client = NULL, *server = NULL;
	struct perch_tls_ctx *cctx = NULL, *sctx = NULL;
	if (strcmp(argv[1], "plain") == 0) {
		if (perch_pipe_new(NULL, &r, &w) != 0)
			die("pipe");
	} else {
		struct perch_pipe_reader *cr, *sr;
		struct perch_pipe_writer *cw, *sw;
		if (perch_pipe_new(NULL, &sr, &cw) != 0 || perch_pipe_new(NULL, &cr, &sw) != 0)
			die("pipes");
		sctx = ctx(PERCH_TLS_SERVER, argv[4]);
		cctx = ctx(PERCH_TLS_CLIENT, argv[4]);
		struct perch_tls_opts co = {.server_name = "localhost"};
		if (perch_tls_new(sctx, loop, sr, sw, NULL, &server) != 0 ||
		    perch_tls_new(cctx, loop, cr, cw, &co, &client) != 0)
			die("sessions");
		for (int i = 0; i < 1000 && !(perch_tls_established(client) && perch_tls_established(server)); i++)
			perch_loop_run_once(loop, 1);
		if (!perch_tls_established(client) || !perch_tls_established(server))
			die("no handshake");
		r = perch_tls_reader(server);
		w = perch_tls_writer(client);
	}
	uint8_t *msg = malloc(size);
	memset(msg, 'x', size);
	one(msg, size);   /* warm: tickets, first buffers */
	workload(msg, size, count);
	printf("%s: %ld messages of %zu bytes\n", argv[1], count, size);
	free(msg);
	if (client) {
		perch_tls_free(client);
		perch_tls_free(server);
	} else {
		perch_pipe_reader_free(r);
		perch_pipe_writer_free(w);
	}
	for (int i = 0; i < 4; i++)
		perch_loop_run_once(loop, 0);
	perch_tls_ctx_free(cctx);
	perch_tls_ctx_free(sctx);
	perch_loop_free(loop);
	return 0;
}
