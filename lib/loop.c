/* lib/loop.c: the backend-agnostic loop: inbox, wake, socket table, listeners, connects, backpressure, sends. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "atomic.h"
#include "backend.h"
#include "invariant.h"

#define DEFAULT_PAUSE_BYTES (256u * 1024)
#define DEFAULT_READ_BUDGET (64u * 1024)   /* epoll: bytes per connection per turn */
#define FREE_DRAIN_MS 5000        /* perch_loop_free waits this long for the last completions */

static const struct perch__transport_ops loop_conn_ops;

/* The loop this thread is running (inside run_once or free): "on the loop thread". */
static __thread struct perch_loop *current_loop;

bool perch_loop_is_current(const struct perch_loop *loop)
{
	return loop && current_loop == loop;
}

/*
 * This thread's id, cached: gettid is a syscall, and run_once checks the
 * owner on every turn (it was half the syscalls of a busy loop). A child
 * process keeps the forking thread's TLS, whether made by fork, _Fork,
 * clone or the raw syscall, and atfork handlers run only for fork. So the
 * cache is tied to a process generation kept on a page the kernel wipes in
 * every child (MADV_WIPEONFORK): a child finds 0 there, starts a new
 * generation, and a cache from another one is read again. Without the page
 * (madvise refused), every call asks the kernel.
 */
static uint64_t *generation_page;
static uint64_t generation_counter;
static __thread pid_t cached_tid;
static __thread uint64_t cached_generation;

static void map_generation_page(void)
{
	size_t size = (size_t)sysconf(_SC_PAGESIZE);
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	if (madvise(p, size, MADV_WIPEONFORK) != 0) {
		munmap(p, size);
		return;
	}
	generation_page = p;
}

/* A new process: a generation above every one its threads may have cached (the counter came with the copy). */
static uint64_t start_generation(uint64_t *page)
{
	uint64_t generation = perch__faa_u64(&generation_counter, 1) + 1;
	if (!perch__cas_u64(page, 0, generation))
		generation = perch__load_u64(page);
	return generation;
}

static pid_t this_tid(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, map_generation_page);
	uint64_t *page = generation_page;
	if (!page)
		return (pid_t)gettid();
	uint64_t generation = perch__load_u64(page);
	if (__builtin_expect(generation == 0, 0))
		generation = start_generation(page);
	if (__builtin_expect(generation != cached_generation, 0)) {
		cached_tid = (pid_t)gettid();
		cached_generation = generation;
	}
	return cached_tid;
}

/* ================= inbox: many producers, the loop consumes ================= */

/* Wakes the loop unless a wake is already pending: one eventfd write until the loop drains. */
static void wake(struct perch_loop *loop)
{
	/* Pairs with the exchange in drain_inbox: our push (or stop) is ordered before this. */
	perch__fence_rmw_then_load();
	if (perch__xchg_u32(&loop->wake_pending, 1) != 0)
		return;
	uint64_t one = 1;
	ssize_t n = write(loop->wake_fd, &one, sizeof(one));
	(void)n; /* EAGAIN means the counter is already non-zero: the loop wakes anyway */
}

/*
 * ck_stack's push writes entry->next and then CASes the head in inline
 * assembly, which TSan cannot see (nor can an annotation go between the
 * two); under TSan the same Treiber push and batch pop use __atomic.
 */
#ifdef PERCH_TSAN
static void inbox_stack_push(ck_stack_t *st, ck_stack_entry_t *e)
{
	ck_stack_entry_t *head = __atomic_load_n(&st->head, __ATOMIC_RELAXED);
	do
		e->next = head;
	while (!__atomic_compare_exchange_n(&st->head, &head, e, true, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED));
}

static ck_stack_entry_t *inbox_stack_pop_all(ck_stack_t *st)
{
	return __atomic_exchange_n(&st->head, NULL, __ATOMIC_ACQUIRE);
}
#else
/* Many producers (push_upmc), one consumer taking the whole batch (LIFO: reversed by the caller). */
static void inbox_stack_push(ck_stack_t *st, ck_stack_entry_t *e)
{
	ck_stack_push_upmc(st, e);
}

static ck_stack_entry_t *inbox_stack_pop_all(ck_stack_t *st)
{
	return ck_stack_batch_pop_upmc(st);
}
#endif

/*
 * Any thread. The message must stay valid until it runs. What it carries
 * may let the loop thread return and free the loop before our wake is
 * written: `posting` makes perch_loop_free wait until we are out.
 */
static void inbox_push(struct perch_loop *loop, struct perch__msg *m)
{
	perch__faa_u32(&loop->posting, 1);
	inbox_stack_push(&loop->inbox, &m->entry);
	wake(loop);
	perch__faa_u32(&loop->posting, (uint32_t)-1);
}

/* Loop thread, in perch_loop_free: posters still writing the eventfd finish first. */
static void wait_posters(struct perch_loop *loop)
{
	unsigned spins = 0;
	while (perch__load_u32(&loop->posting) != 0)
		if (++spins % 64 == 0)
			sched_yield();
		else
			perch__cpu_relax();
}

static struct perch__msg *msg_of(ck_stack_entry_t *e)
{
	return (struct perch__msg *)((char *)e - offsetof(struct perch__msg, entry));
}

