/* tests/tls_test_certs.h: a throwaway CA and certificates (tests/tls_certs.sh) for the tests that speak TLS. */
#ifndef PERCH_TESTS_TLS_TEST_CERTS_H
#define PERCH_TESTS_TLS_TEST_CERTS_H

#include <stdio.h>
#include <stdlib.h>

static char certs[64];   /* their directory, made by make_certs */

/* The path of certificate file `name` (ca.pem, server.key, ...); the last 8 stay valid. */
static const char *cert(const char *name)
{
	static char paths[8][128];
	static int next;
	char *p = paths[next++ % 8];
	snprintf(p, 128, "%s/%s", certs, name);
	return p;
}

/* Makes them in a new directory under /tmp; exits when the script fails. */
static void make_certs(void)
{
	snprintf(certs, sizeof(certs), "/tmp/perch-tls-XXXXXX");
	if (!mkdtemp(certs))
		abort();
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "sh %s %s", TLS_CERTS_SCRIPT, certs);
	if (system(cmd) != 0) {
		fprintf(stderr, "%s failed\n", cmd);
		exit(1);
	}
}

static void remove_certs(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", certs);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", certs);
}

#endif /* PERCH_TESTS_TLS_TEST_CERTS_H */
