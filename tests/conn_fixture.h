/* tests/conn_fixture.h: the cmocka fixture every conn core test starts from: a connection over the fake transport. */
#ifndef PERCH_TESTS_CONN_FIXTURE_H
#define PERCH_TESTS_CONN_FIXTURE_H

#include "cmocka_prelude.h"
#include "fake_transport.h"

struct fixture {
	struct fake_transport t;
	struct perch_conn *c;
};

static inline int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	f->c = perch__conn_new(&fake_ops, &f->t);
	assert_non_null(f->c);
	*state = f;
	return 0;
}

/*
 * Ends as a backend would: the kernel's last send completes, then the
 * user's reference goes. Nothing may be left: the connection is destroyed
 * and every segment is back with its owner.
 */
static inline int teardown(void **state)
{
	struct fixture *f = *state;
	if (f->t.sent)
		fake_send_done(f->c, -ECANCELED);
	perch_conn_release(f->c);
	assert_int_equal(f->t.destroyed, 1);
	assert_int_equal(f->t.segs_out, 0);
	free(f);
	return 0;
}

static inline struct perch_conn *conn_of(void **state)
{
	return ((struct fixture *)*state)->c;
}

static inline struct fake_transport *transport_of(void **state)
{
	return &((struct fixture *)*state)->t;
}

#endif /* PERCH_TESTS_CONN_FIXTURE_H */
