/* stress/race_conn_tasks.c: a connection's first read and first flush race to make its own value tasks: one block wins, both tasks complete. */
/*
 * Judged by stress/harness.c: the race fails unless the read and the
 * flush overlapped in at least 1,000 of 200,000 rounds (the overlap floor,
 * scaled with PERCH_STRESS_ROUNDS), and its named window (both calls made
 * a block, so one install lost its CAS) ran as often; at 200,000 rounds
 * it had ~61k overlaps and ~44k rounds in the window free, ~133k and
 * ~24k scheduled. Mutant 468 fails it.
 */
#include "config.h"

#include <stdlib.h>

#include "race_conn.h"

/*
 * The program links with -Wl,--wrap=malloc: an actor's call counts the
 * blocks of its connection's tasks it makes (nothing else on the race's
 * path allocates that size), so the judge can tell when both made one.
 */
void *__real_malloc(size_t size);
static __thread bool counting;
static uint32_t tasks_made;

void *__wrap_malloc(size_t size)
{
	if (counting && size == sizeof(struct perch__conn_tasks))
		perch__faa_u32(&tasks_made, 1);
	return __real_malloc(size);
}

struct tasks_state {
	struct fake_transport t;
	struct perch_conn *c;
	struct perch_read_result res;
	struct perch_vtask_handle read, flush;
	int rc_read, rc_flush;
};

static void *tasks_create(void)
{
	return calloc(1, sizeof(struct tasks_state));
}

static void tasks_destroy(void *p)
{
	free(p);
}

/* A fresh connection with a byte staged and nothing received: both calls park. */
static void tasks_setup(void *p, uint64_t round)
{
	struct tasks_state *s = p;
	s->c = race_conn_new(&s->t);
	if (perch_conn_write(s->c, "x", 1) != 0)
		abort();
	s->read = s->flush = (struct perch_vtask_handle){ NULL, 0 };
	s->rc_read = s->rc_flush = 1;
	tasks_made = 0;
}

static void first_read(void *p, uint64_t round)
{
	struct tasks_state *s = p;
	counting = true;
	race_window_open();
	s->rc_read = perch_conn_read(s->c, &s->res, &s->read);
	race_window_close();
	counting = false;
}

static void first_flush(void *p, uint64_t round)
{
	struct tasks_state *s = p;
	counting = true;
	race_window_open();
	s->rc_flush = perch_conn_flush(s->c, &s->flush);
	race_window_close();
	counting = false;
}

/* Both calls hold tasks of the one installed block, and the connection's completions reach both. */
static bool judge_tasks(struct race *r, void *p, uint64_t round)
{
	struct tasks_state *s = p;
	struct perch__conn_tasks *own = s->c->own_tasks;
	uint32_t made = perch__load_u32(&tasks_made);
	bool ok = s->rc_read == PERCH_PENDING && s->rc_flush == PERCH_PENDING && own &&
		  s->read.task == &own->read_task && s->flush.task == &own->flush_task && made >= 1 &&
		  made <= 2;
	if (ok) {
		fake_recv(s->c, "y");
		fake_send_done(s->c, 0);
		ok = perch_vtask_status(s->read) == 0 && perch_vtask_status(s->flush) == 0;
	}
	race_branch(r, made == 2 ? 1 : 0);
	if (!ok)
		race_fail(r, round, "read %d, flush %d, %u blocks made; the handles %s the installed block's",
			  s->rc_read, s->rc_flush, made,
			  own && s->read.task == &own->read_task && s->flush.task == &own->flush_task ? "hold"
												      : "miss");
	race_conn_end(s->c);
	return ok;
}

const struct race_def race_conn_tasks_first_read_vs_first_flush = {
	.name = "conn: the first read and the first flush race to make the own tasks",
	.actors = 2, .create = tasks_create, .destroy = tasks_destroy, .setup = tasks_setup,
	.actor = { first_read, first_flush }, .judge = judge_tasks,
	.branch_names = { "one call made the block, the other found it", "both made one: a CAS chose" },
	.window_branch = 2,
};
