/* lib/sock_opts.c: a connection's options: resolved from perch_conn_opts, and kept in one shared, counted record. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>

#include "loop_internal.h"

#define DEFAULT_PAUSE_BYTES (256u * 1024)

int perch__conn_opts_resolve(const struct perch_conn_opts *in, struct perch_conn_opts *out)
{
	struct perch_conn_opts o = in ? *in : (struct perch_conn_opts){ 0 };
	if (o.recv_mode < PERCH_RECV_DEFAULT || o.recv_mode > PERCH_RECV_SINGLESHOT)
		return -EINVAL;
	if (o.recv_mode == PERCH_RECV_DEFAULT)
		o.recv_mode = PERCH_RECV_MULTISHOT;
	if (o.pause_bytes == 0)
		o.pause_bytes = DEFAULT_PAUSE_BYTES;
	if (o.resume_bytes == 0)
		o.resume_bytes = o.pause_bytes / 4;
	if (o.zerocopy_min == 0)
		o.zerocopy_min = PERCH_ZEROCOPY_MIN_DEFAULT;
	if (o.resume_bytes >= o.pause_bytes || o.connect_timeout_ms > PERCH_CONNECT_TIMEOUT_MAX_MS)
		return -EINVAL;
	*out = o;
	return 0;
}

/*
 * The pool buffers a connection may hold before it pauses: twice its
 * pause in buffers, and two, so that a tail filling them at least half
 * holds pause_bytes (the bytes' own pause) and a thinner one is compacted.
 */
static uint32_t pool_max(size_t pause_bytes, uint32_t buf_size)
{
	size_t bufs = pause_bytes / buf_size + (pause_bytes % buf_size != 0);
	return bufs < UINT32_MAX / 2 - 1 ? (uint32_t)(2 * bufs + 2) : UINT32_MAX;
}

struct perch__sock_opts *perch__sock_opts_new(const struct perch_loop *loop, const struct perch_conn_opts *o)
{
	struct perch__sock_opts *r = malloc(sizeof(*r));
	if (r)
		*r = (struct perch__sock_opts){
			.pause_bytes = o->pause_bytes,
			.resume_bytes = o->resume_bytes,
			.zerocopy_min = o->zerocopy_min,
			.pool_max = pool_max(o->pause_bytes, loop->opts.buf_size),
			.refs = 1,
		};
	return r;
}

void perch__sock_opts_unref(struct perch__sock_opts *r)
{
	if (r && perch__faa_u32(&r->refs, UINT32_MAX) == 1)
		free(r);
}

struct perch__sock_opts *perch__sock_opts_for(struct perch_loop *loop, const struct perch_conn_opts *o,
					       struct perch__sock_opts *shared)
{
	struct perch__sock_opts *d = loop->default_opts;
	if (!shared && o->pause_bytes == d->pause_bytes && o->resume_bytes == d->resume_bytes &&
	    o->zerocopy_min == d->zerocopy_min)
		shared = d;
	if (!shared)
		return perch__sock_opts_new(loop, o);
	perch__faa_u32(&shared->refs, 1);
	return shared;
}
