/* bench/baseline_uring_echo.c: a minimal echo server on raw liburing, no perch: the io_uring baseline perch's echo is measured against.
 *
 * What a competent hand-written server does, and no more: one thread, one ring
 * (single issuer and deferred task running where the kernel has them),
 * multishot accept, multishot recv into a provided-buffer ring mapped by hand
 * (liburing 2.3 has no io_uring_setup_buf_ring), and the received buffers
 * sent back as they are (no copy), one send in flight per connection that
 * gathers every queued buffer (sendmsg), a short send resumed where it
 * stopped, and each buffer handed back to the kernel once its bytes are sent.
 * Nagle's algorithm stays on, the kernel's default; --nodelay sets
 * TCP_NODELAY on the listener, which its accepted sockets inherit.
 *
 * Usage: baseline_uring_echo [--host 127.0.0.1] [--port 7000] [--bufs 512] [--buf-size 16384] [--nodelay]
 *        [--unix PATH] (a Unix socket instead of TCP; --nodelay does not apply)
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bench_util.h"

#define BGID      1
#define MAX_IOV   32  /* buffers one sendmsg gathers */

enum op { OP_ACCEPT = 1, OP_RECV, OP_SEND };

/* A received buffer waiting to be echoed: bytes [off, off + len) of buffer bid. */
struct pend {
	uint16_t bid;
	uint32_t off, len;
};

struct conn {
	int fd;
	bool recv_armed, send_inflight, starved;
	bool peer_done;   /* EOF: finish sending what is queued, then close */
	bool failed;      /* error: drop what is queued, close when nothing is in flight */
	struct pend *q;   /* FIFO ring of cap entries */
	uint32_t q_head, q_len, q_cap;
	uint32_t iov_n;   /* entries the send in flight covers */
	struct iovec iov[MAX_IOV];
	struct msghdr msg;
	struct conn *next_starved;
};

static struct {
	struct io_uring ring;
	struct io_uring_buf_ring *br;
	size_t br_bytes;
	char *bufs;
	uint32_t nbufs, buf_size, returned;  /* returned: entries added since the last publish */
	int listen_fd;
	struct conn **conns;                 /* by fd */
	size_t nconns;
	struct conn *starved;                /* conns whose recv ended for want of buffers */
} S;

static uint64_t tag(enum op op, int fd)
{
	return (uint64_t)op << 32 | (uint32_t)fd;
}

/* An SQE, submitting what is queued first when the ring is full. */
static struct io_uring_sqe *sqe_get(void)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&S.ring);
	if (!sqe) {
		io_uring_submit(&S.ring);
		sqe = io_uring_get_sqe(&S.ring);
	}
	return sqe;
}

/* ---- the provided-buffer ring ---- */

/* Queues buffer bid for the kernel; publish_buffers makes the batch visible with one tail store. */
static void buf_return(uint16_t bid)
{
	io_uring_buf_ring_add(S.br, S.bufs + (size_t)bid * S.buf_size, S.buf_size, bid,
			      io_uring_buf_ring_mask(S.nbufs), (int)S.returned++);
}

static void publish_buffers(void)
{
	if (S.returned) {
		io_uring_buf_ring_advance(S.br, (int)S.returned);
		S.returned = 0;
	}
}

