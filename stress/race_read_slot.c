/* stress/race_read_slot.c: races on the read slot: a park against its bytes, a close, a cancel, another park. */
/*
 * Every race here is judged by stress/harness.c: it fails unless its two
 * halves overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS) and every round delivered exactly once.
 */
#include "config.h"

#include <stdlib.h>

#include "race_conn.h"

struct slot_state {
	struct fake_transport t;
	struct perch_conn *c;
	struct task_reader a, b;
	struct perch_read_result res_a, res_b;
	int rc_a, rc_b;
};

static void *slot_create(void)
{
	return calloc(1, sizeof(struct slot_state));
}

static void slot_destroy(void *p)
{
	free(p);
}

static void slot_setup(void *p, uint64_t round)
{
	struct slot_state *s = p;
	s->c = race_conn_new(&s->t);
	task_reader_reset(&s->a);
	task_reader_reset(&s->b);
	s->rc_a = s->rc_b = 0;
	memset(&s->res_a, 0, sizeof(s->res_a));
	memset(&s->res_b, 0, sizeof(s->res_b));
}

static void read_a(void *p, uint64_t round)
{
	struct slot_state *s = p;
	s->rc_a = perch_conn_try_read_or_park(s->c, &s->a.l, &s->res_a);
}

static void read_b(void *p, uint64_t round)
{
	struct slot_state *s = p;
	s->rc_b = perch_conn_try_read_or_park(s->c, &s->b.l, &s->res_b);
}

static void read_b_same_listener(void *p, uint64_t round)
{
	struct slot_state *s = p;
	s->rc_b = perch_conn_try_read_or_park(s->c, &s->a.l, &s->res_b);
}

static void bytes_arrive(void *p, uint64_t round)
{
	fake_recv(((struct slot_state *)p)->c, "x");
}

/* The peer's FIN: a recv of 0. */
static void peer_fin(void *p, uint64_t round)
{
	perch__conn_peer_closed(((struct slot_state *)p)->c);
}

static void conn_closes(void *p, uint64_t round)
{
	perch_conn_close(((struct slot_state *)p)->c);
}

static void read_canceled(void *p, uint64_t round)
{
	perch_conn_cancel_read(((struct slot_state *)p)->c);
}

/*
 * Exactly one delivery for reader `a`: served now (rc 0, and it saw what
 * `served_ok` asks), or parked and woken once, its value task completed.
 */
static bool judge_one_delivery(struct race *r, struct slot_state *s, uint64_t round,
			       bool served_ok)
{
	if (s->rc_a == 0) {
		race_branch(r, s->a.parkings ? 1 : 0);
		if (s->a.deliveries != 0)
			race_fail(r, round, "served at once and delivered %u times too", s->a.deliveries);
		else if (!served_ok)
			race_fail(r, round, "served at once with nothing to serve");
		return s->a.deliveries == 0 && served_ok;
	}
	race_branch(r, s->a.delivered_by == 0 ? 3 : 2);
	if (s->rc_a != PERCH_PENDING) {
		race_fail(r, round, "read returned %d", s->rc_a);
		return false;
	}
	if (s->a.deliveries != 1 || !task_reader_woke(&s->a)) {
		race_fail(r, round, "parked read delivered %u times, task %s", s->a.deliveries,
			  task_reader_woke(&s->a) ? "woke" : "never woke");
		return false;
	}
	return true;
}

static bool judge_read_vs_bytes(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = judge_one_delivery(r, s, round, s->res_a.len == 1);
	race_conn_end(s->c);
	return ok;
}

static bool judge_read_vs_fin(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = judge_one_delivery(r, s, round, s->res_a.completed && s->res_a.len == 0);
	race_conn_end(s->c);
	return ok;
}

static bool judge_read_vs_close(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = judge_one_delivery(r, s, round, s->res_a.closed);
	race_conn_end(s->c);
	return ok;
}

