/* tests/test_uring_enomem.c: an io_uring setup out of memory is diagnosed truthfully (RLIMIT_MEMLOCK only when it is the cause, the receive buffers as memory) and falls back to epoll. */
#include "config.h"

#include <errno.h>
#include <linux/capability.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmocka_prelude.h"
#include <perch.h>

/* ---- the liburing calls, wrapped: a chosen one fails with ENOMEM ---- */

int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int __real_io_uring_register_buf_ring(struct io_uring *ring, struct io_uring_buf_reg *reg, unsigned flags);

static bool fail_ring, fail_buf_ring;

int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
	return fail_ring ? -ENOMEM : __real_io_uring_queue_init_params(entries, ring, p);
}

int __wrap_io_uring_register_buf_ring(struct io_uring *ring, struct io_uring_buf_reg *reg, unsigned flags)
{
	return fail_buf_ring ? -ENOMEM : __real_io_uring_register_buf_ring(ring, reg, flags);
}

int __real_posix_memalign(void **out, size_t align, size_t size);

static bool fail_bufs_once; /* the next posix_memalign of the default receive buffers (512 x 16 KiB) */

int __wrap_posix_memalign(void **out, size_t align, size_t size)
{
	if (fail_bufs_once && size == 512u * 16384u) {
		fail_bufs_once = false;
		return ENOMEM;
	}
	return __real_posix_memalign(out, align, size);
}

/* ---- a child with its own limits, its stderr captured ---- */

/* Drops CAP_IPC_LOCK from the effective set (root has it: it lifts RLIMIT_MEMLOCK). */
static int drop_ipc_lock(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &h, d) != 0)
		return -errno;
	d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	return syscall(SYS_capset, &h, d) == 0 ? 0 : -errno;
}

/* RLIMIT_MEMLOCK set to `bytes` (lowering needs no privilege), without CAP_IPC_LOCK. */
static int limit_memlock(rlim_t bytes)
{
	struct rlimit rl = { bytes, bytes };
	if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
		return -errno;
	return drop_ipc_lock();
}

/* A default loop: 0 when it came up on epoll, 1 on io_uring, 2 when it failed. */
static int new_default_loop(void)
{
	struct perch_loop *loop = NULL;
	unsetenv("PERCH_BACKEND");
	if (perch_loop_new(NULL, &loop) != 0)
		return 2;
	int rc = strcmp(perch_loop_backend_name(loop), "epoll") == 0 ? 0 : 1;
	perch_loop_free(loop);
	return rc;
}

/* Runs fn in a child, its stderr into buf; returns its exit status. */
static int in_child(int (*fn)(void), char *buf, size_t cap)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], STDERR_FILENO);
		_exit(fn());
	}
	close(fds[1]);
	size_t got = 0;
	ssize_t r;
	while (got < cap - 1 && (r = read(fds[0], buf + got, cap - 1 - got)) > 0)
		got += (size_t)r;
	buf[got] = '\0';
	close(fds[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/* ---- the children ---- */

/* ENOMEM from the ring's setup with RLIMIT_MEMLOCK as it is (at least 64 KiB, or lifted). */
static int ring_enomem_with_room(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (64u << 10)))
		return 3;
	fail_ring = true;
	return new_default_loop();
}

/* ENOMEM from the ring's setup under a 16 KiB limit: a 256-entry ring needs 28 KiB. */
static int ring_enomem_over_memlock(void)
{
	if (limit_memlock(16u << 10) != 0)
		return 3;
	fail_ring = true;
	return new_default_loop();
}

/* ENOMEM from the buffer ring's registration, the limit as it is. */
static int buf_ring_enomem_with_room(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (64u << 10)))
		return 3;
	fail_buf_ring = true;
	return new_default_loop();
}

/* ENOMEM from the buffer ring's registration under a 32 KiB limit: ring and buffer ring need 36 KiB. */
static int buf_ring_enomem_over_memlock(void)
{
	if (limit_memlock(32u << 10) != 0)
		return 3;
	fail_buf_ring = true;
	return new_default_loop();
}

/* Nothing forced: the kernel itself, under a 16 KiB limit. */
static int ring_under_a_small_memlock(void)
{
	if (limit_memlock(16u << 10) != 0)
		return 3;
	return new_default_loop();
}

