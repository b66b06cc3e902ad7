/* lib/uring.c: the io_uring backend: the ring's setup, submissions, and the poll that turns CQEs into the loop's perch__loop_* calls. */
#include "config.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "uring_internal.h"

static int enable_ring(struct uring *u)
{
	/* liburing 2.3 declares io_uring_enable_rings but does not export it. */
	int rc = (int)syscall(__NR_io_uring_register, u->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS,
			      NULL, 0);
	if (rc < 0)
		return -errno;
	u->needs_enable = false;
	return 0;
}

/*
 * perch_loop_run starts on this thread: for its span the ring's fd goes in
 * this thread's registered ring table, so io_uring_enter skips the fd
 * lookup. The entry holds a reference to the ring that only this thread
 * can drop, so it never outlives the run: a loop freed from another thread
 * afterwards still tears its ring down. A refusal (a kernel before 5.18,
 * or this thread's 16 entries taken) keeps the plain fd.
 */
static void uring_run_start(struct perch_loop *loop)
{
	struct uring *u = st_of(loop);
	PERCH_ASSERT(!u->ring_fd_registered); /* a run inside its own turn is refused (-EBUSY) */
	if (!u->broken && io_uring_register_ring_fd(&u->ring) == 1) {
		u->ring_fd_registered = true;
		loop->stats.ring_fd_registered = 1;
	}
}

/* perch_loop_run returns, on the thread that started it: the entry goes. */
static void uring_run_end(struct perch_loop *loop)
{
	struct uring *u = st_of(loop);
	if (!u->ring_fd_registered)
		return;
	/* The index is this thread's own, taken by uring_run_start on it: nothing else can free it. */
	int rc = io_uring_unregister_ring_fd(&u->ring);
	PERCH_ASSERT(rc == 1);
	if (rc != 1)
		return; /* still registered: the stat keeps saying so */
	u->ring_fd_registered = false;
	loop->stats.ring_fd_registered = 0;
}

/*
 * Moves every CQE ready into the backlog (in order, behind what is there)
 * without dispatching it: handlers are not re-entered, and the CQ has room
 * again. Returns how many moved.
 */
static unsigned stash_cqes(struct uring *u)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	io_uring_for_each_cqe(&u->ring, head, cqe) {
		if (u->nbacklog == u->capbacklog) {
			size_t cap = u->capbacklog ? u->capbacklog * 2 : 256;
			struct cqe_copy *b = realloc(u->backlog, cap * sizeof(*b));
			if (!b)
				break; /* left in the CQ: the kernel keeps overflow, nothing is lost */
			u->backlog = b;
			u->capbacklog = cap;
		}
		u->backlog[u->nbacklog++] = (struct cqe_copy){ cqe->user_data, cqe->res, cqe->flags };
		n++;
	}
	io_uring_cq_advance(&u->ring, n);
	return n;
}

/* The ring takes no more work: the first refusal stays, and the next poll returns it. */
static void ring_broken(struct uring *u, int err)
{
	if (!u->broken)
		u->broken = err;
}

/* A refusal to retry after the CQ is emptied: a full CQ (-EBUSY), a short allocation (-EAGAIN), a signal. */
static bool refused_for_now(int rc)
{
	return rc == -EBUSY || rc == -EAGAIN || rc == -EINTR;
}

/*
 * An SQE, flushing the queue when it is full (the loop thread owns the
 * ring). A submit refused for now is retried after the CQ is emptied into
 * the backlog and the kernel's task work is run, SQE_RETRIES times at
 * most. Any other refusal, or that many, breaks the ring: NULL, here and
 * from then on, and the caller starts nothing.
 */
struct io_uring_sqe *perch__uring_sqe_get(struct uring *u)
{
	int rc;
	if (u->broken)
		return NULL;
	/* Work posted before the first poll reaches here first: bind the ring to this thread now. */
	if (u->needs_enable && (rc = enable_ring(u)) != 0) {
		ring_broken(u, rc);
		return NULL;
	}
	struct io_uring_sqe *sqe;
	for (int tries = 0; !(sqe = io_uring_get_sqe(&u->ring)); tries++) {
		if (tries == SQE_RETRIES) {
			ring_broken(u, -EIO); /* refused for now every time: for good, then */
			return NULL;
		}
		rc = io_uring_submit(&u->ring);
		if (rc > 0)
			continue;
		if (rc < 0 && !refused_for_now(rc)) {
			ring_broken(u, rc);
			return NULL;
		}
		stash_cqes(u);
		rc = io_uring_get_events(&u->ring);
		if (rc < 0 && !refused_for_now(rc)) {
			ring_broken(u, rc);
			return NULL;
		}
		stash_cqes(u);
	}
	return sqe;
}

/* ================= ring and buffer ring ================= */

bool perch__uring_kernel_at_least(unsigned major, unsigned minor)
{
	struct utsname un;
	unsigned ma, mi;
	if (uname(&un) != 0 || sscanf(un.release, "%u.%u", &ma, &mi) != 2)
		return false;
	return ma > major || (ma == major && mi >= minor);
}

