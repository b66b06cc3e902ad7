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
 * The room a record is decrypted into: one spare per loop thread (engines
 * run on their loop's thread only), so an idle session holds none. A read
 * takes the spare for itself: another session decrypted inside that read
 * (an in-memory pipe's continuation, run as OpenSSL consumes ciphertext)
 * takes or makes its own. A short record is then copied out into a
 * segment of its own size and the room put back; a long one takes the
 * room with it. The thread's exit frees the spare the key names.
 */
static __thread struct perch_seg *spare;
static __thread struct perch_seg *keyed;   /* what the key names */
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_keyed;

static void spare_key_make(void)
{
	spare_keyed = pthread_key_create(&spare_key, free) == 0;
}

static struct perch_seg *take_room(void)
{
	struct perch_seg *room = spare;
	spare = NULL;
	if (room)
		return room;
	if (pthread_once(&spare_once, spare_key_make) != 0 || !spare_keyed)
		return NULL;
	return malloc(sizeof(struct perch_seg) + RECORD_BYTES);
}

/* The key names the spare, not a room handed out. Only a first non-NULL value can fail (no memory). */
static void key_the_spare(void)
{
	if (keyed == spare)
		return;
	if (pthread_setspecific(spare_key, spare) == 0) {
		keyed = spare;
		return;
	}
	free(spare);   /* unkeyed, the thread's exit would leak it */
	spare = NULL;
}

static void put_room(struct perch_seg *room)
{
	if (spare)
		free(room);   /* a session decrypted inside the read made its own: one is kept */
	else
		spare = room;
	key_the_spare();
}

/* The segment of a record of n bytes read into `room`: the room itself, or a copy for a short record. */
static struct perch_seg *seg_of(struct perch_seg *room, size_t n)
{
	struct perch_seg *seg = room;
	if (n >= SHRINK_BELOW) {
		key_the_spare();
	} else {
		seg = malloc(sizeof(*seg) + n);
		if (seg)
			memcpy(seg + 1, room + 1, n);
		put_room(room);
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
	struct perch_seg *into = take_room();
	if (!into) {
		perch__tls_fail(s, -ENOMEM, "no memory for decrypted bytes");
		return false;
	}
	size_t n;
	s->want_input = false;
	perch__tls_clear_errors();
	if (SSL_read_ex(s->ssl, (uint8_t *)(into + 1), RECORD_BYTES, &n) != 1) {
		int e = SSL_get_error(s->ssl, 0);
		put_room(into);   /* before a continuation the error runs: it may decrypt another session */
		if (e == SSL_ERROR_ZERO_RETURN) {
			s->peer_closed = true;
			perch__conn_peer_closed(s->plain);
		} else if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
			perch__tls_fail_from_ssl(s, e);
		}
		return false;
	}
	struct perch_seg *seg = seg_of(into, n);
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
