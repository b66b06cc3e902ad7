#!/usr/bin/env bash
# bench/pipe_cost.sh: callgrind instruction counts per operation for bench/pipe_cost: raw conn, pipes, naive adapter.
# Usage: bench/pipe_cost.sh [BUILD_DIR] [COUNT]   (defaults: build, 100000)
set -euo pipefail
build=${1:-build}
n=${2:-100000}
bin=$build/bench/pipe_cost
make -s -C "$build" bench/pipe_cost
command -v valgrind >/dev/null || { echo "pipe_cost.sh: valgrind is not installed" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions inside workload() for one variant, divided by the count.
per_op() {
	valgrind --tool=callgrind --toggle-collect=workload --callgrind-out-file="$out/cg" \
		"$bin" "$1" "$2" "$n" "${3:-malloc}" >/dev/null 2>"$out/log" || { cat "$out/log" >&2; exit 1; }
	awk -v n="$n" '/^totals:/ { printf "%.1f", $2 / n }' "$out/cg"
}

printf '%-12s %10s %10s %10s %12s %12s\n' workload raw pipes naive "pipes/raw" "naive/raw"
# echo-pooled: the staging buffers come from a pool, as on the loop thread.
for w in read echo echo-pooled; do
	staging=malloc
	[ "$w" = echo-pooled ] && staging=pooled
	raw=$(per_op "${w%-pooled}" raw $staging) pipes=$(per_op "${w%-pooled}" pipes $staging)
	naive=$(per_op "${w%-pooled}" naive $staging)
	printf '%-12s %10s %10s %10s %12s %12s\n' "$w" "$raw" "$pipes" "$naive" \
		"$(awk -v a="$pipes" -v b="$raw" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }')" \
		"$(awk -v a="$naive" -v b="$raw" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }')"
done
echo "(instructions per operation, callgrind, $n operations each)"
