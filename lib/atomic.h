/* lib/atomic.h: perch's only door to atomics and futexes: ck_pr normally, __atomic builtins under TSan, ASan and the scheduler. */
#ifndef PERCH_LIB_ATOMIC_H
#define PERCH_LIB_ATOMIC_H

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * Why two mappings: the sanitizers cannot see ck_pr's inline assembly.
 * TSan takes data handed over by a ck_pr CAS for a race, and ASan misses an
 * atomic touching freed memory. Under either, every operation below becomes
 * the equivalent __atomic builtin, which they instrument; in normal builds
 * ck_pr gives the same orderings.
 *
 * Orderings: loads acquire, stores release, read-modify-writes are
 * atomic (seq_cst under TSan). The protocols need three store-load pairs
 * ordered: a producer publishes state with a read-modify-write and then
 * loads the waiter slot; a read claims the slot and then re-checks the
 * state; a flush arms and then re-checks `closed`. Each uses a
 * read-modify-write followed by perch__fence_rmw_then_load(), so an update
 * cannot sit in a store buffer while the other side's re-check misses it
 * (the doc/model tso models check this on x86 memory ordering).
 */
#if defined(__SANITIZE_THREAD__)
#define PERCH_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PERCH_TSAN 1
#endif
#endif
#if defined(PERCH_TSAN) || defined(__SANITIZE_ADDRESS__) || defined(PERCH_SCHED)
#define PERCH_ATOMIC_BUILTINS 1
#endif
/*
 * Under TSan and the scheduler, the inbox stack runs on this header's
 * operations instead of ck's inline assembly, so the tool sees every step
 * of it (the segment fifo always does).
 */
#if defined(PERCH_TSAN) || defined(PERCH_SCHED)
#define PERCH_ATOMIC_VISIBLE 1
#endif

#if !defined(__x86_64__)
/* ck's read-modify-writes are full barriers only on x86; elsewhere the protocols need more fences. */
#error "perch supports x86-64 only for now"
#endif

#ifdef PERCH_ATOMIC_BUILTINS

#define PERCH__A_LOAD(p)        __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define PERCH__A_STORE(p, v)    __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define PERCH__A_XCHG(p, v)     __atomic_exchange_n((p), (v), __ATOMIC_SEQ_CST)
#define PERCH__A_FAA(p, v)      __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define PERCH__A_FOR(p, v)      __atomic_fetch_or((p), (v), __ATOMIC_SEQ_CST)
#define PERCH__A_FAND(p, v)     __atomic_fetch_and((p), (v), __ATOMIC_SEQ_CST)
#define PERCH__A_CAS(p, o, n)   ({ __typeof__(*(p)) o_ = (o); \
	__atomic_compare_exchange_n((p), &o_, (n), false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); })

static inline uintptr_t perch__load_uptr(const uintptr_t *p) { return PERCH__A_LOAD(p); }
static inline void perch__store_uptr(uintptr_t *p, uintptr_t v) { PERCH__A_STORE(p, v); }
static inline bool perch__cas_uptr(uintptr_t *p, uintptr_t o, uintptr_t n) { return PERCH__A_CAS(p, o, n); }
static inline uintptr_t perch__xchg_uptr(uintptr_t *p, uintptr_t v) { return PERCH__A_XCHG(p, v); }

static inline void *perch__load_ptr(void *const *p) { return PERCH__A_LOAD(p); }
static inline void perch__store_ptr(void **p, void *v) { PERCH__A_STORE(p, v); }
static inline void *perch__xchg_ptr(void **p, void *v) { return PERCH__A_XCHG(p, v); }
static inline bool perch__cas_ptr(void **p, void *o, void *n) { return PERCH__A_CAS(p, o, n); }

static inline uint32_t perch__load_u32(const uint32_t *p) { return PERCH__A_LOAD(p); }
static inline void perch__store_u32(uint32_t *p, uint32_t v) { PERCH__A_STORE(p, v); }
static inline bool perch__cas_u32(uint32_t *p, uint32_t o, uint32_t n) { return PERCH__A_CAS(p, o, n); }
static inline uint32_t perch__xchg_u32(uint32_t *p, uint32_t v) { return PERCH__A_XCHG(p, v); }
static inline uint32_t perch__faa_u32(uint32_t *p, uint32_t v) { return PERCH__A_FAA(p, v); }
static inline uint32_t perch__for_u32(uint32_t *p, uint32_t v) { return PERCH__A_FOR(p, v); }

static inline uint8_t perch__load_u8(const uint8_t *p) { return PERCH__A_LOAD(p); }
static inline uint8_t perch__for_u8(uint8_t *p, uint8_t v) { return PERCH__A_FOR(p, v); }
static inline uint8_t perch__fand_u8(uint8_t *p, uint8_t v) { return PERCH__A_FAND(p, v); }

