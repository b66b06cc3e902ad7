#!/usr/bin/env bash
# bench/run.sh: takes every server through the same load in interleaved rounds, prints medians and ratios, writes doc/perf/results.md and plots.
set -euo pipefail
shopt -s nullglob

usage() {
	cat >&2 <<'EOF'
usage: bench/run.sh [-r ROUNDS] [-d SECS] [-o OUTDIR] [-b BUILDDIR] [SCENARIO...]

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

Each round starts every server afresh, one at a time, pinned to core SERVER_CPU (0), with
the client pinned to CLIENT_CPU (1); servers run in the same order every round (ABAB...).
CPU per request is the server's utime and stime (its process and its children, from
/proc/PID/stat) over the load, divided by the requests the client completed. Each row also
records the server's CPU over the client's wall time (its share of a core) and its capacity,
requests per server-CPU second; a server under BOUND_UTIL (0.90) of its core is marked
client-bound in results.md, and ratios are given for throughput and for capacity.

Options: -r rounds (ROUNDS, 5; FLOOD_ROUNDS, 3), -d seconds a load (SECS, 3),
-o where results.md, raw.tsv and the PNGs go (OUT, doc/perf), -b the build dir (BUILD, build).

perch servers are command lines with {port} (a server whose program is missing is skipped):
  PERCH_ECHO            default: BUILD/examples/echo/echo --port {port}
  PERCH_HTTPD           default: BUILD/examples/httpd/httpd --port {port} --threads 1
  PERCH_RESP            default: BUILD/examples/resp/resp --port {port} --threads 1
  PERCH_ECHO_MULTISHOT  default: PERCH_ECHO --backend uring --recv multishot
  PERCH_ECHO_SINGLESHOT default: PERCH_ECHO --backend uring --recv singleshot
  PERCH_ECHO_EPOLL      default: PERCH_ECHO --backend epoll
  PERCH_ECHO_VS, PERCH_HTTPD_VS, PERCH_RESP_VS: "NAME|COMMAND" adds a server right after perch
                        in its group (another build of perch, say), in the same interleaved rounds

It installs nothing. The Debian packages it uses: wrk nginx-light redis-server redis-tools
gnuplot-nox (as root: apt-get install -y wrk nginx-light redis-server redis-tools gnuplot-nox,
or ./dev bench-deps). Build the bench programs first: ./dev build.
EOF
	exit 2
}

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
# shellcheck source=bench/servers.sh
. "$ROOT/bench/servers.sh"
ROUNDS=${ROUNDS:-5}
FLOOD_ROUNDS=${FLOOD_ROUNDS:-3}
SECS=${SECS:-3}
OUT=${OUT:-$ROOT/doc/perf}
BUILD=${BUILD:-$ROOT/build}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
ECHO_CONNS=${ECHO_CONNS:-50} ECHO_SIZE=${ECHO_SIZE:-64}
STREAM_CONNS=${STREAM_CONNS:-8} STREAM_SIZE=${STREAM_SIZE:-4096}
HTTP_CONNS=${HTTP_CONNS:-50}
RESP_TESTS=${RESP_TESTS:-ping_mbulk set get} RESP_N1=${RESP_N1:-100000} RESP_N16=${RESP_N16:-1000000}
BOUND_UTIL=${BOUND_UTIL:-0.90} # a server under this share of its core was not what bounded the load

while getopts "r:d:o:b:h" opt; do
	case $opt in
	r) ROUNDS=$OPTARG FLOOD_ROUNDS=$OPTARG ;;
	*) common_opt "$opt" "${OPTARG:-}" || usage ;;
	esac
