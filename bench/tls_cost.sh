#!/usr/bin/env bash
# bench/tls_cost.sh: callgrind instructions per message through TLS against plain in-memory pipes, and whose they are (the cipher, OpenSSL's records, perch's TLS layer, the rest of perch).
# Usage: bench/tls_cost.sh [BUILD_DIR] [COUNT] [SIZES...]   (defaults: build, 20000, 64 1024 16384)
set -euo pipefail
build=${1:-build}
n=${2:-20000}
shift $(($# > 2 ? 2 : $#))
sizes=("$@")
((${#sizes[@]})) || sizes=(64 1024 16384)
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/bench/tls_cost
make -s -C "$build" bench/tls_cost
command -v valgrind >/dev/null || { echo "tls_cost.sh: valgrind is not installed" >&2; exit 1; }
command -v callgrind_annotate >/dev/null || { echo "tls_cost.sh: callgrind_annotate is missing (valgrind)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sh "$root/tests/tls_certs.sh" "$out/certs" >/dev/null

# run MODE SIZE: callgrind inside workload(); leaves the profile in $out/cg.MODE.SIZE.
run() {
	valgrind --tool=callgrind --toggle-collect=workload --callgrind-out-file="$out/cg.$1.$2" \
		"$bin" "$1" "$n" "$2" "$out/certs" >/dev/null 2>"$out/log" || { cat "$out/log" >&2; exit 1; }
}

# Instructions per message: all, then those whose code is in libcrypto, libssl, pipes/tls_*.c, and the rest.
split() { # profile
	callgrind_annotate --auto=no --threshold=100 "$1" 2>/dev/null | awk -v n="$n" '
		/PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
		/^ *[0-9,]+ .*:/ && !/PROGRAM TOTALS/ {
			v = $1; gsub(",", "", v)
			if ($0 ~ /libcrypto/) crypto += v
			else if ($0 ~ /libssl/) ssl += v
			else if ($0 ~ /pipes\/tls_/) layer += v
		}
		END { printf "%.0f %.0f %.0f %.0f %.0f", total / n, crypto / n, ssl / n, layer / n,
			(total - crypto - ssl - layer) / n }'
}

printf '%-8s %12s %12s %12s %12s %14s %14s %14s\n' size plain tls "tls/plain" libcrypto libssl "perch tls layer" "rest (perch, libc)"
for size in "${sizes[@]}"; do
	run plain "$size"
	run tls "$size"
	read -r plain _ <<<"$(split "$out/cg.plain.$size")"
	read -r tls crypto ssl layer rest <<<"$(split "$out/cg.tls.$size")"
	printf '%-8s %12s %12s %12s %12s %12s %14s %14s\n' "$size" "$plain" "$tls" \
		"$(awk -v a="$tls" -v b="$plain" 'BEGIN { printf "%.1fx", a / b }')" "$crypto" "$ssl" \
		"$layer ($(awk -v a="$layer" -v b="$tls" 'BEGIN { printf "%.1f%%", a * 100 / b }'))" "$rest"
done
echo "(instructions per message: written, flushed, carried and read; callgrind, $n messages each)"
