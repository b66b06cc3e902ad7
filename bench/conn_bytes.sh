#!/usr/bin/env bash
# bench/conn_bytes.sh: where an idle keep-alive connection's heap goes in examples/httpd, by allocation site (valgrind massif).
set -euo pipefail

usage() {
	cat >&2 <<'EOF'
usage: bench/conn_bytes.sh [-b BUILDDIR] [-n CONNS] [BACKEND...]

Runs BUILD/examples/httpd (--idle-timeout 0) under valgrind's massif on each BACKEND (default:
epoll), opens CONNS (4000) idle keep-alive connections with BUILD/bench/idle_client (one
GET answered on each), and prints the heap at massif's peak by allocation site, in bytes per
connection (the loop's receive pool, allocated once, said apart): what perch and the server keep
for a connection that waits. malloc's own header (8-16 B a block) comes on top. Needs valgrind.
uring may stall at the start: valgrind 3.19 runs io_uring_enter as a call that does not block,
holding the lock that lets one thread run at a time, so a loop waiting in it stops the server's
main thread (4 starts of 6 did not get to listen within 24 s here). The two backends keep the
same state a connection, within a few bytes.
EOF
	exit 2
}

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
# shellcheck source=bench/listen_port.sh
source "$ROOT/bench/listen_port.sh"
BUILD=$ROOT/build CONNS=4000
while getopts "b:n:h" opt; do
	case $opt in
	b) BUILD=$OPTARG ;;
	n) CONNS=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || usage
command -v valgrind >/dev/null || { echo "conn_bytes.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
for prog in examples/httpd/httpd bench/idle_client; do
	[[ -x $BUILD/$prog ]] || { echo "conn_bytes.sh: $BUILD/$prog is missing: ./dev build first" >&2; exit 1; }
done
TMP=$(mktemp -d /tmp/perch-conn-bytes.XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$TMP"' EXIT
pid=""

for be in "${@:-epoll}"; do
	for b in $be; do
		valgrind --tool=massif --massif-out-file="$TMP/massif.$b" --threshold=0.1 --detailed-freq=1 \
			"$BUILD/examples/httpd/httpd" --port 0 --backend "$b" --idle-timeout 0 >"$TMP/out.$b" 2>"$TMP/err.$b" &
		pid=$!
		port=$(listen_port conn_bytes.sh "$TMP/out.$b" "$TMP/err.$b" "$pid")
		(sleep 3 | "$BUILD/bench/idle_client" --port "$port" --conns "$CONNS" --csv >/dev/null)
		kill -TERM "$pid"
		wait "$pid" 2>/dev/null || true
		pid=""
		echo "== $b: heap at the peak, $CONNS idle connections (bytes per connection, by allocation site)"
		# The peak snapshot's first-level entries: "->NN.NN% (BYTES) ADDR: FUNCTION (FILE:LINE)".
		ms_print "$TMP/massif.$b" | awk -v n="$CONNS" '
			/Detailed snapshots:/ { match($0, /[0-9]+ \(peak\)/); peak = substr($0, RSTART, RLENGTH - 7) }
			peak != "" && $1 == peak && $2 ~ /^[0-9,]+$/ { on = 1; next }
			on && /^ +[0-9]+ +[0-9,]+ / { exit }
			on && /^->/ { b = $2; gsub(/[(),B]/, "", b); site = $0; sub(/^[^:]*: /, "", site)
				sub(/^->[0-9.]+% \([0-9,]+B\) /, "", site)
				if (site ~ /bufs_setup|pool_setup/)
					printf "  (the loop'"'"'s receive pool, %d KiB of address space, is not per connection: %s)\n", b / 1024, site
				else if (b / n >= 1) { printf "  %8.0f  %s\n", b / n, site; sum += b / n } }
			END { printf "  %8.0f  in all\n", sum }'
	done
done
