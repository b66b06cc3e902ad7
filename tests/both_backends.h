/* tests/both_backends.h: runs a test table on io_uring, then on epoll, for tests whose loops read the backend from one variable. */
#ifndef PERCH_TESTS_BOTH_BACKENDS_H
#define PERCH_TESTS_BOTH_BACKENDS_H
#include <stdlib.h>

#include <perch.h>

#include "cmocka_prelude.h"

/* PERCH_TEST_FAILFAST=1: a table that failed on io_uring is not run again on epoll. */
static inline int perch_test_failfast(void)
{
	const char *s = getenv("PERCH_TEST_FAILFAST");
	return s && s[0] == '1' && s[1] == '\0';
}

/*
 * cmocka's group runner is a macro sizing `tests` itself, hence a macro
 * (PERCH_TEST_FILTER applies: cmocka_prelude.h); the result is main's exit
 * code. The mutant gate sets PERCH_TEST_FAILFAST=1 where one failure is
 * its verdict, so that a test that catches a mutant by waiting out its
 * bound waits once, not once a backend.
 */
#define RUN_ON_BOTH_BACKENDS(name, tests, backend_var)                                             \
	__extension__({                                                                            \
		(backend_var) = PERCH_BACKEND_URING;                                               \
		int failed_ = cmocka_run_group_tests_name(name " (io_uring)", tests, NULL, NULL);  \
		(backend_var) = PERCH_BACKEND_EPOLL;                                               \
		if (!failed_ || !perch_test_failfast())                                            \
			failed_ += cmocka_run_group_tests_name(name " (epoll)", tests, NULL, NULL); \
		failed_ ? 1 : 0;                                                                   \
	})
#endif
