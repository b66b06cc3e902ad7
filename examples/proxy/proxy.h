/* examples/proxy/proxy.h: a TCP (or Unix socket) proxy over pipes: each client gets its own upstream connection, bytes pass both ways without a copy, and each side's end is passed on with a half-close. */
#ifndef PERCH_EXAMPLES_PROXY_H
#define PERCH_EXAMPLES_PROXY_H

#include <netinet/in.h>

#include "serve.h"

/* Where the proxy connects for each client, and how long it waits for the connect. */
struct proxy_target {
	char unix_name[108];           /* a Unix socket (a path, or "@name"); "" for TCP */
	char host[INET6_ADDRSTRLEN];   /* TCP: numeric IPv4 or IPv6 address */
	int port;                      /* TCP: 1..65535 */
	unsigned connect_timeout_ms;   /* 0: the kernel's own (minutes); else the client is closed after it */
	bool clients_tls;              /* set by proxy_start: clients speak TLS (serve_opts.tls_cert) */
	/* TLS towards the upstream (--to-tls): */
	bool tls;
	const char *ca_file;           /* the CAs its certificate is checked with; NULL: the system's */
	char name[256];                /* the name it must bear, and the SNI; "": the --to address */
	struct perch_tls_ctx *tls_ctx; /* made by proxy_start */
};

/*
 * Parses "HOST:PORT" or "tcp:HOST:PORT" ("[V6]:PORT" for IPv6), or
 * "unix:NAME" (a path, or "@name": abstract), into t (its timeout and
 * TLS fields are left as they are). Returns 0, or -EINVAL for anything
 * else (no port, a port out of 1..65535, a host that is not a numeric
 * address, an empty name or one longer than 107 bytes); *t is then
 * untouched.
 */
int proxy_parse_target(const char *s, struct proxy_target *t);

/* The target as --to says it ("unix:NAME", "HOST:PORT", "[V6]:PORT") in buf; returns buf. */
const char *proxy_target_text(const struct proxy_target *t, char *buf, size_t size);

/*
 * A session whose far side does not read pins what its near side sent
 * up to its pause, in receive buffers of its loop. So the proxy pauses
 * early (2 buffers of 16 KiB) and gives each loop a pool big enough for
 * thousands of such sessions (128 MiB of address space, taken as buffers
 * are first used): 1,000 stalled sessions on one loop still leave room
 * for the rest (doc/hostile-peers.md). --pause-bytes and --recv-buffers
 * override them.
 */
#define PROXY_PAUSE_BYTES (32u * 1024)
#define PROXY_RECV_BUFFERS 8192u

/*
 * Starts the proxy (serve_port says where it listens): every accepted
 * client is connected to *to (copied) on the same loop, over TLS when
 * to->tls (its certificate checked against to->name, or the address);
 * o's pause_bytes and recv_buffers, when 0, are the proxy's above.
 * Returns 0 with *out, -EINVAL for a NULL or bad target (a timeout above
 * PERCH_CONNECT_TIMEOUT_MAX_MS included; TLS to a Unix socket without a
 * name), perch_tls_ctx_new's error (said on stderr), or serve_start's.
 */
int proxy_start(const struct serve_opts *o, const struct proxy_target *to, struct serve **out);

/* Stops it: closes every client and upstream connection and frees everything. NULL is ignored. */
void proxy_stop(struct serve *s);

#endif /* PERCH_EXAMPLES_PROXY_H */
