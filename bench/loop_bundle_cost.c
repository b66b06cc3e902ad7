/* bench/loop_bundle_cost.c: a perch io_uring loop receiving a bulk TCP stream with recv bundles and with recv_bundles_off, side by side: the loop thread's CPU per MiB.
 *
 *   make -C BUILD bench/loop_bundle_cost
 *   BUILD/bench/loop_bundle_cost [MIB [ROUNDS [BUF_SIZE]]]   (defaults: 256 MiB, 7 rounds, 16384)
 *
 * Each round makes an io_uring loop (buffers of BUF_SIZE) on its own
 * thread, accepts one loopback connection, and a thread writes MIB MiB
 * into it in 64 KiB writes; the main thread reads and consumes them
 * through perch_conn_read as they come. Rounds alternate bundles on and
 * off (perch_loop_opts.recv_bundles_off). Reported as medians: the loop
 * thread's CPU per MiB (the kernel's receive work runs there, inside its
 * io_uring_enter), the buffers per completion, the wall rate. Exits 77
 * when the loop cannot take bundles here (io_uring refused, or a kernel
 * before 6.10).
 *
 * A shared machine's figures: compare the columns of one run.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <perch.h>

#include "bench_util.h"

enum { CHUNK = 64 * 1024, MAX_ROUNDS = 31, WAIT_MS = 10000 };

struct run {
	struct perch_loop *loop;
	pthread_t th;
	struct perch_conn *c;        /* accepted; atomic: written by the loop thread */
	struct perch_loop_stats st;
	double cpu_us;               /* the loop thread's, at the round's end */
};

/* The loop's thread: runs it until stopped, then frees it (the ring is bound to this thread). */
static void *loop_main(void *arg)
{
	struct run *r = arg;
	perch_loop_run(r->loop);
	perch_loop_free(r->loop);
	return NULL;
}

static void on_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	(void)l;
	__atomic_store_n(&((struct run *)arg)->c, c, __ATOMIC_RELEASE);
}

