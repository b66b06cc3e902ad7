#!/usr/bin/env bash
# bench/profile.sh: where a server's CPU goes under one load (perf cpu-clock samples by library and function) and its syscalls per request (strace -c).
set -euo pipefail

usage() {
	cat >&2 <<'EOF'
usage: bench/profile.sh [-d SECS] [-b BUILDDIR] [-o OUTDIR] [-m perf|syscalls|strace|ops|tcp|all] [-q PERCENT] [-s SERVER] LOAD...

Loads (loopback only; each client stops by itself, every tool runs under a timeout):
  echo-pingpong   bench/echo_client --mode pingpong, 50 connections x 64 B
  echo-stream     bench/echo_client --mode stream, 8 x 4096 B
  http-plain      wrk -t1 -c50 GET /plaintext (bench/http_client without wrk)
  http-pipelined  the same, 16 requests written at once
  resp-P1         redis-benchmark -c 50 -P 1 -t RESP_TESTS (default ping_mbulk,set,get), RESP_N1 each
  resp-P16        the same at -P 16, RESP_N16 each
  https-keepalive wrk -t1 -c50 over TLS, GET /plaintext (perch's httpd --tls-cert/--tls-key, nginx)
  https-new       openssl s_time -new: a connection and a full TLS 1.2 handshake a request
  resptls-P1      redis-benchmark --tls -c 50 -P 1 (perch's resp with TLS, redis-server --tls-port)

SERVER (default perch: the example for the load, on io_uring) is a name run.sh knows:
perch, perch-epoll, uring-baseline, epoll-baseline (echo loads), nginx (http, https), redis
(resp, resptls).
The echo servers run with the socket options run.sh gives them: Nagle's algorithm on (perch's
echo with --nagle), or TCP_NODELAY on every one with ECHO_NODELAY=1.

-m perf (the default): perf record -e cpu-clock (a software event: no hardware counters
needed) on every thread of the server and its children while the client runs. Each sample is
put in one bucket: kernel; syscall-exit (one of the two instructions after a call of the
server binary into a library function that makes a syscall, io_uring_submit_and_wait say: a
sample that fell due while the kernel returned is taken there, so it is the kernel's time,
not the caller's); perch (a function of the server binary whose source, by its debug
info (nm -l), is under lib/ or pipes/: libperch is linked statically); app (under examples/);
libc; liburing; other (a function of ours with no source: crt, PLT); any other library by
its name. A foreign server's (nginx, redis) own code is app. Prints the shares, perch's
share of the user samples, and the top functions; with the server's CPU per request over the
same run (/proc/PID/stat), perch's share in microseconds.
-m syscalls: perf stat on every syscalls:sys_enter_* tracepoint (and page-faults) of the
server while the client runs: syscalls and page faults per request (the client's count);
counting does not slow the server (no sampling). Counts of per-turn calls (io_uring_enter,
epoll_wait) depend on how many requests a loop turn batches, and so on the load, on how
loaded the machine is, and on a quota (-q), which breaks the server's time into periods.
-m strace: strace -c -f, as a cross-check: ptrace slows the server, so its turns batch more
requests and per-request counts of per-turn syscalls read lower than untraced.
-m ops: perf record of the io_uring:io_uring_submit_req and tcp:tcp_probe tracepoints in the
server's context: io_uring submissions per request by opcode (SEND, SENDMSG, RECV...), and the
TCP segments the kernel received while running on the server's behalf, split by whose socket
took them: the server's own (loopback data from the client, processed when the server released
its socket) or the client's (the server's sends delivered, with the client's wakeup, on the
server's CPU). The tracing slows the server: read ratios between servers, not absolute counts.
-m tcp: nstat's TCP counters over the client's run, per request: segments in and out
(TcpInSegs, TcpOutSegs: on loopback both ends are counted, so a request and its answer in one
segment each read 2.000 in and 2.000 out), pure ACKs, delayed ACKs, retransmits, tail-loss
probes (TcpExtTCPLossProbes: a sender whose bytes went unacknowledged for about two round
trips resends its last segment) and the duplicates a receiver saw of them. nstat counts
every socket of the network namespace: run it on a quiet machine.
-m all: one run of each of perf, syscalls and strace (separate server starts: the tracers
would distort each other).

-q PERCENT runs the server under a CPU quota of PERCENT% of one CPU, as run.sh -q does
(bench/quota.sh; root), to profile it in the server-bound regime.
Options: -d seconds a load (SECS, 3), -b the build dir (BUILD, build), -o where each load's
report goes (OUT, a temp dir that is printed), SERVER_CPU (0) and CLIENT_CPU (1) pin as in
run.sh, PERF_FREQ (1999) is the sampling rate, TOP (20) the functions listed.
EOF
	exit 2
}

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
# shellcheck source=bench/servers.sh
. "$ROOT/bench/servers.sh"
SECS=${SECS:-3}
BUILD=${BUILD:-$ROOT/build}
OUT=${OUT:-}
MODE=perf
SERVER=perch
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
HTTP_CONNS=${HTTP_CONNS:-50}
RESP_TESTS=${RESP_TESTS:-ping_mbulk,set,get} RESP_N1=${RESP_N1:-100000} RESP_N16=${RESP_N16:-1000000}
PERF_FREQ=${PERF_FREQ:-1999}
TOP=${TOP:-20}

QUOTA=""
QUOTA_PERIOD_US=${QUOTA_PERIOD_US:-5000}
QUOTA_CGROUP=${QUOTA_CGROUP:-auto}
# shellcheck source=bench/quota.sh
. "$ROOT/bench/quota.sh"

while getopts "d:b:o:m:s:q:h" opt; do
	case $opt in
	m) MODE=$OPTARG ;;
	q) QUOTA=$OPTARG ;;
	s) SERVER=$OPTARG ;;
	*) common_opt "$opt" "${OPTARG:-}" || usage ;;
	esac
