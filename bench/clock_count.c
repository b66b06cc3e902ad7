/* bench/clock_count.c: an LD_PRELOAD shim that counts a process's clock_gettime calls and prints the count at exit (bench/clock_reads.sh). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

static unsigned long reads;

/* Counts, then calls the C library's own (its vDSO path, as the process would without the shim). */
int clock_gettime(clockid_t id, struct timespec *ts)
{
	static int (*real)(clockid_t, struct timespec *);
	if (!real)
		real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	__atomic_fetch_add(&reads, 1, __ATOMIC_RELAXED);
	return real ? real(id, ts) : -1;
}

__attribute__((destructor)) static void report(void)
{
	fprintf(stderr, "clock_count: %lu clock_gettime calls\n", __atomic_load_n(&reads, __ATOMIC_RELAXED));
}
