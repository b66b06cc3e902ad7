/* pipes/tls_ctx.c: TLS contexts: certificates, verification, ALPN, SNI and the client's session cache. */
#include "config.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "atomic.h"
#include "server_internal.h"
#include "tls_internal.h"

#define ALPN_MAX 255u

/* Writes "what: OpenSSL's reason" into why (the queue is emptied); returns err, -ENOMEM where OpenSSL ran out. */
static int say(char *why, size_t len, int err, const char *fmt, ...)
{
	char what[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	/* The first error says why ("no start line"); the last is the caller's ("PEM lib"). */
	unsigned long e = ERR_peek_error();
	char reason[120] = "";
	if (e)
		ERR_error_string_n(e, reason, sizeof(reason));
	for (unsigned long q; (q = ERR_get_error()) != 0;)
		if (ERR_GET_REASON(q) == ERR_R_MALLOC_FAILURE)
			err = -ENOMEM;   /* a certificate that did not load for want of memory is no bad input */
	if (why && len)
		snprintf(why, len, "%s%s%s", what, e ? ": " : "", reason);
	return err;
}

void perch__tls_ctx_ref(struct perch_tls_ctx *ctx)
{
	perch__faa_u32(&ctx->refs, 1);
}

static int ctx_role(const struct perch_tls_ctx *ctx)
{
	return ctx->role;
}

static const struct perch__tls_hooks hooks = {
	.ctx_role = ctx_role,
	.ctx_ref = perch__tls_ctx_ref,
	.ctx_free = perch_tls_ctx_free,
	.session_new = perch_tls_new,
	.reader = perch_tls_reader,
	.writer = perch_tls_writer,
	.free = perch_tls_free,
	.end = perch_tls_end,
};

void perch_tls_ctx_free(struct perch_tls_ctx *ctx)
{
	if (!ctx || perch__faa_u32(&ctx->refs, (uint32_t)-1) != 1)
		return;
	ERR_set_mark();   /* SSL_CTX_free allocates, and may queue its failure on the caller's thread */
	SSL_CTX_free(ctx->ssl);
	ERR_pop_to_mark();
	SSL_SESSION_free(ctx->cached);
	free(ctx->cached_name);
	pthread_mutex_destroy(&ctx->cache_lock);
	free(ctx->alpn);
	free(ctx);
}

/* "h2,http/1.1" in wire form: each name after its length byte. */
static int alpn_wire(struct perch_tls_ctx *ctx, const char *list, char *why, size_t why_len)
{
	size_t n = strlen(list);
	ctx->alpn = malloc(n + 1);
	if (!ctx->alpn)
		return -ENOMEM;
	unsigned out = 0;
	for (const char *p = list;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == 0 || len > ALPN_MAX)
			return say(why, why_len, -EINVAL, "alpn: a protocol name of %zu bytes (1 to 255)", len);
		ctx->alpn[out++] = (unsigned char)len;
		memcpy(ctx->alpn + out, p, len);
		out += (unsigned)len;
		if (!end)
			break;
		p = end + 1;
	}
	ctx->alpn_len = out;
	return 0;
}

