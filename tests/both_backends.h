/* tests/both_backends.h: runs a test table on io_uring, then on epoll, for tests whose loops read the backend from one variable. */
#ifndef PERCH_TESTS_BOTH_BACKENDS_H
#define PERCH_TESTS_BOTH_BACKENDS_H
#include <stdlib.h>

#include <perch.h>

#include "cmocka_prelude.h"

/*
 * cmocka's group runner is a macro sizing `tests` itself, hence a macro
 * (PERCH_TEST_FILTER applies: cmocka_prelude.h); the result is main's exit
 * code.
 */
#define RUN_ON_BOTH_BACKENDS(name, tests, backend_var)                                             \
	__extension__({                                                                            \
		(backend_var) = PERCH_BACKEND_URING;                                               \
		int failed_ = cmocka_run_group_tests_name(name " (io_uring)", tests, NULL, NULL);  \
		(backend_var) = PERCH_BACKEND_EPOLL;                                               \
		failed_ += cmocka_run_group_tests_name(name " (epoll)", tests, NULL, NULL);        \
		failed_ ? 1 : 0;                                                                   \
	})
#endif