/* Loop thread. Runs everything posted so far in FIFO order; returns how many ran. */
static int drain_inbox(struct perch_loop *loop)
{
	/* Clear the flag before popping: a push after our pop sees 0 and writes the eventfd. */
	perch__xchg_u32(&loop->wake_pending, 0);
	perch__fence_rmw_then_load();
	if (perch__load_ptr((void *const *)&loop->inbox.head) == NULL)
		return 0;
	ck_stack_entry_t *e = inbox_stack_pop_all(&loop->inbox);
	ck_stack_entry_t *fifo = NULL;
	while (e) {
		ck_stack_entry_t *next = e->next;
		e->next = fifo;
		fifo = e;
		e = next;
	}
	int n = 0;
	while (fifo) {
		/* Read next first: run may free or re-post the message. */
		ck_stack_entry_t *next = fifo->next;
		struct perch__msg *m = msg_of(fifo);
		m->run(loop, m);
		fifo = next;
		n++;
	}
	return n;
}

void perch__loop_woken(struct perch_loop *loop)
{
	drain_inbox(loop);
}

struct user_msg {
	struct perch__msg m;
	perch_loop_fn fn;
	void *arg;
};

static void run_user_msg(struct perch_loop *loop, struct perch__msg *m)
{
	struct user_msg *u = (struct user_msg *)m;
	perch_loop_fn fn = u->fn;
	void *arg = u->arg;
	free(u);
	fn(arg);
}

/* ================= socket table (loop thread) ================= */

#define GEN_MASK 0xffffffu         /* generations fit the backend's 24-bit tag */

static int table_grow(struct perch_loop *loop)
{
	uint32_t cap = loop->cap ? loop->cap * 2 : 64;
	struct perch__sock **table = realloc(loop->table, cap * sizeof(*table));
	if (!table)
		return -ENOMEM;
	loop->table = table;
	uint32_t *gens = realloc(loop->gens, cap * sizeof(*gens));
	if (!gens)
		return -ENOMEM;
	loop->gens = gens;
	uint32_t *free_slots = realloc(loop->free_slots, cap * sizeof(*free_slots));
	if (!free_slots)
		return -ENOMEM;
	loop->free_slots = free_slots;
	/* Pushed high to low so the lowest slots are used first. */
	for (uint32_t i = cap; i > loop->cap; i--) {
		table[i - 1] = NULL;
		gens[i - 1] = 0;
		free_slots[loop->nfree++] = i - 1;
	}
	loop->cap = cap;
	return 0;
}

static int table_insert(struct perch_loop *loop, struct perch__sock *s)
{
	if (loop->nfree == 0 && table_grow(loop) != 0)
		return -ENOMEM;
	uint32_t slot = loop->free_slots[--loop->nfree];
	loop->table[slot] = s;
	s->slot = slot;
	s->gen = loop->gens[slot];
	s->in_table = true;
	loop->live++;
	return 0;
}

static void table_remove(struct perch_loop *loop, struct perch__sock *s)
{
	loop->table[s->slot] = NULL;
	/* Completions and releases still tagged with the old generation are dropped. */
	loop->gens[s->slot] = (loop->gens[s->slot] + 1) & GEN_MASK;
	loop->free_slots[loop->nfree++] = s->slot;
	loop->live--;
	s->in_table = false;
}

struct perch__sock *perch__loop_sock(struct perch_loop *loop, uint32_t slot, uint32_t gen)
{
	if (slot >= loop->cap || loop->gens[slot] != gen)
		return NULL;
	return loop->table[slot];
}

void perch__park(struct perch__park_list *l, struct perch__sock *s)
{
	PERCH_ASSERT(!s->parked);
	s->parked = true;
	s->park_next = NULL;
	if (l->tail)
		l->tail->park_next = s;
	else
		l->head = s;
	l->tail = s;
}

bool perch__unpark(struct perch__park_list *l, struct perch__sock *s)
{
	if (!s->parked)
		return false;
	struct perch__sock **pp = &l->head, *prev = NULL;
	while (*pp != s) {
		PERCH_ASSERT(*pp != NULL); /* a parked socket is on its list */
		prev = *pp;
		pp = &(*pp)->park_next;
	}
	*pp = s->park_next;
	if (l->tail == s)
		l->tail = prev;
	s->park_next = NULL;
	s->parked = false;
	return true;
}

/* ================= sockets: options, creation, close ================= */

static int resolve_opts(const struct perch_conn_opts *in, struct perch_conn_opts *out)
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
	if (o.resume_bytes >= o.pause_bytes || o.connect_timeout_ms > PERCH_CONNECT_TIMEOUT_MAX_MS)
		return -EINVAL;
	*out = o;
	return 0;
}

/* A connection socket over `fd`, with the loop's reference on its conn. Any thread. */
static struct perch__sock *conn_sock_new(struct perch_loop *loop, int fd,
					 const struct perch_conn_opts *opts)
{
	struct perch__sock *s = calloc(1, sizeof(*s) + loop->be->sock_size);
	if (!s)
		return NULL;
	s->loop = loop;
	s->kind = PERCH__SOCK_CONN;
	s->fd = fd;
	s->opts = *opts;
	s->conn = perch__conn_new(&loop_conn_ops, s);
	if (!s->conn) {
		free(s);
		return NULL;
	}
	return s;
}

/* ================= accepting without fds: pause, and resume when one is freed ================= */

/*
 * The failures accept(2) says are one connection's (it went away, or the
 * network said no): the next connection may do. Any other failure (out of
 * fds or memory, or a listening socket gone bad) lasts: retried at once it
 * would spin.
 */