static int buf_ring_setup(void)
{
	long page = sysconf(_SC_PAGESIZE);
	S.br_bytes = ((size_t)S.nbufs * sizeof(struct io_uring_buf) + (size_t)page - 1) & ~((size_t)page - 1);
	S.br = mmap(NULL, S.br_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	S.bufs = mmap(NULL, (size_t)S.nbufs * S.buf_size, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (S.br == MAP_FAILED || S.bufs == MAP_FAILED)
		return -ENOMEM;
	io_uring_buf_ring_init(S.br);
	struct io_uring_buf_reg reg = { .ring_addr = (unsigned long)S.br, .ring_entries = S.nbufs, .bgid = BGID };
	int rc = io_uring_register_buf_ring(&S.ring, &reg, 0);
	if (rc < 0)
		return rc;
	for (uint32_t i = 0; i < S.nbufs; i++)
		buf_return((uint16_t)i);
	publish_buffers();
	return 0;
}

/* ---- connections ---- */

static struct conn *conn_new(int fd)
{
	if ((size_t)fd >= S.nconns) {
		size_t n = S.nconns ? S.nconns : 1024;
		while (n <= (size_t)fd)
			n *= 2;
		struct conn **t = realloc(S.conns, n * sizeof(*t));
		if (!t)
			return NULL;
		memset(t + S.nconns, 0, (n - S.nconns) * sizeof(*t));
		S.conns = t;
		S.nconns = n;
	}
	struct conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->fd = fd;
	c->msg.msg_iov = c->iov;
	S.conns[fd] = c;
	return c;
}

static bool enqueue(struct conn *c, uint16_t bid, uint32_t len)
{
	if (c->q_len == c->q_cap) {
		uint32_t cap = c->q_cap ? c->q_cap * 2 : 8;
		struct pend *q = malloc(cap * sizeof(*q));
		if (!q)
			return false;
		for (uint32_t i = 0; i < c->q_len; i++)
			q[i] = c->q[(c->q_head + i) % c->q_cap];
		free(c->q);
		c->q = q;
		c->q_head = 0;
		c->q_cap = cap;
	}
	c->q[(c->q_head + c->q_len++) % c->q_cap] = (struct pend){ bid, 0, len };
	return true;
}

static void arm_recv(struct conn *c)
{
	struct io_uring_sqe *sqe = sqe_get();
	io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = BGID;
	io_uring_sqe_set_data64(sqe, tag(OP_RECV, c->fd));
	c->recv_armed = true;
}

/* One send for everything queued (up to MAX_IOV buffers): a plain send when it is one buffer. */
static void submit_send(struct conn *c)
{
	struct io_uring_sqe *sqe = sqe_get();
	uint32_t n = c->q_len < MAX_IOV ? c->q_len : MAX_IOV;
	for (uint32_t i = 0; i < n; i++) {
		struct pend *p = &c->q[(c->q_head + i) % c->q_cap];
		c->iov[i] = (struct iovec){ S.bufs + (size_t)p->bid * S.buf_size + p->off, p->len };
	}
	if (n == 1) {
		io_uring_prep_send(sqe, c->fd, c->iov[0].iov_base, c->iov[0].iov_len, MSG_NOSIGNAL);
	} else {
		c->msg.msg_iovlen = n;
		io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
	}
	io_uring_sqe_set_data64(sqe, tag(OP_SEND, c->fd));
	c->iov_n = n;
	c->send_inflight = true;
}

/* Frees the connection once nothing of it is in flight (the kernel still writes into armed buffers). */
static void maybe_close(struct conn *c)
{
	if (c->recv_armed || c->send_inflight || c->starved || (!c->failed && c->q_len))
		return;
	for (uint32_t i = 0; i < c->q_len; i++)
		buf_return(c->q[(c->q_head + i) % c->q_cap].bid);
	S.conns[c->fd] = NULL;
	close(c->fd);
	free(c->q);
	free(c);
}

/* An error: stop receiving too (shutdown ends the multishot recv with a final CQE). */
static void fail_conn(struct conn *c)
{
	c->failed = true;
	shutdown(c->fd, SHUT_RDWR);
	maybe_close(c);
}

/* ---- completions ---- */

static void on_accept(int res, unsigned flags)
{
	if (res >= 0) {
		struct conn *c = conn_new(res);
		if (c)
			arm_recv(c);
		else
			close(res);
	} else if (res != -EINTR && res != -ECONNABORTED) {
		fprintf(stderr, "baseline_uring_echo: accept: %s\n", strerror(-res));
	}
	if (!(flags & IORING_CQE_F_MORE)) {
		struct io_uring_sqe *sqe = sqe_get();
		io_uring_prep_multishot_accept(sqe, S.listen_fd, NULL, NULL, SOCK_CLOEXEC);
		io_uring_sqe_set_data64(sqe, tag(OP_ACCEPT, S.listen_fd));
	}
}

static void on_recv(struct conn *c, int res, unsigned flags)
{
	bool more = flags & IORING_CQE_F_MORE;
	if (!more)
		c->recv_armed = false;
	if (flags & IORING_CQE_F_BUFFER) {
		uint16_t bid = (uint16_t)(flags >> IORING_CQE_BUFFER_SHIFT);
		if (res <= 0 || c->failed || !enqueue(c, bid, (uint32_t)res))
			buf_return(bid);
	}
	if (res > 0) {
		if (!c->send_inflight && c->q_len && !c->failed)
			submit_send(c);
		if (!more && !c->failed && !c->peer_done)
			arm_recv(c);
	} else if (res == -ENOBUFS && !more && !c->failed) {
		/* The pool is empty: re-arm once buffers come back (run), not in a busy loop. */
		c->starved = true;
		c->next_starved = S.starved;
		S.starved = c;
	} else if (res == 0) {
		c->peer_done = true;
	} else {
		c->failed = true;
	}
	maybe_close(c);
}

static void on_send(struct conn *c, int res)
{
	c->send_inflight = false;
	if (res < 0) {
		fail_conn(c);
		return;
	}
	uint32_t left = (uint32_t)res;
	for (uint32_t i = 0; i < c->iov_n && c->q_len; i++) {
		struct pend *p = &c->q[c->q_head];
		uint32_t take = left < p->len ? left : p->len;
		p->off += take;
		p->len -= take;
		left -= take;
		if (p->len)
			break; /* a short send: the next one starts inside this buffer */
		buf_return(p->bid);
		c->q_head = (c->q_head + 1) % c->q_cap;
		c->q_len--;
	}
	if (c->q_len && !c->failed)
		submit_send(c);
	maybe_close(c);
}

static void dispatch(struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	enum op op = (enum op)(ud >> 32);
	int fd = (int)(uint32_t)ud;
	if (op == OP_ACCEPT) {
		on_accept(cqe->res, cqe->flags);
		return;
	}
	struct conn *c = (size_t)fd < S.nconns ? S.conns[fd] : NULL;
	if (!c) {
		if (cqe->flags & IORING_CQE_F_BUFFER)
			buf_return((uint16_t)(cqe->flags >> IORING_CQE_BUFFER_SHIFT));
		return;
	}
	if (op == OP_RECV)
		on_recv(c, cqe->res, cqe->flags);
	else
		on_send(c, cqe->res);
}

/* Re-arms the connections that ran out of buffers, now that some came back. */
static void rearm_starved(void)
{
	struct conn *c = S.starved, *next;
	S.starved = NULL;
	for (; c; c = next) {
		next = c->next_starved;
		c->starved = false;
		if (c->failed || c->peer_done)
			maybe_close(c);
		else
			arm_recv(c);
	}
}

static int run(void)
{
	for (;;) {
		int rc = io_uring_submit_and_wait(&S.ring, 1);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			fprintf(stderr, "baseline_uring_echo: io_uring_submit_and_wait: %s\n", strerror(-rc));
			return 1;
		}
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&S.ring, head, cqe) {
			dispatch(cqe);
			seen++;
		}
		io_uring_cq_advance(&S.ring, seen);
		bool any_back = S.returned > 0;
		publish_buffers();
		if (any_back && S.starved)
			rearm_starved();
	}
}

