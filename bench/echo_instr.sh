#!/usr/bin/env bash
# bench/echo_instr.sh: callgrind instructions per echo round trip of examples/echo on epoll (valgrind cannot run io_uring), whole server.
# Usage: bench/echo_instr.sh [BUILD_DIR] [CONNS]   (defaults: build, 1)
# Two runs of N1 and N2 round trips per connection: the difference over the
# N2 - N1 extra ones leaves out start-up and shut-down. With several
# connections a turn serves several at once, so the figure depends on how
# the client's messages batch; compare builds at the same CONNS.
set -euo pipefail
build=${1:-build}
conns=${2:-1}
n1=${N1:-5000} n2=${N2:-25000}
command -v valgrind >/dev/null || { echo "echo_instr.sh: valgrind is not installed" >&2; exit 1; }
make -s -C "$build" examples/echo/echo bench/echo_client
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions of a whole server run that echoes $1 messages per connection.
server_instr() {
	valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$build/examples/echo/echo" --port 0 --backend epoll \
		--idle-timeout 60000 >"$out/server.out" 2>"$out/server.err" &
	local pid=$! port=""
	for _ in $(seq 100); do
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\), .*/\1/p' "$out/server.out")
		[[ -n $port ]] && break
		sleep 0.1
	done
	[[ -n $port ]] || { echo "echo_instr.sh: the server did not start: $(cat "$out/server.err")" >&2; kill "$pid"; exit 1; }
	timeout 120 "$build/bench/echo_client" --port "$port" --mode pingpong --conns "$conns" --size 64 --count "$1" \
		--timeout 60 >/dev/null
	kill -TERM "$pid"
	wait "$pid" || true
	awk '/^(totals|summary):/ { print $2; exit }' "$out/cg"
}

a=$(server_instr "$n1")
b=$(server_instr "$n2")
echo "instructions per round trip ($conns connection(s), 64 B): $(((b - a) / ((n2 - n1) * conns)))"