static bool accept_retry_at_once(int err)
{
	switch (-err) {
	case ECONNABORTED: case EPROTO: case EPERM: case EINTR: case ENETDOWN: case ENOPROTOOPT:
	case EHOSTDOWN: case ENONET: case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
		return true;
	default:
		return false;
	}
}

/* A socket closed (an fd is free) or the retry time passed: every paused listener tries again. */
static void resume_accepting(struct perch_loop *loop)
{
	struct perch__sock *ls = loop->accept_paused;
	loop->accept_paused = NULL;
	perch__timer_disarm(&loop->accept_retry);
	while (ls) {
		struct perch__sock *next = ls->accept_paused_next;
		ls->accept_paused = false;
		ls->accept_paused_next = NULL;
		if (!ls->closing)
			loop->be->accept(ls);
		ls = next;
	}
}

/* PERCH__ACCEPT_RETRY_MS after the first listener paused and no socket closed meanwhile. */
static void accept_retry_due(struct perch_timer *t, void *arg)
{
	resume_accepting(arg);
}

static void pause_accepting(struct perch__sock *ls)
{
	struct perch_loop *loop = ls->loop;
	if (ls->accept_paused)
		return;
	if (!loop->accept_paused)
		perch__timer_arm_at(&loop->accept_retry, perch__now_ms() + PERCH__ACCEPT_RETRY_MS,
				    PERCH__ACCEPT_RETRY_MS);
	ls->accept_paused = true;
	ls->accept_paused_next = loop->accept_paused;
	loop->accept_paused = ls;
	loop->stats.accept_pauses++;
	loop->be->accept_pause(ls);
}

/* How long a turn may sleep: until the soonest timer (a paused listener's retry among them), rounded up. */
static int turn_timeout(struct perch_loop *loop, int timeout_ms)
{
	double due_ms;
	if (!perch__timers_soonest(loop, &due_ms))
		return timeout_ms;
	double left = due_ms - perch__now_ms();
	int ms = left > 0 ? (int)left + 1 : 0;
	return timeout_ms < 0 || ms < timeout_ms ? ms : timeout_ms;
}

/* Takes a listener off loop->dropped, if it was never inserted. */
static void undrop(struct perch_loop *loop, struct perch__sock *ls)
{
	for (struct perch__sock **p = &loop->dropped; *p; p = &(*p)->dropped_next) {
		if (*p == ls) {
			*p = ls->dropped_next;
			return;
		}
	}
}

static void start_close(struct perch__sock *s)
{
	if (s->closing)
		return;
	s->closing = true;
	if (s->in_table) {
		s->loop->be->close(s);
		return;
	}
	/* Its posted insert has not run yet, and frees it when it does (its message is still queued). */
	if (s->kind == PERCH__SOCK_LISTENER && s->listen_pending)
		return;
	/* Never reached the backend: nothing in flight (a listener dropped for want of memory has no fd). */
	if (s->fd >= 0)
		close(s->fd);
	if (s->kind == PERCH__SOCK_LISTENER) {
		undrop(s->loop, s);
		free(s);
	}
}

void perch__loop_abandon_all(struct perch_loop *loop, void (*settle)(struct perch__sock *s))
{
	for (uint32_t i = 0; i < loop->cap; i++) {
		struct perch__sock *s = loop->table[i];
		if (!s)
			continue;
		s->closing = true;
		settle(s);
		if (s->kind == PERCH__SOCK_CONN && s->on_connected)
			perch__loop_connected(s, -ECANCELED);
		close(s->fd);
		perch__loop_sock_closed(s);
	}
}

void perch__loop_sock_closed(struct perch__sock *s)
{
	perch__timer_disarm(&s->connect_timer); /* the connect was answered first; never left for a freed socket */
	table_remove(s->loop, s);
	/*
	 * Its fd is closed: a listener paused for want of one may have it. This
	 * also empties the paused list before a closing listener is freed below
	 * (resume skips it): a paused listener is in the table, so this is the
	 * only place it is freed.
	 */
	if (s->loop->accept_paused)
		resume_accepting(s->loop);
	if (s->kind == PERCH__SOCK_LISTENER) {
		free(s);
		return;
	}
	/* The loop's reference: the last one frees the socket (op_destroy). */
	perch__conn_unref(s->conn);
}

/* ================= receive: segments and backpressure ================= */

bool perch__loop_recv_wanted(const struct perch__sock *s)
{
	return !s->closing && !s->rx_ended && !s->rx_paused;
}

/*
 * Closed here: the close ran on the loop (closing), or the user closed the
 * conn on another thread and the close is still on its way, or the conn
 * failed. What the kernel still completes (bytes, FIN, RST) is not handed
 * to it: a read after a close sees "closed" only.
 */
static bool locally_closed(const struct perch__sock *s)
{
	return s->closing || perch_conn_is_closed(s->conn);
}

