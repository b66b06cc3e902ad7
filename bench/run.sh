#!/usr/bin/env bash
# bench/run.sh: takes every server through the same load in interleaved rounds, prints medians and ratios, writes results.md and plots (bench/out/ unless -o).
set -euo pipefail
shopt -s nullglob

usage() {
	cat >&2 <<'EOF'
usage: bench/run.sh [-r ROUNDS] [-d SECS] [-q PERCENT] [-o OUTDIR] [-b BUILDDIR] [SCENARIO...]

Scenarios (default: all of them, in this order):
  echo    perch echo vs baseline_uring_echo vs baseline_epoll_echo, with bench/echo_client:
          ping-pong (ECHO_CONNS=50 connections, ECHO_SIZE=64 bytes) and stream
          (STREAM_CONNS=8, STREAM_SIZE=4096)
  http    perch httpd vs nginx (one worker, a generated config serving "Hello, World!"), with
          wrk -c HTTP_CONNS=50, plain and 16-deep pipelined (-s bench/pipeline.lua); without
          wrk, bench/http_client does the same
  resp    perch resp vs redis-server, redis-benchmark -t ping_mbulk, set, get (RESP_TESTS),
          -P 1 (RESP_N1=100000 requests) and -P 16 (RESP_N16=1000000), -c 50
  flood   bench/flood_client (96 connections x 64,000 frames of 126 bytes, 2 s write deadline)
          against perch echo's three receive paths and both baselines
  unix    the echo scenario's loads over a Unix socket beside loopback TCP: perch echo, and
          both baselines (--unix PATH), each on TCP then on a Unix socket, in the same rounds
  zerocopy  large GETs (ZC_SIZES, default 16 KiB to 1 MiB; redis-benchmark -c ZC_CONNS=8,
          ZC_BYTES=1 GiB of values a load) from perch resp four ways: values copied into the
          writer (--copy), sent by reference with plain sends (--zerocopy-min off), by reference
          with SEND_ZC (--zerocopy-min 1), and by reference on epoll; the crossover that sets
          perch_conn_opts.zerocopy_min's default; ZC_WAYS picks some of the four (not in the default set)
  hostile bench/partial_client: HOSTILE_CONNS=10000 connections each holding the start of a
          request, and meanwhile HOSTILE_PROBES=200 normal requests timed one at a time (p50, p99,
          worst); then how long after their close the server's fds are back to where they were,
          and its peak RSS; perch httpd on both backends against nginx (not in the default set)
  stalled bench/stall_client through a proxy: STALL_SESSIONS=1000 sessions whose upstream never
          reads (each client sending until its socket stays full), then one normal session
          sending for -d seconds; its MB/s against the same proxy with none stalled, and the
          proxy's peak RSS; perch proxy on both backends against nginx's stream proxy (one
          worker; skipped without libnginx-mod-stream) (not in the default set)
  https   perch httpd --tls-cert/--tls-key vs nginx (one worker, the same ECDSA P-256 certificate, a
          session cache and tickets): keep-alive (wrk -c HTTP_CONNS over TLS), a full handshake a
          request and a resumed one (openssl s_time -new / -reuse, TLS 1.2, GET /plaintext); then
          perch resp over TLS vs redis-server --tls-port (redis-benchmark --tls -P 1, RESP_TESTS)
          (not in the default set)
  scale   SCALE_CONNS (default "10000 100000") idle keep-alive connections to httpd (bench/idle_client:
          each from 127.0.0.2-9, one GET answered, then held): the server's RSS per connection, and
          wrk -c SCALE_ACTIVE (64) before and while they are held; perch httpd on both backends (no
          idle timeout) against nginx (worker_connections raised, keepalive_timeout 600s). A size
          the fd limit cannot hold is skipped, saying what it needs (not in the default set)

Each round starts every server afresh, one at a time, pinned to core SERVER_CPU (0), with
the client pinned to CLIENT_CPU (1); servers run in the same order every round (ABAB...).
CPU per request is the server's utime and stime (its process and its children, from
/proc/PID/stat) over the load, divided by the requests the client completed. Each row also
records the server's CPU over the client's wall time (its share of a core) and its capacity,
requests per server-CPU second; a server under BOUND_UTIL (0.90) of its core is marked
client-bound in results.md, and ratios are given for throughput and for capacity.

Options: -r rounds (ROUNDS, 5; FLOOD_ROUNDS, 3), -d seconds a load (SECS, 3),
-o where results.md, raw.tsv and the PNGs go (OUT, bench/out; the published run is -o doc/perf/final),
-b the build dir (BUILD, build).

Server-bound mode: -q PERCENT (PERCH_BENCH_SERVER_QUOTA; default off) runs every server, its
threads and children, in one cgroup with a CPU bandwidth quota of PERCENT% of one CPU, the
same for all, so the single-threaded client on the other core can outpace it. The period is
QUOTA_PERIOD_US (5000 us: a throttled server waits out the rest of its period, which adds to
the tail latency); QUOTA_CGROUP picks the hierarchy (auto: v1's cpu.cfs_quota_us, else v2's
cpu.max; or v1, v2). Root is needed; when no quota can be set the run stops, never running
unthrottled. A server then counts as saturated at BOUND_UTIL x PERCENT% of a core, and each
row records the share of quota periods in which the server was throttled.

