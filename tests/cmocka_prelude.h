/* tests/cmocka_prelude.h: the headers cmocka needs before it, in the order it needs them, and the test filter every program takes. */
#ifndef PERCH_TESTS_CMOCKA_PRELUDE_H
#define PERCH_TESTS_CMOCKA_PRELUDE_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

/*
 * PERCH_TEST_FILTER=GLOB runs only the tests whose names match, in any
 * program (the mutant gate runs a mutant's named test first). Set before
 * main, for every group the program runs.
 */
__attribute__((constructor)) static void perch_test_filter_from_env(void)
{
	const char *only = getenv("PERCH_TEST_FILTER");
	if (only && *only)
		cmocka_set_test_filter(only);
}
#endif