/* Newest flags first; EINVAL means "this kernel does not know a flag": try plainer ones. */
static int ring_setup(struct perch_loop *loop, struct uring *u, unsigned entries)
{
	static const unsigned flag_sets[] = {
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED,
		IORING_SETUP_COOP_TASKRUN,
		0,
	};
	int rc = -EINVAL;
	for (size_t i = 0; i < sizeof(flag_sets) / sizeof(flag_sets[0]); i++) {
		struct io_uring_params p;
		memset(&p, 0, sizeof(p));
		p.flags = flag_sets[i];
		rc = io_uring_queue_init_params(entries, &u->ring, &p);
		if (rc == 0) {
			u->needs_enable = (flag_sets[i] & IORING_SETUP_R_DISABLED) != 0;
			u->defer_taskrun = (flag_sets[i] & IORING_SETUP_DEFER_TASKRUN) != 0;
			return 0;
		}
		if (rc != -EINVAL)
			break;
	}
	loop->be_refused_at = "io_uring_queue_init";
	if (rc == -ENOMEM)
		perch__uring_explain_enomem(loop, perch__uring_ring_lock_bytes(entries));
	return rc;
}

static void prep_wake(struct perch_loop *loop, struct io_uring_sqe *sqe)
{
	struct uring *u = st_of(loop);
	io_uring_prep_read(sqe, loop->wake_fd, &u->wake_val, sizeof(u->wake_val), 0);
	io_uring_sqe_set_data64(sqe, (uint64_t)OP_WAKE << 56);
}

/* Loop thread. */
static void arm_wake(struct perch_loop *loop)
{
	struct io_uring_sqe *sqe = perch__uring_sqe_get(st_of(loop));
	if (sqe)
		prep_wake(loop, sqe);
}

static void uring_destroy(struct perch_loop *loop)
{
	struct uring *u = st_of(loop);
	if (!u)
		return;
	/* Exiting the ring cancels what is left; the sockets it held go next, the buffers last. */
	perch__uring_zc_reset_held(u);
	PERCH_ASSERT(!u->ring_fd_registered); /* perch_loop_run dropped it before it returned */
	io_uring_queue_exit(&u->ring);
	perch__loop_abandon_all(loop, perch__uring_zc_settle);
	perch__uring_zc_free_all(u);
	free(u->backlog);
	free(u->br);
	free(u->bufs);
	free(u->segs);
	free(u->ring_pos);
	free(u->spare);
	free(u);
	loop->be_state = NULL;
}

static int uring_init(struct perch_loop *loop, const struct perch_loop_opts *opts)
{
	struct uring *u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	int rc = ring_setup(loop, u, opts->sq_entries);
	if (rc != 0) {
		free(u);
		return rc;
	}
	loop->be_state = u;
	u->loop = loop;
	perch__uring_zc_probe(u);
	rc = perch__uring_bufs_setup(loop, u, opts->buf_count, opts->buf_size);
	if (rc != 0) {
		uring_destroy(loop);
		return rc;
	}
	perch__uring_bundles_probe(u, opts->recv_bundles_off);
	perch__uring_fixed_probe(u, opts->fixed_files_off);
	/* On the creating thread: the SQ is empty, and perch__uring_sqe_get would bind the ring to this thread. */
	prep_wake(loop, io_uring_get_sqe(&u->ring));
	return 0;
}

/* ================= completions ================= */

static void dispatch(struct perch_loop *loop, uint64_t ud, int res, uint32_t flags)
{
	struct uring *u = st_of(loop);
	unsigned op = UD_OP(ud);
	if (op == OP_WAKE) {
		arm_wake(loop);
		perch__loop_woken(loop);
		return;
	}
	if (op == OP_SEND_ZC && (flags & IORING_CQE_F_NOTIF)) {
		perch__uring_zc_notified(u, UD_ZC_HOLD(ud)); /* its socket may be gone: the hold is all it needs */
		return;
	}
	/* A zero-copy send's socket is its hold's: the send is in flight, so the socket is in the table. */
	struct zc_hold *h = op == OP_SEND_ZC ? UD_ZC_HOLD(ud) : NULL;
	struct perch__sock *s = h ? h->s : perch__loop_sock(loop, UD_SLOT(ud), UD_GEN(ud));
	if (!s) {
		/* A completion for a socket that has left: its buffers still go back. */
		if (flags & IORING_CQE_F_BUFFER) {
			perch__uring_recv_orphaned(u, res, flags);
			perch__uring_serve_parked(u);
		}
		return;
	}
	/* A zero-copy send's result ends the send, even when its notification is still to come. */
	bool last = op == OP_SEND_ZC || !(flags & IORING_CQE_F_MORE);
	struct usock *us = us_of(s);
	if (last) {
		PERCH_ASSERT(us->inflight > 0); /* every last completion is of an operation counted in flight */
		us->inflight--;
	}
	switch (op) {
	case OP_RECV:
		perch__uring_on_recv(u, s, res, flags, last);
		break;
	case OP_SEND:
		us->flags &= ~F_SEND;
		perch__loop_sent(s, res);
		break;
	case OP_SEND_ZC:
		perch__uring_on_send_zc(h, res, flags);
		break;
	case OP_ACCEPT:
		perch__uring_on_accept(s, res, last);
		break;
	case OP_CONNECT:
		us->flags &= ~F_CONNECT;
		perch__loop_connected(s, res);
		break;
	case OP_HANGUP:
		perch__uring_on_hangup(u, s, res);
		break;
	case OP_FIXED_SET:
		perch__uring_on_fixed_set(s, res);
		break;
	case OP_FIXED_CLEAR:
		perch__uring_on_fixed_clear(s, res);
		break;
	default: /* the cancels: their targets report for themselves */
		break;
	}
	/* Last: the socket is freed here once closing and nothing is in flight. */
	if (s->closing && us->inflight == 0) {
		if (s->tx_chain)
			perch__loop_sent(s, -ECANCELED); /* its send never went: the ring broke before it */
		perch__uring_zc_close_fd(s);
		perch__uring_rare_free(us);
		perch__loop_sock_closed(s);
	}
}

