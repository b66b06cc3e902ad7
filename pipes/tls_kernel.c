/* pipes/tls_kernel.c: whether records could move to the kernel (kTLS): the loop's probe, and each session's verdict. */
#include "config.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <perch/sock.h>

#include "loop_internal.h"
#include "pipe_internal.h"
#include "tls_internal.h"

#ifndef TCP_ULP
#define TCP_ULP 31   /* linux/tcp.h: what glibc's netinet/tcp.h may lack */
#endif

/*
 * Whether the kernel takes the "tls" upper-layer protocol on a connected
 * TCP socket: a loopback pair made for the question. 1, or the negative
 * errno setsockopt gave (ENOENT: a kernel without CONFIG_TLS); *asked is
 * false when the pair could not be made (out of fds, no loopback): no
 * answer, to ask again next time.
 */
static int probe_ulp(bool *asked)
{
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), cs = -1, as = -1, rc = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	*asked = false;
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &len) != 0 ||
	    (cs = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    connect(cs, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    (as = accept4(ls, NULL, NULL, SOCK_CLOEXEC)) < 0)
		rc = -errno;
	else if ((*asked = true) && setsockopt(cs, SOL_TCP, TCP_ULP, "tls", sizeof("tls")) != 0)
		rc = -errno;
	if (as >= 0)
		close(as);
	if (cs >= 0)
		close(cs);
	if (ls >= 0)
		close(ls);
	return rc;
}

/* Once a loop (its thread): 1, or why not (a negative errno); *asked as probe_ulp's. */
static int loop_has_ktls(struct perch_loop *loop, bool *asked)
{
	*asked = true;
	if (loop->tls_kernel != 0)
		return loop->tls_kernel;
	int rc = probe_ulp(asked);
	if (*asked)
		loop->tls_kernel = rc;
	return rc;
}

/* A cipher the kernel's TLS takes (linux/tls.h): AES-GCM 128/256, ChaCha20-Poly1305. */
static bool kernel_cipher(const char *name)
{
	static const char *const taken[] = {
		"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
		"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
		"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384",
		"ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
	};
	for (size_t i = 0; name && i < sizeof(taken) / sizeof(taken[0]); i++)
		if (strcmp(name, taken[i]) == 0)
			return true;
	return false;
}

void perch__tls_choose_path(struct perch_tls *s)
{
	s->path = PERCH_TLS_PATH_USERSPACE;
	int fd = perch_conn_fd(s->cw->c);
	if (fd < 0) {
		snprintf(s->path_why, sizeof(s->path_why), "userspace: the ciphertext is not a socket's");
		return;
	}
	bool asked;
	int ktls = loop_has_ktls(s->loop, &asked);
	if (!asked) {
		snprintf(s->path_why, sizeof(s->path_why), "userspace: the kernel could not be asked (%s)",
			 strerror(-ktls));
		return;
	}
	if (ktls < 0) {
		snprintf(s->path_why, sizeof(s->path_why),
			 "userspace: the kernel refused TCP_ULP \"tls\" (%s%s)", strerror(-ktls),
			 ktls == -ENOENT ? ": no CONFIG_TLS" : "");
		return;
	}
	const char *cipher = SSL_get_cipher_name(s->ssl);
	if (!kernel_cipher(cipher)) {
		snprintf(s->path_why, sizeof(s->path_why), "userspace: the kernel does not take %s",
			 cipher ? cipher : "this cipher");
		return;
	}
	snprintf(s->path_why, sizeof(s->path_why),
		 "userspace: the kernel has TLS, but perch does not hand it keys yet");
}
