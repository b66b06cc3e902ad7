/* tests/pipe_fixture.h: a connection over the fake transport with a pipe reader and writer on it. */
#ifndef PERCH_TESTS_PIPE_FIXTURE_H
#define PERCH_TESTS_PIPE_FIXTURE_H

#include <perch.h>

#include "conn_fixture.h"
#include "pipe_internal.h"
#include "vtask_internal.h"

struct pipe_fixture {
	struct fixture base;            /* first: conn_fixture's teardown frees it */
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
};

static inline int pipe_setup(void **state)
{
	struct pipe_fixture *f = calloc(1, sizeof(*f));
	f->base.c = perch__conn_new(&fake_ops, &f->base.t);
	assert_non_null(f->base.c);
	assert_int_equal(perch_pipe_reader_new(f->base.c, &f->r), 0);
	assert_int_equal(perch_pipe_writer_new(f->base.c, &f->w), 0);
	*state = f;
	return 0;
}

/* The adapters go first (their references), then conn_fixture's checks: destroyed, every segment back. */
static inline int pipe_teardown(void **state)
{
	struct pipe_fixture *f = *state;
	/* A flush the kernel still holds signals the writer: it completes before the writer goes. */
	if (f->base.t.sent)
		fake_send_done(f->base.c, -ECANCELED);
	perch_pipe_reader_free(f->r);
	perch_pipe_writer_free(f->w);
	return teardown(state);
}

static inline struct perch_pipe_reader *reader_of(void **state)
{
	return ((struct pipe_fixture *)*state)->r;
}

static inline struct perch_pipe_writer *writer_of(void **state)
{
	return ((struct pipe_fixture *)*state)->w;
}

#define PIPE_TEST(fn) cmocka_unit_test_setup_teardown(fn, pipe_setup, pipe_teardown)

/* A continuation that counts its runs and keeps the result. */
struct cont_probe {
	uint32_t runs;
	int64_t result;
};

static inline void cont_probe_fn(void *arg, int64_t result)
{
	struct cont_probe *p = arg;
	p->runs++;
	p->result = result;
}

#endif /* PERCH_TESTS_PIPE_FIXTURE_H */
