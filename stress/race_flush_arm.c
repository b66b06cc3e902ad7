/* stress/race_flush_arm.c: races on the flush arm: a flush against the last one's completion, and against close. */
/*
 * Every race here is judged by stress/harness.c: it fails unless its two
 * halves overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS) and every round delivered exactly once.
 */
#include "config.h"

#include <stddef.h>
#include <stdlib.h>

#include "race_conn.h"

#define WRITE_SPIN_LIMIT 10000000u

struct flush_state {
	struct fake_transport t;
	struct perch_conn *c;
	struct counting_flusher first, second;
	uint64_t rng;
	int rc;
	bool gave_up;
	bool parked_during_signal;     /* the second flush parked before the first's signal returned */
	bool refused_in_flight;        /* a shutdown was refused while the send was out */
};

static void *flush_create(void)
{
	struct flush_state *s = calloc(1, sizeof(*s));
	s->rng = 0x2545f4914f6cdd1dull;
	return s;
}

static void flush_destroy(void *p)
{
	free(p);
}

static void flusher_reset(struct counting_flusher *f)
{
	*f = (struct counting_flusher)COUNTING_FLUSHER;
}

/* The first flush's listener does a little work when signalled, as a real continuation would. */
static void busy_signal(struct counting_flusher *f, struct perch_conn *c)
{
	struct flush_state *s = (struct flush_state *)((char *)f - offsetof(struct flush_state, first));
	race_busy_work();
	s->parked_during_signal = perch__load_u32(&s->second.parkings) != 0;
}

static void setup_one_parked(void *p, uint64_t round)
{
	struct flush_state *s = p;
	s->c = race_conn_new(&s->t);
	flusher_reset(&s->first);
	flusher_reset(&s->second);
	s->second.cookie_base = 100;
	s->first.during_done = busy_signal;
	s->rc = 0;
	s->gave_up = false;
	s->parked_during_signal = false;
	perch_conn_write(s->c, "a", 1);
	if (perch_conn_try_flush_or_park(s->c, &s->first.l) != PERCH_PENDING)
		abort();
}

/* The writer stages and flushes again the moment the guard lets it. */
static void write_and_flush_again(void *p, uint64_t round)
{
	struct flush_state *s = p;
	unsigned spins = 0, total = 0;
	while (perch_conn_write(s->c, "b", 1) == -EBUSY) {
		if (++total > WRITE_SPIN_LIMIT) {
			s->gave_up = true;
			return;
		}
		race_spin_pause(&spins);
	}
	race_window_open();
	s->rc = perch_conn_try_flush_or_park(s->c, &s->second.l);
	race_window_close();
}

static void first_send_completes(void *p, uint64_t round)
{
	struct flush_state *s = p;
	race_window_open();
	fake_send_done(s->c, 0);
	race_window_close();
}

/* Neither refused as armed nor signalled in the other's place; each signalled by its own send. */
static bool judge_flush_vs_completion(struct race *r, void *p, uint64_t round)
{
	struct flush_state *s = p;
	bool ok = true;
	if (s->gave_up || s->rc != PERCH_PENDING) {
		race_fail(r, round, "second flush %s (rc %d)", s->gave_up ? "never got the guard" : "not parked", s->rc);
		ok = false;
	}
	if (s->first.deliveries != 1 || s->first.last_result != 0) {
		race_fail(r, round, "first flush signalled %u times (result %d)", s->first.deliveries, s->first.last_result);
		ok = false;
	}
	/* Its own park's cookie: read before the guard let the second park store its own. */
	if (s->first.deliveries == 1 && s->first.last_cookie != 1) {
		race_fail(r, round, "first flush signalled with cookie %llu, not its own (1)",
			  (unsigned long long)s->first.last_cookie);
		ok = false;
	}
	if (s->second.deliveries != 0) {
		race_fail(r, round, "second flush signalled before its send completed");
		ok = false;
	}
	race_branch(r, s->parked_during_signal ? 0 : 1);
	if (s->t.sent)
		fake_send_done(s->c, 0);
	if (ok && s->second.deliveries != 1) {
		race_fail(r, round, "second flush signalled %u times by its own send", s->second.deliveries);
		ok = false;
	}
	race_conn_end(s->c);
	return ok;
}

static void setup_staged(void *p, uint64_t round)
{
	struct flush_state *s = p;
	s->c = race_conn_new(&s->t);
	flusher_reset(&s->first);
	s->rc = 0;
	perch_conn_write(s->c, "a", 1);
}

static void flush_first(void *p, uint64_t round)
{
	struct flush_state *s = p;
	s->rc = perch_conn_try_flush_or_park(s->c, &s->first.l);
}

static void conn_closes(void *p, uint64_t round)
{
	perch_conn_close(((struct flush_state *)p)->c);
}

