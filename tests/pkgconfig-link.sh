#!/usr/bin/env bash
# tests/pkgconfig-link.sh [BUILD_DIR]: installs perch from BUILD_DIR (default build/) into a
# temporary directory, links a small program against it with `pkg-config --static`, runs it,
# checks the headers in strict C and C++, and that libperch.a defines no global symbol outside
# the perch_ namespace.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

make -C "$build" install DESTDIR="$tmp/root" prefix=/usr/local >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; exit 1; }
pcdir=$tmp/root/usr/local/lib/pkgconfig
lib=$tmp/root/usr/local/lib/libperch.a

cat >"$tmp/prog.c" <<'EOF'
#include <perch.h>
int main(void) {
	struct perch_vtask vt;
	if (perch_vtask_init(&vt) != 0) return 1;
	(void)perch_vtask_ready(&vt);
	return 0;
}
EOF
# --define-prefix: prefix is taken from where perch.pc lies, so every path resolves into $tmp.
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --define-prefix --cflags --libs --static perch)
echo "pkg-config --static --cflags --libs perch: $flags"
# shellcheck disable=SC2086 # the flags are meant to split
gcc -Wall -Werror -o "$tmp/prog" "$tmp/prog.c" $flags
"$tmp/prog"
echo "linked through pkg-config and ran: ok"

# The public headers hold in strict ISO C and in C++ (extern "C", nothing GNU-only).
for std in c99 c11; do
	gcc -std=$std -pedantic -Wall -Werror -o "$tmp/prog-$std" "$tmp/prog.c" $flags
done
cp "$tmp/prog.c" "$tmp/prog.cpp"
g++ -std=c++17 -Wall -Werror -o "$tmp/prog-cxx" "$tmp/prog.cpp" $flags
"$tmp/prog-cxx"
echo "headers compile as -std=c99/c11 -pedantic and as C++, and link: ok"

offenders=$(nm -g --defined-only "$lib" | awk 'NF == 3 && $3 !~ /^perch_/ { print $3 }')
if [[ -n $offenders ]]; then
	echo "libperch.a exports symbols outside the perch_/perch__ namespace:" >&2
	echo "$offenders" >&2
	exit 1
fi
echo "libperch.a exports only perch_ symbols: ok"
