/* examples/echo/echo_main.c: `echo [--copy] [--port P] [--threads N] [--backend B] [--recv M]`. */
#include <string.h>

#include "echo.h"

/* --copy (anywhere on the line) picks the copying echo, for a side-by-side with the forwarding one. */
int main(int argc, char **argv)
{
	serve_extra_usage = "  --copy         copy received bytes into the writer instead of forwarding them\n";
	serve_extra_synopsis = "[--copy]";
	serve_start_fn start = echo_start;
	int n = 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--copy") == 0)
			start = echo_copy_start;
		else
			argv[n++] = argv[i];
	}
	argv[n] = NULL;
	return serve_main(n, argv, "echo", start, echo_stop);
}