/* Exactly one outcome: refused (-EPIPE, never signalled) or parked and signalled once, even after the kernel's completion. */
static bool judge_flush_vs_close(struct race *r, void *p, uint64_t round)
{
	struct flush_state *s = p;
	bool ok;
	race_conn_end(s->c);   /* completes a send the kernel held, as the backend will */
	if (s->rc == -EPIPE) {
		race_branch(r, s->first.parkings ? 1 : 0);
		ok = s->first.deliveries == 0;
	} else if (s->rc == PERCH_PENDING) {
		race_branch(r, s->t.sends ? 3 : 2);
		ok = s->first.deliveries == 1 && s->first.last_result == -EPIPE;
	} else {
		ok = false;
	}
	if (!ok)
		race_fail(r, round, "flush rc %d, signalled %u times (result %d)", s->rc,
			  s->first.deliveries, s->first.last_result);
	return ok;
}

/* ---- a close and the send's completion both complete the parked flush ---- */

static void setup_parked_flush(void *p, uint64_t round)
{
	struct flush_state *s = p;
	setup_staged(p, round);
	if (perch_conn_try_flush_or_park(s->c, &s->first.l) != PERCH_PENDING)
		abort();
}

static void send_completes(void *p, uint64_t round)
{
	fake_send_done(((struct flush_state *)p)->c, 0);
}

/* One signal, from whichever disarmed first. */
static bool judge_close_vs_send_done(struct race *r, void *p, uint64_t round)
{
	struct flush_state *s = p;
	bool ok = s->first.deliveries == 1;
	race_branch(r, s->first.last_result == 0 ? 0 : 1);
	if (!ok)
		race_fail(r, round, "parked flush signalled %u times", s->first.deliveries);
	race_conn_end(s->c);
	return ok;
}

/* ---- the conn's own flush again, against the kernel's completion of the first ---- */

static uint32_t own_first_runs;
static int64_t own_first_result;

static void count_own_first(void *arg, int64_t result)
{
	own_first_result = result;
	perch__faa_u32(&own_first_runs, 1);
}

/* perch_conn_flush parked with a continuation registered on the conn's own task. */
static void setup_own_flush_awaited(void *p, uint64_t round)
{
	struct flush_state *s = p;
	struct perch_vtask_handle h;
	s->c = race_conn_new(&s->t);
	s->rc = 0;
	own_first_runs = 0;
	own_first_result = 1;
	perch_conn_write(s->c, "a", 1);
	if (perch_conn_flush(s->c, &h) != PERCH_PENDING ||
	    perch_vtask_on_complete(h, count_own_first, NULL) != PERCH_PENDING)
		abort();
}

/* Another thread writes and flushes again at once: refused while the first waits or is signalled. */
static void own_write_and_flush_again(void *p, uint64_t round)
{
	struct flush_state *s = p;
	struct perch_vtask_handle second;
	race_window_open();
	s->rc = perch_conn_write(s->c, "b", 1);
	if (s->rc == 0)
		s->rc = perch_conn_flush(s->c, &second);
	race_window_close();
}

/* The first flush's continuation runs once with 0, whatever the second got. */
static bool judge_own_flush_vs_completion(struct race *r, void *p, uint64_t round)
{
	struct flush_state *s = p;
	uint32_t runs = perch__load_u32(&own_first_runs);
	bool ok = runs == 1 && own_first_result == 0 &&
		  (s->rc == -EBUSY || s->rc == PERCH_PENDING);
	race_branch(r, s->rc == PERCH_PENDING ? 1 : 0);
	if (!ok)
		race_fail(r, round, "the first flush's continuation ran %u times (result %lld); the second got %d",
			  runs, (long long)own_first_result, s->rc);
	race_conn_end(s->c);
	return ok;
}

/*
 * A proxy passing an end on as soon as it may: the shutdown is refused
 * while the kernel holds the flush's bytes and retried, so the end always
 * follows them. The fake transport plays the kernel, so the scheduler
 * drives both sides (loop_close's race of the same name waits on a real
 * loop's thread, which no scheduler drives).
 */
static void setup_send_in_flight(void *p, uint64_t round)
{
	struct flush_state *s = p;
	setup_one_parked(p, round);
	s->rc = 1;
	s->refused_in_flight = false;
}

static void shutdown_once_it_may(void *p, uint64_t round)
{
	struct flush_state *s = p;
	unsigned spins = 0, total = 0;
	int rc;
	while ((rc = perch_conn_shutdown(s->c)) == -EBUSY) {
		s->refused_in_flight = true;
		if (++total > WRITE_SPIN_LIMIT) {
			s->gave_up = true;
			break;
		}
		race_spin_pause(&spins);
	}
	s->rc = rc;
}