/* Posted: the loop's stats and its thread's CPU time, read on it. */
static void measure(void *arg)
{
	struct run *r = arg;
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	r->cpu_us = (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
	perch_loop_stats(r->loop, &r->st);
}

struct writer {
	int fd;
	uint64_t bytes;
};

static void *write_all(void *arg)
{
	struct writer *w = arg;
	static char chunk[CHUNK];
	for (uint64_t left = w->bytes; left > 0;) {
		long n = send(w->fd, chunk, left < CHUNK ? (size_t)left : CHUNK, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		left -= (uint64_t)n;
	}
	shutdown(w->fd, SHUT_WR);
	return NULL;
}

/* Reads and consumes to the end of the stream; the bytes read, or -1. */
static long long read_to_end(struct perch_conn *c)
{
	long long got = 0;
	for (;;) {
		struct perch_read_result r;
		struct perch_vtask_handle h;
		int rc = perch_conn_read(c, &r, &h);
		if (rc == PERCH_PENDING) {
			int64_t v;
			if (perch_vtask_wait(h, WAIT_MS, &v) != 0)
				return -1;
			rc = perch_conn_try_read(c, &r);
			if (rc == -EAGAIN)
				continue;
		}
		if (rc != 0)
			return -1;
		got += (long long)r.len;
		perch_conn_advance(c, r.len, r.len);
		if (r.completed || r.error || r.closed)
			return r.error || r.closed ? -1 : got;
	}
}

/* Posts fn(arg) to the loop and waits (bounded) for it to have run. */
struct posted {
	void (*fn)(void *);
	void *arg;
	int done;
};

static void run_posted(void *p)
{
	struct posted *x = p;
	x->fn(x->arg);
	__atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
}

static int on_loop(struct perch_loop *loop, void (*fn)(void *), void *arg)
{
	struct posted x = { fn, arg, 0 };
	if (perch_loop_post(loop, run_posted, &x) != 0)
		return -1;
	for (int i = 0; i < WAIT_MS && !__atomic_load_n(&x.done, __ATOMIC_ACQUIRE); i++)
		usleep(1000);
	return __atomic_load_n(&x.done, __ATOMIC_ACQUIRE) ? 0 : -1;
}

struct result {
	double cpu_us_per_mib, bundled, mib_per_s; /* bundled: the share of buffers that came in bundles */
	bool bundles;
};

static int round_once(uint64_t bytes, uint32_t buf_size, bool off, struct result *res)
{
	struct run r = { 0 };
	struct perch_loop_opts o = { .backend = PERCH_BACKEND_URING, .buf_size = buf_size, .recv_bundles_off = off };
	struct perch_listener *ls;
	if (perch_loop_new(&o, &r.loop) != 0)
		return 77;
	if (perch_listen(r.loop, "127.0.0.1", 0, NULL, on_accept, &r, &ls) != 0 ||
	    pthread_create(&r.th, NULL, loop_main, &r) != 0)
		return -1;
	int fd = bu_connect("127.0.0.1", perch_listener_port(ls));
	for (int i = 0; i < WAIT_MS && !__atomic_load_n(&r.c, __ATOMIC_ACQUIRE); i++)
		usleep(1000);
	if (fd < 0 || !r.c) {
		fprintf(stderr, "loop_bundle_cost: no loopback connection\n");
		return -1;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* bu_connect leaves it non-blocking */
	struct writer w = { .fd = fd, .bytes = bytes };
	pthread_t wt;
	if (on_loop(r.loop, measure, &r) != 0)
		return -1;
	double cpu0 = r.cpu_us;
	double t0 = (double)bu_now_ns();
	if (pthread_create(&wt, NULL, write_all, &w) != 0)
		return -1;
	long long got = read_to_end(r.c);
	double wall_s = ((double)bu_now_ns() - t0) / 1e9;
	pthread_join(wt, NULL);
	if (on_loop(r.loop, measure, &r) != 0)
		return -1;
	perch_conn_release(r.c);
	perch_listener_close(ls);
	perch_loop_stop(r.loop);
	pthread_join(r.th, NULL);
	close(fd);
	if (got != (long long)bytes) {
		fprintf(stderr, "loop_bundle_cost: %lld of %llu bytes\n", got, (unsigned long long)bytes);
		return -1;
	}
	double mib = (double)bytes / (1 << 20);
	res->cpu_us_per_mib = (r.cpu_us - cpu0) / mib;
	res->bundled = (double)r.st.bundle_bufs / ((double)bytes / buf_size);
	res->mib_per_s = mib / wall_s;
	res->bundles = r.st.recv_bundles != 0;
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t mib = 256, rounds = 7, size = 16384;
	if ((argc > 1 && !bu_parse_u64("loop_bundle_cost", "MIB", argv[1], 1, 1 << 16, &mib)) ||
	    (argc > 2 && !bu_parse_u64("loop_bundle_cost", "ROUNDS", argv[2], 1, MAX_ROUNDS, &rounds)) ||
	    (argc > 3 && !bu_parse_u64("loop_bundle_cost", "BUF_SIZE", argv[3], 512, 1 << 20, &size)))
		return 2;
	double cpu[2][MAX_ROUNDS], share[2][MAX_ROUNDS], rate[2][MAX_ROUNDS];
	for (int i = 0; i < (int)rounds; i++)
		for (int k = 0; k < 2; k++) {
			bool on = (i + k) % 2; /* alternate which goes first */
			struct result r;
			int rc = round_once(mib << 20, (uint32_t)size, !on, &r);
			if (rc == 0 && on && !r.bundles)
				rc = 77;
			if (rc == 77)
				printf("loop_bundle_cost: this loop takes no recv bundles here (io_uring refused, or before 6.10)\n");
			if (rc != 0)
				return rc == 77 ? 77 : 1;
			cpu[on][i] = r.cpu_us_per_mib;
			share[on][i] = r.bundled * 100;
			rate[on][i] = r.mib_per_s;
		}
	printf("loop_bundle_cost: %llu MiB a round, %llu rounds, buffers of %llu bytes (medians)\n",
	       (unsigned long long)mib, (unsigned long long)rounds, (unsigned long long)size);
	printf("%-12s %20s %22s %10s\n", "recv", "loop CPU us/MiB", "buffers in bundles %", "MiB/s");
	for (int k = 0; k < 2; k++)
		printf("%-12s %20.1f %22.1f %10.0f\n", k ? "bundles" : "bundles off", bu_median(cpu[k], (int)rounds),
		       bu_median(share[k], (int)rounds), bu_median(rate[k], (int)rounds));
	return 0;
}