/* The io_uring backend's receive buffers refused by the allocator (as under prlimit --as): epoll's are not. */
static int receive_buffers_refused(void)
{
	fail_bufs_once = true;
	return new_default_loop();
}

/* ---- the tests ---- */

static void an_enomem_with_memlock_room_is_out_of_memory(void **state)
{
	char buf[1024];
	assert_int_equal(in_child(ring_enomem_with_room, buf, sizeof(buf)), 0);
	print_message("%s", buf);
	assert_non_null(strstr(buf, "perch: io_uring refused: io_uring_queue_init: out of memory"));
	assert_null(strstr(buf, "locked-memory limit"));
	assert_non_null(strstr(buf, "; using epoll\n"));
}

static void an_enomem_over_the_memlock_limit_names_it(void **state)
{
	char buf[1024];
	assert_int_equal(in_child(ring_enomem_over_memlock, buf, sizeof(buf)), 0);
	print_message("%s", buf);
	assert_non_null(strstr(buf, "perch: io_uring refused: io_uring_queue_init: over the locked-memory limit: "
				    "the ring needs 28 KiB, RLIMIT_MEMLOCK allows 16 KiB"));
	assert_non_null(strstr(buf, "; using epoll\n"));
}

static void a_buffer_ring_enomem_with_memlock_room_is_out_of_memory(void **state)
{
	char buf[1024];
	assert_int_equal(in_child(buf_ring_enomem_with_room, buf, sizeof(buf)), 0);
	print_message("%s", buf);
	assert_non_null(strstr(buf, "perch: io_uring refused: io_uring_register_buf_ring: out of memory"));
	assert_null(strstr(buf, "locked-memory limit"));
	assert_non_null(strstr(buf, "; using epoll\n"));
}

static void a_buffer_ring_enomem_over_the_memlock_limit_names_it(void **state)
{
	char buf[1024];
	assert_int_equal(in_child(buf_ring_enomem_over_memlock, buf, sizeof(buf)), 0);
	print_message("%s", buf);
	assert_non_null(strstr(buf, "perch: io_uring refused: io_uring_register_buf_ring: over the locked-memory "
				    "limit: the ring needs 36 KiB, RLIMIT_MEMLOCK allows 32 KiB"));
	assert_non_null(strstr(buf, "; using epoll\n"));
}

static void receive_buffers_refused_by_the_allocator_are_out_of_memory(void **state)
{
	char buf[1024];
	assert_int_equal(in_child(receive_buffers_refused, buf, sizeof(buf)), 0);
	print_message("%s", buf);
	assert_string_equal(buf, "perch: io_uring refused: the receive buffers' allocation: out of memory; using epoll\n");
}

/*
 * Without a forced failure, a 16 KiB limit: a kernel that charges rings to
 * RLIMIT_MEMLOCK (6.18 does) refuses the ring and the line names the limit;
 * one that charges the memory cgroup instead runs io_uring, silently.
 */
static void a_real_ring_over_a_small_memlock_is_named_or_runs(void **state)
{
	char buf[1024];
	int rc = in_child(ring_under_a_small_memlock, buf, sizeof(buf));
	print_message("%s", rc == 1 ? "io_uring runs: this kernel does not charge rings to RLIMIT_MEMLOCK\n" : buf);
	assert_true(rc == 0 || rc == 1);
	if (rc == 0)
		assert_non_null(strstr(buf, "over the locked-memory limit: the ring needs 28 KiB, RLIMIT_MEMLOCK allows 16 KiB"));
	else
		assert_string_equal(buf, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(an_enomem_with_memlock_room_is_out_of_memory),
		cmocka_unit_test(an_enomem_over_the_memlock_limit_names_it),
		cmocka_unit_test(a_buffer_ring_enomem_with_memlock_room_is_out_of_memory),
		cmocka_unit_test(a_buffer_ring_enomem_over_the_memlock_limit_names_it),
		cmocka_unit_test(receive_buffers_refused_by_the_allocator_are_out_of_memory),
		cmocka_unit_test(a_real_ring_over_a_small_memlock_is_named_or_runs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