/* A server picks the first of its own protocols the client offers; none shared: no ALPN. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
		       const unsigned char *in, unsigned inlen, void *arg)
{
	struct perch_tls_ctx *ctx = arg;
	unsigned char *sel;
	if (SSL_select_next_proto(&sel, outlen, ctx->alpn, ctx->alpn_len, in, inlen) !=
	    OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_NOACK;
	*out = sel;
	return SSL_TLSEXT_ERR_OK;
}

/* The server's SNI: the chooser may move the session to another context. */
static int sni_select(SSL *ssl, int *alert, void *arg)
{
	struct perch_tls_ctx *ctx = arg;
	struct perch_tls *s = SSL_get_app_data(ssl);
	const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
	if (!name || !ctx->sni || !s)
		return SSL_TLSEXT_ERR_NOACK;
	struct perch_tls_ctx *use = NULL;
	int rc = ctx->sni(ctx->sni_arg, name, &use);
	if (rc == -ENOENT)
		return SSL_TLSEXT_ERR_NOACK;
	if (rc != 0 || !use || use->role != PERCH_TLS_SERVER) {
		*alert = SSL_AD_UNRECOGNIZED_NAME;
		return SSL_TLSEXT_ERR_ALERT_FATAL;
	}
	if (use != ctx && !s->sni_ctx) {
		if (!SSL_set_SSL_CTX(ssl, use->ssl)) {
			*alert = SSL_AD_INTERNAL_ERROR;   /* out of memory: not the context that was chosen */
			return SSL_TLSEXT_ERR_ALERT_FATAL;
		}
		perch__tls_ctx_ref(use);
		s->sni_ctx = use;
	}
	return SSL_TLSEXT_ERR_OK;
}

/* A client keeps its newest session (per context, with the name it was for) to resume with. */
static int session_new(SSL *ssl, SSL_SESSION *sess)
{
	struct perch_tls_ctx *ctx = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
	char *copy = name ? strdup(name) : NULL;
	if (!ctx || (name && !copy)) {
		free(copy);
		return 0;
	}
	pthread_mutex_lock(&ctx->cache_lock);
	SSL_SESSION *old = ctx->cached;
	char *old_name = ctx->cached_name;
	ctx->cached = sess;
	ctx->cached_name = copy;
	pthread_mutex_unlock(&ctx->cache_lock);
	SSL_SESSION_free(old);
	free(old_name);
	return 1;   /* the cache keeps the reference OpenSSL gave */
}

SSL_SESSION *perch__tls_ctx_cached(struct perch_tls_ctx *ctx, const char *name)
{
	SSL_SESSION *sess = NULL;
	pthread_mutex_lock(&ctx->cache_lock);
	bool same = name && ctx->cached_name ? strcmp(name, ctx->cached_name) == 0
					     : !name && !ctx->cached_name;
	if (ctx->cached && same && SSL_SESSION_is_resumable(ctx->cached) &&
	    SSL_SESSION_up_ref(ctx->cached))
		sess = ctx->cached;
	pthread_mutex_unlock(&ctx->cache_lock);
	return sess;
}

static int file_there(const char *what, const char *path, char *why, size_t why_len)
{
	struct stat st;
	if (stat(path, &st) == 0)
		return 0;
	int err = errno;
	return say(why, why_len, -err, "%s %s: %s", what, path, err == ENOENT ? "not there" : strerror(err));
}

/* Whether the PEM reads that just ended found the input's end ("no start line"), not a broken block. */
static bool pem_ended_cleanly(void)
{
	unsigned long e = ERR_peek_last_error();
	return ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
}

static int load_pem_chain(SSL_CTX *ssl, const char *pem, char *why, size_t why_len)
{
	BIO *b = BIO_new_mem_buf(pem, -1);
	X509 *leaf = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
	int ok = leaf && SSL_CTX_use_certificate(ssl, leaf) == 1;
	X509_free(leaf);
	X509 *ca;
	while (ok && (ca = PEM_read_bio_X509(b, NULL, NULL, NULL)))
		if (SSL_CTX_add0_chain_cert(ssl, ca) != 1) {
			X509_free(ca);
			ok = 0;
		}
	BIO_free(b);
	if (!ok)
		return say(why, why_len, -EINVAL, "cert_pem: no certificate loaded");
	if (!pem_ended_cleanly())
		return say(why, why_len, -EINVAL, "cert_pem: a certificate after the first does not parse");
	ERR_clear_error();
	return 0;
}

static int load_pem_key(SSL_CTX *ssl, const char *pem, char *why, size_t why_len)
{
	BIO *b = BIO_new_mem_buf(pem, -1);
	EVP_PKEY *key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
	int ok = key && SSL_CTX_use_PrivateKey(ssl, key) == 1;
	EVP_PKEY_free(key);
	BIO_free(b);
	return ok ? 0 : say(why, why_len, -EINVAL, "key_pem: no key loaded");
}

