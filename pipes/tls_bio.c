/* pipes/tls_bio.c: the BIO OpenSSL reads ciphertext through, from the received segments, and writes records through, into staging. */
#include "config.h"

#include <limits.h>
#include <openssl/err.h>
#include <perch/segs.h>

#include "invariant.h"
#include "tls_internal.h"

/*
 * Loop thread, inside the engine's OpenSSL calls. A read copies from the
 * ciphertext result the engine holds (its segments, no intermediate
 * buffer) and, once OpenSSL took all of it, advances past it and looks
 * for more without waiting; nothing there is a retry, and the engine
 * parks the read. A write stages the record on the ciphertext writer; a
 * flush still waiting is a retry, and the engine writes again once it
 * completed. Once OpenSSL handed its write keys to the kernel
 * (BIO_CTRL_SET_KTLS), what it writes is plaintext for the kernel to
 * encrypt: tls_kernel.c sends control records itself and says when data
 * may be staged.
 */

/* OpenSSL's kernel TLS controls: numbers its bio.h names only in a comment. */
#define BIO_CTRL_SET_KTLS 72             /* num: the write keys (not 0) or the read keys; ptr: them */
#define BIO_CTRL_SET_KTLS_TX_CTRL_MSG 74 /* num: the record type of the next write */
#define BIO_CTRL_CLEAR_KTLS_TX_CTRL_MSG 75

/* The engine holds the result and parks no read meanwhile: the advance cannot be refused. */
static void cin_advance(struct perch_tls *s, size_t n)
{
	int rc = perch_pipe_advance_to(s->cr, n, n);
	PERCH_ASSERT(rc == 0);
	(void)rc;
}

/* An empty result (a cancel's) is advanced past at once, so that the engine parks the next read. */
static int cin_skip(struct perch_tls *s)
{
	cin_advance(s, 0);
	s->cin_have = false;
	return -EAGAIN;
}

/* Takes the next ciphertext result, if one is there now. 0, -EAGAIN, or an end (eof, error). */
static int next_result(struct perch_tls *s)
{
	if (s->cin_have) {
		cin_advance(s, s->cin.len);
		s->cin_have = false;
	}
	if (s->cin_eof || s->io_error)
		return -EPIPE;
	int rc = perch_pipe_try_read(s->cr, &s->cin);
	if (rc != 0)
		return rc;
	s->cin_have = true;
	s->cin_off = 0;
	if (s->cin.len > 0)
		return 0;
	if (s->cin.error || s->cin.closed)
		s->io_error = s->cin.error ? s->cin.error : -EPIPE;
	else if (s->cin.completed)
		s->cin_eof = true;
	else
		return cin_skip(s);   /* canceled: nothing new */
	return -EPIPE;
}

/*
 * next_result, from inside OpenSSL's read: the advance may complete a
 * flush and run its continuation in there. What that continuation
 * leaves on the thread's error queue is not this read's error.
 */
static int next_result_in_openssl(struct perch_tls *s)
{
	s->in_openssl_read = true;
	int rc;
	if (s->cin_have) {
		ERR_set_mark();   /* 0 on an empty queue, with no mark: the pop then empties it, as wanted */
		rc = next_result(s);
		ERR_pop_to_mark();
	} else {
		rc = next_result(s);   /* no advance, no continuation */
	}
	s->in_openssl_read = false;
	return rc;
}

bool perch__tls_read_would_wait(struct perch_tls *s)
{
	if (s->cin_have && s->cin_off < s->cin.len)
		return false;
	/* Taken now, the result is what OpenSSL's read would take first. */
	int rc = s->cin_parked ? -EAGAIN : next_result(s);
	if (rc != -EAGAIN)
		return false;   /* bytes, or an end that OpenSSL must see */
	if (SSL_has_pending(s->ssl) || SSL_in_init(s->ssl))
		return false;
	s->want_input = true;
	return true;
}

static int bio_read(BIO *b, char *out, int len)
{
	struct perch_tls *s = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	if (!s->cin_have || s->cin_off == s->cin.len) {
		/* A parked read holds the reader: its delivery kicks the engine, which reads again. */
		int rc = s->cin_parked ? -EAGAIN : next_result_in_openssl(s);
		if (rc == -EAGAIN) {
			s->want_input = true;
			BIO_set_retry_read(b);
			return -1;
		}
		if (rc != 0)
			return s->cin_eof ? 0 : -1;
	}
	size_t n = perch_segs_copy(&s->cin, s->cin_off, out, (size_t)len);
	s->cin_off += n;
	return (int)n;
}

static int bio_write(BIO *b, const char *in, int len)
{
	struct perch_tls *s = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	if (s->cout_flushing) {
		BIO_set_retry_write(b);
		return -1;
	}
	int rc = s->ktls >= KTLS_KEYS ? perch__tls_kernel_write(s, in, (size_t)len) : 0;
	if (rc == 0)
		rc = perch_pipe_write(s->cw, in, (size_t)len);
	else if (rc > 0)
		return rc;   /* a control record, sent */
	if (rc == -EBUSY || rc == -EAGAIN) {
		BIO_set_retry_write(b);
		return -1;
	}
	if (rc != 0) {
		s->io_error = s->io_error ? s->io_error : rc;
		return -1;
	}
	return len;
}

/* The controls OpenSSL sends about kernel TLS, on the session `s`. */
static long ktls_ctrl(struct perch_tls *s, int cmd, long num, void *ptr)
{
	switch (cmd) {
	case BIO_CTRL_SET_KTLS:
		return perch__tls_kernel_keys(s, num != 0, ptr);
	case BIO_CTRL_GET_KTLS_SEND:
		return s->ktls >= KTLS_KEYS;
	case BIO_CTRL_SET_KTLS_TX_CTRL_MSG:
		/* Again before each retry of the same record: what the kernel took of it stays counted. */
		s->ktls_ctrl_type = (int)num;
		return 1;
	default: /* BIO_CTRL_CLEAR_KTLS_TX_CTRL_MSG */
		s->ktls_ctrl_type = -1;
		s->ktls_ctrl_sent = 0;
		return 1;
	}
}

/* OpenSSL asks several of these a record: the session is looked up only by those that need it. */
static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1;   /* the engine flushes once OpenSSL is done writing */
	case BIO_CTRL_EOF:
		return ((struct perch_tls *)BIO_get_data(b))->cin_eof;
	case BIO_CTRL_SET_KTLS:
	case BIO_CTRL_GET_KTLS_SEND:
	case BIO_CTRL_SET_KTLS_TX_CTRL_MSG:
	case BIO_CTRL_CLEAR_KTLS_TX_CTRL_MSG:
		return ktls_ctrl(BIO_get_data(b), cmd, num, ptr);
	default:
		return 0;
	}
}

static int bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

static BIO_METHOD *method;
static pthread_once_t method_once = PTHREAD_ONCE_INIT;

static void method_make(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "perch pipes");
	if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read) &&
	    BIO_meth_set_ctrl(m, bio_ctrl) && BIO_meth_set_create(m, bio_create)) {
		method = m;
		return;
	}
	BIO_meth_free(m);
}

BIO *perch__tls_bio_new(struct perch_tls *s)
{
	if (pthread_once(&method_once, method_make) != 0 || !method)
		return NULL;
	BIO *b = BIO_new(method);
	if (b)
		BIO_set_data(b, s);
	return b;
}
