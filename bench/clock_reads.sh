#!/usr/bin/env bash
# bench/clock_reads.sh: clock_gettime calls per echo round trip of examples/echo (native, either backend), whole server.
# Usage: bench/clock_reads.sh [BUILD_DIR] [BACKEND] [CONNS]   (defaults: build, uring, 1)
# callgrind cannot show what a clock read costs (valgrind has no vDSO: the
# read is a system call it does not count), so this counts the calls
# natively, through an LD_PRELOAD shim (bench/clock_count.c); each costs
# what the vDSO takes (23.7 ns on this machine: doc/loop.md, Timers).
# Two runs of N1 and N2 round trips per connection: the difference over
# the extra ones leaves out start-up and shut-down.
set -euo pipefail
build=${1:-build}
backend=${2:-uring}
conns=${3:-1}
n1=${N1:-2000} n2=${N2:-12000}
here=$(cd "$(dirname "$0")" && pwd)
make -s -C "$build" examples/echo/echo bench/echo_client
source "$here/echo_pingpong_run.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
${CC:-cc} -O2 -shared -fPIC -o "$out/clock_count.so" "$here/clock_count.c" -ldl

# clock_gettime calls of a whole server run that echoes $1 messages per connection.
server_reads() {
	echo_pingpong_run clock_reads.sh "$out" "$build" "$backend" "$conns" "$1" env LD_PRELOAD="$out/clock_count.so"
	sed -n 's/^clock_count: \([0-9]*\) .*/\1/p' "$out/server.err"
}

a=$(server_reads "$n1")
b=$(server_reads "$n2")
[[ -n $a && -n $b ]] || { echo "clock_reads.sh: the shim reported no count" >&2; exit 1; }
awk -v a="$a" -v b="$b" -v n=$(((n2 - n1) * conns)) -v c="$conns" -v be="$backend" \
	'BEGIN { printf "clock reads per round trip (%s, %d connection(s), 64 B): %.3f\n", be, c, (b - a) / n }'
