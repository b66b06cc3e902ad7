# bench/echo_pingpong_run.sh: one whole run of examples/echo under a 64-byte ping-pong load (sourced by echo_instr.sh and clock_reads.sh).
# echo_pingpong_run NAME OUT BUILD BACKEND CONNS COUNT [WRAPPER...]
# Starts BUILD's examples/echo behind WRAPPER (valgrind, env LD_PRELOAD=...),
# with its output in OUT/server.out and OUT/server.err; sends COUNT round
# trips on each of CONNS connections; then stops it with SIGTERM and waits.
# NAME is the calling script's, for its messages.
# shellcheck source=bench/listen_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/listen_port.sh"

echo_pingpong_run() {
	local name=$1 out=$2 build=$3 backend=$4 conns=$5 count=$6
	shift 6
	"$@" "$build/examples/echo/echo" --port 0 --backend "$backend" --idle-timeout 60000 \
		>"$out/server.out" 2>"$out/server.err" &
	local pid=$! port
	port=$(listen_port "$name" "$out/server.out" "$out/server.err" "$pid")
	timeout 120 "$build/bench/echo_client" --port "$port" --mode pingpong --conns "$conns" --size 64 --count "$count" \
		--timeout 60 >/dev/null
	kill -TERM "$pid"
	wait "$pid" || true
}
