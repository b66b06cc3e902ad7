# bench/echo_pingpong_run.sh: one whole run of examples/echo under a 64-byte ping-pong load (sourced by echo_instr.sh and clock_reads.sh).
# echo_pingpong_run NAME OUT BUILD BACKEND CONNS COUNT [WRAPPER...]
# Starts BUILD's examples/echo behind WRAPPER (valgrind, env LD_PRELOAD=...),
# with its output in OUT/server.out and OUT/server.err; sends COUNT round
# trips on each of CONNS connections; then stops it with SIGTERM and waits.
# NAME is the calling script's, for its messages.
echo_pingpong_run() {
	local name=$1 out=$2 build=$3 backend=$4 conns=$5 count=$6
	shift 6
	"$@" "$build/examples/echo/echo" --port 0 --backend "$backend" --idle-timeout 60000 \
		>"$out/server.out" 2>"$out/server.err" &
	local pid=$! port=""
	for _ in $(seq 100); do
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\), .*/\1/p' "$out/server.out")
		[[ -n $port ]] && break
		sleep 0.1
	done
	[[ -n $port ]] || { echo "$name: the server did not start: $(cat "$out/server.err")" >&2; kill "$pid"; exit 1; }
	timeout 120 "$build/bench/echo_client" --port "$port" --mode pingpong --conns "$conns" --size 64 --count "$count" \
		--timeout 60 >/dev/null
	kill -TERM "$pid"
	wait "$pid" || true
}