static inline uint64_t perch__load_u64(const uint64_t *p) { return PERCH__A_LOAD(p); }
static inline void perch__store_u64(uint64_t *p, uint64_t v) { PERCH__A_STORE(p, v); }
static inline uint64_t perch__faa_u64(uint64_t *p, uint64_t v) { return PERCH__A_FAA(p, v); }
static inline bool perch__cas_u64(uint64_t *p, uint64_t o, uint64_t n) { return PERCH__A_CAS(p, o, n); }

static inline void perch__cpu_relax(void) { __builtin_ia32_pause(); }

/* Every operation is seq_cst here already. */
static inline void perch__fence_rmw_then_load(void) {}


#else /* ck_pr */

#include <ck_pr.h>

static inline uintptr_t perch__load_uptr(const uintptr_t *p)
{
	uintptr_t v = (uintptr_t)ck_pr_load_ptr((void *const *)p);
	ck_pr_fence_acquire();
	return v;
}
static inline void perch__store_uptr(uintptr_t *p, uintptr_t v)
{
	ck_pr_fence_release();
	ck_pr_store_ptr((void **)p, (void *)v);
}
static inline bool perch__cas_uptr(uintptr_t *p, uintptr_t o, uintptr_t n)
{
	return ck_pr_cas_ptr((void **)p, (void *)o, (void *)n);
}
static inline uintptr_t perch__xchg_uptr(uintptr_t *p, uintptr_t v)
{
	return (uintptr_t)ck_pr_fas_ptr((void **)p, (void *)v);
}

static inline void *perch__load_ptr(void *const *p)
{
	void *v = ck_pr_load_ptr(p);
	ck_pr_fence_acquire();
	return v;
}
static inline void perch__store_ptr(void **p, void *v)
{
	ck_pr_fence_release();
	ck_pr_store_ptr(p, v);
}
static inline void *perch__xchg_ptr(void **p, void *v) { return ck_pr_fas_ptr(p, v); }
static inline bool perch__cas_ptr(void **p, void *o, void *n) { return ck_pr_cas_ptr(p, o, n); }

static inline uint32_t perch__load_u32(const uint32_t *p)
{
	uint32_t v = ck_pr_load_32(p);
	ck_pr_fence_acquire();
	return v;
}
static inline void perch__store_u32(uint32_t *p, uint32_t v)
{
	ck_pr_fence_release();
	ck_pr_store_32(p, v);
}
static inline bool perch__cas_u32(uint32_t *p, uint32_t o, uint32_t n) { return ck_pr_cas_32(p, o, n); }
static inline uint32_t perch__xchg_u32(uint32_t *p, uint32_t v) { return ck_pr_fas_32(p, v); }
static inline uint32_t perch__faa_u32(uint32_t *p, uint32_t v) { return ck_pr_faa_32(p, v); }
static inline uint32_t perch__for_u32(uint32_t *p, uint32_t v)
{
	uint32_t o = ck_pr_load_32(p);
	while (!ck_pr_cas_32_value(p, o, o | v, &o))
		ck_pr_stall();
	return o;
}

static inline uint8_t perch__load_u8(const uint8_t *p)
{
	uint8_t v = ck_pr_load_8(p);
	ck_pr_fence_acquire();
	return v;
}
static inline uint8_t perch__for_u8(uint8_t *p, uint8_t v)
{
	uint8_t o = ck_pr_load_8(p);
	while (!ck_pr_cas_8_value(p, o, (uint8_t)(o | v), &o))
		ck_pr_stall();
	return o;
}
static inline uint8_t perch__fand_u8(uint8_t *p, uint8_t v)
{
	uint8_t o = ck_pr_load_8(p);
	while (!ck_pr_cas_8_value(p, o, (uint8_t)(o & v), &o))
		ck_pr_stall();
	return o;
}

static inline uint64_t perch__load_u64(const uint64_t *p)
{
	uint64_t v = ck_pr_load_64(p);
	ck_pr_fence_acquire();
	return v;
}
static inline void perch__store_u64(uint64_t *p, uint64_t v)
{
	ck_pr_fence_release();
	ck_pr_store_64(p, v);
}
static inline uint64_t perch__faa_u64(uint64_t *p, uint64_t v) { return ck_pr_faa_64(p, v); }
static inline bool perch__cas_u64(uint64_t *p, uint64_t o, uint64_t n) { return ck_pr_cas_64(p, o, n); }

static inline void perch__cpu_relax(void) { ck_pr_stall(); }

/*
 * Orders a read-modify-write before a later load of another word (the
 * store-load pairs of the slot and flush protocols). Free on x86, where
 * lock-prefixed operations are full barriers; ck's LL/SC ones are not.
 */
static inline void perch__fence_rmw_then_load(void) { ck_pr_fence_atomic_load(); }

