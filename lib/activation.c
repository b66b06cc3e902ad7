/* lib/activation.c: socket activation: the listening fds a service manager passed, by sd_listen_fds(3)'s protocol (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <perch/sock.h>

/* A decimal number in [0, max] (digits only), or -1. */
static long parse_count(const char *s, long max)
{
	if (!s || *s < '0' || *s > '9')
		return -1;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	return errno || *end || v > max ? -1 : v;
}

void perch_listen_fds_names_free(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}

/*
 * LISTEN_FDNAMES split at ':' into n names (NULL-terminated), or n times
 * "unknown" when it is not set, as sd_listen_fds_with_names(3) does.
 * -EINVAL when the count differs from n; -ENOMEM.
 */
static int split_names(const char *env, int n, char ***out)
{
	char **names = calloc((size_t)n + 1, sizeof(*names));
	if (!names)
		return -ENOMEM;
	int rc = 0;
	const char *p = env;
	for (int i = 0; i < n && rc == 0; i++) {
		if (env && !p) {
			rc = -EINVAL; /* fewer names than fds */
			break;
		}
		if (!env) {
			names[i] = strdup("unknown");
		} else {
			const char *end = strchrnul(p, ':');
			names[i] = strndup(p, (size_t)(end - p));
			p = *end ? end + 1 : NULL;
		}
		if (!names[i])
			rc = -ENOMEM;
	}
	if (rc == 0 && env && p)
		rc = -EINVAL; /* more names than fds */
	if (rc != 0) {
		perch_listen_fds_names_free(names);
		return rc;
	}
	*out = names;
	return 0;
}

static void unset_env(void)
{
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
}

/*
 * The count sd_listen_fds(3) reads: 0 when not meant for this process;
 * -EINVAL when malformed. LISTEN_PID first: what a service manager set
 * for another process (a parent that did not unset it) is not ours to judge.
 */
static int fds_passed(void)
{
	const char *pid_env = getenv("LISTEN_PID"), *fds_env = getenv("LISTEN_FDS");
	if (!pid_env || !fds_env)
		return 0;
	long pid = parse_count(pid_env, INT_MAX);
	if (pid <= 0)
		return -EINVAL;
	if (pid != getpid())
		return 0;
	long n = parse_count(fds_env, INT_MAX - PERCH_LISTEN_FDS_START);
	return n < 0 ? -EINVAL : (int)n;
}

int perch_listen_fds(bool unset_environment, char ***names)
{
	if (names)
		*names = NULL;
	int n = fds_passed();
	/* The fds are ours now: a program this one executes must not inherit them. */
	for (int i = 0; i < n; i++) {
		int fd = PERCH_LISTEN_FDS_START + i, fl = fcntl(fd, F_GETFD);
		if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) != 0) {
			n = -errno;
			break;
		}
	}
	if (n > 0 && names) {
		int rc = split_names(getenv("LISTEN_FDNAMES"), n, names);
		if (rc != 0)
			n = rc;
	}
	if (unset_environment)
		unset_env();
	return n;
}