void perch__loop_received(struct perch__sock *s, struct perch__rxseg *rs)
{
	struct perch_loop *loop = s->loop;
	uint32_t len = rs->seg.len;
	if (locally_closed(s)) {
		loop->be->buf_release(loop, rs);
		return;
	}
	rs->slot = s->slot;
	rs->gen = s->gen;
	s->unconsumed += len;
	if (perch__conn_recv_arrived(s->conn, &rs->seg) != 0) {
		s->unconsumed -= len;
		loop->be->buf_release(loop, rs);
		s->rx_ended = true;
		loop->be->recv_pause(s);
		perch__conn_failed(s->conn, -ENOMEM);
		return;
	}
	/*
	 * Inline, in this turn: a deferred pause would let the rest of this
	 * batch (and the next) overfill the connection. What arrives before
	 * the pause lands is still queued above, never dropped. The conn's
	 * reader may have consumed (and even closed) inside recv_arrived: the
	 * socket stays valid until the end of this completion.
	 */
	if (!s->rx_paused && s->unconsumed >= s->opts.pause_bytes) {
		s->rx_paused = true;
		loop->stats.recv_pauses++;
		if (!s->closing)
			loop->be->recv_pause(s);
	}
}

void perch__loop_recv_ended(struct perch__sock *s, int res)
{
	if (s->rx_ended)
		return;
	s->rx_ended = true;
	if (locally_closed(s))
		return;
	if (res == 0)
		perch__conn_peer_closed(s->conn);
	else
		perch__conn_failed(s->conn, res);
}

static void maybe_resume(struct perch__sock *s)
{
	if (!s->rx_paused || s->unconsumed > s->opts.resume_bytes)
		return;
	s->rx_paused = false;
	if (perch__loop_recv_wanted(s))
		s->loop->be->recv_arm(s);
}

/* Loop thread: the buffer goes back; the socket it was lent to (if still there) may resume. */
static void release_now(struct perch_loop *loop, struct perch__rxseg *rs)
{
	struct perch__sock *s = perch__loop_sock(loop, rs->slot, rs->gen);
	uint32_t len = rs->seg.len;
	loop->be->buf_release(loop, rs);
	if (s && s->kind == PERCH__SOCK_CONN) {
		s->unconsumed -= len;
		maybe_resume(s);
	}
}

static void run_posted_release(struct perch_loop *loop, struct perch__msg *m)
{
	release_now(loop, (struct perch__rxseg *)((char *)m - offsetof(struct perch__rxseg, release)));
}

/* ================= send ================= */

int perch__loop_tx_iov(struct perch__sock *s, struct iovec *iov, int max)
{
	int n = 0;
	uint32_t off = s->tx_off;
	for (struct perch__txbuf *b = s->tx_cur; b && n < max; b = b->next, off = 0) {
		if (b->len == off)
			continue;
		iov[n].iov_base = b->bytes + off;
		iov[n].iov_len = b->len - off;
		n++;
	}
	return n;
}

/* Skips `n` sent bytes; true when the whole chain is sent. */
static bool tx_advance(struct perch__sock *s, size_t n)
{
	while (s->tx_cur) {
		size_t left = s->tx_cur->len - s->tx_off;
		if (n < left) {
			s->tx_off += (uint32_t)n;
			return false;
		}
		n -= left;
		s->tx_cur = s->tx_cur->next;
		s->tx_off = 0;
	}
	return true;
}

static void finish_send(struct perch__sock *s, int result)
{
	struct perch__txbuf *chain = s->tx_chain;
	s->tx_chain = s->tx_cur = NULL;
	s->tx_off = 0;
	/* May drop the send's reference; the loop's keeps the socket alive. */
	perch__conn_send_done(s->conn, chain, result);
}

void perch__loop_sent(struct perch__sock *s, int res)
{
	if (res < 0) {
		finish_send(s, res);
		return;
	}
	if (tx_advance(s, (size_t)res)) {
		finish_send(s, 0);
		return;
	}
	/* A short send: resubmit from where it stopped, unless closing (or the kernel took nothing). */
	if (s->closing)
		finish_send(s, -ECANCELED);
	else if (res == 0)
		finish_send(s, -EIO);
	else
		s->loop->be->send(s);
}

/* Loop thread. `c` is passed apart from s->conn: after a close the socket may be finalized. */
static void start_send(struct perch__sock *s, struct perch_conn *c, struct perch__txbuf *chain)
{
	if (s->closing || !s->in_table) {
		perch__conn_send_done(c, chain, -EPIPE);
		return;
	}
	if (s->tx_chain) {
		/* The flush guard allows one send at a time; refuse rather than reorder. */
		perch__conn_send_done(c, chain, -EBUSY);
		return;
	}
	s->tx_chain = s->tx_cur = chain;
	s->tx_off = 0;
	if (tx_advance(s, 0)) {
		finish_send(s, 0);
		return;
	}
	s->loop->be->send(s);
}

static void run_posted_send(struct perch_loop *loop, struct perch__msg *m)
{
	struct perch__sock *s = (struct perch__sock *)((char *)m - offsetof(struct perch__sock, send_msg));
	start_send(s, s->conn, s->posted_chain);
}

/* ================= the conn core's transport ops ================= */

static void op_send(struct perch_conn *c, struct perch__txbuf *chain)
{
	struct perch__sock *s = c->transport;
	if (perch_loop_is_current(s->loop)) {
		start_send(s, c, chain);
		return;
	}
	/* The send's own conn reference (taken by the core) keeps s alive until it runs. */
	s->posted_chain = chain;
	s->send_msg.run = run_posted_send;
	inbox_push(s->loop, &s->send_msg);
}

static void op_release_seg(struct perch_seg *seg)
{
	struct perch__rxseg *rs = (struct perch__rxseg *)seg;
	struct perch_loop *loop = seg->owner;
	if (perch_loop_is_current(loop)) {
		release_now(loop, rs);
		return;
	}
	rs->release.run = run_posted_release;
	inbox_push(loop, &rs->release);
}

