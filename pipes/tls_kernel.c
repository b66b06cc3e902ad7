/* pipes/tls_kernel.c: records through the kernel (kTLS): the loop's probe, the offer, OpenSSL's keys handed over, the switch, and control records. */
#include "config.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <perch/sock.h>

#include "invariant.h"
#include "loop_internal.h"
#include "pipe_internal.h"
#include "tls_internal.h"

#ifndef TCP_ULP
#define TCP_ULP 31   /* linux/tcp.h: what glibc's netinet/tcp.h may lack */
#endif
#ifndef SOL_TLS
#define SOL_TLS 282  /* linux/socket.h */
#endif

/* A control record the socket had no room for is tried again after 2 ms, then twice as long, up to 256 ms. */
#define CTRL_RETRY_FIRST_MS 2u
#define CTRL_RETRY_MOST_MS 256u

/* ---- the kernel's calls (a test replaces them) ---- */

static int real_ulp(int fd)
{
	return setsockopt(fd, SOL_TCP, TCP_ULP, "tls", sizeof("tls")) == 0 ? 0 : -errno;
}

static int real_set_tx(int fd, const void *keys, unsigned len)
{
	return setsockopt(fd, SOL_TLS, TLS_TX, keys, len) == 0 ? 0 : -errno;
}

static ssize_t real_send_ctrl(int fd, uint8_t type, const void *buf, size_t len)
{
	char control[CMSG_SPACE(sizeof(type))] = {0};
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			   .msg_controllen = sizeof(control)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_TLS;
	c->cmsg_type = TLS_SET_RECORD_TYPE;
	c->cmsg_len = CMSG_LEN(sizeof(type));
	memcpy(CMSG_DATA(c), &type, sizeof(type));
	ssize_t n = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	return n >= 0 ? n : -errno;
}

static const struct perch__tls_kernel_ops real_ops = {
	.ulp = real_ulp, .set_tx = real_set_tx, .send_ctrl = real_send_ctrl,
};
static const struct perch__tls_kernel_ops *kernel = &real_ops;

void perch__tls_kernel_use(const struct perch__tls_kernel_ops *ops)
{
	kernel = ops ? ops : &real_ops;
}

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
	else if ((*asked = true) && (rc = kernel->ulp(cs)) == 0)
		rc = 1;
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

/* Says why the session's records stay in userspace. */
#define USERSPACE(s, ...) snprintf((s)->path_why, sizeof((s)->path_why), "userspace: " __VA_ARGS__)

void perch__tls_kernel_offer(struct perch_tls *s)
{
	int fd = perch_conn_fd(s->cw->c);
	if (fd < 0) {
		USERSPACE(s, "the ciphertext is not a socket's");
		return;
	}
	bool asked;
	int ktls = loop_has_ktls(s->loop, &asked);
	if (!asked) {
		USERSPACE(s, "the kernel could not be asked (%s)", strerror(-ktls));
		return;
	}
	if (ktls < 0) {
		USERSPACE(s, "the kernel refused TCP_ULP \"tls\" (%s%s)", strerror(-ktls),
			  ktls == -ENOENT ? ": no CONFIG_TLS" : "");
		return;
	}
	int rc = kernel->ulp(fd);
	if (rc != 0) {
		USERSPACE(s, "this socket refused TCP_ULP \"tls\" (%s)", strerror(-rc));
		return;
	}
	/* OpenSSL hands its write keys to the BIO when the cipher changes (perch__tls_kernel_keys). */
	SSL_set_options(s->ssl, SSL_OP_ENABLE_KTLS);
	s->ktls = KTLS_OFFERED;
}

/* The size of the kernel's structure for the keys' cipher, 0 for one it does not take. */
static unsigned keys_len(const struct tls_crypto_info *info)
{
	switch (info->cipher_type) {
	case TLS_CIPHER_AES_GCM_128:
		return sizeof(struct tls12_crypto_info_aes_gcm_128);
	case TLS_CIPHER_AES_GCM_256:
		return sizeof(struct tls12_crypto_info_aes_gcm_256);
	case TLS_CIPHER_AES_CCM_128:
		return sizeof(struct tls12_crypto_info_aes_ccm_128);
	case TLS_CIPHER_CHACHA20_POLY1305:
		return sizeof(struct tls12_crypto_info_chacha20_poly1305);
	default:
		return 0;
	}
}

long perch__tls_kernel_keys(struct perch_tls *s, bool tx, const void *keys)
{
	/* Receiving stays with OpenSSL: the engine decrypts into the plaintext reader's segments. */
	if (!tx || !keys || s->ktls == KTLS_OFF)
		return 0;
	if (s->ktls != KTLS_OFFERED) {
		/* OpenSSL would encrypt under the new keys, and the kernel again under the old. */
		perch__tls_fail(s, -EPROTO, "new write keys (a key update) on a session the kernel encrypts");
		return 0;
	}
	unsigned len = keys_len(keys);
	if (len == 0)
		return 0;   /* OpenSSL keeps encrypting */
	memcpy(&s->ktls_keys, keys, len);
	s->ktls = KTLS_KEYS;
	return 1;
}

