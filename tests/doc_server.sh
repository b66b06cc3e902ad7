#!/usr/bin/env bash
# tests/doc_server.sh: the complete server in doc/server.md compiles and links against this build, warning-free.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
lib=$PWD/.libs/libperch.a
[[ -f $lib ]] || { echo "SKIP: no $lib (run from the build directory)"; exit 77; }
out=$(mktemp -d "${TMPDIR:-/tmp}/perch-doc.XXXXXX")
trap 'rm -rf "$out"' EXIT
# The first C block of the page, as a reader would paste it.
awk '/^```c$/ { on = 1; next } on && /^```$/ { exit } on' "$top/doc/server.md" >"$out/server.c"
[[ -s $out/server.c ]] || { echo "FAIL: no C block in doc/server.md"; exit 1; }
# The build's compiler and sanitizer flags (make check exports them): an ASan archive needs ASan.
# shellcheck disable=SC2086
if ! ${PERCH_CC:-${CC:-cc}} -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Werror ${PERCH_SAN_CFLAGS:-} \
	-I"$top/include" "$out/server.c" "$lib" -luring -lck -lpthread -o "$out/server"; then
	echo "FAIL: doc/server.md's server does not build"
	exit 1
fi
echo "PASS: doc/server.md's server builds"