/*
 * Runs a connection's call on its loop thread: at once when already there,
 * else posted as m. The caller holds a reference only for the call; the one
 * taken here keeps s alive while m waits, and run_posted drops it.
 */
static void call_on_loop(struct perch__sock *s, struct perch__msg *m, perch__msg_fn run_posted,
			 void (*call)(struct perch__sock *s))
{
	if (perch_loop_is_current(s->loop)) {
		call(s);
		return;
	}
	perch__conn_ref(s->conn);
	m->run = run_posted;
	inbox_push(s->loop, m);
}

/* The posted half of call_on_loop: the call, then the reference it took (which may free s). */
static void run_posted_call(struct perch__sock *s, void (*call)(struct perch__sock *s))
{
	struct perch_conn *c = s->conn;
	call(s);
	perch__conn_unref(c);
}

static void run_posted_close(struct perch_loop *loop, struct perch__msg *m)
{
	run_posted_call((struct perch__sock *)((char *)m - offsetof(struct perch__sock, close_msg)), start_close);
}

static void op_close(struct perch_conn *c)
{
	struct perch__sock *s = c->transport;
	call_on_loop(s, &s->close_msg, run_posted_close, start_close);
}

/* A close whose fd goes with a reset: SO_LINGER 0 makes the kernel's last release send an RST. */
static void start_abort(struct perch__sock *s)
{
	if (!s->closing) {
		struct linger now = { .l_onoff = 1, .l_linger = 0 };
		setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
	}
	start_close(s);
}

static void run_posted_abort(struct perch_loop *loop, struct perch__msg *m)
{
	run_posted_call((struct perch__sock *)((char *)m - offsetof(struct perch__sock, close_msg)), start_abort);
}

/* The core calls close or abort once per connection: they share the close's message. */
static void op_abort(struct perch_conn *c)
{
	struct perch__sock *s = c->transport;
	call_on_loop(s, &s->close_msg, run_posted_abort, start_abort);
}

static void op_destroy(struct perch_conn *c)
{
	free(c->transport);
}

/*
 * Staging buffers, pooled per loop and touched only on its thread: a write
 * there stages in a buffer a send gave back instead of a new one. Without
 * the pool every write mallocs and every send completion frees, and glibc
 * trims the loop thread's heap and grows it back, each regrown page a
 * fault. Bounded, so idle connections hold none and a burst's buffers go.
 */
static struct perch_loop *loop_of_conn(struct perch_conn *c)
{
	return ((struct perch__sock *)c->transport)->loop;
}

/*
 * On the loop's thread, a buffer of the pool's size: pooled, or new when
 * the pool is empty (so that it comes back to the pool: a write the core
 * would give one bigger buffer of its own never would).
 */
static struct perch__txbuf *op_txbuf_get(struct perch_conn *c)
{
	struct perch_loop *loop = loop_of_conn(c);
	if (!perch_loop_is_current(loop))
		return NULL;
	struct perch__txbuf *b = loop->txbuf_pool;
	if (!b)
		return perch__txbuf_new(PERCH__TXBUF_CAP);
	loop->txbuf_pool = b->next;
	loop->txbuf_pooled--;
	return b;
}

static bool op_txbuf_put(struct perch_conn *c, struct perch__txbuf *b)
{
	struct perch_loop *loop = loop_of_conn(c);
	if (!perch_loop_is_current(loop) || loop->txbuf_pooled >= PERCH__TXBUF_POOL_MAX)
		return false;
	b->next = loop->txbuf_pool;
	loop->txbuf_pool = b;
	loop->txbuf_pooled++;
	return true;
}

/*
 * On the loop thread only, where the fd cannot be closed under the call:
 * a socket already closing keeps its close's cancel. An error (the peer
 * reset) is the reader's to see, from its receive.
 */
static void shutdown_write(struct perch__sock *s)
{
	if (!s->closing)
		shutdown(s->fd, SHUT_WR);
}

static void run_posted_shutdown(struct perch_loop *loop, struct perch__msg *m)
{
	run_posted_call((struct perch__sock *)((char *)m - offsetof(struct perch__sock, shutdown_msg)),
			shutdown_write);
}

/* The core calls it once per connection, with no send in flight: nothing is queued before the FIN. */
static void op_shutdown(struct perch_conn *c)
{
	struct perch__sock *s = c->transport;
	call_on_loop(s, &s->shutdown_msg, run_posted_shutdown, shutdown_write);
}

static void free_txbuf_pool(struct perch_loop *loop)
{
	perch__conn_free_chain(loop->txbuf_pool);
	loop->txbuf_pool = NULL;
	loop->txbuf_pooled = 0;
}

static const struct perch__transport_ops loop_conn_ops = {
	.send = op_send,
	.release_seg = op_release_seg,
	.close = op_close,
	.abort = op_abort,
	.shutdown = op_shutdown,
	.destroy = op_destroy,
	.txbuf_get = op_txbuf_get,
	.txbuf_put = op_txbuf_put,
};

/* ================= accept and connect ================= */

/*
 * TCP_NODELAY unless the connection asked to keep Nagle's algorithm
 * (perch_conn_opts.nagle). A failure is ignored: it can only come from a
 * socket that is not TCP, and the connection works either way.
 */
