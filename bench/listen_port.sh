# bench/listen_port.sh: the port an example server says it listens on, waited for (sourced by the bench scripts that start one).
# listen_port NAME OUT ERR PID: waits up to 20 s for "listening on 127.0.0.1:PORT, " in the
# server's output file OUT and prints PORT; if it never comes, says so with the server's
# error output ERR, kills PID and exits 1. NAME is the calling script's, for its message.
listen_port() {
	local name=$1 out=$2 err=$3 pid=$4 port=""
	for _ in $(seq 200); do
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\), .*/\1/p' "$out")
		[[ -n $port ]] && break
		sleep 0.1
	done
	[[ -n $port ]] || { echo "$name: the server did not start: $(cat "$err")" >&2; kill "$pid"; exit 1; }
	echo "$port"
}