/* Newest flags first; EINVAL means this kernel does not know one of them. */
static int ring_init(unsigned entries)
{
	static const unsigned flag_sets[] = {
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, IORING_SETUP_COOP_TASKRUN, 0,
	};
	int rc = -EINVAL;
	for (size_t i = 0; i < 3 && rc == -EINVAL; i++) {
		struct io_uring_params p = { .flags = flag_sets[i] };
		rc = io_uring_queue_init_params(entries, &S.ring, &p);
	}
	return rc;
}

static void usage(void)
{
	fprintf(stderr, "usage: baseline_uring_echo [--host ADDR] [--port P] [--bufs N (power of two)] "
			"[--buf-size B] [--nodelay] [--unix PATH (instead of host and port)]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "host", required_argument, 0, 'h' }, { "port", required_argument, 0, 'p' },
		{ "bufs", required_argument, 0, 'b' }, { "buf-size", required_argument, 0, 's' },
		{ "nodelay", no_argument, 0, 'n' }, { "unix", required_argument, 0, 'u' }, { 0, 0, 0, 0 },
	};
	const char *host = "127.0.0.1", *prog = "baseline_uring_echo", *unix_path = NULL;
	uint64_t port = 7000, nbufs = 512, bsize = 16384;
	bool nodelay = false;
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		bool ok = o == 'h' ? (host = optarg, true)
			: o == 'p' ? bu_parse_u64(prog, "port", optarg, 1, 65535, &port)
			: o == 'b' ? bu_parse_u64(prog, "bufs", optarg, 1, 32768, &nbufs)
			: o == 's' ? bu_parse_u64(prog, "buf-size", optarg, 64, 1 << 20, &bsize)
			: o == 'n' ? (nodelay = true, true)
			: o == 'u' ? (unix_path = optarg, true)
			: false;
		if (!ok) {
			usage();
			return 2;
		}
	}
	if (optind < argc || (nbufs & (nbufs - 1))) {
		usage();
		return 2;
	}
	bu_ignore_sigpipe();
	S.nbufs = (uint32_t)nbufs;
	S.buf_size = (uint32_t)bsize;
	int rc = ring_init(4096);
	if (rc < 0) {
		fprintf(stderr, "%s: io_uring_queue_init: %s\n", prog, strerror(-rc));
		return 1;
	}
	if ((rc = buf_ring_setup()) < 0) {
		fprintf(stderr, "%s: provided-buffer ring: %s\n", prog, strerror(-rc));
		return 1;
	}
	S.listen_fd = unix_path ? bu_listen_unix(unix_path, 4096) : bu_listen(host, (int)port, 4096, nodelay);
	if (S.listen_fd < 0) {
		fprintf(stderr, "%s: listen on %s: %s\n", prog, unix_path ? unix_path : host, strerror(-S.listen_fd));
		return 1;
	}
	on_accept(-EINTR, 0); /* arms the first multishot accept */
	if (unix_path)
		fprintf(stderr, "%s: listening on unix:%s\n", prog, unix_path);
	else
		fprintf(stderr, "%s: listening on %s:%d\n", prog, host, (int)port);
	return run();
}