static void set_nodelay(const struct perch__sock *s)
{
	int one = 1;
	if (!s->opts.nagle)
		setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/*
 * At most one line per listener every PERCH__ACCEPT_LOG_MS, with the count
 * since the last: at the fd limit every close lets one accept through and
 * the next fails, and a line each would flood a slow stderr from the loop.
 */
static void accept_failed(struct perch__sock *ls, int err)
{
	ls->loop->stats.accept_errors++;
	ls->accept_unlogged++;
	bool pause = !accept_retry_at_once(err) && !ls->closing;
	double now = perch__now_ms();
	if (ls->accept_logged_at_ms == 0 || now - ls->accept_logged_at_ms >= PERCH__ACCEPT_LOG_MS) {
		fprintf(stderr, "perch: accept on port %d failed: %s (%u failed since the last line)%s\n",
			ls->port, strerror(-err), ls->accept_unlogged,
			pause ? "; paused until a socket closes or 100 ms pass" : "");
		ls->accept_logged_at_ms = now;
		ls->accept_unlogged = 0;
	}
	if (pause)
		pause_accepting(ls);
}

void perch__loop_accepted(struct perch__sock *ls, int fd)
{
	if (fd < 0) {
		accept_failed(ls, fd);
		return;
	}
	if (ls->closing) {
		close(fd);
		return;
	}
	struct perch__sock *s = conn_sock_new(ls->loop, fd, &ls->accept_opts);
	if (!s || table_insert(ls->loop, s) != 0) {
		if (s)
			perch_conn_release(s->conn); /* not in the table yet: closes fd inline */
		else
			close(fd);
		return;
	}
	set_nodelay(s);
	ls->loop->be->recv_arm(s);
	struct perch_conn *c = s->conn;
	perch__conn_ref(c); /* the callback's */
	ls->on_accept((struct perch_listener *)ls, c, ls->accept_arg);
}

void perch__loop_connected(struct perch__sock *s, int res)
{
	perch__timer_disarm(&s->connect_timer);
	perch_connect_fn cb = s->on_connected;
	void *arg = s->connect_arg;
	s->on_connected = NULL;
	if (!cb)
		return;
	if (res < 0) {
		start_close(s);
		cb(s->loop, NULL, res, arg);
		return;
	}
	set_nodelay(s);
	if (perch__loop_recv_wanted(s))
		s->loop->be->recv_arm(s);
	perch__conn_ref(s->conn); /* the callback's */
	cb(s->loop, s->conn, 0, arg);
}

/*
 * Its timeout passed and the turn's completions did not answer it:
 * perch__loop_connected closes the socket, and the connect's own
 * completion, when it comes, finds the callback gone.
 */
static void connect_timed_out(struct perch_timer *t, void *arg)
{
	perch__loop_connected(arg, -ETIMEDOUT);
}

static void connect_start(struct perch__sock *s)
{
	/* Posted work that perch_loop_free's last drain runs: no later turn would report it. */
	int err = s->loop->freeing ? -ECANCELED : table_insert(s->loop, s) != 0 ? -ENOMEM : 0;
	if (err) {
		perch_connect_fn cb = s->on_connected;
		void *arg = s->connect_arg;
		struct perch_loop *loop = s->loop;
		perch_conn_release(s->conn); /* not in the table: closes fd, frees s */
		cb(loop, NULL, err, arg);
		return;
	}
	if (s->connect_deadline_ms)
		perch__timer_arm_at(&s->connect_timer, s->connect_deadline_ms, s->opts.connect_timeout_ms);
	s->loop->be->connect(s);
}

static void run_posted_connect(struct perch_loop *loop, struct perch__msg *m)
{
	connect_start((struct perch__sock *)((char *)m - offsetof(struct perch__sock, connect_msg)));
}

/* Numeric host + port -> sockaddr. Returns 0 or -EINVAL. */
static int parse_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len)
{
	if (!host || port < 0 || port > 65535)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)port);
		*len = sizeof(*in4);
		return 0;
	}
	if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
		return 0;
	}
	return -EINVAL;
}

int perch_connect(struct perch_loop *loop, const char *host, int port,
		  const struct perch_conn_opts *opts, perch_connect_fn on_connected, void *arg)
{
	struct sockaddr_storage ss;
	socklen_t len;
	struct perch_conn_opts o;
	if (!loop || !on_connected || port == 0 || parse_addr(host, port, &ss, &len) != 0 ||
	    resolve_opts(opts, &o) != 0)
		return -EINVAL;
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct perch__sock *s = conn_sock_new(loop, fd, &o);
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->peer = ss;
	s->peer_len = len;
	s->on_connected = on_connected;
	s->connect_arg = arg;
	s->connect_deadline_ms = o.connect_timeout_ms ? perch__now_ms() + o.connect_timeout_ms : 0;
	perch_timer_init(&s->connect_timer, loop, connect_timed_out, s);
	if (perch_loop_is_current(loop)) {
		connect_start(s);
		return 0;
	}
	s->connect_msg.run = run_posted_connect;
	inbox_push(loop, &s->connect_msg);
	return 0;
}

/* Puts a listener in the loop's table and starts accepting: 0, -ENOMEM, or -ECANCELED while the loop is freed. */
static int listener_insert(struct perch_loop *loop, struct perch__sock *ls)
{
	/* Run by perch_loop_free's last drain (as connect_start is): nothing would ever close it. */
	if (loop->freeing)
		return -ECANCELED;
	int rc = table_insert(loop, ls);
	if (rc == 0)
		loop->be->accept(ls);
	return rc;
}