Every echo server keeps Nagle's algorithm (perch's echo with --nagle; the baselines as they are),
or with ECHO_NODELAY=1 sets TCP_NODELAY (perch's echo as it is; the baselines with --nodelay):
the same socket options on both sides of every echo comparison.

perch servers are command lines with {port} (a server whose program is missing is skipped):
  PERCH_ECHO            default: BUILD/examples/echo/echo --port {port} --nagle (ECHO_NODELAY=1: without --nagle)
  PERCH_HTTPD           default: BUILD/examples/httpd/httpd --port {port} --threads 1
  PERCH_RESP            default: BUILD/examples/resp/resp --port {port} --threads 1
  PERCH_PROXY           default: BUILD/examples/proxy/proxy --port {port} --to 127.0.0.1:{up}
  PERCH_HTTPS, PERCH_RESP_TLS  default: PERCH_HTTPD, PERCH_RESP with --tls-cert/--tls-key (a throwaway
                        CA and certificate from tests/tls_certs.sh, in the temp dir: {dir}/certs)
  PERCH_ECHO_MULTISHOT  default: PERCH_ECHO --backend uring --recv multishot
  PERCH_ECHO_SINGLESHOT default: PERCH_ECHO --backend uring --recv singleshot
  PERCH_ECHO_EPOLL      default: PERCH_ECHO --backend epoll
  PERCH_ECHO_UNIX       default: BUILD/examples/echo/echo --listen unix:{unix} ({unix}: a path in the temp dir)
  PERCH_ECHO_VS, PERCH_HTTPD_VS, PERCH_RESP_VS, PERCH_HTTPS_VS, PERCH_RESP_TLS_VS: "NAME|COMMAND"
                        adds a server right after perch
                        in its group (another build of perch, say), in the same interleaved rounds

It installs nothing. The Debian packages it uses: wrk nginx-light libnginx-mod-stream
redis-server redis-tools gnuplot-nox (as root: apt-get install -y wrk nginx-light
libnginx-mod-stream redis-server redis-tools gnuplot-nox, or ./dev bench-deps). Build the
bench programs first: ./dev build.
EOF
	exit 2
}

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
# shellcheck source=bench/servers.sh
. "$ROOT/bench/servers.sh"
# shellcheck source=bench/quota.sh
. "$ROOT/bench/quota.sh"
ROUNDS=${ROUNDS:-5}
FLOOD_ROUNDS=${FLOOD_ROUNDS:-3}
SECS=${SECS:-3}
OUT=${OUT:-$ROOT/bench/out}
BUILD=${BUILD:-$ROOT/build}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
ECHO_CONNS=${ECHO_CONNS:-50} ECHO_SIZE=${ECHO_SIZE:-64}
STREAM_CONNS=${STREAM_CONNS:-8} STREAM_SIZE=${STREAM_SIZE:-4096}
HTTP_CONNS=${HTTP_CONNS:-50}
HOSTILE_CONNS=${HOSTILE_CONNS:-10000} HOSTILE_PROBES=${HOSTILE_PROBES:-200}
STALL_SESSIONS=${STALL_SESSIONS:-1000}
SCALE_CONNS=${SCALE_CONNS:-10000 100000} SCALE_ACTIVE=${SCALE_ACTIVE:-64}
RESP_TESTS=${RESP_TESTS:-ping_mbulk set get} RESP_N1=${RESP_N1:-100000} RESP_N16=${RESP_N16:-1000000}
ZC_SIZES=${ZC_SIZES:-16384 65536 262144 1048576} ZC_CONNS=${ZC_CONNS:-8} ZC_BYTES=${ZC_BYTES:-1073741824}
ZC_WAYS=${ZC_WAYS:-copy ref ref-zc ref-epoll}
BOUND_UTIL=${BOUND_UTIL:-0.90} # a server under this share of its core (of its quota) was not what bounded the load
CONTEND=${CONTEND:-0.10}         # other work taking this share of the server's or the client's core contends the row
QUOTA=${PERCH_BENCH_SERVER_QUOTA:-} # percent of one CPU for every server, empty: no quota
QUOTA_PERIOD_US=${QUOTA_PERIOD_US:-5000}
QUOTA_CGROUP=${QUOTA_CGROUP:-auto}

while getopts "r:d:q:o:b:h" opt; do
	case $opt in
	r) ROUNDS=$OPTARG FLOOD_ROUNDS=$OPTARG ;;
	q) QUOTA=$OPTARG ;;
	*) common_opt "$opt" "${OPTARG:-}" || usage ;;
	esac
