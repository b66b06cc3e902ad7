/* tests/fake_transport.h: a transport that records what the conn core hands it, so tests play the reactor. */
#ifndef PERCH_TESTS_FAKE_TRANSPORT_H
#define PERCH_TESTS_FAKE_TRANSPORT_H

#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "conn_internal.h"

/* Counters are bumped atomically: the race suite shares this transport across threads. */
struct fake_transport {
	struct perch__txbuf *sent;     /* the chain of the last send, until send_done */
	uint32_t sends;
	uint32_t closes;
	uint32_t aborts;
	uint32_t shutdowns;
	uint32_t shut_while_sending;   /* shutdowns made while a send was still the kernel's */
	uint32_t segs_out;             /* segments handed to the conn and not yet returned */
	uint32_t destroyed;
};

static inline void fake_send(struct perch_conn *c, struct perch__txbuf *chain)
{
	struct fake_transport *t = c->transport;
	t->sent = chain;
	perch__faa_u32(&t->sends, 1);
}

static inline void fake_release_seg(struct perch_seg *seg)
{
	struct fake_transport *t = seg->owner;
	perch__faa_u32(&t->segs_out, (uint32_t)-1);
	free(seg);
}

static inline void fake_close(struct perch_conn *c)
{
	struct fake_transport *t = c->transport;
	perch__faa_u32(&t->closes, 1);
}

static inline void fake_abort(struct perch_conn *c)
{
	struct fake_transport *t = c->transport;
	perch__faa_u32(&t->aborts, 1);
}

static inline void fake_shutdown(struct perch_conn *c)
{
	struct fake_transport *t = c->transport;
	if (t->sent)
		perch__faa_u32(&t->shut_while_sending, 1);
	perch__faa_u32(&t->shutdowns, 1);
}

static inline void fake_destroy(struct perch_conn *c)
{
	struct fake_transport *t = c->transport;
	perch__faa_u32(&t->destroyed, 1);
}

static const struct perch__transport_ops fake_ops = {
	.send = fake_send,
	.release_seg = fake_release_seg,
	.close = fake_close,
	.abort = fake_abort,
	.shutdown = fake_shutdown,
	.destroy = fake_destroy,
};

/* Queues a copy of `s` as one received segment, as a backend would. */
static inline void fake_recv(struct perch_conn *c, const char *s)
{
	struct fake_transport *t = c->transport;
	size_t n = strlen(s);
	struct perch_seg *seg = calloc(1, sizeof(*seg) + n);
	seg->data = (uint8_t *)(seg + 1);
	memcpy(seg->data, s, n);
	seg->len = (uint32_t)n;
	seg->owner = t;
	perch__faa_u32(&t->segs_out, 1);
	perch__conn_recv_arrived(c, seg);
}

/* Completes the outstanding send as the kernel would. */
static inline void fake_send_done(struct perch_conn *c, int result)
{
	struct fake_transport *t = c->transport;
	struct perch__txbuf *chain = t->sent;
	t->sent = NULL;
	perch__conn_send_done(c, chain, result);
}

/* Counting listeners: each delivery, and each readying, is tallied. */
struct counting_reader {
	struct perch_recv_listener l;
	uint32_t parkings;
	uint32_t deliveries;
	void (*during_parking)(struct perch_conn *c);
	uint64_t last_cookie;
	uint64_t cookie_base;          /* added to the ordinal: tells two readers' cookies apart */
};

/* The cookie is the park's ordinal (plus cookie_base); a delivery must hand back the newest. */
static inline uint64_t counting_reader_parking(struct perch_recv_listener *l, struct perch_conn *c)
{
	struct counting_reader *r = (struct counting_reader *)l;
	uint64_t cookie = r->cookie_base + perch__faa_u32(&r->parkings, 1) + 1;
	if (r->during_parking)
		r->during_parking(c);
	return cookie;
}

static inline void counting_reader_ready(struct perch_recv_listener *l, struct perch_conn *c,
					 uint64_t cookie)
{
	struct counting_reader *r = (struct counting_reader *)l;
	perch__faa_u32(&r->deliveries, 1);
	r->last_cookie = cookie;
}

#define COUNTING_READER { { counting_reader_parking, counting_reader_ready }, 0, 0, NULL, 0, 0 }

struct counting_flusher {
	struct perch_flush_listener l;
	uint32_t parkings;
	uint32_t deliveries;
	int last_result;
	void (*during_done)(struct counting_flusher *f, struct perch_conn *c);
	uint64_t last_cookie;
	uint64_t cookie_base;          /* added to the ordinal: tells two flushers' cookies apart */
};

static inline uint64_t counting_flusher_parking(struct perch_flush_listener *l, struct perch_conn *c)
{
	struct counting_flusher *f = (struct counting_flusher *)l;
	return f->cookie_base + perch__faa_u32(&f->parkings, 1) + 1;
}

static inline void counting_flusher_done(struct perch_flush_listener *l, struct perch_conn *c,
					 uint64_t cookie, int result)
{
	struct counting_flusher *f = (struct counting_flusher *)l;
	perch__faa_u32(&f->deliveries, 1);
	f->last_result = result;
	f->last_cookie = cookie;
	if (f->during_done)
		f->during_done(f, c);
}

#define COUNTING_FLUSHER { { counting_flusher_parking, counting_flusher_done }, 0, 0, 0, NULL, 0, 0 }

#endif /* PERCH_TESTS_FAKE_TRANSPORT_H */