static int load_identity(struct perch_tls_ctx *ctx, const struct perch_tls_ctx_opts *o, char *why,
			 size_t why_len)
{
	int rc = 0;
	if (o->cert_file && !(rc = file_there("cert_file", o->cert_file, why, why_len)) &&
	    SSL_CTX_use_certificate_chain_file(ctx->ssl, o->cert_file) != 1)
		rc = say(why, why_len, -EINVAL, "cert_file %s", o->cert_file);
	if (!rc && !o->cert_file && o->cert_pem)
		rc = load_pem_chain(ctx->ssl, o->cert_pem, why, why_len);
	if (!rc && o->key_file && !(rc = file_there("key_file", o->key_file, why, why_len)) &&
	    SSL_CTX_use_PrivateKey_file(ctx->ssl, o->key_file, SSL_FILETYPE_PEM) != 1)
		rc = say(why, why_len, -EINVAL, "key_file %s", o->key_file);
	if (!rc && !o->key_file && o->key_pem)
		rc = load_pem_key(ctx->ssl, o->key_pem, why, why_len);
	bool has_cert = o->cert_file || o->cert_pem, has_key = o->key_file || o->key_pem;
	if (!rc && has_cert != has_key)
		rc = say(why, why_len, -EINVAL, "a certificate needs its key, and a key its certificate");
	if (!rc && has_cert && SSL_CTX_check_private_key(ctx->ssl) != 1)
		rc = say(why, why_len, -EINVAL, "the key does not match the certificate");
	if (!rc && !has_cert && ctx->role == PERCH_TLS_SERVER)
		rc = say(why, why_len, -EINVAL, "a server needs cert_file and key_file (or cert_pem and key_pem)");
	return rc;
}

static int load_trust(struct perch_tls_ctx *ctx, const struct perch_tls_ctx_opts *o, char *why,
		      size_t why_len)
{
	int rc = 0;
	if (o->ca_file && (rc = file_there("ca_file", o->ca_file, why, why_len)))
		return rc;
	if (o->ca_dir && (rc = file_there("ca_dir", o->ca_dir, why, why_len)))
		return rc;
	if ((o->ca_file || o->ca_dir) &&
	    SSL_CTX_load_verify_locations(ctx->ssl, o->ca_file, o->ca_dir) != 1)
		return say(why, why_len, -EINVAL, "ca_file/ca_dir: no CA loaded");
	if (!o->ca_file && !o->ca_dir && ctx->role == PERCH_TLS_CLIENT &&
	    SSL_CTX_set_default_verify_paths(ctx->ssl) != 1)
		return say(why, why_len, -EINVAL, "the system's CAs did not load");
	int verify = o->verify;
	if (verify == PERCH_TLS_VERIFY_DEFAULT)
		verify = ctx->role == PERCH_TLS_CLIENT ? PERCH_TLS_VERIFY_PEER : PERCH_TLS_VERIFY_NONE;
	int mode = verify == PERCH_TLS_VERIFY_NONE ? SSL_VERIFY_NONE : SSL_VERIFY_PEER;
	if (verify == PERCH_TLS_VERIFY_REQUIRE && ctx->role == PERCH_TLS_SERVER)
		mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
	SSL_CTX_set_verify(ctx->ssl, mode, NULL);
	return 0;
}

