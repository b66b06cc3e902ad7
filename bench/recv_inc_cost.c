/* bench/recv_inc_cost.c: what incremental buffer consumption (IOU_PBUF_RING_INC) changes for an echo of small messages received by multishot recvs.
 *
 *   make -C BUILD bench/recv_inc_cost
 *   BUILD/bench/recv_inc_cost [CONNS [TRIPS [SIZE [ROUNDS]]]]   (defaults: 50, 20000, 64, 7)
 *
 * Free-standing (liburing only, no perch): the kernel mechanism behind
 * issue "Ahead of raw io_uring"'s incremental buffers, measured before
 * perch builds on it. Each round opens CONNS loopback TCP connections. A
 * client thread writes SIZE bytes on each, then reads each one's echo,
 * TRIPS times. The main thread echoes them: one multishot recv per
 * connection over a ring of 64 provided buffers of 16 KiB (perch's warm
 * ring), the bytes copied out and sent back, the buffer given back as soon
 * as the kernel is done with it. Rounds alternate between a ring whose
 * receives each take a whole buffer and one registered with
 * IOU_PBUF_RING_INC (Linux 6.12), where a receive takes only the bytes it
 * needs and the next continues in the same buffer
 * (IORING_CQE_F_BUF_MORE). It reports, as medians over the rounds, the
 * echoing thread's CPU time per message (user and kernel: DEFER_TASKRUN
 * runs the receives on it), buffers given back per 1,000 messages, and
 * messages per second. Exits 77 when the kernel refuses the flag.
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

/* liburing 2.3's headers predate incremental consumption (kernel 6.12). */
#ifndef IOU_PBUF_RING_INC
#define IOU_PBUF_RING_INC 2
#endif
#ifndef IORING_CQE_F_BUF_MORE
#define IORING_CQE_F_BUF_MORE (1U << 4)
#endif

enum { NBUFS = 64, BUF_SIZE = 16384, MAX_CONNS = 512, MAX_SIZE = 8192, MAX_ROUNDS = 31 };
enum { UD_RECV = 1, UD_SEND = 2 }; /* user_data: kind << 32 | connection */

struct bufring {
	struct bu_bufring ring;
	uint32_t off[NBUFS];         /* bytes the kernel has filled of each (incremental only) */
	int bgid;
	bool inc;
};

static void give_back(struct bufring *b, uint32_t bid, int i)
{
	b->off[bid] = 0;
	bu_bufring_add(&b->ring, bid, i);
}

static int bufring_setup(struct io_uring *ring, struct bufring *b, int bgid, bool inc)
{
	b->bgid = bgid;
	b->inc = inc;
	return bu_bufring_setup(ring, &b->ring, NBUFS, BUF_SIZE, bgid, inc ? IOU_PBUF_RING_INC : 0);
}

struct client {
	int fds[MAX_CONNS];
	int conns, size;
	uint64_t trips;
	int failed;
};

/* Blocking: SIZE bytes out on each connection, then each one's echo back, TRIPS times; then closes them. */
static void *client_run(void *arg)
{
	struct client *c = arg;
	char out[MAX_SIZE], in[MAX_SIZE];
	memset(out, 'x', sizeof(out));
	for (uint64_t t = 0; t < c->trips && !c->failed; t++) {
		for (int i = 0; i < c->conns && !c->failed; i++)
			if (bu_send(c->fds[i], out, (size_t)c->size) != c->size)
				c->failed = 1;
		for (int i = 0; i < c->conns && !c->failed; i++)
			for (int got = 0; got < c->size;) {
				long n = recv(c->fds[i], in + got, (size_t)(c->size - got), 0);
				if (n < 0 && errno == EINTR)
					continue;
				if (n <= 0) {
					c->failed = 1;
					break;
				}
				got += (int)n;
			}
	}
	for (int i = 0; i < c->conns; i++)
		close(c->fds[i]);
	return NULL;
}

struct server {
	struct io_uring *ring;
	struct bufring *b;
	int fds[MAX_CONNS];
	char echo[MAX_CONNS][MAX_SIZE];
	int open;
	uint64_t msgs_bytes, given_back;
	int failed;
};

static struct io_uring_sqe *sqe_get(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	return sqe;
}