#endif /* PERCH_ATOMIC_BUILTINS */

/* One step of a wait that lasts a moment: pause, and give the CPU away every 64th time. */
static inline void perch__spin_wait(unsigned *spins)
{
	if (++*spins % 64 == 0)
		sched_yield();
	else
		perch__cpu_relax();
}

/* Sleeps while *addr still equals `seen`, until an absolute CLOCK_MONOTONIC deadline (NULL: none). */
static inline void perch__futex_wait(uint32_t *addr, uint32_t seen, const struct timespec *deadline)
{
	syscall(SYS_futex, addr, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, seen, deadline, NULL,
		FUTEX_BITSET_MATCH_ANY);
}

/* Wakes every sleeper on addr; reads and writes no memory there. */
static inline void perch__futex_wake_all(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
}

#ifdef PERCH_SCHED
/*
 * The stress build's controlled scheduler (stress/sched.c): every operation
 * above first passes a scheduling point named by its call site, where the
 * scheduler may run another of the race's threads; a spin-wait's pause is
 * a yield, and a futex wait blocks the thread until a wake of its address.
 * Threads the scheduler does not control pass straight through. Fences are
 * no points: threads that run one at a time see every store in order.
 */
void perch__sched_point(const char *where);
void perch__sched_yield(const char *where);
bool perch__sched_futex_wait(uint32_t *addr, uint32_t seen, const char *where);
void perch__sched_futex_wake(uint32_t *addr, const char *where);

#define PERCH__STR2(x) #x
#define PERCH__STR(x) PERCH__STR2(x)
#define PERCH__AT __FILE__ ":" PERCH__STR(__LINE__)
/* Inside its own expansion a macro's name is not expanded again: `op` is the function. */
#define PERCH__SCHED(op, ...) (perch__sched_point(PERCH__AT " " #op), op(__VA_ARGS__))

#define perch__load_uptr(...) PERCH__SCHED(perch__load_uptr, __VA_ARGS__)
#define perch__store_uptr(...) PERCH__SCHED(perch__store_uptr, __VA_ARGS__)
#define perch__cas_uptr(...) PERCH__SCHED(perch__cas_uptr, __VA_ARGS__)
#define perch__xchg_uptr(...) PERCH__SCHED(perch__xchg_uptr, __VA_ARGS__)
#define perch__load_ptr(...) PERCH__SCHED(perch__load_ptr, __VA_ARGS__)
#define perch__store_ptr(...) PERCH__SCHED(perch__store_ptr, __VA_ARGS__)
#define perch__xchg_ptr(...) PERCH__SCHED(perch__xchg_ptr, __VA_ARGS__)
#define perch__cas_ptr(...) PERCH__SCHED(perch__cas_ptr, __VA_ARGS__)
#define perch__load_u32(...) PERCH__SCHED(perch__load_u32, __VA_ARGS__)
#define perch__store_u32(...) PERCH__SCHED(perch__store_u32, __VA_ARGS__)
#define perch__cas_u32(...) PERCH__SCHED(perch__cas_u32, __VA_ARGS__)
#define perch__xchg_u32(...) PERCH__SCHED(perch__xchg_u32, __VA_ARGS__)
#define perch__faa_u32(...) PERCH__SCHED(perch__faa_u32, __VA_ARGS__)
#define perch__for_u32(...) PERCH__SCHED(perch__for_u32, __VA_ARGS__)
#define perch__load_u8(...) PERCH__SCHED(perch__load_u8, __VA_ARGS__)
#define perch__for_u8(...) PERCH__SCHED(perch__for_u8, __VA_ARGS__)
#define perch__fand_u8(...) PERCH__SCHED(perch__fand_u8, __VA_ARGS__)
#define perch__load_u64(...) PERCH__SCHED(perch__load_u64, __VA_ARGS__)
#define perch__store_u64(...) PERCH__SCHED(perch__store_u64, __VA_ARGS__)
#define perch__faa_u64(...) PERCH__SCHED(perch__faa_u64, __VA_ARGS__)
#define perch__cas_u64(...) PERCH__SCHED(perch__cas_u64, __VA_ARGS__)
#define perch__spin_wait(spins) (perch__sched_yield(PERCH__AT " spin_wait"), perch__spin_wait(spins))
#define perch__cpu_relax() perch__sched_yield(PERCH__AT " cpu_relax")
#define perch__futex_wait(a, s, d) \
	(perch__sched_futex_wait((a), (s), PERCH__AT " futex_wait") ? (void)0 : perch__futex_wait((a), (s), (d)))
#define perch__futex_wake_all(a) \
	(perch__sched_futex_wake((a), PERCH__AT " futex_wake"), perch__futex_wake_all(a))
#endif /* PERCH_SCHED */

#endif /* PERCH_LIB_ATOMIC_H */
