/* tests/test_tls_kernel.c: records through the kernel (kTLS) after the handshake; exits 77 (skip) on a kernel without TLS, saying why. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <perch.h>
#include <perch/tls.h>

/* 0 when a connected loopback TCP socket takes TCP_ULP "tls", else -errno (ENOENT: no CONFIG_TLS). */
static int kernel_takes_tls(void)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0), cs = socket(AF_INET, SOCK_STREAM, 0), rc = 0;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	if (ls < 0 || cs < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &len) != 0 || connect(cs, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    setsockopt(cs, IPPROTO_TCP, 31 /* TCP_ULP */, "tls", 4) != 0)
		rc = -errno;
	if (cs >= 0)
		close(cs);
	if (ls >= 0)
		close(ls);
	return rc;
}

int main(void)
{
	int rc = kernel_takes_tls();
	if (rc != 0) {
		printf("SKIP: the kernel refuses TCP_ULP \"tls\" (%s%s): the kernel path cannot run here; "
		       "the userspace path and the probe are tested by test_tls\n",
		       strerror(-rc), rc == -ENOENT ? ": built without CONFIG_TLS" : "");
		return 77;
	}
	/*
	 * A kernel with TLS: sessions over sockets with a cipher it takes
	 * must move their records to it. perch does not hand the kernel its
	 * keys yet (doc/tls.md, "Not yet"), so this says so and fails, as it
	 * should until that is built.
	 */
	printf("FAIL: the kernel takes TLS, and perch keeps records in userspace "
	       "(perch_tls_path_reason: \"the kernel has TLS, but perch does not hand it keys yet\")\n");
	return 1;
}
