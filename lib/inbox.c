/* lib/inbox.c: which thread runs a loop (the owner's claim, the cached thread id), and the loop's inbox: posts, wakes, stop. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "atomic.h"
#include "loop_internal.h"

/* ================= thread identity: the running loop, the owner ================= */

__thread struct perch_loop *perch__current_loop;

bool perch_loop_is_current(const struct perch_loop *loop)
{
	return perch__loop_is_current(loop);
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

/* ================= inbox: many producers, the loop consumes ================= */

/* Wakes the loop unless a wake is already pending: one eventfd write until the loop drains. */
static void wake(struct perch_loop *loop)
{
	/* Pairs with the exchange in perch__inbox_drain: our push (or stop) is ordered before this. */
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
 * two); under TSan and the scheduler the same Treiber push and batch pop
 * run on lib/atomic.h.
 */
#ifdef PERCH_ATOMIC_VISIBLE
static void inbox_stack_push(ck_stack_t *st, ck_stack_entry_t *e)
{
	ck_stack_entry_t *head;
	do {
		head = perch__load_ptr((void *const *)&st->head);
		e->next = head;
	} while (!perch__cas_ptr((void **)&st->head, head, e));
}

static ck_stack_entry_t *inbox_stack_pop_all(ck_stack_t *st)
{
	return perch__xchg_ptr((void **)&st->head, NULL);
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
void perch__inbox_push(struct perch_loop *loop, struct perch__msg *m)
{
	perch__faa_u32(&loop->posting, 1);
	inbox_stack_push(&loop->inbox, &m->entry);
	wake(loop);
	perch__faa_u32(&loop->posting, (uint32_t)-1);
}

/* Loop thread, in perch_loop_free: posters still writing the eventfd finish first. */
void perch__inbox_wait_posters(struct perch_loop *loop)
{
	unsigned spins = 0;
	while (perch__load_u32(&loop->posting) != 0)
		perch__spin_wait(&spins);
}

bool perch__inbox_has_posts(struct perch_loop *loop)
{
	return perch__load_ptr((void *const *)&loop->inbox.head) != NULL;
}

/* Loop thread. Runs everything posted so far in FIFO order; returns how many ran. */
int perch__inbox_drain(struct perch_loop *loop)
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
		struct perch__msg *m = perch__container_of(fifo, struct perch__msg, entry);
		m->run(loop, m);
		fifo = next;
		n++;
	}
	return n;
}

void perch__loop_woken(struct perch_loop *loop)
{
	perch__inbox_drain(loop);
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

/* A wake without a message: `posting` covers it as it covers a push. */
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
	perch__inbox_push(loop, &u->m);
	return 0;
}

