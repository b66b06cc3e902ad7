/* examples/proxy/proxy_main.c: `proxy --to HOST:PORT [--connect-timeout MS] [--port P] [--host ADDR] [--threads N] [--backend B] [--recv M]`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 5000

static struct proxy_target target = { .connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS };

static int start(const struct serve_opts *o, struct serve **out)
{
	return proxy_start(o, &target, out);
}

/* The value of option `name` at argv[*i] ("--name V" or "--name=V"), stepping *i past it; NULL if argv[*i] is another. */
static const char *own_option(char **argv, int argc, int *i, const char *name)
{
	size_t n = strlen(name);
	if (strncmp(argv[*i], name, n) != 0)
		return NULL;
	if (argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (argv[*i][n] == '\0' && *i + 1 < argc)
		return argv[++*i];
	return NULL;
}

static int bad(const char *what, const char *value)
{
	if (value)
		fprintf(stderr, "proxy: bad value '%s' for %s\n%s", value, what, serve_extra_usage);
	else
		fprintf(stderr, "proxy: %s is required\n%s", what, serve_extra_usage);
	return 2;
}

/* The proxy's own options are taken out of the line before the shared ones are parsed. */
int main(int argc, char **argv)
{
	serve_extra_usage =
		"  --to HOST:PORT  where each client is connected (numeric; [V6]:PORT for IPv6); required\n"
		"  --connect-timeout MS  a client whose upstream has not answered by then is closed\n"
		"                        (default 5000; 0: the kernel's own, minutes)\n";
	const char *to = NULL, *timeout = NULL, *v;
	bool help = false;
	int n = 1;
	for (int i = 1; i < argc; i++) {
		if ((v = own_option(argv, argc, &i, "--to")))
			to = v;
		else if ((v = own_option(argv, argc, &i, "--connect-timeout")))
			timeout = v;
		else
			help |= strcmp(argv[n++] = argv[i], "--help") == 0;
	}
	argv[n] = NULL;
	if (help)
		return serve_main(n, argv, "proxy", start, proxy_stop);
	if (!to || proxy_parse_target(to, &target) != 0)
		return bad("--to", to);
	if (timeout) {
		char *end;
		errno = 0;
		unsigned long ms = strtoul(timeout, &end, 10);
		if (errno || end == timeout || *end || timeout[0] == '-' || ms > PERCH_CONNECT_TIMEOUT_MAX_MS)
			return bad("--connect-timeout", timeout);
		target.connect_timeout_ms = (unsigned)ms;
	}
	return serve_main(n, argv, "proxy", start, proxy_stop);
}
