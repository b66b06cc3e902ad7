/* tests/cmocka_prelude.h: the headers cmocka needs before it, in the order it needs them. */
#ifndef PERCH_TESTS_CMOCKA_PRELUDE_H
#define PERCH_TESTS_CMOCKA_PRELUDE_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#endif
