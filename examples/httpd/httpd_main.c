/* examples/httpd/httpd_main.c: `httpd [--port P] [--threads N] [--backend B] [--recv M]`. */
#include "httpd.h"

int main(int argc, char **argv)
{
	return serve_main(argc, argv, "httpd", httpd_start, httpd_stop);
}
