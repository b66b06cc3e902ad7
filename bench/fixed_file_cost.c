/* bench/fixed_file_cost.c: what a registered file saves an io_uring send, and what registering and unregistering one costs, in a process whose file table is shared.
 *
 *   make -C BUILD bench/fixed_file_cost
 *   BUILD/bench/fixed_file_cost [SENDS [ROUNDS]]      (defaults: 200000 sends, 7 rounds)
 *
 * Free-standing (liburing only, no perch): the kernel mechanism behind
 * issue "Ahead of raw io_uring"'s registered files, measured before perch
 * builds on it. A second thread waits, as a server's does, so each fd
 * lookup takes a reference. Each round times SENDS sends of 64 bytes over
 * a Unix socketpair (read back in batches), one SQE submitted and reaped
 * per send, by fd and by registered index in turn; then SENDS/10 pairs of
 * io_uring_register_files_update (the socket in, then out), as a
 * connection's accept and close would pay by syscall; then SENDS sends
 * each with a FILES_UPDATE SQE in its submit, as perch pays them. Medians
 * of ns per operation.
 *
 * A wall-clock figure on a shared machine: compare the columns of one run.
 */
#include <errno.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"

enum { MSG = 64, DRAIN_EVERY = 256 };

/* Reads what the sends left in the peer's queue, so the sender never blocks. */
static void drain(int fd)
{
	char buf[65536];
	while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
}

/*
 * How each send names the socket: by fd, by registered index 0, or by fd
 * with an IORING_OP_FILES_UPDATE SQE of index 1 queued ahead of it in the
 * same submit (the socket in, then out, in turn), as perch enters a socket
 * at its second send and removes it at its close. Less BY_FD, the last is
 * what one update adds.
 */
enum how { BY_FD, BY_INDEX, BY_FD_WITH_UPDATE };

/* ns per send of one SQE (two with an update); -1 on a failure. */
static double sends_ns(struct io_uring *ring, int fd, int peer, enum how how, long sends)
{
	static const char msg[MSG];
	static int none = -1;
	int in = fd;
	unsigned sqes = how == BY_FD_WITH_UPDATE ? 2 : 1;
	double t0 = (double)bu_now_ns();
	for (long i = 0; i < sends; i++) {
		if (how == BY_FD_WITH_UPDATE)
			io_uring_prep_files_update(io_uring_get_sqe(ring), i % 2 ? &none : &in, 1, 1);
		struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
		io_uring_prep_send(sqe, how == BY_INDEX ? 0 : fd, msg, sizeof(msg), 0);
		if (how == BY_INDEX)
			sqe->flags |= IOSQE_FIXED_FILE;
		if (io_uring_submit_and_wait(ring, sqes) != (int)sqes)
			return -1;
		for (unsigned k = 0; k < sqes; k++) {
			struct io_uring_cqe *cqe;
			if (io_uring_peek_cqe(ring, &cqe) != 0)
				return -1;
			int res = cqe->res;
			io_uring_cqe_seen(ring, cqe);
			if (res != MSG && !(how == BY_FD_WITH_UPDATE && res == 1))
				return -1;
		}
		if (i % DRAIN_EVERY == DRAIN_EVERY - 1)
			drain(peer);
	}
	double ns = ((double)bu_now_ns() - t0) / (double)sends;
	drain(peer);
	return ns;
}

/* ns per io_uring_register_files_update of index 1 (the socket in, then out: two per pair); -1 on a failure. */
static double updates_ns(struct io_uring *ring, int fd, long pairs)
{
	int in = fd, out = -1;
	double t0 = (double)bu_now_ns();
	for (long i = 0; i < pairs; i++)
		if (io_uring_register_files_update(ring, 1, &in, 1) != 1 ||
		    io_uring_register_files_update(ring, 1, &out, 1) != 1)
			return -1;
	return ((double)bu_now_ns() - t0) / (double)(2 * pairs);
}

int main(int argc, char **argv)
{
	long sends = argc > 1 ? atol(argv[1]) : 200000, rounds = argc > 2 ? atol(argv[2]) : 7;
	if (sends < 10 || rounds < 1 || rounds > 99) {
		fprintf(stderr, "usage: fixed_file_cost [SENDS [ROUNDS]] (SENDS at least 10, ROUNDS 1 to 99)\n");
		return 2;
	}
	int sv[2];
	struct io_uring ring;
	if (bu_second_thread() != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
		fprintf(stderr, "fixed_file_cost: no second thread or socketpair\n");
		return 1;
	}
	int rc = io_uring_queue_init(8, &ring, 0);
	if (rc != 0) {
		fprintf(stderr, "fixed_file_cost: io_uring refused: %s\n", strerror(-rc));
		return 1;
	}
	int files[2] = { sv[0], -1 };
	rc = io_uring_register_files(&ring, files, 2);
	if (rc != 0) {
		fprintf(stderr, "fixed_file_cost: io_uring_register_files refused: %s\n", strerror(-rc));
		return 1;
	}
	double by_fd[99], by_index[99], update[99], with_sqe[99];
	for (long r = 0; r < rounds; r++) {
		by_fd[r] = sends_ns(&ring, sv[0], sv[1], BY_FD, sends);
		by_index[r] = sends_ns(&ring, sv[0], sv[1], BY_INDEX, sends);
		update[r] = updates_ns(&ring, sv[0], sends / 10);
		with_sqe[r] = sends_ns(&ring, sv[0], sv[1], BY_FD_WITH_UPDATE, sends);
		if (by_fd[r] < 0 || by_index[r] < 0 || update[r] < 0 || with_sqe[r] < 0) {
			fprintf(stderr, "fixed_file_cost: a send or an update failed\n");
			return 1;
		}
	}
	double fd_ns = bu_median(by_fd, (int)rounds), index_ns = bu_median(by_index, (int)rounds);
	double update_ns = bu_median(update, (int)rounds), sqe_ns = bu_median(with_sqe, (int)rounds) - fd_ns;
	printf("sends of %d B, %ld per round, %ld rounds, medians (ns per operation)\n", MSG, sends, rounds);
	printf("  send by fd:               %8.1f\n", fd_ns);
	printf("  send by registered index: %8.1f\n", index_ns);
	printf("  saved per send:           %8.1f\n", fd_ns - index_ns);
	printf("  one files update:         %8.1f (a syscall: io_uring_register_files_update)\n", update_ns);
	printf("  one update as an SQE:     %8.1f (FILES_UPDATE beside a send, in its submit: perch's way)\n", sqe_ns);
	if (fd_ns > index_ns) {
		printf("  sends a connection needs to repay two updates: %.0f by syscall, %.0f by SQE\n",
		       2 * update_ns / (fd_ns - index_ns), 2 * sqe_ns / (fd_ns - index_ns));
	}
	io_uring_queue_exit(&ring);
	return 0;
}
