/* pipes/tls_decrypt.c: the engine's decryption: records read by OpenSSL into the plaintext reader's segments. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "loop_internal.h"
#include "tls_internal.h"

#define RECORD_BYTES 16384u        /* the most plaintext one record carries: one SSL_read */
#define SHRINK_BELOW (RECORD_BYTES / 4)   /* a record shorter than this is copied out of the spare */

/*
 * The segment the next record is decrypted into: a record's room, one
 * per loop thread (engines run on their loop's thread only), so an idle
 * session holds none. A short record is copied out into a segment of its
 * own size and the spare kept; a long one takes the spare with it. The
 * thread's exit frees it.
 */
static __thread struct perch_seg *spare;
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_keyed;

static void spare_key_make(void)
{
	spare_keyed = pthread_key_create(&spare_key, free) == 0;
}

static struct perch_seg *record_seg(void)
{
	if (spare)
		return spare;
	if (pthread_once(&spare_once, spare_key_make) != 0 || !spare_keyed)
		return NULL;
	spare = malloc(sizeof(struct perch_seg) + RECORD_BYTES);
	if (spare && pthread_setspecific(spare_key, spare) != 0) {
		free(spare);
		spare = NULL;
	}
	return spare;
}

static struct perch_seg *seg_of(size_t n)
{
	struct perch_seg *seg = spare;
	if (n >= SHRINK_BELOW) {
		spare = NULL;   /* taken: the key no longer owns it */
		pthread_setspecific(spare_key, NULL);
	} else {
		seg = malloc(sizeof(*seg) + n);
		if (seg)
			memcpy(seg + 1, spare + 1, n);
	}
	if (seg)
		*seg = (struct perch_seg){.data = (uint8_t *)(seg + 1), .len = (uint32_t)n, .buf_id = PERCH__SEG_OWN};
	return seg;
}

/* One segment of decrypted bytes for the plaintext reader; false when none came. */
static bool decrypt_one(struct perch_tls *s)
{
	if (perch__tls_read_would_wait(s))
		return false;   /* OpenSSL's read and its error queue would cost more than the check */
	struct perch_seg *into = record_seg();
	if (!into) {
		perch__tls_fail(s, -ENOMEM, "no memory for decrypted bytes");
		return false;
	}
	size_t n;
	s->want_input = false;
	perch__tls_clear_errors();
	if (SSL_read_ex(s->ssl, (uint8_t *)(into + 1), RECORD_BYTES, &n) != 1) {
		int e = SSL_get_error(s->ssl, 0);
		if (e == SSL_ERROR_ZERO_RETURN) {
			s->peer_closed = true;
			perch__conn_peer_closed(s->plain);
		} else if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
			perch__tls_fail_from_ssl(s, e);
		}
		return false;
	}
	struct perch_seg *seg = seg_of(n);
	if (!seg) {
		perch__tls_fail(s, -ENOMEM, "no memory for decrypted bytes");
		return false;
	}
	perch__faa_u64(&s->unread, n);
	if (perch__conn_recv_arrived(s->plain, seg) != 0) {
		perch__faa_u64(&s->unread, (uint64_t)0 - n);
		free(seg);
		perch__tls_fail(s, -ENOMEM, "no memory to queue decrypted bytes");
		return false;
	}
	return true;
}

/* Whether the plaintext reader has its fill: then a consume at the resume mark kicks. */
static bool reader_full(struct perch_tls *s)
{
	if (perch__load_u64(&s->unread) < s->pause)
		return false;
	perch__xchg_u32(&s->paused, 1);
	perch__fence_rmw_then_load();
	if (perch__load_u64(&s->unread) >= s->pause)
		return true;
	perch__xchg_u32(&s->paused, 0);   /* a consume came meanwhile (its kick may come too: harmless) */
	return false;
}

void perch__tls_decrypt(struct perch_tls *s)
{
	while (s->state == TLS_OPEN && !s->peer_closed && !s->freed && !reader_full(s))
		if (!decrypt_one(s))
			return;
}
