/* examples/echo/echo_main.c: `echo [--port P] [--threads N] [--backend B] [--recv M]`. */
#include "echo.h"

int main(int argc, char **argv)
{
	return serve_main(argc, argv, "echo", echo_start, echo_stop);
}
