/* bench/recv_bundle_cost.c: what a recv bundle (one completion for several provided buffers) saves a multishot receive of a bulk TCP stream.
 *
 *   make -C BUILD bench/recv_bundle_cost
 *   BUILD/bench/recv_bundle_cost [MIB [ROUNDS [BUF_SIZE]]]   (defaults: 256 MiB, 7 rounds, 16384)
 *
 * Free-standing (liburing only, no perch): the kernel mechanism behind
 * issue "Ahead of raw io_uring"'s recv bundles, measured before perch
 * builds on it. Each round opens a loopback TCP connection; a thread
 * sends MIB MiB down it in 64 KiB writes and closes; the main thread
 * receives them with one multishot recv over a ring of 64 provided buffers
 * of BUF_SIZE bytes (perch's warm ring), with and without
 * IORING_RECVSEND_BUNDLE in turn, giving each buffer back as soon as its
 * completion is seen. It reports, as medians over the rounds, the
 * receiving thread's CPU time per MiB, completions per MiB and the wall
 * rate. Exits 77 when the kernel has no bundles (before 6.10).
 *
 * A shared machine's figures: compare the columns of one run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_bufring.h"
#include "bench_util.h"

/* liburing 2.3's headers predate bundles (kernel 6.10). */
#ifndef IORING_RECVSEND_BUNDLE
#define IORING_RECVSEND_BUNDLE (1U << 4)
#endif
#ifndef IORING_FEAT_RECVSEND_BUNDLE
#define IORING_FEAT_RECVSEND_BUNDLE (1U << 14)
#endif

enum { NBUFS = 64, BGID = 1, CHUNK = 64 * 1024, MAX_ROUNDS = 31 };

struct sender {
	int fd;
	uint64_t bytes;
};

/* Sends `bytes` in CHUNK writes, then closes: the receiver reads the end. */
static void *send_all(void *arg)
{
	struct sender *s = arg;
	static char chunk[CHUNK];
	fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) & ~O_NONBLOCK); /* bu_connect leaves it non-blocking */
	for (uint64_t left = s->bytes; left > 0;) {
		long n = send(s->fd, chunk, left < CHUNK ? (size_t)left : CHUNK, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		left -= (uint64_t)n;
	}
	close(s->fd);
	return NULL;
}

static int arm(struct io_uring *ring, int fd, bool bundle)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = BGID;
	if (bundle)
		sqe->ioprio |= IORING_RECVSEND_BUNDLE;
	return 0;
}

struct result {
	double cpu_us_per_mib, cqes_per_mib, mib_per_s;
};

/*
 * One round: receives everything a sender thread writes into a new
 * connection. The buffers a completion took are the ring's next ones in
 * order (ids follow each other: each goes back to the tail as it is seen).
 * 0, or -1 after saying why.
 */
