/* examples/resp/resp_main.c: `resp [--copy] [--port P] [--threads N] [--backend B] [--recv M]`. */
#include <stdint.h>
#include <string.h>

#include "resp.h"
#include "resp_store.h"

/* --copy (anywhere on the line) copies every value into the writer, for a side-by-side with references. */
int main(int argc, char **argv)
{
	serve_extra_usage = "  --copy         copy every GET's value into the writer (default: values of 16 KiB\n"
			    "                 and more are sent from the store's memory, by reference)\n";
	serve_extra_synopsis = "[--copy]";
	int n = 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--copy") == 0)
			resp_reply_ref_min = SIZE_MAX;
		else
			argv[n++] = argv[i];
	}
	argv[n] = NULL;
	return serve_main(n, argv, "resp", resp_start, resp_stop);
}