static int configure_ctx(struct perch_tls_ctx *ctx, const struct perch_tls_ctx_opts *o, char *why,
			 size_t why_len)
{
	SSL_CTX *ssl = ctx->ssl;
	/* The new-session callback finds the context by its app data. */
	if (SSL_CTX_set_app_data(ssl, ctx) != 1 || SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION) != 1)
		return say(why, why_len, -ENOMEM, "SSL_CTX set-up");
	SSL_CTX_set_options(ssl, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
					 SSL_OP_CIPHER_SERVER_PREFERENCE);
	SSL_CTX_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
				      SSL_MODE_RELEASE_BUFFERS);
	int rc = load_identity(ctx, o, why, why_len);
	if (!rc)
		rc = load_trust(ctx, o, why, why_len);
	if (!rc && o->alpn)
		rc = alpn_wire(ctx, o->alpn, why, why_len);
	if (rc)
		return rc;
	if (ctx->role == PERCH_TLS_SERVER) {
		static const unsigned char sid_ctx[] = "perch";
		SSL_CTX_set_session_id_context(ssl, sid_ctx, sizeof(sid_ctx) - 1);
		if (o->alpn)
			SSL_CTX_set_alpn_select_cb(ssl, alpn_select, ctx);
		ctx->sni = o->sni;
		ctx->sni_arg = o->sni_arg;
		SSL_CTX_set_tlsext_servername_callback(ssl, sni_select);
		SSL_CTX_set_tlsext_servername_arg(ssl, ctx);
	} else {
		if (o->alpn && SSL_CTX_set_alpn_protos(ssl, ctx->alpn, ctx->alpn_len) != 0)
			return say(why, why_len, -ENOMEM, "alpn");
		SSL_CTX_set_session_cache_mode(ssl, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
		SSL_CTX_sess_set_new_cb(ssl, session_new);
	}
	if (o->no_tickets) {
		SSL_CTX_set_options(ssl, SSL_OP_NO_TICKET);
		SSL_CTX_set_num_tickets(ssl, 0);
		SSL_CTX_set_session_cache_mode(ssl, SSL_SESS_CACHE_OFF);
	}
	return 0;
}

/*
 * A call that said it succeeded but queued an error: out of memory, an
 * OpenSSL 3.0 chain loader stops at a CA it could not allocate and still
 * reports the leaf loaded. The context would be short of what was asked.
 */
static int quiet_failure(char *why, size_t why_len)
{
	return say(why, why_len, -EINVAL, "OpenSSL failed while the context was made");
}

int perch_tls_ctx_new(const struct perch_tls_ctx_opts *o, struct perch_tls_ctx **out, char *why,
		      size_t why_len)
{
	if (why && why_len)
		why[0] = '\0';
	if (!o || !out)
		return say(why, why_len, -EINVAL, "NULL options or out");
	if (o->role != PERCH_TLS_SERVER && o->role != PERCH_TLS_CLIENT)
		return say(why, why_len, -EINVAL, "role %d: PERCH_TLS_SERVER or PERCH_TLS_CLIENT", o->role);
	if (o->verify < PERCH_TLS_VERIFY_DEFAULT || o->verify > PERCH_TLS_VERIFY_REQUIRE)
		return say(why, why_len, -EINVAL, "verify %d: one of PERCH_TLS_VERIFY_*", o->verify);
	struct perch_tls_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	perch__tls_hooks_set(&hooks);   /* the server scaffold reaches the layer through it */
	ctx->refs = 1;
	ctx->role = o->role;
	/* Default attributes: glibc does not fail this, but a libc may (ENOMEM). */
	if (pthread_mutex_init(&ctx->cache_lock, NULL) != 0) {
		free(ctx);
		return say(why, why_len, -ENOMEM, "pthread_mutex_init");
	}
	ERR_clear_error();   /* so that what is queued below is this call's */
	ctx->ssl = SSL_CTX_new(o->role == PERCH_TLS_SERVER ? TLS_server_method() : TLS_client_method());
	int rc = ctx->ssl ? configure_ctx(ctx, o, why, why_len) : say(why, why_len, -ENOMEM, "SSL_CTX_new");
	if (rc == 0 && ERR_peek_error() != 0)
		rc = quiet_failure(why, why_len);
	if (rc) {
		perch_tls_ctx_free(ctx);
		return rc;
	}
	*out = ctx;
	return 0;
}
