/* lib/loop.c: the loop itself: options, the choice of backend, turns, and the free that waits out the last completions. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "atomic.h"
#include "loop_internal.h"

#define DEFAULT_READ_BUDGET (64u * 1024)   /* epoll: bytes per connection per turn */
#define DEFAULT_LINGER_MAX 1024u           /* connections in a lingering close at once */
#define FREE_DRAIN_MS 5000        /* perch_loop_free waits this long for the last completions */
#define FREE_LAST_DRAINS 64       /* and drains posts made by posts at most this many times */

/* ================= options and the backend ================= */

/* Every backend, in the order the default tries them (doc/loop.md says what a new one takes). */
static const struct perch__backend *const backends[] = {
	&perch__uring_backend,
	&perch__epoll_backend,
};
#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

/* DEFAULT resolves through $PERCH_BACKEND (a row's env_name or name); an unknown one is -EINVAL. */
static int resolve_backend(enum perch_backend *b)
{
	if (*b < PERCH_BACKEND_DEFAULT || *b > PERCH_BACKEND_EPOLL)
		return -EINVAL;
	const char *env = getenv("PERCH_BACKEND");
	if (*b != PERCH_BACKEND_DEFAULT || !env || !*env)
		return 0;
	for (size_t i = 0; i < NBACKENDS; i++) {
		if (strcmp(env, backends[i]->env_name) == 0 || strcmp(env, backends[i]->name) == 0) {
			*b = backends[i]->id;
			return 0;
		}
	}
	return -EINVAL;
}

static int resolve_loop_opts(const struct perch_loop_opts *in, struct perch_loop_opts *o)
{
	*o = in ? *in : (struct perch_loop_opts){ 0 };
	if (o->sq_entries == 0)
		o->sq_entries = 256;
	if (o->buf_count == 0)
		o->buf_count = 512;
	if (o->buf_size == 0)
		o->buf_size = 16 * 1024;
	if (o->read_budget == 0)
		o->read_budget = DEFAULT_READ_BUDGET;
	if (o->linger_max == 0)
		o->linger_max = DEFAULT_LINGER_MAX;
	if (o->sq_entries > 32768 || o->buf_count > 32768 || (o->buf_count & (o->buf_count - 1)) ||
	    o->buf_size > (1u << 20))
		return -EINVAL;
	return resolve_backend(&o->backend);
}

/* What the kernel says when it will not run a backend here (seccomp, a disabled feature, a limit). */
static bool refused(int rc)
{
	return rc == -EPERM || rc == -ENOSYS || rc == -ENOMEM;
}

/*
 * The backend asked for, or with the default the first of the table that
 * the kernel accepts. A refusal is logged in one line, naming the call
 * and the next backend tried; an explicit request fails with it. Other
 * errors are not refusals and fail as they are.
 */
static int backend_init(struct perch_loop *loop)
{
	bool any = loop->opts.backend == PERCH_BACKEND_DEFAULT;
	int rc = -EINVAL;
	for (size_t i = 0; i < NBACKENDS; i++) {
		const struct perch__backend *be = backends[i];
		if (!any && be->id != loop->opts.backend)
			continue;
		loop->be = be;
		loop->be_refused_at = NULL;
		loop->be_refused_why[0] = '\0';
		rc = be->init(loop, &loop->opts);
		if (rc == 0 || !refused(rc))
			return rc;
		const struct perch__backend *next = any && i + 1 < NBACKENDS ? backends[i + 1] : NULL;
		fprintf(stderr, "perch: %s refused: %s: %s%s%s\n", be->name,
			loop->be_refused_at ? loop->be_refused_at : "setup",
			loop->be_refused_why[0] ? loop->be_refused_why
			: be->refusal_cause ? be->refusal_cause(rc) : strerror(-rc), next ? "; using " : "",
			next ? next->name : "");
		if (!next)
			return rc;
	}
	return rc;
}

