/* lib/invariant.c: what a failed PERCH_ASSERT does: one line on stderr, then abort. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "invariant.h"

#ifdef PERCH_ASSERTIONS
void perch__assert_failed(const char *cond, const char *file, int line, const char *func)
{
	fprintf(stderr, "perch: invariant broken: %s (%s:%d, %s)\n", cond, file, line, func);
	abort();
}
#endif
