/* pipes/tls_absent.c: perch/tls.h's calls in a perch built without OpenSSL: each says so. */
#include "config.h"

#include <stdio.h>

#include <perch/tls.h>

int perch_tls_ctx_new(const struct perch_tls_ctx_opts *opts, struct perch_tls_ctx **out, char *why,
		      size_t why_len)
{
	if (why && why_len)
		snprintf(why, why_len, "perch was built without TLS (configure found no OpenSSL 3)");
	return -EOPNOTSUPP;
}

void perch_tls_ctx_free(struct perch_tls_ctx *ctx)
{
}

int perch_tls_new(struct perch_tls_ctx *ctx, struct perch_loop *loop,
		  struct perch_pipe_reader *cipher_r, struct perch_pipe_writer *cipher_w,
		  const struct perch_tls_opts *opts, struct perch_tls **out)
{
	perch_pipe_reader_free(cipher_r);
	perch_pipe_writer_free(cipher_w);
	return -EOPNOTSUPP;
}

struct perch_pipe_reader *perch_tls_reader(struct perch_tls *t)
{
	return NULL;
}

struct perch_pipe_writer *perch_tls_writer(struct perch_tls *t)
{
	return NULL;
}

void perch_tls_free(struct perch_tls *t)
{
}

/* No session exists without OpenSSL: there is nothing to end. */
void perch_tls_end(struct perch_tls *t, void (*after)(void *arg), void *arg)
{
}

const char *perch_tls_alpn(const struct perch_tls *t)
{
	return NULL;
}

const char *perch_tls_version(const struct perch_tls *t)
{
	return NULL;
}

const char *perch_tls_cipher(const struct perch_tls *t)
{
	return NULL;
}

bool perch_tls_resumed(const struct perch_tls *t)
{
	return false;
}

bool perch_tls_established(const struct perch_tls *t)
{
	return false;
}

int perch_tls_path(const struct perch_tls *t)
{
	return PERCH_TLS_PATH_USERSPACE;
}

const char *perch_tls_path_reason(const struct perch_tls *t)
{
	return NULL;
}

int perch_tls_error(const struct perch_tls *t, char *buf, size_t len)
{
	return -EOPNOTSUPP;
}