int perch_loop_new(const struct perch_loop_opts *opts, struct perch_loop **out)
{
	struct perch_loop_opts o;
	if (!out || resolve_loop_opts(opts, &o) != 0)
		return -EINVAL;
	struct perch_loop *loop;
	if (posix_memalign((void **)&loop, CK_MD_CACHELINE, sizeof(*loop)) != 0)
		return -ENOMEM;
	memset(loop, 0, sizeof(*loop));
	loop->park_head = loop->park_tail = PERCH__PARK_NONE;
	ck_stack_init(&loop->inbox);
	perch_timer_init(&loop->accept_retry, loop, perch__accept_retry_due, loop);
	loop->opts = o;
	struct perch_conn_opts defaults;
	perch__conn_opts_resolve(NULL, &defaults);
	loop->default_opts = perch__sock_opts_new(loop, &defaults);
	if (!loop->default_opts) {
		free(loop);
		return -ENOMEM;
	}
	loop->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int rc = loop->wake_fd < 0 ? -errno : backend_init(loop);
	if (rc != 0) {
		if (loop->wake_fd >= 0)
			close(loop->wake_fd);
		perch__sock_opts_unref(loop->default_opts);
		free(loop);
		return rc;
	}
	*out = loop;
	return 0;
}

const char *perch_loop_backend_name(const struct perch_loop *loop)
{
	return loop ? loop->be->name : NULL;
}

int perch_loop_stats(struct perch_loop *loop, struct perch_loop_stats *out)
{
	if (!loop || !out)
		return -EINVAL;
	if (!perch__loop_is_current(loop) && !perch__loop_claim(loop))
		return -EEXIST;
	*out = (struct perch_loop_stats){
		.enobufs_parks = loop->stats.enobufs_parks,
		.own_receives = loop->stats.own_receives,
		.recv_pauses = loop->stats.recv_pauses,
		.accept_errors = loop->stats.accept_errors,
		.accept_pauses = loop->stats.accept_pauses,
		.zerocopy_available = loop->stats.zerocopy_available,
		.zerocopy_sends = loop->stats.zerocopy_sends,
		.zerocopy_notifs = loop->stats.zerocopy_notifs,
		.zerocopy_refused = loop->stats.zerocopy_refused,
		.lingering = loop->stats.lingering,
		.lingers_refused = loop->stats.lingers_refused,
		.recv_limit_refused = loop->stats.recv_limit_refused,
		.bufs_given_back = loop->stats.bufs_given_back,
		.ring_fd_registered = loop->stats.ring_fd_registered,
		.recv_bundles = loop->stats.recv_bundles,
		.bundle_bufs = loop->stats.bundle_bufs,
		.fixed_files = loop->stats.fixed_files,
		.fixed_sockets = loop->stats.fixed_sockets,
		.fixed_refused = loop->stats.fixed_refused,
	};
	return 0;
}

/* ================= turns ================= */

/* How long a turn may sleep: until the soonest timer (a paused listener's retry among them), rounded up. */
static int turn_timeout(struct perch_loop *loop, int timeout_ms)
{
	double due_ms;
	if (!perch__timers_soonest(loop, &due_ms))
		return timeout_ms;
	double left = due_ms - perch__loop_clock_read(loop); /* fresh, and the clock of what the poll runs before its wait */
	int ms = left > 0 ? (int)left + 1 : 0;
	return timeout_ms < 0 || ms < timeout_ms ? ms : timeout_ms;
}

int perch_loop_run_once(struct perch_loop *loop, int timeout_ms)
{
	if (!loop)
		return -EINVAL;
	if (!perch__loop_claim(loop))
		return -EEXIST;
	/* From inside one of this loop's callbacks, or another loop's run from one: a nested turn would re-enter dispatch. */
	if (perch__current_loop == loop || loop->in_turn)
		return -EBUSY;
	struct perch_loop *prev = perch__current_loop;
	perch__current_loop = loop;
	loop->in_turn = true;
	perch__thread_clock_epoch++; /* a turn's clock is never the last turn's */
	int posted = perch__inbox_drain(loop);
	/* Posted work counts as this turn's events: do not also sleep. */
	int rc = loop->be->poll(loop, posted ? 0 : turn_timeout(loop, timeout_ms));
	perch__timers_expire(loop);
	loop->in_turn = false;
	perch__current_loop = prev;
	return rc < 0 ? rc : rc + posted;
}

