/* pipes/server_internal.h: the server scaffold's workers and sessions, shared by server.c and session.c. */
#ifndef PERCH_SERVER_INTERNAL_H
#define PERCH_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>

#include <perch/server.h>
#include <perch/sock.h>
#include <perch/timer.h>
#include <perch/tls.h>

/* One loop, its thread and listener. Fields past `th` are touched on the loop's thread only. */
struct perch__server_worker {
	struct perch_server *srv;
	struct perch_loop *loop;
	struct perch_listener *ls;
	pthread_t th;
	bool thread_made;
	bool exited;                   /* its loop's run returned (under srv->mu) */
	bool run_returned;             /* the same, read on the loop thread without the lock */
	bool stopping;                 /* the graceful stop began on this loop */
	bool aborting;                 /* its deadline passed (or the loop failed): what ends now was cut */
	struct perch_session *sessions;
	uint64_t open;
	struct perch_timer deadline;
	struct perch_timer linger_poll; /* the sessions ended: the stop waits for their lingering closes */
	struct perch_server_report counts;
};

struct perch_server {
	struct perch_server_opts opts; /* host and unix_name point into the copies below */
	char host[64];
	char unix_name[108];
	int port;
	pthread_mutex_t mu;
	pthread_cond_t stop_cond;
	bool stop_requested;           /* under mu */
	bool go;                       /* under mu: every thread was made, the loops may run */
	unsigned deadline_ms;          /* set before the stop is posted */
	int nworkers;
	struct perch__server_worker wk[];
};

struct perch_session {
	struct perch_session *prev, *next;
	struct perch__server_worker *wk;
	struct perch_conn *c;
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	struct perch_tls *tls;         /* the TLS session r and w are the plaintext ends of, or NULL */
	struct perch_timer idle;
	bool ending;                   /* perch_session_end began */
	bool held;                     /* the server holds it across a callback: it frees it after */
	struct perch_session *stop_next; /* the stop's snapshot of the open sessions */
	alignas(max_align_t) unsigned char state[];
};

/* A listener's accept: makes the session and calls the start callback. Loop thread. */
void perch__session_accept(struct perch_listener *l, struct perch_conn *c, void *arg);

/* Calls the stop callback (or nothing) on every open session of wk. Loop thread. */
void perch__session_stop_all(struct perch__server_worker *wk);

/* Cuts every open session of wk with a reset, ending what its close does not. Loop thread. */
void perch__session_abort_all(struct perch__server_worker *wk);

/*
 * The TLS layer's calls the scaffold makes, reached through this table
 * so that a program that never makes a TLS context links no TLS (nor
 * OpenSSL): perch_tls_ctx_new sets it (pipes/tls_ctx.c), and a server
 * given a context finds it set. NULL until then.
 */
struct perch__tls_hooks {
	int (*ctx_role)(const struct perch_tls_ctx *ctx);  /* PERCH_TLS_SERVER or PERCH_TLS_CLIENT */
	void (*ctx_ref)(struct perch_tls_ctx *ctx);
	void (*ctx_free)(struct perch_tls_ctx *ctx);
	int (*session_new)(struct perch_tls_ctx *ctx, struct perch_loop *loop, struct perch_pipe_reader *r,
			   struct perch_pipe_writer *w, const struct perch_tls_opts *opts, struct perch_tls **out);
	struct perch_pipe_reader *(*reader)(struct perch_tls *t);
	struct perch_pipe_writer *(*writer)(struct perch_tls *t);
	void (*free)(struct perch_tls *t);
	/* perch_tls_free, then after(arg) once its close_notify was flushed (pipes/tls_end.c). */
	void (*end)(struct perch_tls *t, void (*after)(void *arg), void *arg);
};

/* Any thread: the table, or NULL before any TLS context was made. */
const struct perch__tls_hooks *perch__tls_hooks_get(void);
/* Sets it (perch_tls_ctx_new, every time: the same table). */
void perch__tls_hooks_set(const struct perch__tls_hooks *hooks);

/* A session of wk ended: stops the loop once the last one ends during a stop. Loop thread. */
void perch__server_session_ended(struct perch__server_worker *wk);

#endif /* PERCH_SERVER_INTERNAL_H */