/* Two parks at once: one parks, the other is refused having touched nothing; the parked one gets the bytes. */
static bool judge_two_reads(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool a_parked = s->rc_a == PERCH_PENDING;
	struct task_reader *parked = a_parked ? &s->a : &s->b;
	struct task_reader *refused = a_parked ? &s->b : &s->a;
	int refused_rc = a_parked ? s->rc_b : s->rc_a;
	int parked_rc = a_parked ? s->rc_a : s->rc_b;
	bool ok = parked_rc == PERCH_PENDING && refused_rc == -EBUSY;
	if (!ok)
		race_fail(r, round, "reads returned %d and %d", s->rc_a, s->rc_b);
	race_branch(r, a_parked ? 0 : 1);
	if (refused->parkings != 0) {
		race_fail(r, round, "the refused read readied its listener");
		ok = false;
	}
	fake_recv(s->c, "x");
	if (parked->deliveries != 1 || refused->deliveries != 0 || !task_reader_woke(parked)) {
		race_fail(r, round, "deliveries: parked %u, refused %u", parked->deliveries,
			  refused->deliveries);
		ok = false;
	}
	race_conn_end(s->c);
	return ok;
}

/* The same listener parked twice at once: readied once, delivered once, its caller woken. */
static bool judge_same_listener(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = (s->rc_a == PERCH_PENDING && s->rc_b == -EBUSY) ||
		  (s->rc_b == PERCH_PENDING && s->rc_a == -EBUSY);
	if (!ok)
		race_fail(r, round, "reads returned %d and %d", s->rc_a, s->rc_b);
	race_branch(r, s->rc_a == PERCH_PENDING ? 0 : 1);
	if (s->a.parkings != 1) {
		race_fail(r, round, "listener readied %u times", s->a.parkings);
		ok = false;
	}
	fake_recv(s->c, "x");
	if (s->a.deliveries != 1 || !task_reader_woke(&s->a)) {
		race_fail(r, round, "listener delivered %u times, task %s", s->a.deliveries,
			  task_reader_woke(&s->a) ? "woke" : "never woke");
		ok = false;
	}
	race_conn_end(s->c);
	return ok;
}

static void setup_parked(void *p, uint64_t round)
{
	struct slot_state *s = p;
	slot_setup(p, round);
	s->rc_a = perch_conn_try_read_or_park(s->c, &s->a.l, &s->res_a);
}

/* A cancel and a completion both take the parked read back: one delivery, and the read sees both. */
static bool judge_cancel_vs_bytes(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = s->rc_a == PERCH_PENDING && s->a.deliveries == 1 && task_reader_woke(&s->a);
	if (!ok)
		race_fail(r, round, "parked read (rc %d) delivered %u times", s->rc_a, s->a.deliveries);
	struct perch_read_result res;
	if (perch_conn_try_read(s->c, &res) != 0 || !res.canceled || res.len != 1) {
		race_fail(r, round, "after the race the read sees canceled=%d len=%zu", res.canceled,
			  res.len);
		ok = false;
	}
	race_branch(r, s->a.delivered_by == 0 ? 0 : 1);
	race_conn_end(s->c);
	return ok;
}

#define READ_BRANCHES { "served at once", "served after a mark (during on_parking)", \
	"parked, the completion delivered", "parked, delivered on the reader's thread" }

const struct race_def race_read_vs_bytes = {
	.name = "read_slot: park races its bytes",
	.actors = 2, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, bytes_arrive }, .judge = judge_read_vs_bytes,
	.branch_names = READ_BRANCHES,
};

const struct race_def race_read_vs_fin = {
	.name = "read_slot: park races the peer's FIN",
	.actors = 2, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, peer_fin }, .judge = judge_read_vs_fin,
	.branch_names = READ_BRANCHES,
};

const struct race_def race_read_vs_close = {
	.name = "read_slot: park races close",
	.actors = 2, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, conn_closes }, .judge = judge_read_vs_close,
	.branch_names = READ_BRANCHES,
};

const struct race_def race_two_reads = {
	.name = "read_slot: two parks at once",
	.actors = 2, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, read_b }, .judge = judge_two_reads,
	.branch_names = { "first reader parked", "second reader parked" },
};

const struct race_def race_same_listener = {
	.name = "read_slot: same listener parks twice",
	.actors = 2, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, read_b_same_listener }, .judge = judge_same_listener,
	.branch_names = { "first call parked", "second call parked" },
};

const struct race_def race_cancel_vs_bytes = {
	.name = "read_slot: cancel races completion",
	.actors = 2, .create = slot_create, .destroy = slot_destroy, .setup = setup_parked,
	.actor = { read_canceled, bytes_arrive }, .judge = judge_cancel_vs_bytes,
	.branch_names = { "the cancel delivered", "the completion delivered" },
};