/*
 * A listen queued from outside the loop's turns, whose caller already
 * holds the listener. If the insert fails (no room, or the loop is being
 * freed) its socket is closed (nothing would accept on it) and the struct
 * waits on loop->dropped for perch_listener_close or the loop's free.
 */
static void run_posted_listen(struct perch_loop *loop, struct perch__msg *m)
{
	struct perch__sock *ls = (struct perch__sock *)((char *)m - offsetof(struct perch__sock, listen_msg));
	ls->listen_pending = false;
	if (ls->closing) {
		/* Closed inside an earlier turn's callback, before this ran: start_close left it here. */
		close(ls->fd);
		free(ls);
		return;
	}
	int rc = listener_insert(loop, ls);
	if (rc != 0) {
		fprintf(stderr, "perch: listener on port %d dropped: %s\n", ls->port,
			rc == -ECANCELED ? "the loop is being freed" : "out of memory");
		close(ls->fd);
		ls->fd = -1;
		ls->dropped_next = loop->dropped;
		loop->dropped = ls;
	}
}

static int listen_socket(const struct sockaddr_storage *ss, socklen_t len, int *port)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	struct sockaddr_storage bound;
	socklen_t blen = sizeof(bound);
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
	    (ss->ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, SOMAXCONN) != 0 ||
	    getsockname(fd, (struct sockaddr *)&bound, &blen) != 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	*port = ntohs(ss->ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
					       : ((struct sockaddr_in6 *)&bound)->sin6_port);
	return fd;
}

int perch_listen(struct perch_loop *loop, const char *host, int port,
		 const struct perch_conn_opts *opts, perch_accept_fn on_accept, void *arg,
		 struct perch_listener **out)
{
	struct sockaddr_storage ss;
	socklen_t len;
	struct perch_conn_opts o;
	if (!loop || !on_accept || !out || parse_addr(host, port, &ss, &len) != 0 ||
	    resolve_opts(opts, &o) != 0)
		return -EINVAL;
	struct perch_listener *l = calloc(1, sizeof(*l) + loop->be->sock_size);
	if (!l)
		return -ENOMEM;
	struct perch__sock *ls = &l->sk;
	int fd = listen_socket(&ss, len, &ls->port);
	if (fd < 0) {
		free(l);
		return fd;
	}
	ls->loop = loop;
	ls->kind = PERCH__SOCK_LISTENER;
	ls->fd = fd;
	ls->on_accept = on_accept;
	ls->accept_arg = arg;
	ls->accept_opts = o;
	if (perch_loop_is_current(loop)) {
		int rc = listener_insert(loop, ls);
		if (rc != 0) {
			close(fd);
			free(l);
			return rc;
		}
		*out = l;
		return 0;
	}
	/* Marked before *out is: a loop thread that sees l (through the caller's own handoff) sees it pending. */
	ls->listen_pending = true;
	ls->listen_msg.run = run_posted_listen;
	*out = l;
	inbox_push(loop, &ls->listen_msg);
	return 0;
}

int perch_listener_port(const struct perch_listener *l)
{
	return l ? l->sk.port : -EINVAL;
}

static void run_posted_listener_close(struct perch_loop *loop, struct perch__msg *m)
{
	start_close((struct perch__sock *)((char *)m - offsetof(struct perch__sock, close_msg)));
}

int perch_listener_close(struct perch_listener *l)
{
	if (!l)
		return -EINVAL;
	struct perch__sock *ls = &l->sk;
	if (perch_loop_is_current(ls->loop)) {
		start_close(ls);
		return 0;
	}
	ls->close_msg.run = run_posted_listener_close;
	inbox_push(ls->loop, &ls->close_msg);
	return 0;
}

/* ================= the loop ================= */

/* DEFAULT resolves through $PERCH_BACKEND; an unknown name is -EINVAL. */
static int resolve_backend(enum perch_backend *b)
{
	if (*b < PERCH_BACKEND_DEFAULT || *b > PERCH_BACKEND_EPOLL)
		return -EINVAL;
	const char *env = getenv("PERCH_BACKEND");
	if (*b != PERCH_BACKEND_DEFAULT || !env || !*env)
		return 0;
	if (strcmp(env, "uring") == 0 || strcmp(env, "io_uring") == 0)
		*b = PERCH_BACKEND_URING;
	else if (strcmp(env, "epoll") == 0)
		*b = PERCH_BACKEND_EPOLL;
	else
		return -EINVAL;
	return 0;
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
	if (o->sq_entries > 32768 || o->buf_count > 32768 || (o->buf_count & (o->buf_count - 1)) ||
	    o->buf_size > (1u << 20))
		return -EINVAL;
	return resolve_backend(&o->backend);
}

static const char *refusal_cause(int err)
{
	switch (err) {
	case -EPERM: return "not permitted (kernel.io_uring_disabled, seccomp, or a container policy)";
	case -ENOSYS: return "not supported by this kernel";
	case -ENOMEM: return "out of locked memory for the ring (RLIMIT_MEMLOCK)";
	default: return strerror(-err);
	}
}

/*
 * io_uring unless epoll was asked for. A refusal (EPERM, ENOSYS, ENOMEM)
 * is logged in one line; with the default backend the loop then runs on
 * epoll, an explicit io_uring request fails with the error.
 */