int perch_loop_run(struct perch_loop *loop)
{
	if (!loop)
		return -EINVAL;
	if (!perch__loop_claim(loop))
		return -EEXIST;
	if (perch__current_loop == loop || loop->in_turn)
		return -EBUSY;
	if (loop->be->run_start)
		loop->be->run_start(loop);
	int rc = 0;
	while (rc == 0 && !perch__xchg_u32(&loop->stop, 0)) {
		rc = perch_loop_run_once(loop, -1);
		if (rc > 0 || rc == -EINTR)
			rc = 0;
	}
	if (loop->be->run_end)
		loop->be->run_end(loop);
	return rc;
}

/* ================= the free ================= */

/* Closes connections through the core, so parked reads and flushes get their closed result. */
static void close_all(struct perch_loop *loop)
{
	for (uint32_t i = 0; i < loop->cap; i++) {
		struct perch__sock *s = loop->table[i];
		if (!s || s->closing)
			continue;
		if (s->kind == PERCH__SOCK_CONN)
			perch_conn_close(perch__sock_conn(s));
		else
			perch__sock_start_close(s);
	}
}

/* The free's own turns, on the owner's thread: everything posted runs and every socket is closed. */
static void last_turns(struct perch_loop *loop)
{
	struct perch_loop *prev = perch__current_loop;
	perch__current_loop = loop;
	perch__inbox_drain(loop);
	close_all(loop);
	/* Every socket leaves the table after its last completion; bounded, in case one never comes. */
	double deadline = perch__now_ms() + FREE_DRAIN_MS;
	while (loop->live > 0 && perch__now_ms() < deadline) {
		int rc = loop->be->poll(loop, 50);
		if (rc < 0 && rc != -EINTR)
			break; /* the backend failed for good: its destroy settles what is left */
		perch__inbox_drain(loop);
		close_all(loop);
	}
	/*
	 * A post under way when the free began lands before these last drains,
	 * and runs; so does one that a callback they run makes (an adoption's
	 * -ECANCELED report). Bounded, for a callback that posts from every post.
	 */
	int rounds = 0;
	do
		perch__inbox_wait_posters(loop);
	while (perch__inbox_drain(loop) > 0 && ++rounds < FREE_LAST_DRAINS);
	perch__current_loop = prev;
}

/* Listeners never inserted (no room, or queued when the free began) and never closed: nothing is in flight for them. */
static void free_dropped(struct perch_loop *loop)
{
	while (loop->dropped) {
		struct perch__sock *ls = loop->dropped;
		loop->dropped = perch__lx(ls)->dropped_next;
		perch__listener_free(ls);
	}
}

void perch_loop_free(struct perch_loop *loop)
{
	if (!loop)
		return;
	bool owner = perch__loop_claim(loop);
	loop->freeing = true;
	if (owner)
		last_turns(loop);
	perch__inbox_wait_posters(loop);
	if (loop->live > 0)
		fprintf(stderr, "perch: loop freed with %u sockets still in flight%s: finalized without their last completions\n",
			loop->live, owner ? "" : " (perch_loop_free called off the loop's thread)");
	if (perch__inbox_has_posts(loop))
		fprintf(stderr, "perch: loop freed with posted work never run%s\n",
			owner ? " (callbacks kept posting through its last drains)"
			      : " (perch_loop_free called off the loop's thread)");
	/* After the last turns: their drains drop the listens still queued onto the list. */
	free_dropped(loop);
	perch__timers_unbind_all(loop);
	loop->be->destroy(loop);
	perch__txbuf_pool_free(loop);
	close(loop->wake_fd);
	free(loop->table);
	free(loop->gens);
	free(loop->free_slots);
	free(loop->park_next);
	free(loop->connecting);
	perch__sock_opts_unref(loop->default_opts); /* connections still held keep theirs */
	free(loop);
}
