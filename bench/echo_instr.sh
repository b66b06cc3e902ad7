#!/usr/bin/env bash
# bench/echo_instr.sh: callgrind instructions per echo round trip of examples/echo on epoll (valgrind cannot run io_uring), whole server.
# Usage: bench/echo_instr.sh [BUILD_DIR] [CONNS]   (defaults: build, 1)
# Two runs of N1 and N2 round trips per connection: the difference over the
# N2 - N1 extra ones leaves out start-up and shut-down. Then perch's atomic
# read-modify-writes a round trip (bench/callgrind_atomics.py). With several
# connections a turn serves several at once, so the figure depends on how
# the client's messages batch; compare builds at the same CONNS.
set -euo pipefail
build=${1:-build}
conns=${2:-1}
n1=${N1:-5000} n2=${N2:-25000}
for tool in valgrind python3 objdump; do
	command -v "$tool" >/dev/null || { echo "echo_instr.sh: $tool is not installed" >&2; exit 1; }
done
make -s -C "$build" examples/echo/echo bench/echo_client
source "$(dirname "$0")/echo_pingpong_run.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions of a whole server run that echoes $1 messages per connection (its profile in $2).
server_instr() {
	echo_pingpong_run echo_instr.sh "$out" "$build" epoll "$conns" "$1" \
		valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out/$2"
	awk '/^(totals|summary):/ { print $2; exit }' "$out/$2"
}

a=$(server_instr "$n1" a)
b=$(server_instr "$n2" b)
echo "instructions per round trip ($conns connection(s), 64 B): $(((b - a) / ((n2 - n1) * conns)))"
printf "atomic read-modify-writes per round trip, "
python3 "$(dirname "$0")/callgrind_atomics.py" --per $(((n2 - n1) * conns)) "$out/a" "$out/b" "$build/examples/echo/echo"