static void arm_recv(struct server *sv, int i)
{
	struct io_uring_sqe *sqe = sqe_get(sv->ring);
	io_uring_prep_recv_multishot(sqe, sv->fds[i], NULL, 0, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = (uint16_t)sv->b->bgid;
	io_uring_sqe_set_data64(sqe, (uint64_t)UD_RECV << 32 | (uint32_t)i);
}

/*
 * A receive's bytes: where the kernel put them (a whole buffer's start,
 * or, incrementally, where the last receive into it stopped), copied out
 * and sent back; the buffer goes back once the kernel is done with it.
 * Returns how many buffers went back (0 or 1).
 */
static int on_recv(struct server *sv, int i, int res, uint32_t flags, int added)
{
	struct bufring *b = sv->b;
	uint32_t bid = flags >> IORING_CQE_BUFFER_SHIFT;
	const char *data = b->ring.mem + (size_t)bid * BUF_SIZE + b->off[bid];
	int n = res < MAX_SIZE ? res : MAX_SIZE; /* the client waits for its echo: never more than SIZE */
	memcpy(sv->echo[i], data, (size_t)n);
	struct io_uring_sqe *sqe = sqe_get(sv->ring);
	io_uring_prep_send(sqe, sv->fds[i], sv->echo[i], (size_t)n, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, (uint64_t)UD_SEND << 32 | (uint32_t)i);
	sv->msgs_bytes += (uint64_t)res;
	if (b->inc && (flags & IORING_CQE_F_BUF_MORE)) {
		b->off[bid] += (uint32_t)res;
		return 0;
	}
	give_back(b, bid, added);
	return 1;
}

/* One completion; returns the buffers it gave back. */
static int on_cqe(struct server *sv, const struct io_uring_cqe *cqe, int added)
{
	int i = (int)(uint32_t)cqe->user_data, got = 0;
	if ((cqe->user_data >> 32) == UD_SEND) {
		if (cqe->res < 0)
			sv->failed = 1;
		return 0;
	}
	if ((cqe->flags & IORING_CQE_F_BUFFER) && cqe->res > 0)
		got = on_recv(sv, i, cqe->res, cqe->flags, added);
	else if (cqe->res == 0)
		sv->open--;
	else if (cqe->res != -ENOBUFS)
		sv->failed = 1;
	if (!(cqe->flags & IORING_CQE_F_MORE) && cqe->res != 0 && !sv->failed)
		arm_recv(sv, i);
	return got;
}

struct result {
	double cpu_ns_per_msg, back_per_kmsg, msgs_per_s;
};

/* CONNS connections to `lfd`, each end's fd in cl and sv. 0, or -1 after saying why. */
static int open_conns(int lfd, int port, int conns, struct client *cl, struct server *sv)
{
	for (int i = 0; i < conns; i++) {
		cl->fds[i] = bu_connect("127.0.0.1", port);
		sv->fds[i] = -1;
		for (int k = 0; cl->fds[i] >= 0 && sv->fds[i] < 0 && k < 1000; k++)
			if ((sv->fds[i] = accept(lfd, NULL, NULL)) < 0)
				usleep(1000);
		if (cl->fds[i] < 0 || sv->fds[i] < 0) {
			fprintf(stderr, "recv_inc_cost: no loopback connection\n");
			return -1;
		}
		fcntl(cl->fds[i], F_SETFL, fcntl(cl->fds[i], F_GETFL) & ~O_NONBLOCK); /* bu_connect leaves it non-blocking */
		bu_set_nodelay(cl->fds[i]);
		bu_set_nodelay(sv->fds[i]);
	}
	return 0;
}

/* One round on ring `b`: the echo of CONNS x TRIPS messages. 0, or -1 after saying why. */
static int round_once(struct io_uring *ring, struct bufring *b, int lfd, int port, int conns, uint64_t trips,
		      int size, struct result *r)
{
	static struct client cl;
	static struct server sv;
	cl = (struct client){ .conns = conns, .size = size, .trips = trips };
	sv = (struct server){ .ring = ring, .b = b, .open = conns };
	if (open_conns(lfd, port, conns, &cl, &sv) != 0)
		return -1;
	for (int i = 0; i < conns; i++)
		arm_recv(&sv, i);
	pthread_t th;
	if (pthread_create(&th, NULL, client_run, &cl) != 0)
		return -1;
	double cpu0 = bu_thread_cpu_ns(), t0 = (double)bu_now_ns();
	while (sv.open > 0 && !sv.failed) {
		if (io_uring_submit_and_wait(ring, 1) < 0)
			sv.failed = 1;
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		int added = 0;
		io_uring_for_each_cqe(ring, head, cqe) {
			seen++;
			added += on_cqe(&sv, cqe, added);
		}
		io_uring_buf_ring_advance(b->ring.br, added);
		sv.given_back += (uint64_t)added;
		io_uring_cq_advance(ring, seen);
	}
	double cpu = bu_thread_cpu_ns() - cpu0, wall_s = ((double)bu_now_ns() - t0) / 1e9;
	pthread_join(th, NULL);
	for (int i = 0; i < conns; i++)
		close(sv.fds[i]);
	io_uring_submit_and_wait(ring, 0); /* the closed connections' last completions */
	struct io_uring_cqe *cqe;
	while (io_uring_peek_cqe(ring, &cqe) == 0) {
		if ((cqe->flags & IORING_CQE_F_BUFFER) && !(b->inc && (cqe->flags & IORING_CQE_F_BUF_MORE))) {
			give_back(b, cqe->flags >> IORING_CQE_BUFFER_SHIFT, 0);
			io_uring_buf_ring_advance(b->ring.br, 1);
		}
		io_uring_cqe_seen(ring, cqe);
	}
	uint64_t msgs = (uint64_t)conns * trips;
	if (sv.failed || cl.failed || sv.msgs_bytes != msgs * (uint64_t)size) {
		fprintf(stderr, "recv_inc_cost: the echo failed (%llu of %llu bytes)\n", (unsigned long long)sv.msgs_bytes,
			(unsigned long long)(msgs * (uint64_t)size));
		return -1;
	}
	*r = (struct result){ cpu / (double)msgs, (double)sv.given_back * 1000 / (double)msgs, (double)msgs / wall_s };
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t conns = 50, trips = 20000, size = 64, rounds = 7;
	if ((argc > 1 && !bu_parse_u64("recv_inc_cost", "CONNS", argv[1], 1, MAX_CONNS, &conns)) ||
	    (argc > 2 && !bu_parse_u64("recv_inc_cost", "TRIPS", argv[2], 1, 1 << 24, &trips)) ||
	    (argc > 3 && !bu_parse_u64("recv_inc_cost", "SIZE", argv[3], 1, MAX_SIZE, &size)) ||
	    (argc > 4 && !bu_parse_u64("recv_inc_cost", "ROUNDS", argv[4], 1, MAX_ROUNDS, &rounds)))
		return 2;
	struct io_uring ring;
	struct io_uring_params p = { .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN };
	int rc = io_uring_queue_init_params(1024, &ring, &p);
	if (rc != 0) {
		fprintf(stderr, "recv_inc_cost: io_uring_queue_init: %s\n", strerror(-rc));
		return 1;
	}
	static struct bufring b[2];
	if ((rc = bufring_setup(&ring, &b[0], 1, false)) != 0) {
		fprintf(stderr, "recv_inc_cost: buffer ring: %s\n", strerror(-rc));
		return 1;
	}
	if ((rc = bufring_setup(&ring, &b[1], 2, true)) != 0) {
		printf("recv_inc_cost: the kernel refused an incremental buffer ring (%s): Linux 6.12+\n", strerror(-rc));
		return 77;
	}
	int port, lfd = bu_listen_loopback("recv_inc_cost", 1024, &port);
	if (lfd < 0)
		return 1;
	double cpu[2][MAX_ROUNDS], back[2][MAX_ROUNDS], rate[2][MAX_ROUNDS];
	for (int i = 0; i < (int)rounds; i++)
		for (int k = 0; k < 2; k++) {
			int inc = (i + k) % 2; /* alternate which goes first */
			struct result r;
			if (round_once(&ring, &b[inc], lfd, port, (int)conns, trips, (int)size, &r) != 0)
				return 1;
			cpu[inc][i] = r.cpu_ns_per_msg;
			back[inc][i] = r.back_per_kmsg;
			rate[inc][i] = r.msgs_per_s;
		}
	printf("recv_inc_cost: %llu connections x %llu round trips of %llu bytes, %llu rounds, 64 buffers of %d bytes (medians)\n",
	       (unsigned long long)conns, (unsigned long long)trips, (unsigned long long)size, (unsigned long long)rounds,
	       BUF_SIZE);
	printf("%-12s %20s %22s %12s\n", "buffers", "echo CPU ns/message", "given back/1000 msgs", "messages/s");
	for (int k = 0; k < 2; k++)
		printf("%-12s %20.0f %22.1f %12.0f\n", k ? "incremental" : "whole", bu_median(cpu[k], (int)rounds),
		       bu_median(back[k], (int)rounds), bu_median(rate[k], (int)rounds));
	io_uring_queue_exit(&ring);
	close(lfd);
	return 0;
}
