/* examples/proxy/proxy_main.c: `proxy --to HOST:PORT [--port P] [--host ADDR] [--threads N] [--backend B] [--recv M]`. */
#include <stdio.h>
#include <string.h>

#include "proxy.h"

static struct proxy_target target;

static int start(const struct serve_opts *o, struct serve **out)
{
	return proxy_start(o, &target, out);
}

/* --to is the proxy's own option: taken out of the line before the shared ones are parsed. */
int main(int argc, char **argv)
{
	serve_extra_usage = "  --to HOST:PORT  where each client is connected (numeric; [V6]:PORT for IPv6); required\n";
	const char *to = NULL;
	int n = 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--to") == 0 && i + 1 < argc)
			to = argv[++i];
		else if (strncmp(argv[i], "--to=", 5) == 0)
			to = argv[i] + 5;
		else
			argv[n++] = argv[i];
	}
	argv[n] = NULL;
	for (int i = 1; i < n; i++)
		if (strcmp(argv[i], "--help") == 0)
			return serve_main(n, argv, "proxy", start, proxy_stop);
	if (!to || proxy_parse_target(to, &target) != 0) {
		if (to)
			fprintf(stderr, "proxy: bad value '%s' for --to\n%s", to, serve_extra_usage);
		else
			fprintf(stderr, "proxy: --to HOST:PORT is required\n%s", serve_extra_usage);
		return 2;
	}
	return serve_main(n, argv, "proxy", start, proxy_stop);
}
