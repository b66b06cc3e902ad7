/* tests/malloc_fails.h: fault injection for a test linked with -Wl,--wrap=malloc: the n-th malloc from now fails. */
#ifndef PERCH_TESTS_MALLOC_FAILS_H
#define PERCH_TESTS_MALLOC_FAILS_H

#include <stddef.h>

/*
 * Every malloc of the test and of the static library comes here. Armed
 * with n (malloc_fails_in = n), the n-th call from now fails; it reads 0
 * once it has.
 */
void *__real_malloc(size_t size);
static int malloc_fails_in;

void *__wrap_malloc(size_t size)
{
	if (malloc_fails_in > 0 && --malloc_fails_in == 0)
		return NULL;
	return __real_malloc(size);
}

#endif /* PERCH_TESTS_MALLOC_FAILS_H */
