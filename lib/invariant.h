/* lib/invariant.h: PERCH_ASSERT, for what the code relies on and no input can break: on in debug and sanitizer builds, compiled out otherwise. */
#ifndef PERCH_LIB_INVARIANT_H
#define PERCH_LIB_INVARIANT_H

/*
 * A failed assertion is a bug in perch, never bad input (that gets an
 * -errno): it prints the condition and where, and aborts. On when built
 * with --enable-debug (PERCH_DEBUG) or a sanitizer; otherwise the
 * condition is compiled (so it stays correct) but never evaluated, and the
 * hot paths pay nothing.
 */
#if defined(PERCH_DEBUG) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PERCH_ASSERTIONS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PERCH_ASSERTIONS 1
#endif
#endif

#ifdef PERCH_ASSERTIONS
__attribute__((noreturn, cold)) void perch__assert_failed(const char *cond, const char *file, int line,
							  const char *func);
#define PERCH_ASSERT(cond) \
	(__builtin_expect(!!(cond), 1) ? (void)0 : perch__assert_failed(#cond, __FILE__, __LINE__, __func__))
#else
#define PERCH_ASSERT(cond) ((void)sizeof(!(cond)))
#endif

#endif /* PERCH_LIB_INVARIANT_H */