static int backend_init(struct perch_loop *loop)
{
	if (loop->opts.backend != PERCH_BACKEND_EPOLL) {
		loop->be = &perch__uring_backend;
		int rc = loop->be->init(loop, &loop->opts);
		bool refused = rc == -EPERM || rc == -ENOSYS || rc == -ENOMEM;
		bool fall_back = refused && loop->opts.backend == PERCH_BACKEND_DEFAULT;
		if (refused)
			fprintf(stderr, "perch: io_uring refused: %s: %s%s\n",
				loop->be_refused_at ? loop->be_refused_at : "setup", refusal_cause(rc),
				fall_back ? "; using epoll" : "");
		if (!fall_back)
			return rc;
	}
	loop->be = &perch__epoll_backend;
	return loop->be->init(loop, &loop->opts);
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
	ck_stack_init(&loop->inbox);
	perch_timer_init(&loop->accept_retry, loop, accept_retry_due, loop);
	loop->opts = o;
	loop->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (loop->wake_fd < 0) {
		int err = -errno;
		free(loop);
		return err;
	}
	int rc = backend_init(loop);
	if (rc != 0) {
		close(loop->wake_fd);
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

/*
 * Whether this thread owns the loop, claiming it if nobody does: the first
 * thread to run a turn (or to free it unrun). A CAS, so two threads
 * starting a new loop at the same moment cannot both take it.
 */
static bool claim_or_own(struct perch_loop *loop, uint32_t tid)
{
	if (perch__load_u32(&loop->owner_tid) == 0 && perch__cas_u32(&loop->owner_tid, 0, tid))
		return true;
	return perch__load_u32(&loop->owner_tid) == tid;
}

bool perch__loop_claim(struct perch_loop *loop)
{
	return claim_or_own(loop, (uint32_t)this_tid());
}

int perch_loop_run_once(struct perch_loop *loop, int timeout_ms)
{
	if (!loop)
		return -EINVAL;
	if (!claim_or_own(loop, (uint32_t)this_tid()))
		return -EEXIST;
	/* From inside one of this loop's callbacks: a nested turn would re-enter dispatch. */
	if (current_loop == loop)
		return -EBUSY;
	struct perch_loop *prev = current_loop;
	current_loop = loop;
	int posted = drain_inbox(loop);
	/* Posted work counts as this turn's events: do not also sleep. */
	int rc = loop->be->poll(loop, posted ? 0 : turn_timeout(loop, timeout_ms));
	perch__timers_expire(loop);
	current_loop = prev;
	return rc < 0 ? rc : rc + posted;
}

int perch_loop_run(struct perch_loop *loop)
{
	if (!loop)
		return -EINVAL;
	while (!perch__xchg_u32(&loop->stop, 0)) {
		int rc = perch_loop_run_once(loop, -1);
		if (rc < 0 && rc != -EINTR)
			return rc;
	}
	return 0;
}

int perch_loop_stop(struct perch_loop *loop)
{
	if (!loop)
		return -EINVAL;
	perch__faa_u32(&loop->posting, 1);
	perch__xchg_u32(&loop->stop, 1);
	wake(loop);
	perch__faa_u32(&loop->posting, (uint32_t)-1);
	return 0;
}

int perch_loop_post(struct perch_loop *loop, perch_loop_fn fn, void *arg)
{
	if (!loop || !fn)
		return -EINVAL;
	struct user_msg *u = malloc(sizeof(*u));
	if (!u)
		return -ENOMEM;
	u->m.run = run_user_msg;
	u->fn = fn;
	u->arg = arg;
	inbox_push(loop, &u->m);
	return 0;
}

/* Closes connections through the core, so parked reads and flushes get their closed result. */
static void close_all(struct perch_loop *loop)
{
	for (uint32_t i = 0; i < loop->cap; i++) {
		struct perch__sock *s = loop->table[i];
		if (!s || s->closing)
			continue;
		if (s->kind == PERCH__SOCK_CONN)
			perch_conn_close(s->conn);
		else
			start_close(s);
	}
}

void perch_loop_free(struct perch_loop *loop)
{
	if (!loop)
		return;
	bool owner = claim_or_own(loop, (uint32_t)this_tid());
	loop->freeing = true;
	if (owner) {
		struct perch_loop *prev = current_loop;
		current_loop = loop;
		drain_inbox(loop);
		close_all(loop);
		/* Every socket leaves the table after its last completion; bounded, in case one never comes. */
		double deadline = perch__now_ms() + FREE_DRAIN_MS;
		while (loop->live > 0 && perch__now_ms() < deadline) {
			int rc = loop->be->poll(loop, 50);
			if (rc < 0 && rc != -EINTR)
				break; /* the backend failed for good: its destroy settles what is left */
			drain_inbox(loop);
			close_all(loop);
		}
		/* A post under way when the free began lands before this last drain, and runs. */
		wait_posters(loop);
		drain_inbox(loop);
		current_loop = prev;
	}
	wait_posters(loop);
	if (loop->live > 0)
		fprintf(stderr, "perch: loop freed with %u sockets still in flight%s: finalized without their last completions\n",
			loop->live, owner ? "" : " (perch_loop_free called off the loop's thread)");
	/* Listeners never inserted (no room, or queued when the free began) and never closed: nothing is in flight for them. */
	while (loop->dropped) {
		struct perch__sock *ls = loop->dropped;
		loop->dropped = ls->dropped_next;
		free(ls);
	}
	perch__timers_unbind_all(loop);
	loop->be->destroy(loop);
	free_txbuf_pool(loop);
	close(loop->wake_fd);
	free(loop->table);
	free(loop->gens);
	free(loop->free_slots);
	free(loop);
}