done
shift $((OPTIND - 1))
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $FLOOD_ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: rounds must be a positive whole number" >&2; usage; }
[[ $SECS =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "run.sh: -d takes seconds, e.g. 3" >&2; usage; }
BUILD=$(readlink -f "$BUILD")
SCENARIOS=("$@")
((${#SCENARIOS[@]})) || SCENARIOS=(echo http resp flood unix)
for s in "${SCENARIOS[@]}"; do
	[[ $s =~ ^(echo|http|resp|flood|unix|hostile|zerocopy|stalled|https|scale)$ ]] || { echo "run.sh: unknown scenario '$s'" >&2; usage; }
done

server_defaults

TMP=$(mktemp -d /tmp/perch-bench.XXXXXX)
RAW=$TMP/raw.tsv
SERVER_PID=""
UNIX_TARGET=""
CLK_TCK=$(getconf CLK_TCK)
PORT=17100

cleanup() {
	stop_server
	quota_teardown
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [[ -n $QUOTA ]]; then
	quota_setup "$QUOTA" "$QUOTA_PERIOD_US" "$QUOTA_CGROUP"
	echo "run.sh: every server runs under a CPU quota of $QUOTA% of one CPU ($QUOTA_HOW)"
fi
# The share of a core at which a server counts as saturated: BOUND_UTIL of the core, or of the quota.
BOUND=$(awk -v b="$BOUND_UTIL" -v q="${QUOTA:-100}" 'BEGIN { print b * q / 100 }')

# ---- what is here ----

MISSING=()
for tool in taskset wrk nginx redis-server redis-benchmark gnuplot; do
	have "$tool" || MISSING+=("$tool")
done
if ((${#MISSING[@]})); then
	echo "run.sh: not installed here: ${MISSING[*]} (Debian: apt-get install -y wrk nginx-light redis-server" \
		"redis-tools gnuplot-nox; or ./dev bench-deps); what needs them is skipped or falls back" >&2
fi
have taskset || { echo "run.sh: taskset (util-linux) is required to pin server and client" >&2; exit 1; }
for prog in echo_client flood_client http_client idle_client partial_client baseline_uring_echo baseline_epoll_echo; do
	[[ -x $BUILD/bench/$prog ]] || { echo "run.sh: $BUILD/bench/$prog is missing: run ./dev build first" >&2; exit 1; }
done

# ---- one measurement ----

# The counters a run is measured by, on one line: server user and system ticks, the client core's busy and total ticks,
# the server core's busy and total ticks, quota periods and throttled periods, the time.
# The time is read last; snapshot after reads it first (so the wall brackets the client closely).
snapshot() { # before|after
	local t=$EPOCHREALTIME
	[[ $1 == after ]] || t=""
	echo "$(server_cpu) $(core_ticks "$CLIENT_CPU") $(core_ticks "$SERVER_CPU") $(quota_periods) ${t:-$EPOCHREALTIME}"
}

# measure SCENARIO LOAD SERVER CMD ROUND CLIENT-FUNCTION ARGS...: one server run under one load, one row in raw.tsv.
measure() {
	local scen=$1 load=$2 name=$3 cmd=$4 round=$5 port=$((PORT++)) before after out
	shift 5
	start_server "$cmd" "$port" || { printf '%s\t%s\t%s\t%s\tFAILED\n' "$scen" "$load" "$name" "$round" >>"$RAW"; return; }
	before=$(snapshot before)
	# The client's line, then its own CPU: the user and system time of the subshell's children (the client, wrappers).
	out=$([[ -z $CLIENT_PROCS ]] || echo "$BASHPID" >"$CLIENT_PROCS" || { echo "run.sh: cannot put the client in $CLIENT_DIR" >&2; exit 97; }
		"$@" "$port"
		times)
	after=$(snapshot after)
	stop_server
	record "$scen	$load	$name	$round" "$(head -1 <<<"$out") $(tail -1 <<<"$out" | awk '{ for (i = 1; i <= 2; i++) {
		split($i, a, "m"); s += a[1] * 60 + a[2] } print s + 0 }')" "$before" "$after"
}

# record "SCEN\tLOAD\tSERVER\tROUND" "requests throughput p99 errors CLIENT" BEFORE AFTER: appends the row to raw.tsv and
# prints it; CLIENT is the client's CPU seconds (user + system).
# Columns from 5: throughput, p99 us, user and sys us/req, errors, wall s, server CPU s, server CPU / wall (its share of a
# core), capacity (requests per server-CPU second), client core busy share, throttled share of quota periods ("-"
# without a quota), the client's own CPU / wall (the client and its wrappers), other
# work on the server's core / wall (that core's busy share less the server's own CPU: the server is pinned there).
record() {
	local row
	row=$(awk -v key="$1" -v res="$2" -v a="$3" -v b="$4" -v h="$CLK_TCK" -v quota="$QUOTA" 'BEGIN {
		split(res, r, " "); split(a, x, " "); split(b, y, " "); for (i = 1; i <= 9; i++) d[i] = y[i] - x[i]
		n = r[1]; w = d[9]; c = (d[1] + d[2]) / h; cu = (d[4] > 0 ? d[3] / d[4] : 0); sv = (d[6] > 0 ? d[5] / d[6] : 0)
		th = (quota == "" ? "-" : sprintf("%.3f", (d[7] > 0 ? d[8] / d[7] : 0))); oth = sv - (w > 0 ? c / w : 0)
		printf "%s\t%s\t%s\t%.2f\t%.2f\t%s\t%.3f\t%.2f\t%.3f\t%.0f\t%.3f\t%s\t%.3f\t%.3f\n", key, r[2], r[3],
			(n ? d[1] * 1e6 / h / n : 0), (n ? d[2] * 1e6 / h / n : 0), r[4], w, c, (w > 0 ? c / w : 0), (c > 0 ? n / c : 0),
			cu, th, (w > 0 ? r[5] / w : 0), (oth > 0 ? oth : 0) }')
	echo "$row" >>"$RAW"
	awk -F'\t' '{ printf "  round %s  %-16s %-18s %12s/s  p99 %9s us  cpu %6s us user %6s us sys  server cpu %3.0f%%%s" \
		"  client %3.0f%%  other on server core %3.0f%%%s\n", $4, $2, $3, $5, $6, $7, $8, $12 * 100,
		($15 == "-" ? "" : sprintf("  throttled %.0f%%", $15 * 100)), $16 * 100, $17 * 100, ($9 ? "  ERRORS=" $9 : "") }' <<<"$row"
}

# The servers of a group that can run here, as "name|cmd" lines; says what it skips.
pick() {
	local entry name cmd
	for entry in "$@"; do
		name=${entry%%|*} cmd=${entry#*|}
		if runnable "$cmd"; then
			echo "$entry"
		else
			echo "run.sh: skip $name: '${cmd%% *}' is not built or not installed" >&2
		fi
	done
}

# rounds GROUP-ROUNDS SCENARIO LOAD CLIENT-ARGS... < servers: every round runs each server once, same order.
rounds() {
	local n=$1 scen=$2 load=$3 r entry list
	shift 3
	mapfile -t list < <(grep -v '^$' || true)
	((${#list[@]})) || { echo "  (no server to run for $scen)"; return; }
	for ((r = 1; r <= n; r++)); do
		for entry in "${list[@]}"; do
			measure "$scen" "$load" "${entry%%|*}" "${entry#*|}" "$r" "$@"
		done
	done
}

# ---- scenarios ----

scenario_echo() {
	local servers
	servers=$(pick "perch|$PERCH_ECHO" ${PERCH_ECHO_VS:+"$PERCH_ECHO_VS"} "uring-baseline|$URING_ECHO" "epoll-baseline|$EPOLL_ECHO")
	echo "== echo: ping-pong, $ECHO_CONNS connections x $ECHO_SIZE B; stream, $STREAM_CONNS x $STREAM_SIZE B"
	rounds "$ROUNDS" echo pingpong client_echo pingpong "$ECHO_CONNS" "$ECHO_SIZE" <<<"$servers"
	rounds "$ROUNDS" echo stream client_echo stream "$STREAM_CONNS" "$STREAM_SIZE" <<<"$servers"
}

# Echo over a Unix socket beside loopback TCP: each server twice, the same loads, interleaved in the same rounds.
scenario_unix() {
	local servers
	servers=$(pick "perch-tcp|$PERCH_ECHO" "perch-unix|$PERCH_ECHO_UNIX" "uring-baseline-tcp|$URING_ECHO" \
		"uring-baseline-unix|$URING_ECHO_UNIX" "epoll-baseline-tcp|$EPOLL_ECHO" "epoll-baseline-unix|$EPOLL_ECHO_UNIX")
	echo "== unix: echo over a Unix socket and over loopback TCP; ping-pong, $ECHO_CONNS x $ECHO_SIZE B; stream, $STREAM_CONNS x $STREAM_SIZE B"
	rounds "$ROUNDS" unix pingpong client_echo pingpong "$ECHO_CONNS" "$ECHO_SIZE" <<<"$servers"
	rounds "$ROUNDS" unix stream client_echo stream "$STREAM_CONNS" "$STREAM_SIZE" <<<"$servers"
}

scenario_http() {
	local servers client=wrk
	have wrk || client="bench/http_client (wrk is not installed)"
	servers=$(pick "perch|$PERCH_HTTPD" ${PERCH_HTTPD_VS:+"$PERCH_HTTPD_VS"} "nginx|$NGINX")
	echo "== http: GET /plaintext, $HTTP_CONNS connections, $client; plain and 16-deep pipelined"
	rounds "$ROUNDS" http plain client_http 1 <<<"$servers"
	rounds "$ROUNDS" http pipelined-16 client_http 16 <<<"$servers"
}

scenario_resp() {
	local servers t p
	have redis-benchmark || { echo "== resp: skipped, redis-benchmark is not installed (redis-tools)"; return; }
	servers=$(pick "perch|$PERCH_RESP" ${PERCH_RESP_VS:+"$PERCH_RESP_VS"} "redis|$REDIS")
	echo "== resp: redis-benchmark -c 50, tests: $RESP_TESTS; -P 1 and -P 16"
	for p in 1 16; do
		for t in $RESP_TESTS; do
			rounds "$ROUNDS" resp "$t-P$p" client_resp "$t" "$p" <<<"$servers"
		done
	done
}

# HTTPS against nginx (same certificate, a session cache), and resp over TLS against redis.
scenario_https() {
	local servers t
	have wrk || { echo "== https: skipped, wrk is not installed"; return; }
	tls_certs
	servers=$(pick "perch|$PERCH_HTTPS" ${PERCH_HTTPS_VS:+"$PERCH_HTTPS_VS"} "nginx|$NGINX_TLS")
	echo "== https: GET /plaintext over TLS; keep-alive (wrk -c $HTTP_CONNS), a full handshake a request and a resumed one (openssl s_time -tls1_2)"
	rounds "$ROUNDS" https keepalive client_https <<<"$servers"
	rounds "$ROUNDS" https handshake-full client_handshakes new <<<"$servers"
	rounds "$ROUNDS" https handshake-resumed client_handshakes reuse <<<"$servers"
	have redis-benchmark || { echo "== resp over TLS: skipped, redis-benchmark is not installed"; return; }
	servers=$(pick "perch|$PERCH_RESP_TLS" ${PERCH_RESP_TLS_VS:+"$PERCH_RESP_TLS_VS"} "redis|$REDIS_TLS")
	echo "== resp over TLS: redis-benchmark --tls -c 50 -P 1, tests: $RESP_TESTS"
	for t in $RESP_TESTS; do
		rounds "$ROUNDS" resp-tls "$t" client_resp_tls "$t" <<<"$servers"
	done
}

# Large GETs: one value, copied or referenced, plain or zero-copy; one load per size.
scenario_zerocopy() {
	local servers size base="$BUILD/examples/resp/resp --port {port} --threads 1"
	have redis-benchmark || { echo "== zerocopy: skipped, redis-benchmark is not installed (redis-tools)"; return; }
	servers=$(pick "copy|$base --copy" "ref|$base --zerocopy-min off" "ref-zc|$base --zerocopy-min 1" \
		"ref-epoll|$base --backend epoll" | awk -F'|' -v ways=" $ZC_WAYS " 'index(ways, " " $1 " ")')
	echo "== zerocopy: GET of one value, redis-benchmark -c $ZC_CONNS, $ZC_BYTES bytes of values a load; sizes: $ZC_SIZES"
	for size in $ZC_SIZES; do
		rounds "$ROUNDS" zerocopy "get-$size" client_get_size "$size" <<<"$servers"
	done
}

# Flood: one row per run with delivered frames, deadline hits and wall time (not a throughput).
flood_once() { # port
	local line
	line=$(taskset -c "$CLIENT_CPU" timeout 90 "$BUILD/bench/flood_client" --port "$1" --csv </dev/null) || true
	IFS=, read -r conns frames _ _ delivered deadline stalled failed wall <<<"$line"
	[[ -n ${wall:-} ]] || { echo "FLOOD 0/0 0 0 1 0"; return; }
	echo "FLOOD $delivered/$((conns * frames)) $deadline $stalled $failed $wall"
}

scenario_flood() {
	local servers entry r port res
	servers=$(pick "perch-multishot|$PERCH_ECHO_MULTISHOT" "perch-singleshot|$PERCH_ECHO_SINGLESHOT" \
		"perch-epoll|$PERCH_ECHO_EPOLL" "uring-baseline|$URING_ECHO" "epoll-baseline|$EPOLL_ECHO")
	echo "== flood: 96 connections x 64,000 frames of 126 B, 2 s write deadline"
	[[ -n $servers ]] || { echo "  (no server to run)"; return; }
	for ((r = 1; r <= FLOOD_ROUNDS; r++)); do
		while IFS= read -r entry; do
			port=$((PORT++))
			start_server "${entry#*|}" "$port" || continue
			res=$(flood_once "$port")
			stop_server
			read -r _ delivered deadline stalled failed wall <<<"$res"
			printf 'flood\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${entry%%|*}" "$r" "$delivered" "$deadline" \
				"$stalled" "$failed" "$wall" >>"$TMP/flood.tsv"
			printf '  round %s  %-18s delivered %s  deadline_hit %s  stalled %s  failed %s  wall %s s\n' \
				"$r" "${entry%%|*}" "$delivered" "$deadline" "$stalled" "$failed" "$wall"
		done <<<"$servers"
	done
}

# The fds the server holds (nginx: its master and worker), and their peak RSS in KiB.
server_fds() {
	local pid n=0
	for pid in $SERVER_PID $(pgrep -P "$SERVER_PID" || true); do
		n=$((n + $(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)))
	done
	echo "$n"
}
server_hwm_kib() {
	server_status_kib VmHWM
}

# A /proc/PID/status field in kB (VmHWM, VmRSS) of the server's processes, summed.
server_status_kib() { # field
	local pid n=0 kib
	for pid in $SERVER_PID $(pgrep -P "$SERVER_PID" || true); do
		kib=$(awk -v f="$1:" '$1 == f { print $2 }' "/proc/$pid/status" 2>/dev/null) || true
		n=$((n + ${kib:-0}))
	done
	echo "$n"
}

# Seconds until the server's fds are back to $1 (bounded at 10 s: "never" past it).
fds_back_after() { # baseline
	local t0=$EPOCHREALTIME
	while (($(server_fds) > $1)); do
		awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a > 10) }' && { echo never; return; }
		sleep 0.01
	done
	awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f\n", b - a }'
}

# Hostile: one row per run with the probes' latencies, the fds' return and the peak RSS.
scenario_hostile() {
	local servers entry r port base line back hwm
	servers=$(pick "perch-uring|$PERCH_HTTPD --backend uring" "perch-epoll|$PERCH_HTTPD --backend epoll" \
		${PERCH_HTTPD_VS:+"$PERCH_HTTPD_VS"} "nginx|$NGINX")
	echo "== hostile: $HOSTILE_CONNS connections holding half a request, $HOSTILE_PROBES normal requests meanwhile"
	[[ -n $servers ]] || { echo "  (no server to run)"; return; }
	# Every server and the client need more than 10,000 fds: the hard limit, if it allows.
	ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
	for ((r = 1; r <= ROUNDS; r++)); do
		while IFS= read -r entry; do
			port=$((PORT++))
			start_server "${entry#*|}" "$port" || continue
			sleep 0.2
			base=$(server_fds)
			line=$(taskset -c "$CLIENT_CPU" timeout 300 "$BUILD/bench/partial_client" --port "$port" \
				--conns "$HOSTILE_CONNS" --probes "$HOSTILE_PROBES" --csv </dev/null) || true
			back=$(fds_back_after "$base")
			hwm=$(server_hwm_kib)
			stop_server
			IFS=, read -r opened answered unanswered p50 p99 worst <<<"${line:-0,0,0,0,0,0}"
			printf 'hostile\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${entry%%|*}" "$r" "$opened" "$answered" \
				"$unanswered" "$p50" "$p99" "$worst" "$back" "$hwm" >>"$TMP/hostile.tsv"
			printf '  round %s  %-12s partial %s  answered %s  unanswered %s  p50 %s us  p99 %s us  worst %s us' \
				"$r" "${entry%%|*}" "$opened" "$answered" "$unanswered" "$p50" "$p99" "$worst"
			printf '  fds back after %s s  peak RSS %s KiB\n' "$back" "$hwm"
		done <<<"$servers"
	done
}

# wrk -c SCALE_ACTIVE for SECS against the server on port $1: "requests/s capacity errors" (capacity: requests
# per server-CPU second).
scale_load() { # port
	local a b out
	a=$(server_cpu)
	out=$(HTTP_CONNS=$SCALE_ACTIVE client_http 1 "$1")
	b=$(server_cpu)
	awk -v a="$a" -v b="$b" -v out="$out" -v h="$CLK_TCK" 'BEGIN { split(a, x, " "); split(b, y, " "); split(out, o, " ")
		c = (y[1] + y[2] - x[1] - x[2]) / h; printf "%.0f %.0f %d\n", o[2], (c > 0 ? o[1] / c : 0), o[4] }'
}

# One server, one size: its RSS and the active load alone, then SIZE idle connections opened and held, the RSS
# and the load again among them; one row in scale.tsv.
scale_once() { # name cmd round size
	local port=$((PORT++)) rss0 rss1 alone with ready="" opened=0 answered=0 line="" kept=0 per
	start_server "$2" "$port" || return 0
	sleep 0.2
	SECS=1 scale_load "$port" >/dev/null # warm: a fresh server's first load runs slower than its second
	rss0=$(server_status_kib VmRSS)
	alone=$(scale_load "$port")
	coproc IDLE { exec taskset -c "$CLIENT_CPU" timeout 900 "$BUILD/bench/idle_client" --port "$port" --conns "$4" --csv; }
	# shellcheck disable=SC2153 # IDLE_PID: set by coproc
	local idle_pid=$IDLE_PID idle_out=${IDLE[0]} idle_in=${IDLE[1]}
	read -r -t 600 ready opened answered <&"$idle_out" || true
	sleep 0.5
	rss1=$(server_status_kib VmRSS)
	with=$(scale_load "$port")
	exec {idle_in}>&- # its standard input ends: it counts the connections still open and exits
	read -r -t 120 line <&"$idle_out" || true
	wait "$idle_pid" 2>/dev/null || true
	stop_server
	[[ $ready == ready ]] || { echo "  round $3  $1  $4: the idle client did not get its connections up"; return 0; }
	IFS=, read -r opened answered kept <<<"${line:-0,0,0}"
	per=$(((rss1 - rss0) * 1024 / (opened > 0 ? opened : 1)))
	printf 'scale\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$4" "$1" "$3" "$opened" "$kept" "$rss0" "$rss1" "$per" \
		"$alone" "$with" >>"$TMP/scale.tsv"
	printf '  round %s  %-12s %6s idle (kept %s)  RSS %s -> %s KiB, %s B each  active: %s -> %s req/s, capacity %s -> %s\n' \
		"$3" "$1" "$opened" "$kept" "$rss0" "$rss1" "$per" "${alone%% *}" "${with%% *}" \
		"$(cut -d' ' -f2 <<<"$alone")" "$(cut -d' ' -f2 <<<"$with")"
}

# Scale: idle keep-alive connections by the thousand; RSS per connection and an active load among them.
scenario_scale() {
	local servers entry r n hard sizes=() max=0
	have wrk || { echo "== scale: skipped, wrk is not installed"; return; }
	ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
	hard=$(ulimit -Hn)
	for n in $SCALE_CONNS; do
		if [[ $hard != unlimited ]] && ((hard < n + 1024)); then
			echo "== scale: skip $n connections: the server and the client each need $((n + 1024)) fds and the" \
				"hard limit (RLIMIT_NOFILE) here is $hard; raise it as root (ulimit -Hn $((n + 1024)), LimitNOFILE=)"
			continue
		fi
		sizes+=("$n")
		((n > max)) && max=$n
	done
	((${#sizes[@]})) || return 0
	servers=$(pick "perch-uring|$PERCH_HTTPD --backend uring --idle-timeout 0" \
		"perch-epoll|$PERCH_HTTPD --backend epoll --idle-timeout 0" ${PERCH_HTTPD_VS:+"$PERCH_HTTPD_VS"} "nginx|$NGINX")
	echo "== scale: ${sizes[*]} idle keep-alive connections from 127.0.0.2-9; RSS each, wrk -c $SCALE_ACTIVE alone and among them"
	export NGINX_CONNS=$((max + 1024)) NGINX_KEEPALIVE=600s
	for ((r = 1; r <= ROUNDS; r++)); do
		for n in "${sizes[@]}"; do
			while IFS= read -r entry; do
				[[ -n $entry ]] && scale_once "${entry%%|*}" "${entry#*|}" "$r" "$n"
			done <<<"$servers"
		done
	done
	unset NGINX_CONNS NGINX_KEEPALIVE
}

# nginx's stream module proxying 127.0.0.1:$1 to :$2, one worker; false without the module.
nginx_stream_conf() { # port upstream-port
	local mod=/usr/lib/nginx/modules/ngx_stream_module.so
	[[ -f $mod ]] || return 1
	cat >"$TMP/nginx-stream-$1.conf" <<EOF
load_module $mod;
worker_processes 1;
daemon off;
pid $TMP/nginx-stream-$1.pid;
worker_rlimit_nofile 32768;
events { worker_connections 16384; }
stream {
	server {
		listen 127.0.0.1:$1;
		proxy_pass 127.0.0.1:$2;
	}
}
EOF
}

# Stalled: per server and round, a normal session's MB/s with none stalled, then with STALL_SESSIONS.
scenario_stalled() {
	local servers entry r n port up line hwm cmd opened sent mbps first
	local nginx_stream="nginx-stream|nginx -p {dir} -c {dir}/nginx-stream-{port}.conf -e {dir}/nginx-error.log"
	servers=$(pick "perch-uring|$PERCH_PROXY --backend uring" "perch-epoll|$PERCH_PROXY --backend epoll" "$nginx_stream")
	echo "== stalled: $STALL_SESSIONS sessions whose upstream never reads, then a normal session for $SECS s"
	[[ -n $servers ]] || { echo "  (no server to run)"; return; }
	ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
	for ((r = 1; r <= ROUNDS; r++)); do
		while IFS= read -r entry; do
			for n in 0 "$STALL_SESSIONS"; do
				port=$((PORT++)) up=$((PORT++))
				cmd=${entry#*|}
				if [[ $cmd == *nginx-stream-* ]] && ! nginx_stream_conf "$port" "$up"; then
					echo "  skip ${entry%%|*}: no nginx stream module (apt-get install libnginx-mod-stream)"
					break
				fi
				start_server "${cmd//\{up\}/$up}" "$port" || continue
				line=$(taskset -c "$CLIENT_CPU" timeout 300 "$BUILD/bench/stall_client" --port "$port" \
					--upstream-port "$up" --stalled "$n" --secs "$SECS" --csv </dev/null) || true
				hwm=$(server_hwm_kib)
				stop_server
				IFS=, read -r opened sent mbps first <<<"${line:-0,0,0,-1}"
				printf 'stalled\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${entry%%|*}" "$r" "$n" "$opened" "$sent" "$mbps" \
					"$hwm" >>"$TMP/stalled.tsv"
				printf '  round %s  %-12s stalled %5s (sent %s B)  normal %s MB/s, first byte %s ms  peak RSS %s KiB\n' \
					"$r" "${entry%%|*}" "$opened" "$sent" "$mbps" "$first" "$hwm"
			done
		done <<<"$servers"
	done
}

# ---- results ----

# An awk median of a space-separated list, for the plots: the one summarize.awk has.
AWK_MEDIAN=$(sed -n '/^function median(/,/^}/p' "$ROOT/bench/summarize.awk")

# The table of medians, ratios and who bounded each row: bench/summarize.awk over raw.tsv. A server under BOUND
# (BOUND_UTIL of a core, or of the quota) was not the bottleneck; what was (the client, other work on a core, or
# neither) is said, and a throughput ratio with such a run on either side is starred.
summarize() {
	awk -v bound="$BOUND" -v bound_util="$BOUND_UTIL" -v contend="$CONTEND" -v quota="$QUOTA" -f "$ROOT/bench/summarize.awk" "$RAW"
}

summarize_hostile() {
	awk -F'\t' '
	{ k = $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	  runs[k]++; un[k] += $6; ans[k] += $5; p50[k] = p50[k] " " $7; p99[k] = p99[k] " " $8; worst[k] = worst[k] " " $9
	  back[k] = back[k] " " $10; hwm[k] = hwm[k] " " int($11 / 1024) }
	END {
		print "| server | runs | probes answered / unanswered | p50 us (each run) | p99 us (each run) | worst us (each run) | fds back after s (each run) | peak RSS MiB (each run) |"
		print "|---|---:|---:|---|---|---|---|---|"
		for (i = 1; i <= n; i++) { k = order[i]
			printf "| %s | %d | %d / %d |%s |%s |%s |%s |%s |\n", k, runs[k], ans[k], un[k], p50[k], p99[k], worst[k], back[k], hwm[k] }
	}' "$TMP/hostile.tsv"
}

summarize_stalled() {
	awk -F'\t' -v want="$STALL_SESSIONS" "$AWK_MEDIAN"'
	{ k = $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	  if ($4 == 0) { idle[k] = idle[k] " " $7; hi[k] = hi[k] > $8 ? hi[k] : $8 }
	  else { st[k] = st[k] " " $7; opened[k] = opened[k] " " $5; hs[k] = hs[k] > $8 ? hs[k] : $8 } }
	END {
		print "| server | MB/s, none stalled (each run) | MB/s, " want " stalled (each run) | median ratio | sessions stalled (each run) | peak RSS MiB, none / stalled |"
		print "|---|---|---|---:|---|---|"
		for (i = 1; i <= n; i++) { k = order[i]
			a = median(idle[k]); b = median(st[k])
			printf "| %s |%s |%s | %.2f |%s | %d / %d |\n", k, idle[k], st[k], (a > 0 ? b / a : 0), opened[k], hi[k] / 1024, hs[k] / 1024 }
	}' "$TMP/stalled.tsv"
}

summarize_scale() {
	awk -F'\t' "$AWK_MEDIAN"'
	{ k = $2 "|" $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	  runs[k]++; kept[k] += $6; opened[k] += $5; per[k] = per[k] " " $9
	  split($10, a, " "); split($11, w, " "); ra[k] = ra[k] " " a[1]; rw[k] = rw[k] " " w[1]
	  ca[k] = ca[k] " " a[2]; cw[k] = cw[k] " " w[2]; err[k] += a[3] + w[3] }
	END {
		print "| idle connections | server | runs | kept / opened | RSS bytes each (each run) | req/s alone | req/s among them | ratio | capacity alone | capacity among them | ratio |"
		print "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
		for (i = 1; i <= n; i++) { k = order[i]; split(k, kk, "|")
			ma = median(ra[k]); mw = median(rw[k]); mca = median(ca[k]); mcw = median(cw[k])
			printf "| %s | %s | %d | %d / %d |%s | %.0f | %.0f | %.3f | %.0f | %.0f | %.3f |%s\n", kk[1], kk[2], runs[k],
				kept[k], opened[k], per[k], ma, mw, (ma > 0 ? mw / ma : 0), mca, mcw, (mca > 0 ? mcw / mca : 0),
				(err[k] ? " errors: " err[k] : "") }
	}' "$TMP/scale.tsv"
}

summarize_flood() {
	awk -F'\t' '
	{ k = $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	  runs[k]++; if ($4 !~ /^0\//) { split($4, d, "/"); del[k] += d[1]; off[k] += d[2] }
	  dl[k] += $5; st[k] += $6; fl[k] += $7; wall[k] = wall[k] " " $8 }
	END {
		print "| server | runs | frames delivered (all runs) | clients past deadline | stalled | failed | wall s (each run) |"
		print "|---|---:|---:|---:|---:|---:|---|"
		for (i = 1; i <= n; i++) { k = order[i]
			printf "| %s | %d | %d / %d (%.2f%%) | %d | %d | %d |%s |\n", k, runs[k], del[k], off[k],
				off[k] ? 100 * del[k] / off[k] : 0, dl[k], st[k], fl[k], wall[k] }
	}' "$TMP/flood.tsv"
}

# plot SCENARIO COLUMN NAME TITLE YLABEL: one bar chart, the median of raw.tsv's COLUMN per load and server, into NAME.png.
plot() {
	local scen=$1 col=$2 name=$3 title=$4 ylabel=$5 data=$TMP/plot-$3.dat
	awk -F'\t' -v s="$scen" -v c="$col" "$AWK_MEDIAN"'
		$1 == s && $5 != "FAILED" && NF >= c { k = $2 "\t" $3; v[k] = v[k] " " $c; if (!(k in seen)) { seen[k] = 1; o[++n] = k } }
		END { for (i = 1; i <= n; i++) print o[i] "\t" median(v[o[i]]) }' "$RAW" >"$data.long"
	[[ -s $data.long ]] || return 0
	# Wide form: one row a load, one column a server.
	awk -F'\t' '{ if (!($2 in sc)) { sc[$2] = ++ns; sn[ns] = $2 } if (!($1 in lc)) { lc[$1] = ++nl; ln[nl] = $1 } v[$1, $2] = $3 }
		END { printf "load"; for (j = 1; j <= ns; j++) printf "\t%s", sn[j]; print ""
		      for (i = 1; i <= nl; i++) { printf "%s", ln[i]; for (j = 1; j <= ns; j++) printf "\t%s", ((ln[i], sn[j]) in v) ? v[ln[i], sn[j]] : 0; print "" } }' \
		"$data.long" >"$data"
	local ncol
	ncol=$(head -1 "$data" | awk -F'\t' '{ print NF }')
	gnuplot <<EOF
set terminal pngcairo size 900,500 noenhanced
set output "$OUT/$name.png"
set title "$scen: $title over $ROUNDS rounds (higher is better)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "$ylabel"
set yrange [0:*]
set key top left
set datafile separator "\t"
set grid ytics
plot for [c=2:$ncol] "$data" using c:xtic(1) title columnheader(c)
EOF
	WRITTEN+=("$OUT/$name.png")
}

# The results' word on the quota: what was set, for whom, and what "saturated" means under it (nothing without one).
quota_paragraph() {
	[[ -n $QUOTA ]] || return 0
	echo "**Server-bound mode: every server ran under a CPU quota of $QUOTA% of one CPU** ($QUOTA_HOW; -q $QUOTA),"
	echo "the same for every server: its process, threads and children were put in that cgroup before the exec. The"
	echo "server's group and the client's have the highest CPU weight, so other work on their cores yields to them"
	echo "(the quota caps the server; the weight keeps a neighbour from taking its share). The"
	echo "period is $QUOTA_PERIOD_US us: a server that spends its quota early waits out the rest of its period, which"
	echo "adds up to $(awk -v p="$QUOTA_PERIOD_US" -v q="$QUOTA" 'BEGIN { printf "%.1f", p * (100 - q) / 100 / 1000 }') ms to a request caught there (p99 reads higher than without a quota). A server counts as"
	echo "saturated at $(awk -v b="$BOUND_UTIL" 'BEGIN { print b * 100 }')% of its quota ($(awk -v b="$BOUND" 'BEGIN { print b * 100 }')% of a core). Throttled: the share of the quota's periods, while"
	echo "the load ran, in which the server used up its quota (cpu.stat nr_throttled / nr_periods)."
	echo
}

write_results() {
	mkdir -p "$OUT"
	local md=$OUT/results.md
	{
		echo "# perch benchmark results"
		echo
		local flood_rounds=""
		[[ " ${SCENARIOS[*]} " == *" flood "* ]] && flood_rounds=" (flood: $FLOOD_ROUNDS)"
		echo "Made by \`bench/run.sh ${SCENARIOS[*]}\` on $(date -u '+%Y-%m-%d %H:%M UTC'): $ROUNDS round$( ((ROUNDS == 1)) || echo s)$flood_rounds of ${SECS} s a load,"
		echo "servers pinned to core $SERVER_CPU and clients to core $CLIENT_CPU, every server restarted for each run."
		echo "Echo servers' sockets: $([[ ${ECHO_NODELAY:-0} == 1 ]] && echo "TCP_NODELAY on every one (ECHO_NODELAY=1)" ||
			echo "Nagle's algorithm on every one (perch's echo with --nagle; ECHO_NODELAY=0)"); servers given from outside"
		local echo_cmds="\`$PERCH_ECHO\`${PERCH_ECHO_VS:+, \`${PERCH_ECHO_VS#*|}\`}"
		echo "(PERCH_ECHO*, PERCH_*_VS) run as given: ${echo_cmds//$BUILD/BUILD} (BUILD: the build dir)."
		echo
		echo "Machine: $(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), Linux $(uname -r)."
		echo "Tools: $(have nginx && nginx -v 2>&1 | tr -d '\n'), $(have redis-server && redis-server --version | awk '{ print $1, $3 }'), $(have wrk && wrk -v 2>&1 | head -1 | awk '{ print $1, $2 }')."
		echo
		echo "Throughput is the client's count; p99 is the client's round-trip (echo ping-pong, wrk, redis-benchmark);"
		echo "user/sys us/req is the server's CPU (utime, stime from /proc/PID/stat, process and children) over the load"
		echo "divided by the requests done. Ratio: the median throughput over the group's first server's."
		echo
		echo "Server CPU is the server's CPU seconds over the client's wall seconds (its share of one core; the wall"
		echo "includes the client's start and connects, so it reads a little low). Capacity is requests per second of"
		echo "server CPU (1e6 / (user + sys us/req)): what the server would do were its core saturated, and the capacity"
		echo "ratio compares that. Client CPU: the client's own CPU over the wall. Client core: how busy core $CLIENT_CPU"
		echo "was (/proc/stat; anything else running there counts too). Other on server core: core $SERVER_CPU's busy share"
		echo "less the server's own CPU."
		echo
		echo "Bound by, who set the pace of a row: **server**, its CPU at $(awk -v b="$BOUND_UTIL" 'BEGIN { print b * 100 }')% or more of what it may use (its core,"
		echo "or its quota), or throttled in half the quota's periods; else **contended**, when other work took $(awk -v c="$CONTEND" 'BEGIN { print c * 100 }')% of a core or more from the"
		echo "server's core or the client's (neither server compares); else **client**, the single-threaded client's own"
		echo "CPU at $(awk -v b="$BOUND_UTIL" 'BEGIN { print b * 100 }')%; else **neither** (both waited: latency set the pace). A throughput ratio with a"
		echo "run that was not server-bound on either side is starred (*): read the capacity ratio. bench/README.md,"
		echo "\"Who bounded a row, and other work on the cores\", has the details."
		echo
		quota_paragraph
		[[ -s $RAW ]] && summarize
		if [[ -s $TMP/flood.tsv ]]; then
			echo
			echo "## Flood: 96 connections x 64,000 frames of 126 B, 2 s write deadline"
			echo
			summarize_flood
		fi
		if [[ -s $TMP/hostile.tsv ]]; then
			echo
			echo "## Hostile: $HOSTILE_CONNS connections each holding half a request, $HOSTILE_PROBES normal requests meanwhile"
			echo
			echo "Each probe: a fresh connection, one GET, its answer, timed from the connect (5 s, else unanswered)."
			echo "Fds back after: from the client's exit (its partial connections closed) until the server holds"
			echo "what it held before the load (\"never\": not within 10 s). Peak RSS: VmHWM, the server's processes summed."
			echo
			summarize_hostile
		fi
		if [[ -s $TMP/scale.tsv ]]; then
			echo
			echo "## Scale: idle keep-alive connections, and $SCALE_ACTIVE active ones among them"
			echo
			echo "bench/idle_client opens the connections from 127.0.0.2-9, one GET answered on each, and holds them;"
			echo "RSS each: the server's VmRSS (processes summed) with them held less before them, over their number;"
			echo "kept: those still open when released. The active load (wrk -c $SCALE_ACTIVE, $SECS s) runs on the same"
			echo "server, after a 1 s warm-up, before the idle ones and while they are held; ratio: among them over alone"
			echo "(medians)."
			echo
			summarize_scale
		fi
		if [[ -s $TMP/stalled.tsv ]]; then
			echo
			echo "## Stalled: $STALL_SESSIONS proxy sessions whose upstream never reads, a normal session meanwhile"
			echo
			echo "bench/stall_client is the upstream (4 KiB receive buffers, never read but for the normal session) and"
			echo "the clients (64 KiB send buffers); the normal session sends for $SECS s, its MB/s is what its upstream"
			echo "read over that time. Ratio: the medians, stalled over none stalled, per server. Peak RSS: VmHWM."
			echo
			summarize_stalled
		fi
		echo
		echo "Raw rounds: raw.tsv (scenario, load, server, round, throughput, p99 us, user us/req, sys us/req, errors,"
		echo "wall s, server CPU s, server CPU / wall, capacity in requests per server-CPU second, client core busy share,"
		echo "share of quota periods throttled or - without a quota, client CPU, other work on the server core)."
	} >"$md"
	RAW_WRITTEN= FLOOD_WRITTEN=
	[[ -s $RAW ]] && cp "$RAW" "$OUT/raw.tsv" && RAW_WRITTEN=1
	[[ -s $TMP/flood.tsv ]] && cp "$TMP/flood.tsv" "$OUT/flood.tsv" && FLOOD_WRITTEN=1
	[[ -s $TMP/hostile.tsv ]] && cp "$TMP/hostile.tsv" "$OUT/hostile.tsv"
	[[ -s $TMP/stalled.tsv ]] && cp "$TMP/stalled.tsv" "$OUT/stalled.tsv"
	[[ -s $TMP/scale.tsv ]] && cp "$TMP/scale.tsv" "$OUT/scale.tsv"
	WRITTEN=()
	if have gnuplot; then
		for s in echo http resp unix; do
			plot "$s" 5 "$s" "median throughput" "requests or messages per second"
			plot "$s" 13 "$s-capacity" "median capacity (requests per second of server CPU)" "requests per server-CPU second"
		done
	else
		echo "run.sh: gnuplot is not installed: no plots (apt-get install gnuplot-nox)" >&2
	fi
	echo
	cat "$md"
	echo
	echo "written: $md" ${RAW_WRITTEN:+"$OUT/raw.tsv"} ${FLOOD_WRITTEN:+"$OUT/flood.tsv"} "${WRITTEN[@]}"
}

: >"$RAW"
for s in "${SCENARIOS[@]}"; do "scenario_$s"; done
write_results
