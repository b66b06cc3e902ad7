/* bench/idle_client.c: many idle keep-alive HTTP connections, each having had one answer, held open from several source addresses. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"

static const char REQUEST[] = "GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n";

struct opts {
	const char *host;
	uint64_t port, conns, sources, hold_s;
	double timeout_s;
	bool csv;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: idle_client --port N [--host ADDR] [--conns N] [--sources K] [--hold SECS]\n"
		   "                   [--timeout SECS] [--csv]\n"
		   "  Opens --conns keep-alive connections (10000) to the IPv4 --host (127.0.0.1), from the\n"
		   "  source addresses 127.0.0.2 up to 127.0.0.(K+1) in turn (--sources, 8: each has its own\n"
		   "  ephemeral ports), sends each one GET /plaintext and reads its answer (--timeout for\n"
		   "  each, 5 s), then prints \"ready OPENED ANSWERED\" and holds them idle until its\n"
		   "  standard input ends or --hold seconds pass (600). Then it counts the connections the\n"
		   "  server kept open and prints: opened, answered, kept (--csv: one comma-separated line).\n"
		   "  Needs --conns + 16 fds (RLIMIT_NOFILE): it says so when the limit is lower.\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{ "host", required_argument, 0, 'H' }, { "port", required_argument, 0, 'p' },
		{ "conns", required_argument, 0, 'c' }, { "sources", required_argument, 0, 's' },
		{ "hold", required_argument, 0, 'o' }, { "timeout", required_argument, 0, 't' },
		{ "csv", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	*o = (struct opts){ .host = "127.0.0.1", .conns = 10000, .sources = 8, .hold_s = 600, .timeout_s = 5 };
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case 'H': o->host = optarg; break;
		case 'p': ok = bu_parse_u64(argv[0], "port", optarg, 1, 65535, &o->port); break;
		case 'c': ok = bu_parse_u64(argv[0], "conns", optarg, 1, 1000000, &o->conns); break;
		case 's': ok = bu_parse_u64(argv[0], "sources", optarg, 1, 250, &o->sources); break;
		case 'o': ok = bu_parse_u64(argv[0], "hold", optarg, 0, 86400, &o->hold_s); break;
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

/* A blocking connection from 127.0.0.(2 + source) to o's host and port, with o's timeouts; -errno. */
static int connect_from(const struct opts *o, unsigned source)
{
	struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002u + source) };
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)o->port) };
	if (inet_pton(AF_INET, o->host, &to.sin_addr) != 1)
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	struct timeval tv = { .tv_sec = (time_t)o->timeout_s,
			      .tv_usec = (suseconds_t)((o->timeout_s - (double)(time_t)o->timeout_s) * 1e6) };
	/* The port is picked at connect, per destination: each source address has the whole range. */
	if (setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one)) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
	    bind(fd, (struct sockaddr *)&from, sizeof(from)) != 0 ||
	    connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

/* Sends the request and reads one whole answer (head and its Content-Length body). */
static bool one_request(int fd)
{
	if (send(fd, REQUEST, sizeof(REQUEST) - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof(REQUEST) - 1))
		return false;
	char buf[4096];
	size_t len = 0;
	while (len < sizeof(buf) - 1) {
		ssize_t r = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		len += (size_t)r;
		buf[len] = '\0';
		if (bu_http_answer_whole(buf, len))
			return true;
	}
	return false;
}

/* Whether the server still holds fd open: nothing to read, no end, no error. */
static bool still_open(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
	return poll(&p, 1, 0) == 0;
}

/* Waits until standard input ends (a line, EOF, or an error) or hold_s passes. */
static void hold(uint64_t hold_s)
{
	uint64_t end = bu_now_ns() + hold_s * 1000000000ull;
	for (;;) {
		uint64_t now = bu_now_ns();
		if (now >= end)
			return;
		struct pollfd p = { .fd = 0, .events = POLLIN };
		uint64_t left_ms = (end - now) / 1000000 + 1;
		int n = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
		if (n < 0 && errno != EINTR)
			return;
		if (n > 0)
			return;
	}
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse(argc, argv, &o) != 0)
		return 2;
	bu_ignore_sigpipe();
	int rc = bu_room_for_fds("idle_client", o.conns + 16);
	if (rc != 0) {
		if (rc != -EMFILE)
			fprintf(stderr, "idle_client: cannot raise RLIMIT_NOFILE: %s\n", strerror(-rc));
		return 1;
	}
	int *fds = calloc(o.conns, sizeof(*fds));
	if (!fds) {
		fprintf(stderr, "idle_client: out of memory\n");
		return 1;
	}
	uint64_t opened = 0, answered = 0, kept = 0;
	for (; opened < o.conns; opened++) {
		fds[opened] = connect_from(&o, (unsigned)(opened % o.sources));
		if (fds[opened] < 0) {
			fprintf(stderr, "idle_client: connection %llu: %s\n", (unsigned long long)opened,
				strerror(-fds[opened]));
			break;
		}
		answered += one_request(fds[opened]);
	}
	printf("ready %llu %llu\n", (unsigned long long)opened, (unsigned long long)answered);
	fflush(stdout);
	hold(o.hold_s);
	for (uint64_t i = 0; i < opened; i++) {
		kept += still_open(fds[i]);
		close(fds[i]);
	}
	if (o.csv)
		printf("%llu,%llu,%llu\n", (unsigned long long)opened, (unsigned long long)answered,
		       (unsigned long long)kept);
	else
		printf("opened %llu  answered %llu  kept open by the server %llu\n", (unsigned long long)opened,
		       (unsigned long long)answered, (unsigned long long)kept);
	free(fds);
	return opened == o.conns && answered == opened && kept == opened ? 0 : 1;
}
