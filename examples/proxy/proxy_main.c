/* examples/proxy/proxy_main.c: `proxy --to HOST:PORT|unix:PATH [--connect-timeout MS] [--to-tls [--ca FILE] [--to-name NAME]] [--port P] [--host ADDR] [--threads N] [--backend B] [--recv M] [--idle-timeout MS] [--nagle]`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 5000

static struct proxy_target target = { .connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS };

/* Called by serve_main once the shared options parsed: only then is the target worth announcing. */
static int start(const struct serve_opts *o, struct serve **out)
{
	char at[160];
	printf("proxy: each client to %s%s, connect timeout %u ms%s\n", proxy_target_text(&target, at, sizeof(at)),
	       target.tls ? " over TLS" : "", target.connect_timeout_ms,
	       target.connect_timeout_ms ? "" : " (none: the kernel's)");
	return proxy_start(o, &target, out);
}

static const char missing[] = "";

/*
 * The value of option `name` at argv[*i] ("--name V" or "--name=V"),
 * stepping *i past it; `missing` when it has none; NULL if argv[*i] is
 * another option.
 */
static const char *own_option(char **argv, int argc, int *i, const char *name)
{
	size_t n = strlen(name);
	if (strncmp(argv[*i], name, n) != 0)
		return NULL;
	if (argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (argv[*i][n] != '\0')
		return NULL;
	return *i + 1 < argc ? argv[++*i] : missing;
}

/* Takes option `name`'s value into *into; false (said on stderr) when it has none or came twice. */
static bool take(const char *v, const char *name, const char **into)
{
	if (v == missing || *into) {
		fprintf(stderr, "proxy: %s %s\n", name, v == missing ? "needs a value" : "given twice");
		return false;
	}
	*into = v;
	return true;
}

/* The exit status of a bad command line, after the usage line. */
static int usage_error(void)
{
	fprintf(stderr, "usage: proxy --to HOST:PORT|unix:PATH [--connect-timeout MS] [OPTIONS] (proxy --help lists them)\n");
	return 2;
}

static int bad(const char *what, const char *value)
{
	if (value)
		fprintf(stderr, "proxy: bad value '%s' for %s\n", value, what);
	else
		fprintf(stderr, "proxy: %s is required\n", what);
	return usage_error();
}

/* The proxy's own options are taken out of the line before the shared ones are parsed. */
int main(int argc, char **argv)
{
	serve_extra_synopsis = "--to HOST:PORT|unix:PATH [--connect-timeout MS] [--to-tls [--ca FILE] [--to-name NAME]]";
	serve_extra_usage =
		"  --to HOST:PORT  where each client is connected (numeric; [V6]:PORT for IPv6; tcp:HOST:PORT\n"
		"                  too), or --to unix:PATH (unix:@NAME: abstract); required\n"
		"  --connect-timeout MS  a client whose upstream has not answered by then is reset\n"
		"                        (default 5000; 0: the kernel's own, minutes, each waiting\n"
		"                        client holding two sockets meanwhile, even one that left)\n"
		"  --to-tls        speak TLS to the upstream, its certificate checked against --to-name,\n"
		"                  or the --to address (its IP names); close_notify passes each end on\n"
		"  --ca FILE       the PEM CAs the upstream's certificate is checked with (default: the\n"
		"                  system's); --to-name NAME the name it must bear, sent as SNI\n"
		"  (the proxy's defaults: --pause-bytes 32768 and --recv-buffers 8192, so that sessions\n"
		"  whose far side does not read pin little each and leave room for the rest;\n"
		"  --recv and --nagle apply to both sockets of a session, the client's and the upstream's;\n"
		"  --nagle suits bulk traffic: a proxied request/answer protocol waits on delayed ACKs)\n";
	const char *to = NULL, *timeout = NULL, *ca = NULL, *name = NULL, *v;
	bool help = false;
	int n = 1;
	for (int i = 1; i < argc; i++) {
		bool ok = true;
		if ((v = own_option(argv, argc, &i, "--to")))
			ok = take(v, "--to", &to);
		else if ((v = own_option(argv, argc, &i, "--connect-timeout")))
			ok = take(v, "--connect-timeout", &timeout);
		else if ((v = own_option(argv, argc, &i, "--ca")))
			ok = take(v, "--ca", &ca);
		else if ((v = own_option(argv, argc, &i, "--to-name")))
			ok = take(v, "--to-name", &name);
		else if (strcmp(argv[i], "--to-tls") == 0)
			target.tls = true;
		else
			help |= strcmp(argv[n++] = argv[i], "--help") == 0;
		if (!ok)
			return usage_error();
	}
	argv[n] = NULL;
	if (help)
		return serve_main(n, argv, "proxy", start, proxy_stop);
	if ((ca || name) && !target.tls) {
		fprintf(stderr, "proxy: %s applies to --to-tls only\n", ca ? "--ca" : "--to-name");
		return usage_error();
	}
	if (name && (!name[0] || strlen(name) >= sizeof(target.name)))
		return bad("--to-name", name);
	if (name)
		strcpy(target.name, name);
	target.ca_file = ca;
	if (target.tls && !name && to && strncmp(to, "unix:", 5) == 0) {
		fprintf(stderr, "proxy: --to-tls to a Unix socket needs --to-name: the name its certificate bears\n");
		return usage_error();
	}
	if (!to || proxy_parse_target(to, &target) != 0)
		return bad("--to", to);
	if (timeout) {
		char *end;
		errno = 0;
		unsigned long ms = strtoul(timeout, &end, 10);
		if (errno || timeout[0] < '0' || timeout[0] > '9' || *end || ms > PERCH_CONNECT_TIMEOUT_MAX_MS)
			return bad("--connect-timeout", timeout);
		target.connect_timeout_ms = (unsigned)ms;
	}
	return serve_main(n, argv, "proxy", start, proxy_stop);
}