done
shift $((OPTIND - 1))
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $FLOOD_ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: rounds must be a positive whole number" >&2; usage; }
[[ $SECS =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "run.sh: -d takes seconds, e.g. 3" >&2; usage; }
BUILD=$(readlink -f "$BUILD")
SCENARIOS=("$@")
((${#SCENARIOS[@]})) || SCENARIOS=(echo http resp flood)
for s in "${SCENARIOS[@]}"; do
	[[ $s =~ ^(echo|http|resp|flood)$ ]] || { echo "run.sh: unknown scenario '$s'" >&2; usage; }
done

server_defaults

TMP=$(mktemp -d /tmp/perch-bench.XXXXXX)
RAW=$TMP/raw.tsv
SERVER_PID=""
CLK_TCK=$(getconf CLK_TCK)
PORT=17100

cleanup() {
	stop_server
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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
for prog in echo_client flood_client http_client baseline_uring_echo baseline_epoll_echo; do
	[[ -x $BUILD/bench/$prog ]] || { echo "run.sh: $BUILD/bench/$prog is missing: run ./dev build first" >&2; exit 1; }
done

# ---- one measurement ----

# measure SCENARIO LOAD SERVER CMD ROUND CLIENT-FUNCTION ARGS...: one server run under one load, one row in raw.tsv.
measure() {
	local scen=$1 load=$2 name=$3 cmd=$4 round=$5 port=$((PORT++)) c0 c1 w0 w1 k0 k1 res
	shift 5
	start_server "$cmd" "$port" || { printf '%s\t%s\t%s\t%s\tFAILED\n' "$scen" "$load" "$name" "$round" >>"$RAW"; return; }
	c0=$(server_cpu)
	k0=$(core_ticks "$CLIENT_CPU")
	w0=$EPOCHREALTIME
	res=$("$@" "$port")
	w1=$EPOCHREALTIME
	k1=$(core_ticks "$CLIENT_CPU")
	c1=$(server_cpu)
	stop_server
	local req thr p99 errs u0 s0 u1 s1
	read -r req thr p99 errs <<<"$res"
	read -r u0 s0 <<<"$c0"
	read -r u1 s1 <<<"$c1"
	local uus sus sat
	uus=$(awk -v d=$((u1 - u0)) -v n="$req" -v h="$CLK_TCK" 'BEGIN { printf "%.2f", n ? d * 1e6 / h / n : 0 }')
	sus=$(awk -v d=$((s1 - s0)) -v n="$req" -v h="$CLK_TCK" 'BEGIN { printf "%.2f", n ? d * 1e6 / h / n : 0 }')
	# wall s, server CPU s, utilisation (CPU s / wall s), capacity (requests per server-CPU second),
	# and how busy the client's core was (busy ticks over all ticks of that core).
	sat=$(awk -v w0="$w0" -v w1="$w1" -v d=$((u1 - u0 + s1 - s0)) -v n="$req" -v h="$CLK_TCK" -v k0="$k0" -v k1="$k1" 'BEGIN {
		w = w1 - w0; c = d / h; split(k0, a, " "); split(k1, b, " "); kt = b[2] - a[2]
		printf "%.3f\t%.2f\t%.3f\t%.0f\t%.3f", w, c, (w > 0 ? c / w : 0), (c > 0 ? n / c : 0), (kt > 0 ? (b[1] - a[1]) / kt : 0) }')
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scen" "$load" "$name" "$round" "$thr" "$p99" "$uus" "$sus" \
		"$errs" "$sat" >>"$RAW"
	local util
	util=$(cut -f3 <<<"$sat")
	printf '  round %s  %-16s %-18s %12s/s  p99 %9s us  cpu %6s us user %6s us sys  server cpu %3.0f%%%s\n' "$round" \
		"$load" "$name" "$thr" "$p99" "$uus" "$sus" "$(awk -v u="$util" 'BEGIN { print u * 100 }')" \
		"$( ((errs)) && echo "  ERRORS=$errs")"
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

# ---- results ----

# An awk median of a space-separated list (mawk has no asort).
AWK_MEDIAN='
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# Medians per (scenario, load, server) from raw.tsv, with the ratios of throughput and of capacity
# to the group's first server. A server whose median utilisation is under BOUND_UTIL was not the
# bottleneck: the row says client-bound, and a throughput ratio with such a run on either side is
# starred (it compares the client's pace, not the servers; the capacity ratio does compare them).
summarize() {
	awk -F'\t' -v bound="$BOUND_UTIL" "$AWK_MEDIAN"'
	$5 == "FAILED" { next }
	{
		k = $1 SUBSEP $2 SUBSEP $3
		if (!(k in seen)) { seen[k] = 1; order[++n] = k; if (!(($1 SUBSEP $2) in first)) first[$1 SUBSEP $2] = $3 }
		thr[k] = thr[k] " " $5; p99[k] = p99[k] " " $6; us[k] = us[k] " " $7; sy[k] = sy[k] " " $8
		errs[k] += $9; runs[k]++
		if (NF >= 13) { ut[k] = ut[k] " " $12; cap[k] = cap[k] " " $13 } # raw.tsv from before these columns has none
		if (NF >= 14) cl[k] = cl[k] " " $14
	}
	function util(k) { return (k in ut) ? median(ut[k]) : -1 }
	function capa(k) { return (k in cap) ? median(cap[k]) : 0 }
	function client_bound(k) { return util(k) >= 0 && util(k) < bound }
	END {
		print "| scenario | load | server | throughput/s (median) | p99 us | user us/req | sys us/req | ratio | capacity ratio | server CPU | client core | capacity req/CPU-s | bound by | runs | errors |"
		print "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|---:|---:|"
		for (i = 1; i <= n; i++) {
			k = order[i]
			split(k, f, SUBSEP)
			g = f[1] SUBSEP f[2]; ref = g SUBSEP first[g]
			m = median(thr[k]); r = median(thr[ref]); c = capa(k); rc = capa(ref)
			star = (client_bound(k) || client_bound(ref)) ? " *" : ""
			if (f[3] == first[g]) {
				ratio = "1.00 (reference)"; cratio = "1.00 (reference)"
			} else {
				ratio = sprintf("%.2f x %s%s", r ? m / r : 0, first[g], star)
				cratio = (c && rc) ? sprintf("%.2f x %s", c / rc, first[g]) : "-"
			}
			p = median(p99[k]); p = p > 0 ? sprintf("%.1f", p) : "-" # stream loads have no round trip
			u = util(k)
			printf "| %s | %s | %s | %.0f | %s | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %d | %d |\n", f[1], f[2], f[3], m,
				p, median(us[k]), median(sy[k]), ratio, cratio, u < 0 ? "-" : sprintf("%.0f%%", u * 100),
				(k in cl) ? sprintf("%.0f%%", median(cl[k]) * 100) : "-",
				c ? sprintf("%.0f", c) : "-", u < 0 ? "-" : (u < bound ? "**client**" : "server"), runs[k], errs[k]
		}
	}' "$RAW"
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
}

write_results() {
	mkdir -p "$OUT"
	local md=$OUT/results.md
	{
		echo "# perch benchmark results"
		echo
		echo "Made by \`bench/run.sh ${SCENARIOS[*]}\` on $(date -u '+%Y-%m-%d %H:%M UTC'): $ROUNDS rounds (flood: $FLOOD_ROUNDS) of ${SECS} s a load,"
		echo "servers pinned to core $SERVER_CPU and clients to core $CLIENT_CPU, every server restarted for each run."
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
		echo "ratio compares that. A server under $(awk -v b="$BOUND_UTIL" 'BEGIN { print b * 100 }')% of its core was not the bottleneck: the"
		echo "**client** bounded that run (the client is single-threaded on the other core), and a throughput ratio"
		echo "with such a run on either side is starred (*): it measures the client's pace, read the capacity ratio."
		echo "Client core: how busy core $CLIENT_CPU was over the run (/proc/stat; anything else running there counts too)."
		echo
		[[ -s $RAW ]] && summarize
		if [[ -s $TMP/flood.tsv ]]; then
			echo
			echo "## Flood: 96 connections x 64,000 frames of 126 B, 2 s write deadline"
			echo
			summarize_flood
		fi
		echo
		echo "Raw rounds: raw.tsv (scenario, load, server, round, throughput, p99 us, user us/req, sys us/req, errors,"
		echo "wall s, server CPU s, server CPU / wall, capacity in requests per server-CPU second, client core busy share)."
	} >"$md"
	[[ -s $RAW ]] && cp "$RAW" "$OUT/raw.tsv"
	[[ -s $TMP/flood.tsv ]] && cp "$TMP/flood.tsv" "$OUT/flood.tsv"
	if have gnuplot; then
		for s in echo http resp; do
			plot "$s" 5 "$s" "median throughput" "requests or messages per second"
			plot "$s" 13 "$s-capacity" "median capacity (requests per second of server CPU)" "requests per server-CPU second"
		done
	else
		echo "run.sh: gnuplot is not installed: no plots (apt-get install gnuplot-nox)" >&2
	fi
	echo
	cat "$md"
	echo
	echo "written: $md" "$OUT"/*.png
}

: >"$RAW"
for s in "${SCENARIOS[@]}"; do "scenario_$s"; done
write_results