/* The records before the keys were handed over have left: the kernel takes the keys. */
static int switch_tx(struct perch_tls *s)
{
	int fd = perch_conn_fd(s->cw->c);
	int rc = fd < 0 ? -EBADF : kernel->set_tx(fd, &s->ktls_keys, keys_len(&s->ktls_keys.info));
	OPENSSL_cleanse(&s->ktls_keys, sizeof(s->ktls_keys));
	if (rc != 0) {
		char why[96];
		snprintf(why, sizeof(why), "the kernel refused the session's keys (TLS_TX: %s)", strerror(-rc));
		perch__tls_fail(s, rc, why);
		return rc;
	}
	s->ktls = KTLS_TX;
	return 0;
}

/* Arms the retry of a control record, each wait twice the last one's: a peer that stopped reading costs little. */
static int retry_later(struct perch_tls *s)
{
	unsigned ms = s->ktls_retry_ms ? 2 * s->ktls_retry_ms : CTRL_RETRY_FIRST_MS;
	s->ktls_retry_ms = ms < CTRL_RETRY_MOST_MS ? ms : CTRL_RETRY_MOST_MS;
	return perch_timer_start(&s->ktls_retry, s->ktls_retry_ms);
}

/* A record of another type than data: a sendmsg of its own, which the kernel makes one record. */
static int send_ctrl(struct perch_tls *s, const char *in, size_t len)
{
	int fd = perch_conn_fd(s->cw->c);
	PERCH_ASSERT(s->ktls_ctrl_sent < len);   /* a retry offers the same record again, whole */
	while (s->ktls_ctrl_sent < len) {
		ssize_t n = fd < 0 ? -EBADF
				   : kernel->send_ctrl(fd, (uint8_t)s->ktls_ctrl_type, in + s->ktls_ctrl_sent,
						       len - s->ktls_ctrl_sent);
		if (n == -EAGAIN || n == -EWOULDBLOCK || n == 0) {
			/* No room in the socket, and no completion to wait for: try again shortly. */
			int rc = perch_timer_is_armed(&s->ktls_retry) ? 0 : retry_later(s);
			return rc != 0 ? rc : -EAGAIN;
		}
		if (n < 0) {
			s->ktls_ctrl_sent = 0;   /* the session fails: no retry of this record */
			return (int)n;
		}
		s->ktls_ctrl_sent += (size_t)n;
	}
	s->ktls_ctrl_type = -1;
	s->ktls_ctrl_sent = 0;
	s->ktls_retry_ms = 0;
	return (int)len;
}

int perch__tls_kernel_write(struct perch_tls *s, const char *in, size_t len)
{
	PERCH_ASSERT(s->ktls >= KTLS_KEYS);
	bool ctrl = s->ktls_ctrl_type >= 0;
	/* The kernel must see every earlier byte written to the socket before the switch or a control record. */
	if ((s->ktls == KTLS_KEYS || ctrl) && perch_pipe_writer_staged(s->cw) > 0)
		return -EAGAIN;
	if (s->ktls == KTLS_KEYS) {
		int rc = switch_tx(s);
		if (rc != 0)
			return rc;
	}
	if (ctrl && s->ktls_ctrl_type == SSL3_RT_HANDSHAKE && (uint8_t)in[0] == SSL3_MT_KEY_UPDATE) {
		/* OpenSSL moves to new write keys after this message and tells no BIO: the kernel's go stale. */
		perch__tls_fail(s, -EPROTO, "the peer asked for a key update, which the kernel's keys cannot follow");
		return -EPROTO;
	}
	return ctrl ? send_ctrl(s, in, len) : 0;
}

void perch__tls_choose_path(struct perch_tls *s)
{
	if (s->ktls >= KTLS_KEYS) {
		s->path = PERCH_TLS_PATH_KERNEL_TX;
		snprintf(s->path_why, sizeof(s->path_why), "kernel: the kernel encrypts (TLS_TX), OpenSSL decrypts");
		return;
	}
	if (s->ktls == KTLS_OFF)
		return;   /* the offer said why */
	/* OpenSSL hands over only keys of a cipher it knows the kernel takes, and only when built with kTLS. */
	const char *cipher = SSL_get_cipher_name(s->ssl);
	USERSPACE(s, "OpenSSL kept the keys of %s (a cipher the kernel does not take, or no kTLS in OpenSSL)",
		  cipher ? cipher : "its cipher");
}
