/* examples/resp/resp_main.c: `resp [--port P] [--threads N] [--backend B] [--recv M]`. */
#include "resp.h"

int main(int argc, char **argv)
{
	return serve_main(argc, argv, "resp", resp_start, resp_stop);
}