/* The end was made once, never while the kernel still held the flush, and the flush was signalled once. */
static bool judge_shutdown_vs_send(struct race *r, void *p, uint64_t round)
{
	struct flush_state *s = p;
	bool ok = s->rc == 0 && !s->gave_up && s->t.shutdowns == 1 && s->t.shut_while_sending == 0 &&
		  s->first.deliveries == 1;
	if (!ok)
		race_fail(r, round, "shutdown rc %d%s: %u made, %u while the send was out; flush signalled %u times",
			  s->rc, s->gave_up ? " (gave up)" : "", s->t.shutdowns, s->t.shut_while_sending,
			  s->first.deliveries);
	race_branch(r, s->refused_in_flight ? 1 : 0);
	race_conn_end(s->c);
	return ok;
}

const struct race_def race_shutdown_vs_send_done = {
	.name = "flush_arm: a shutdown retried while the send is out; the end comes last",
	.actors = 2, .exhaustive = true, .create = flush_create, .destroy = flush_destroy,
	.setup = setup_send_in_flight,
	.actor = { shutdown_once_it_may, first_send_completes }, .judge = judge_shutdown_vs_send,
	.branch_names = { "shut once the send had completed", "refused while the send was out, then shut" },
	.window_branch = 2,
};

const struct race_def race_own_flush_vs_completion = {
	.name = "flush_arm: the conn's own flush again races the last completion",
	.actors = 2, .exhaustive = true, .create = flush_create, .destroy = flush_destroy, .setup = setup_own_flush_awaited,
	.actor = { own_write_and_flush_again, first_send_completes }, .judge = judge_own_flush_vs_completion,
	.branch_names = { "the second refused (the first still waited)", "the second parked after the first" },
	.window_branch = 2,
};

const struct race_def race_close_vs_send_done = {
	.name = "flush_arm: close races the send's completion",
	.actors = 2, .exhaustive = true, .create = flush_create, .destroy = flush_destroy, .setup = setup_parked_flush,
	.actor = { conn_closes, send_completes }, .judge = judge_close_vs_send_done,
	.branch_names = { "the send's completion signalled", "the close signalled" },
};

const struct race_def race_flush_vs_completion = {
	.name = "flush_arm: flush races last completion",
	.actors = 2, .exhaustive = true, .create = flush_create, .destroy = flush_destroy, .setup = setup_one_parked,
	.actor = { write_and_flush_again, first_send_completes }, .judge = judge_flush_vs_completion,
	.branch_names = { "second parked while the first was signalled", "second parked after the signal" },
};

/* The ways a flush and a close end (judge_flush_vs_close's branches); the referenced write's race has them too. */
#define FLUSH_VS_CLOSE_BRANCHES                                                                  \
	"refused: closed before the flush", "refused: close taken back after arming",            \
		"parked, close delivered before the send", "parked and sent, close delivered"

const struct race_def race_flush_vs_close = {
	.name = "flush_arm: flush races close",
	.actors = 2, .exhaustive = true, .create = flush_create, .destroy = flush_destroy, .setup = setup_staged,
	.actor = { flush_first, conn_closes }, .judge = judge_flush_vs_close,
	.branch_names = { FLUSH_VS_CLOSE_BRANCHES },
};

/* ---- a referenced write: its release runs once, whichever of the flush and the close wins ---- */

static uint32_t ref_releases;
static const void *ref_released;
static const char ref_bytes[] = "the caller's own bytes";

static void count_ref_release(void *arg, const void *data, size_t len)
{
	perch__faa_u32(&ref_releases, 1);
	ref_released = data;
}

static void setup_staged_ref(void *p, uint64_t round)
{
	struct flush_state *s = p;
	s->c = race_conn_new(&s->t);
	flusher_reset(&s->first);
	s->rc = 0;
	perch__store_u32(&ref_releases, 0);
	ref_released = NULL;
	if (perch_conn_write_ref(s->c, ref_bytes, sizeof(ref_bytes) - 1, count_ref_release, NULL) != 0)
		abort();
}

/* The flush's outcome as for copied bytes; the send read the caller's memory; the release ran once. */
static bool judge_ref_flush_vs_close(struct race *r, void *p, uint64_t round)
{
	struct flush_state *s = p;
	bool sent_in_place = !s->t.sent || s->t.sent->bytes == (const uint8_t *)ref_bytes;
	bool ok = judge_flush_vs_close(r, p, round); /* ends the round's connection */
	uint32_t releases = perch__load_u32(&ref_releases);
	if (ok && (!sent_in_place || releases != 1 || ref_released != ref_bytes)) {
		race_fail(r, round, "flush rc %d: %s, released %u times", s->rc,
			  sent_in_place ? "sent in place" : "sent a copy", releases);
		ok = false;
	}
	return ok;
}

const struct race_def race_ref_flush_vs_close = {
	.name = "flush_arm: a referenced write's flush races close; released once",
	.actors = 2, .exhaustive = true, .create = flush_create, .destroy = flush_destroy, .setup = setup_staged_ref,
	.actor = { flush_first, conn_closes }, .judge = judge_ref_flush_vs_close,
	.branch_names = { FLUSH_VS_CLOSE_BRANCHES },
};
