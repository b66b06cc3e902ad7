/* stress/race_conn.h: what the race families share: a fresh connection per round and a value-task listener. */
#ifndef PERCH_STRESS_RACE_CONN_H
#define PERCH_STRESS_RACE_CONN_H

#include <perch.h>

#include "../tests/fake_transport.h"
#include "harness.h"

/*
 * The shutdown(2) calls the library made on `fd` so far, counted by the
 * stress binary's wrap of shutdown (stress/race_loop_close.c); 0 for an fd
 * past its table. A race takes the difference over its round.
 */
uint32_t race_shutdowns_made(int fd);

/* A reader shaped like a pipe adapter: on_parking readies its value task, on_recv_ready completes it. */
struct task_reader {
	struct perch_recv_listener l;
	struct perch_vtask vt;
	uint32_t token;
	uint32_t parkings;
	uint32_t deliveries;
	int delivered_by;          /* the actor whose call delivered */
};

static inline uint64_t task_reader_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	struct task_reader *r = (struct task_reader *)l;
	perch__faa_u32(&r->parkings, 1);
	r->token = perch_vtask_ready(&r->vt);
	return r->token;
}

static inline void task_reader_ready(struct perch_recv_listener *l, struct perch_conn *c,
				     uint64_t cookie)
{
	struct task_reader *r = (struct task_reader *)l;
	perch__faa_u32(&r->deliveries, 1);
	r->delivered_by = race_current_actor();
	perch_vtask_complete(&r->vt, (uint32_t)cookie, 1);
}

static inline void task_reader_reset(struct task_reader *r)
{
	r->l.on_parking = task_reader_parking;
	r->l.on_recv_ready = task_reader_ready;
	r->parkings = r->deliveries = 0;
	r->token = 0;
	r->delivered_by = -1;
	perch_vtask_init(&r->vt);
}

/* True when the version the reader parked with has completed: its caller would wake. */
static inline bool task_reader_woke(struct task_reader *r)
{
	struct perch_vtask_handle h = { &r->vt, r->token };
	return perch_vtask_status(h) == 0;
}

/* A new connection over a zeroed fake transport. */
static inline struct perch_conn *race_conn_new(struct fake_transport *t)
{
	memset(t, 0, sizeof(*t));
	struct perch_conn *c = perch__conn_new(&fake_ops, t);
	if (!c)
		abort();
	return c;
}

/* Ends a round's connection: the kernel's last send completes, the user's reference goes. */
static inline void race_conn_end(struct perch_conn *c)
{
	struct fake_transport *t = c->transport;
	if (t->sent)
		fake_send_done(c, -ECANCELED);
	perch_conn_release(c);
}

#endif /* PERCH_STRESS_RACE_CONN_H */