static int uring_poll(struct perch_loop *loop, int timeout_ms)
{
	struct uring *u = st_of(loop);
	int rc;
	if (u->needs_enable && (rc = enable_ring(u)) != 0)
		ring_broken(u, rc);
	if (u->broken)
		return u->broken;
	u->grew_this_poll = false;
	perch__uring_ring_maybe_shrink(u);
	struct io_uring_cqe *cqe;
	if (u->nbacklog)
		timeout_ms = 0; /* completions are waiting already: do not sleep */
	if (timeout_ms < 0) {
		rc = io_uring_submit_and_wait(&u->ring, 1);
	} else if (timeout_ms == 0) {
		rc = io_uring_submit_and_get_events(&u->ring);
	} else {
		struct __kernel_timespec ts = { .tv_sec = timeout_ms / 1000,
						.tv_nsec = (long long)(timeout_ms % 1000) * 1000000 };
		rc = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, &ts, NULL);
	}
	perch__loop_waited(loop);
	if (rc < 0 && rc != -ETIME && !refused_for_now(rc)) {
		ring_broken(u, rc);
		return rc;
	}
	/*
	 * Copy out, then advance, then dispatch: handlers submit, which may
	 * post more CQEs (and perch__uring_sqe_get may stash some in the backlog). The
	 * backlog is always older than what is still in the CQ, so it goes
	 * first: per-socket order (recv data) is kept.
	 */
	int seen = 0;
	for (int batch = 0; batch < MAX_BATCHES; batch++) {
		if (u->nbacklog) {
			struct cqe_copy *b = u->backlog;
			size_t n = u->nbacklog;
			u->backlog = NULL;
			u->nbacklog = u->capbacklog = 0;
			for (size_t i = 0; i < n; i++)
				dispatch(loop, b[i].ud, b[i].res, b[i].flags);
			free(b);
			seen += (int)n;
			continue;
		}
		struct io_uring_cqe *cqes[CQE_BATCH];
		struct cqe_copy got[CQE_BATCH];
		unsigned n = io_uring_peek_batch_cqe(&u->ring, cqes, CQE_BATCH);
		if (n == 0)
			break;
		for (unsigned i = 0; i < n; i++)
			got[i] = (struct cqe_copy){ cqes[i]->user_data, cqes[i]->res, cqes[i]->flags };
		io_uring_cq_advance(&u->ring, n);
		for (unsigned i = 0; i < n; i++)
			dispatch(loop, got[i].ud, got[i].res, got[i].flags);
		seen += (int)n;
	}
	return seen;
}

/* What a refusal of io_uring means here, for the loop's one log line. */
static const char *uring_refusal_cause(int err)
{
	switch (err) {
	case -EPERM: return "not permitted (kernel.io_uring_disabled, seccomp, or a container policy)";
	case -ENOSYS: return "not supported by this kernel";
	case -ENOMEM: return "out of memory"; /* the locked-memory limit is named by perch__uring_explain_enomem */
	default: return strerror(-err);
	}
}

const struct perch__backend perch__uring_backend = {
	.name = "io_uring",
	.env_name = "uring",
	.id = PERCH_BACKEND_URING,
	.refusal_cause = uring_refusal_cause,
	.sock_size = sizeof(struct usock),
	.init = uring_init,
	.destroy = uring_destroy,
	.poll = uring_poll,
	.run_start = uring_run_start,
	.run_end = uring_run_end,
	.accept = perch__uring_accept,
	.accept_pause = perch__uring_accept_pause,
	.connect = perch__uring_connect,
	.recv_arm = perch__uring_recv_arm,
	.recv_pause = perch__uring_recv_pause,
	.send = perch__uring_send,
	.send_keep = perch__uring_zc_keep,
	.close = perch__uring_close,
	.buf_release = perch__uring_buf_release,
};
