/* bench/partial_client.c: hostile peers against an HTTP server: many connections each holding half a request, and a normal client's latency meanwhile. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

static const char PARTIAL[] = "GET /plaintext HTTP/1.1\r\nHost: x\r\n";
static const char FULL[] = "GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n";

struct opts {
	const char *host;
	uint64_t port, conns, probes;
	double timeout_s;
	bool csv;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: partial_client --port N [--host ADDR] [--conns N] [--probes N] [--timeout SECS] [--csv]\n"
		   "  Opens --conns connections (10000), each sending the start of a request and nothing\n"
		   "  more, then times --probes (200) normal requests on fresh connections, one at a time\n"
		   "  (each given --timeout, 5 s), then closes the partial ones.\n"
		   "  Prints: partial connections opened, probes answered, unanswered, p50, p99 and worst\n"
		   "  latency in us (--csv: the same as one comma-separated line).\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{ "host", required_argument, 0, 'H' }, { "port", required_argument, 0, 'p' },
		{ "conns", required_argument, 0, 'c' }, { "probes", required_argument, 0, 'n' },
		{ "timeout", required_argument, 0, 't' }, { "csv", no_argument, 0, 'v' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	*o = (struct opts){ .host = "127.0.0.1", .conns = 10000, .probes = 200, .timeout_s = 5 };
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case 'H': o->host = optarg; break;
		case 'p': ok = bu_parse_u64(argv[0], "port", optarg, 1, 65535, &o->port); break;
		case 'c': ok = bu_parse_u64(argv[0], "conns", optarg, 0, 1000000, &o->conns); break;
		case 'n': ok = bu_parse_u64(argv[0], "probes", optarg, 1, 1000000, &o->probes); break;
		case 't': ok = bu_parse_secs(argv[0], "timeout", optarg, 0.01, 600, &o->timeout_s); break;
		case 'v': o->csv = true; break;
		case 'h': usage(stdout); exit(0);
		default: ok = false;
		}
		if (!ok)
			return -1;
	}
	if (o->port == 0 || optind != argc) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Sends all of s on a non-blocking socket, waiting for room up to deadline_ns. */
static bool send_all(int fd, const char *s, size_t n, uint64_t deadline_ns)
{
	while (n > 0) {
		long w = bu_send(fd, s, n);
		if (w < 0)
			return false;
		if (w == 0) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			if (bu_now_ns() >= deadline_ns || poll(&p, 1, 10) < 0)
				return false;
			continue;
		}
		s += w;
		n -= (size_t)w;
	}
	return true;
}

/* Reads until one whole answer (head and its Content-Length body) is in, or the deadline. */
static bool read_answer(int fd, uint64_t deadline_ns)
{
	char buf[4096];
	size_t len = 0;
	for (;;) {
		uint64_t now = bu_now_ns();
		if (now >= deadline_ns || len == sizeof(buf) - 1)
			return false;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left_ms = (int)((deadline_ns - now) / 1000000) + 1;
		if (poll(&p, 1, left_ms) <= 0)
			continue;
		ssize_t r = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (r <= 0)
			return false;
		len += (size_t)r;
		buf[len] = '\0';
		if (bu_http_answer_whole(buf, len))
			return true;
	}
}

/* One normal request on a fresh connection: its latency in ns, or 0 when it went unanswered. */
static uint64_t probe(const struct opts *o)
{
	uint64_t t0 = bu_now_ns(), deadline = t0 + (uint64_t)(o->timeout_s * 1e9);
	int fd = bu_connect(o->host, (int)o->port);
	if (fd < 0)
		return 0;
	bool ok = send_all(fd, FULL, strlen(FULL), deadline) && read_answer(fd, deadline);
	close(fd);
	return ok ? bu_now_ns() - t0 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse(argc, argv, &o) != 0)
		return 2;
	bu_ignore_sigpipe();
	int rc = bu_room_for_fds("partial_client", o.conns + 80);
	if (rc != 0) {
		if (rc != -EMFILE)
			fprintf(stderr, "partial_client: cannot raise RLIMIT_NOFILE: %s\n", strerror(-rc));
		return 1;
	}
	int *fds = calloc(o.conns ? o.conns : 1, sizeof(*fds));
	struct bu_hist *h = calloc(1, sizeof(*h));
	if (!fds || !h) {
		fprintf(stderr, "partial_client: out of memory\n");
		return 1;
	}
	uint64_t opened = 0, unanswered = 0;
	for (; opened < o.conns; opened++) {
		fds[opened] = bu_connect(o.host, (int)o.port);
		if (fds[opened] < 0) {
			fprintf(stderr, "partial_client: connection %llu: %s\n", (unsigned long long)opened,
				strerror(-fds[opened]));
			break;
		}
		if (!send_all(fds[opened], PARTIAL, strlen(PARTIAL), bu_now_ns() + 1000000000ull)) {
			close(fds[opened]);
			break;
		}
	}
	usleep(500 * 1000); /* the server takes the partial requests in */
	for (uint64_t i = 0; i < o.probes; i++) {
		uint64_t ns = probe(&o);
		if (ns)
			bu_hist_add(h, ns);
		else
			unanswered++;
	}
	for (uint64_t i = 0; i < opened; i++)
		close(fds[i]);
	double p50 = (double)bu_hist_quantile(h, 0.5) / 1e3, p99 = (double)bu_hist_quantile(h, 0.99) / 1e3;
	double worst = (double)h->max / 1e3;
	if (o.csv)
		printf("%llu,%llu,%llu,%.0f,%.0f,%.0f\n", (unsigned long long)opened, (unsigned long long)h->count,
		       (unsigned long long)unanswered, p50, p99, worst);
	else
		printf("partial connections %llu  probes answered %llu  unanswered %llu  p50 %.0f us  p99 %.0f us"
		       "  worst %.0f us\n",
		       (unsigned long long)opened, (unsigned long long)h->count, (unsigned long long)unanswered, p50,
		       p99, worst);
	free(fds);
	free(h);
	return opened == o.conns && unanswered == 0 ? 0 : 1;
}