done
shift $((OPTIND - 1))
(($#)) || usage
[[ $MODE =~ ^(perf|syscalls|strace|ops|tcp|all)$ ]] || { echo "profile.sh: -m takes perf, syscalls, strace, ops, tcp or all" >&2; usage; }
[[ -z $QUOTA || $QUOTA =~ ^[0-9]+$ ]] || { echo "profile.sh: -q takes a whole percent" >&2; usage; }
[[ $SECS =~ ^[0-9]+$ ]] || { echo "profile.sh: -d takes whole seconds" >&2; usage; }
BUILD=$(readlink -f "$BUILD")
server_defaults

TMP=$(mktemp -d /tmp/perch-profile.XXXXXX)
[[ -n $OUT ]] || OUT=$TMP/out
mkdir -p "$OUT"
SERVER_PID=""
TRACER_PID=""
CLK_TCK=$(getconf CLK_TCK)
PORT=17600

stop_tracer() {
	[[ -n $TRACER_PID ]] || return 0
	kill -INT "$TRACER_PID" 2>/dev/null || true
	wait "$TRACER_PID" 2>/dev/null || true
	TRACER_PID=""
}
cleanup() {
	stop_tracer
	stop_server
	quota_teardown
	[[ $OUT == "$TMP"/* ]] || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in taskset perf strace nm objdump; do
	have "$tool" || { echo "profile.sh: $tool is required (Debian: linux-perf, strace, binutils)" >&2; exit 1; }
done

# The server command line for LOAD's family and SERVER, or nothing when that pair does not exist.
server_cmd() {
	case ${1%%-*}/$SERVER in
	echo/perch) echo "$PERCH_ECHO" ;;
	echo/perch-epoll) echo "$PERCH_ECHO_EPOLL" ;;
	echo/uring-baseline) echo "$URING_ECHO" ;;
	echo/epoll-baseline) echo "$EPOLL_ECHO" ;;
	http/perch) echo "$PERCH_HTTPD" ;;
	http/nginx) echo "$NGINX" ;;
	resp/perch) echo "$PERCH_RESP" ;;
	resp/redis) echo "$REDIS" ;;
	https/perch) echo "$PERCH_HTTPS" ;;
	https/nginx) echo "$NGINX_TLS" ;;
	resptls/perch) echo "$PERCH_RESP_TLS" ;;
	resptls/redis) echo "$REDIS_TLS" ;;
	esac
}

# Runs LOAD's client against PORT in the foreground: prints "requests throughput p99_us errors".
run_client() { # load port
	case $1 in
	echo-pingpong) client_echo pingpong 50 64 "$2" ;;
	echo-stream) client_echo stream 8 4096 "$2" ;;
	http-plain) client_http 1 "$2" ;;
	http-pipelined) client_http 16 "$2" ;;
	resp-P1 | resp-P16) client_resp_all "${1#resp-P}" "$2" ;;
	https-keepalive) client_https "$2" ;;
	https-new) client_handshakes new "$2" ;;
	resptls-P1) client_resp_tls_all "$2" ;;
	*) echo "profile.sh: unknown load '$1'" >&2; usage ;;
	esac
}

# Every test of RESP_TESTS in turn; the requests added up, the other figures of the last.
client_resp_all() { # pipeline port
	local t total=0 req thr p99 errs=0 e
	for t in ${RESP_TESTS//,/ }; do
		read -r req thr p99 e <<<"$(client_resp "$t" "$1" "$2")"
		total=$((total + req)) errs=$((errs + e))
	done
	echo "$total $thr $p99 $errs"
}

# The same over TLS, at -P 1.
client_resp_tls_all() { # port
	local t total=0 req thr p99 errs=0 e
	for t in ${RESP_TESTS//,/ }; do
		read -r req thr p99 e <<<"$(client_resp_tls "$t" "$1")"
		total=$((total + req)) errs=$((errs + e))
	done
	echo "$total $thr $p99 $errs"
}

# The server and its children as a comma list (nginx's worker is a child of its master).
server_pids() {
	local pids=$SERVER_PID p
	for p in $(pgrep -P "$SERVER_PID" || true); do pids+=",$p"; done
	echo "$pids"
}

# Starts a tracer on the server in the background: its command, then the server's pids.
start_tracer() {
	"$@" &
	TRACER_PID=$!
	sleep 0.5 # attached before the first request
}

# ---- perf: samples by bucket ----

# "function<TAB>source file<TAB>address" for every function of BINARY that has debug info.
function_sources() {
	nm -l --defined-only "$1" | awk -F'\t' 'NF == 2 { split($1, a, " "); if (a[2] ~ /^[tTwW]$/) { sub(/:[0-9]+$/, "", $2); print a[3] "\t" $2 "\t" a[1] } }'
}

# The addresses (hex) of the two instructions after each call of BINARY into a library function
# that makes a syscall. A cpu-clock sample that falls due while the kernel returns from the
# syscall is taken on the first user instructions after it: there, it is the kernel's time.
syscall_returns() {
	objdump -d --no-show-raw-insn "$1" | awk -F'[:\t]' '
		after > 0 && $1 ~ /^ *[0-9a-f]+$/ { a = $1; gsub(/ /, "", a); print a; after-- }
		/call .*<(io_uring_(submit|enter|wait|get_events|peek)[a-z_]*|__io_uring_get_cqe|gettid|syscall|epoll_wait|epoll_ctl|recv[a-z]*|send[a-z]*|read|write|writev|close|accept4?|setsockopt|madvise)@plt>/ { after = 2 }'
}

# Reads `perf script -F ip,sym,symoff,dso` and prints the report of one profile.
bucket_samples() { # binary sources-file syscall-returns-file
	awk -v bin="$(readlink -f "$1")" -v root="$ROOT" -F'\t' '
	function hex(h,   i, v) { v = 0; h = tolower(h); sub(/^0x/, "", h)
		for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
		return v }
	FILENAME == ARGV[1] { src[$1] = $2; if ($1 in addr) addr[$1] = -1; else addr[$1] = hex($3); next } # -1: a name twice
	FILENAME == ARGV[2] { exitpc[hex($1)] = 1; next }
	{
		n = split($0, w, " "); if (n < 3) next
		dso = w[n]; gsub(/[()]/, "", dso); sym = w[n - 1]; off = -1
		if (split(sym, so, /[+]0x/) == 2) { sym = so[1]; off = hex(so[2]) }
		if (dso ~ /kernel|^\[k/) b = "kernel"
		else if (dso == bin && off >= 0 && addr[sym] > 0 && ((addr[sym] + off) in exitpc)) b = "syscall-exit"
		else if (dso == bin) {
			f = (sym in src) ? src[sym] : ""
			if (index(f, root "/lib/") == 1 || index(f, root "/pipes/") == 1 || (f == "" && sym ~ /^perch_/)) b = "perch"
			else if (f == "" && index(bin, root "/") == 1) b = "other" # our binary, no source: crt, PLT
			else b = "app" # examples/, a baseline, or the code of a foreign server
		} else if (dso ~ /\/libc\.so/) b = "libc"
		else if (dso ~ /\/liburing\.so/) b = "liburing"
		else if (dso ~ /\[unknown\]/) b = "unknown"
		else { b = dso; sub(/.*\//, "", b) } # the loader, vdso, the libraries of a foreign server
		count[b]++; total++
		if (b != "kernel" && b != "syscall-exit") user++
		fn[b "\t" sym]++
	}
	END {
		if (!total) { print "no samples"; exit }
		printf "samples %d (user %d, kernel %d, syscall-exit %d)\n", total, user, count["kernel"], count["syscall-exit"]
		for (b in count) printf "bucket\t%s\t%d\t%.1f%% of all\t%s\n", b, count[b], 100 * count[b] / total,
			(b == "kernel" || b == "syscall-exit") ? "" : sprintf("%.1f%% of user", user ? 100 * count[b] / user : 0)
		printf "perch_share\t%.4f\t%.4f\n", count["perch"] / total, user ? count["perch"] / user : 0
		# Every function, most samples first (the summary prints the first TOP of all and of user).
		for (k in fn) print "fn\t" fn[k] "\t" k | "sort -t\"\t\" -k2,2nr"
	}' "$2" "$3" -
}

profile_perf() { # load port cmd
	local data=$TMP/$1-$SERVER.perf report=$OUT/$1-$SERVER.perf.txt c0 c1 res req bin
	read -r bin _ <<<"${3//\{port\}/0}"
	bin=$(command -v "$bin" || echo "$bin")
	start_tracer timeout $((SECS + 60)) perf record -q -e cpu-clock -F "$PERF_FREQ" -p "$(server_pids)" -o "$data"
	c0=$(server_cpu)
	res=$(run_client "$1" "$2")
	c1=$(server_cpu)
	stop_tracer
	read -r req _ _ _ <<<"$res"
	function_sources "$bin" >"$TMP/sources.tsv"
	syscall_returns "$bin" >"$TMP/exits.txt"
	{
		echo "# $1 on $SERVER ($3)${QUOTA:+, under a quota of $QUOTA% of a CPU}: perf record -e cpu-clock -F $PERF_FREQ, $req requests"
		awk -v c0="$c0" -v c1="$c1" -v h="$CLK_TCK" -v n="$req" 'BEGIN { split(c0, a, " "); split(c1, b, " ")
			u = (b[1] - a[1]) * 1e6 / h; s = (b[2] - a[2]) * 1e6 / h
			printf "server cpu %.2f us/req (user %.2f, sys %.2f; /proc/PID/stat, under perf)\n", n ? (u + s) / n : 0, n ? u / n : 0, n ? s / n : 0 }'
		perf script -i "$data" -F ip,sym,symoff,dso 2>/dev/null | bucket_samples "$bin" "$TMP/sources.tsv" "$TMP/exits.txt"
	} >"$report"
	awk -F'\t' '/^server cpu/ { split($0, a, " "); us = a[3]; print "  " $0 } /^perch_share/ { all = $2; user = $3 }
		/^samples/ { print "  " $0 }
		/^bucket/ { printf "  %-9s %6d samples %7s %s\n", $2, $3, $4, $5 }
		END { if (perch) printf "  perch: %.1f%% of all server CPU, %.1f%% of its user CPU; %.2f of %.2f us/req\n", all * 100, user * 100, all * us, us }' \
		perch="$([[ $SERVER == perch* ]] && echo 1 || echo 0)" "$report"
	echo "  top functions:"
	awk -F'\t' -v top="$TOP" '$1 == "fn" && n++ < top { printf "    %6d  %-9s %s\n", $2, $3, $4 }' "$report"
	echo "  top user functions:"
	awk -F'\t' -v top="$TOP" '$1 == "fn" && $3 != "kernel" && n++ < top { printf "    %6d  %-9s %s\n", $2, $3, $4 }' "$report"
}

# ---- strace: syscalls per request ----

profile_strace() { # load port cmd
	local log=$TMP/$1-$SERVER.strace report=$OUT/$1-$SERVER.strace.txt res req
	local pids=() p
	for p in ${SERVER_PID} $(pgrep -P "$SERVER_PID" || true); do pids+=(-p "$p"); done
	start_tracer timeout $((SECS + 90)) strace -c -f -o "$log" "${pids[@]}"
	res=$(run_client "$1" "$2")
	stop_tracer
	read -r req _ _ _ <<<"$res"
	{
		echo "# $1 on $SERVER ($3): strace -c -f, $req requests (the server runs slower traced: counts, not times)"
		# strace -c rows: % time, seconds, usecs/call, calls, [errors], syscall; the last row is the total.
		awk -v n="$req" '$1 ~ /^[0-9.]+$/ && NF >= 5 {
			row = sprintf("%-20s %10d calls %8.3f per request", $NF, $4, n ? $4 / n : 0)
			if ($NF == "total") last = row; else print row | "sort -k4,4nr"
		} END { close("sort -k4,4nr"); print last }' "$log"
	} >"$report"
	sed 's/^/  /' "$report"
}

# ---- perf stat: syscalls per request (counters only: the server is not slowed) ----

profile_syscalls() { # load port cmd
	local log=$TMP/$1-$SERVER.sysstat report=$OUT/$1-$SERVER.syscalls.txt res req
	start_tracer timeout $((SECS + 90)) perf stat -x, -o "$log" -e 'syscalls:sys_enter_*' -e page-faults -p "$(server_pids)"
	res=$(run_client "$1" "$2")
	stop_tracer
	read -r req _ _ _ <<<"$res"
	{
		echo "# $1 on $SERVER ($3)${QUOTA:+, under a quota of $QUOTA% of a CPU}: perf stat -e 'syscalls:sys_enter_*' (tracepoint counters: no sampling, so no slowdown), $req requests"
		awk -F, -v n="$req" '$3 ~ /^syscalls:sys_enter_/ && $1 + 0 > 0 {
			name = $3; sub(/^syscalls:sys_enter_/, "", name); total += $1
			printf "%-20s %10d calls %8.3f per request\n", name, $1, n ? $1 / n : 0 | "sort -k4,4nr"
		} $3 == "page-faults" { faults = $1 }
		END { close("sort -k4,4nr"); printf "%-20s %10d calls %8.3f per request\n", "total", total, n ? total / n : 0
		      printf "%-20s %10d       %8.3f per request\n", "(page faults)", faults, n ? faults / n : 0 }' "$log"
	} >"$report"
	sed 's/^/  /' "$report"
}

# Submissions by opcode and received TCP segments by socket, in the server's context, per request.
profile_ops() { # load port cmd
	local data=$TMP/$1-$SERVER.ops.data report=$OUT/$1-$SERVER.ops.txt res req
	start_tracer timeout $((SECS + 90)) perf record -q -o "$data" -e io_uring:io_uring_submit_req \
		-e tcp:tcp_probe -p "$(server_pids)"
	res=$(run_client "$1" "$2")
	stop_tracer
	read -r req _ _ _ <<<"$res"
	{
		echo "# $1 on $SERVER ($3)${QUOTA:+, under a quota of $QUOTA% of a CPU}: perf record -e io_uring:io_uring_submit_req -e tcp:tcp_probe, $req requests"
		perf script -i "$data" 2>/dev/null | awk -v n="$req" -v port="$2" '
			/io_uring_submit_req:/ { for (i = 1; i < NF; i++) if ($i == "opcode") { op = $(i + 1); sub(/,$/, "", op); ops[op]++ } }
			/tcp_probe:/ { for (i = 1; i < NF; i++) if ($i ~ /^src=/) { side = ($i ~ (":" port "$")) ? "the server'"'"'s socket" : "the client'"'"'s socket"; seg[side]++ } }
			END {
				for (op in ops) printf "submitted %-12s %10d %8.4f per request\n", op, ops[op], n ? ops[op] / n : 0
				for (s in seg) printf "segments received by %-20s %10d %8.4f per request\n", s, seg[s], n ? seg[s] / n : 0
			}' | sort
	} >"$report"
	sed 's/^/  /' "$report"
}

# TCP segments and ACKs per request, from nstat's counters (the whole network namespace).
profile_tcp() { # load port cmd
	local report=$OUT/$1-$SERVER.tcp.txt res req
	have nstat || { echo "profile.sh: -m tcp needs nstat (iproute2)" >&2; exit 1; }
	nstat -n >/dev/null # the counters now become the history the next nstat subtracts
	res=$(run_client "$1" "$2")
	read -r req _ _ _ <<<"$res"
	{
		echo "# $1 on $SERVER ($3)${QUOTA:+, under a quota of $QUOTA% of a CPU}: nstat over the client's run (every socket of the network namespace, both ends), $req requests"
		nstat -z 2>/dev/null | awk -v n="$req" '$1 ~ /^(TcpInSegs|TcpOutSegs|TcpRetransSegs|TcpExtTCPPureAcks|TcpExtDelayedACKs|TcpExtTCPOrigDataSent|TcpExtTCPLossProbes|TcpExtDelayedACKLost)$/ {
			printf "%-24s %10d %8.3f per request\n", $1, $2, n ? $2 / n : 0 }'
	} >"$report"
	sed 's/^/  /' "$report"
}

if [[ -n $QUOTA ]]; then
	quota_setup "$QUOTA" "$QUOTA_PERIOD_US" "$QUOTA_CGROUP"
	echo "profile.sh: the server runs under a CPU quota of $QUOTA% of one CPU ($QUOTA_HOW)"
fi

for load in "$@"; do
	[[ $load == https-* || $load == resptls-* ]] && tls_certs
	cmd=$(server_cmd "$load")
	[[ -n $cmd ]] || { echo "profile.sh: no server '$SERVER' for load '$load'" >&2; exit 2; }
	runnable "$cmd" || { echo "profile.sh: '${cmd%% *}' is not built or not installed" >&2; exit 1; }
	modes=("$MODE")
	[[ $MODE == all ]] && modes=(perf syscalls strace)
	for m in "${modes[@]}"; do
		port=$((PORT++))
		echo "== $load on $SERVER: $m"
		start_server "$cmd" "$port" || exit 1
		"profile_$m" "$load" "$port" "$cmd"
		stop_server
	done
done
echo "reports: $OUT"
