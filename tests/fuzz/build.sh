#!/usr/bin/env bash
# tests/fuzz/build.sh: builds the libFuzzer harnesses with clang (-fsanitize=fuzzer,address,undefined),
# outside automake's build: the configured CC need not be clang.
#
# Usage: tests/fuzz/build.sh BUILDDIR OUTDIR   (BUILDDIR: a configured build tree, for config.h)
# Prints each harness's path. Needs clang with libclang_rt.fuzzer (clang 14 here).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null || { echo "fuzz: $CLANG not found (the harnesses need clang's libFuzzer)" >&2; exit 1; }
flags=(-g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Werror
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
	-DHAVE_CONFIG_H -I"$build" -I"$src/include" -I"$src/lib" -I"$src/pipes")

# The library's sources for the session harnesses: all but the TLS layer (its OpenSSL is not
# linked here, and no harness makes a TLS context, so nothing reaches it).
lib_sources=()
for f in "$src"/pipes/*.c "$src"/lib/*.c; do
	[[ $f == */pipes/tls_* ]] || lib_sources+=("$f")
done

# NAME SOURCES...: one harness, always rebuilt (seconds; no header is missed).
harness() {
	local name=$1
	shift
	"$CLANG" "${flags[@]}" "$@" -o "$out/$name" -luring -lck -lpthread
	echo "$out/$name"
}

harness fuzz_http_parse "$src/tests/fuzz/fuzz_http_parse.c" "$src/examples/httpd/http_parse.c"
harness fuzz_resp_parse "$src/tests/fuzz/fuzz_resp_parse.c" "$src/examples/resp/resp_parse.c"
# The session runs the library's in-memory pipes: the library is built in, instrumented too.
harness fuzz_lines_session "$src/tests/fuzz/fuzz_lines_session.c" "$src/examples/lines/lines.c" \
	"${lib_sources[@]}"
harness fuzz_resp_session "$src/tests/fuzz/fuzz_resp_session.c" "$src/examples/common/frames.c" \
	"$src/examples/resp/resp_parse.c" "$src/examples/resp/resp_store.c" "$src/examples/resp/siphash.c" \
	"${lib_sources[@]}"
