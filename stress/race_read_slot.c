/* stress/race_read_slot.c: races on the read slot: a park against its bytes, a close, a cancel, another park. */
/*
 * Every race here is judged by stress/harness.c: it fails unless its two
 * halves overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS) and every round delivered exactly once.
 */
#include "config.h"

#include <stddef.h>
#include <stdlib.h>

#include "race_conn.h"

#define POLL_SPIN_LIMIT 10000000u

struct slot_state {
	struct fake_transport t;
	struct perch_conn *c;
	struct task_reader a, b;
	struct perch_read_result res_a, res_b;
	int rc_a, rc_b;
	struct counting_reader first, again;  /* the cookie race's two parks */
	bool gave_up;
	bool again_before_ready;              /* the next park came before the first's callback ran */
	bool fin_before_read;                 /* the FIN had landed before the read began */
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

/* One byte is queued before the round, so the read is served at once; a byte and the FIN race it. */
static void setup_one_byte_queued(void *p, uint64_t round)
{
	struct slot_state *s = p;
	slot_setup(p, round);
	fake_recv(s->c, "a");
}

/* The read, noting first whether the FIN had landed already (so the judge can tell it landed during the read). */
static void read_after_looking_for_the_fin(void *p, uint64_t round)
{
	struct slot_state *s = p;
	s->fin_before_read = (perch__load_u32(&s->c->rx_flags) & PERCH__RX_PEER_FIN) != 0;
	s->rc_a = perch_conn_try_read_or_park(s->c, &s->a.l, &s->res_a);
}

static void byte_then_fin(void *p, uint64_t round)
{
	struct slot_state *s = p;
	fake_recv(s->c, "x");
	perch__conn_peer_closed(s->c);
}

/*
 * Served at once (a byte was queued), with one or both bytes; a result
 * that says the stream ended holds every byte queued before the end.
 */
static bool judge_read_vs_byte_then_fin(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = s->rc_a == 0 && s->res_a.len >= 1 && s->res_a.len <= 2 &&
		  (!s->res_a.completed || s->res_a.len == 2);
	race_branch(r, !s->res_a.completed ? 0 : s->fin_before_read ? 1 : 2);
	if (!ok)
		race_fail(r, round, "read returned %d: completed=%d with %zu of the 2 bytes before the FIN",
			  s->rc_a, s->res_a.completed, s->res_a.len);
	race_conn_end(s->c);
	return ok;
}

static void first_ready(struct perch_recv_listener *l, struct perch_conn *c, uint64_t cookie)
{
	struct slot_state *s = (struct slot_state *)((char *)l - offsetof(struct slot_state, first));
	s->again_before_ready = perch__load_u32(&s->again.parkings) != 0;
	counting_reader_ready(l, c, cookie);
}

/* The first reader is parked before the round; its delivery races the reader's next park. */
static void setup_first_parked(void *p, uint64_t round)
{
	struct slot_state *s = p;
	slot_setup(p, round);
	s->first = (struct counting_reader)COUNTING_READER;
	s->first.l.on_recv_ready = first_ready;
	s->again_before_ready = false;
	s->again = (struct counting_reader)COUNTING_READER;
	s->again.cookie_base = 100;
	s->gave_up = false;
	if (perch_conn_try_read_or_park(s->c, &s->first.l, &s->res_a) != PERCH_PENDING)
		abort();
}

/*
 * A reader that polls instead of waiting for its wake: refused while the
 * first park is parked or being delivered, then served the byte, then
 * parked again with another listener (its own cookie).
 */
static void poll_then_park_again(void *p, uint64_t round)
{
	struct slot_state *s = p;
	unsigned spins = 0, total = 0;
	for (;;) {
		struct perch_read_result res;
		int rc = perch_conn_try_read_or_park(s->c, &s->again.l, &res);
		if (rc == PERCH_PENDING)
			break;
		if (++total > POLL_SPIN_LIMIT) {
			s->gave_up = true;
			break;
		}
		if (rc == 0)
			perch_conn_advance(s->c, res.len, res.len); /* and look again at once */
		else
			race_spin_pause(&spins);
	}
}

/* The first park's delivery hands back the first park's cookie, whatever the next park stored. */
static bool judge_delivery_vs_next_park(struct race *r, void *p, uint64_t round)
{
	struct slot_state *s = p;
	bool ok = !s->gave_up && s->first.deliveries == 1 && s->first.last_cookie == 1 &&
		  s->again.parkings == 1 && s->again.deliveries == 0;
	race_branch(r, s->again_before_ready ? 1 : 0);
	if (!ok)
		race_fail(r, round, "first park delivered %u times with cookie %llu (its own: 1); "
			  "the next parked %u times, delivered %u%s",
			  s->first.deliveries, (unsigned long long)s->first.last_cookie, s->again.parkings,
			  s->again.deliveries, s->gave_up ? " (gave up)" : "");
	race_conn_end(s->c);
	return ok;
}

#define READ_BRANCHES { "served at once", "served after a mark (during on_parking)", \
	"parked, the completion delivered", "parked, delivered on the reader's thread" }

const struct race_def race_read_vs_bytes = {
	.name = "read_slot: park races its bytes",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, bytes_arrive }, .judge = judge_read_vs_bytes,
	.branch_names = READ_BRANCHES,
};

const struct race_def race_read_vs_fin = {
	.name = "read_slot: park races the peer's FIN",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, peer_fin }, .judge = judge_read_vs_fin,
	.branch_names = READ_BRANCHES,
};

const struct race_def race_read_vs_close = {
	.name = "read_slot: park races close",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, conn_closes }, .judge = judge_read_vs_close,
	.branch_names = READ_BRANCHES,
};

const struct race_def race_two_reads = {
	.name = "read_slot: two parks at once",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, read_b }, .judge = judge_two_reads,
	.branch_names = { "first reader parked", "second reader parked" },
};

const struct race_def race_same_listener = {
	.name = "read_slot: same listener parks twice",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy, .setup = slot_setup,
	.actor = { read_a, read_b_same_listener }, .judge = judge_same_listener,
	.branch_names = { "first call parked", "second call parked" },
};

const struct race_def race_cancel_vs_bytes = {
	.name = "read_slot: cancel races completion",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy, .setup = setup_parked,
	.actor = { read_canceled, bytes_arrive }, .judge = judge_cancel_vs_bytes,
	.branch_names = { "the cancel delivered", "the completion delivered" },
};

const struct race_def race_read_vs_byte_then_fin = {
	.name = "read_slot: a served read races a byte and the FIN behind it",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy,
	.setup = setup_one_byte_queued,
	.actor = { read_after_looking_for_the_fin, byte_then_fin }, .judge = judge_read_vs_byte_then_fin,
	.branch_names = { "served before the FIN", "the FIN had landed before the read",
			  "the FIN landed during the read, every byte before it served" },
	.window_branch = 3, .window_needs_scheduler = true,
};

const struct race_def race_delivery_vs_next_park = {
	.name = "read_slot: a delivery races the reader's next park",
	.actors = 2, .exhaustive = true, .create = slot_create, .destroy = slot_destroy,
	.setup = setup_first_parked,
	.actor = { bytes_arrive, poll_then_park_again }, .judge = judge_delivery_vs_next_park,
	.branch_names = { "the next park after the first's callback",
			  "the next park before the first's callback ran" },
	.window_branch = 2, .window_needs_scheduler = true,
};