static int round_once(struct io_uring *ring, struct bu_bufring *b, int lfd, int port, uint64_t bytes, bool bundle,
		      uint32_t *next_bid, struct result *r)
{
	int cfd = bu_connect("127.0.0.1", port), afd = -1;
	for (int i = 0; cfd >= 0 && afd < 0 && i < 1000; i++)
		if ((afd = accept(lfd, NULL, NULL)) < 0)
			usleep(1000);
	if (cfd < 0 || afd < 0) {
		fprintf(stderr, "recv_bundle_cost: no loopback connection\n");
		return -1;
	}
	struct sender s = { .fd = cfd, .bytes = bytes };
	pthread_t th;
	if (pthread_create(&th, NULL, send_all, &s) != 0)
		return -1;
	double cpu0 = bu_thread_cpu_ns(), t0 = (double)bu_now_ns();
	uint64_t got = 0, cqes = 0;
	bool done = false;
	int rc = arm(ring, afd, bundle);
	while (rc == 0 && !done) {
		if (io_uring_submit_and_wait(ring, 1) < 0)
			rc = -1;
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		int added = 0;
		io_uring_for_each_cqe(ring, head, cqe) {
			seen++;
			cqes++;
			int res = cqe->res;
			if ((cqe->flags & IORING_CQE_F_BUFFER) && res > 0) {
				uint32_t bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
				if (bid != *next_bid) {
					fprintf(stderr, "recv_bundle_cost: buffer %u, not %u, came next\n", bid, *next_bid);
					rc = -1;
				}
				for (int left = res; left > 0; left -= (int)b->size) {
					bu_bufring_add(b, *next_bid, added++);
					*next_bid = (*next_bid + 1) % NBUFS;
				}
				got += (uint64_t)res;
			} else if (res == 0) {
				done = true;
			} else if (res != -ENOBUFS) {
				fprintf(stderr, "recv_bundle_cost: recv: %s\n", strerror(-res));
				rc = -1;
			}
			if (!(cqe->flags & IORING_CQE_F_MORE) && !done && rc == 0)
				rc = arm(ring, afd, bundle);
		}
		io_uring_buf_ring_advance(b->br, added);
		io_uring_cq_advance(ring, seen);
	}
	double cpu = (bu_thread_cpu_ns() - cpu0) / 1e3, wall_s = ((double)bu_now_ns() - t0) / 1e9;
	pthread_join(th, NULL);
	close(afd);
	if (rc != 0 || got != bytes) {
		if (rc == 0)
			fprintf(stderr, "recv_bundle_cost: %llu of %llu bytes\n", (unsigned long long)got,
				(unsigned long long)bytes);
		return -1;
	}
	double mib = (double)bytes / (1 << 20);
	*r = (struct result){ cpu / mib, (double)cqes / mib, mib / wall_s };
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t mib = 256, rounds = 7, size = 16384;
	if ((argc > 1 && !bu_parse_u64("recv_bundle_cost", "MIB", argv[1], 1, 1 << 16, &mib)) ||
	    (argc > 2 && !bu_parse_u64("recv_bundle_cost", "ROUNDS", argv[2], 1, MAX_ROUNDS, &rounds)) ||
	    (argc > 3 && !bu_parse_u64("recv_bundle_cost", "BUF_SIZE", argv[3], 512, 1 << 20, &size)))
		return 2;
	struct io_uring ring;
	struct io_uring_params p = { .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN };
	int rc = io_uring_queue_init_params(64, &ring, &p);
	if (rc != 0) {
		fprintf(stderr, "recv_bundle_cost: io_uring_queue_init: %s\n", strerror(-rc));
		return 1;
	}
	if (!(p.features & IORING_FEAT_RECVSEND_BUNDLE)) {
		printf("recv_bundle_cost: this kernel has no recv bundles (6.10+)\n");
		return 77;
	}
	struct bu_bufring b;
	if ((rc = bu_bufring_setup(&ring, &b, NBUFS, (uint32_t)size, BGID, 0)) != 0) {
		fprintf(stderr, "recv_bundle_cost: buffer ring: %s\n", strerror(-rc));
		return 1;
	}
	int port, lfd = bu_listen_loopback("recv_bundle_cost", 16, &port);
	if (lfd < 0)
		return 1;
	double cpu[2][MAX_ROUNDS], cq[2][MAX_ROUNDS], rate[2][MAX_ROUNDS];
	uint32_t next_bid = 0;
	for (int i = 0; i < (int)rounds; i++)
		for (int k = 0; k < 2; k++) {
			bool bundle = (i + k) % 2; /* alternate which goes first */
			struct result r;
			if (round_once(&ring, &b, lfd, port, mib << 20, bundle, &next_bid, &r) != 0)
				return 1;
			cpu[bundle][i] = r.cpu_us_per_mib;
			cq[bundle][i] = r.cqes_per_mib;
			rate[bundle][i] = r.mib_per_s;
		}
	printf("recv_bundle_cost: %llu MiB a round, %llu rounds, 64 buffers of %llu bytes (medians)\n",
	       (unsigned long long)mib, (unsigned long long)rounds, (unsigned long long)size);
	printf("%-10s %18s %18s %12s\n", "recv", "receiver CPU us/MiB", "completions/MiB", "MiB/s");
	for (int k = 0; k < 2; k++)
		printf("%-10s %18.1f %18.1f %12.0f\n", k ? "bundle" : "one each", bu_median(cpu[k], (int)rounds),
		       bu_median(cq[k], (int)rounds), bu_median(rate[k], (int)rounds));
	io_uring_queue_exit(&ring);
	close(lfd);
	return 0;
}
