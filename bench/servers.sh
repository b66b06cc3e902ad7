# bench/servers.sh: sourced by run.sh and profile.sh: the servers under test, started pinned and stopped, their CPU time, and the load clients.
# The caller sets ROOT, BUILD, TMP, SECS, SERVER_CPU, CLIENT_CPU, HTTP_CONNS, RESP_N1, RESP_N16 and SERVER_PID="".

have() { command -v "$1" >/dev/null 2>&1; }

# The options run.sh and profile.sh share: -d SECS, -o OUT, -b BUILD. Fails on any other.
common_opt() { # opt arg
	case $1 in
	d) SECS=$2 ;;
	o) OUT=$2 ;;
	b) BUILD=$2 ;;
	*) return 1 ;;
	esac
}

# The command lines of every server, with {port} (and {dir}, the temp dir); perch's may be set from outside.
server_defaults() {
	# The echo servers' sockets, the same for all: Nagle's algorithm on (the baselines' and the kernel's
	# default), or with ECHO_NODELAY=1 TCP_NODELAY on every one (perch's default, as nginx and redis set it).
	local perch_nagle=" --nagle" baseline_nodelay=""
	case ${ECHO_NODELAY:-0} in
	0) ;;
	1) perch_nagle="" baseline_nodelay=" --nodelay" ;;
	*) echo "$(basename "$0"): ECHO_NODELAY is 0 or 1 (got '$ECHO_NODELAY')" >&2; exit 2 ;;
	esac
	PERCH_ECHO=${PERCH_ECHO:-"$BUILD/examples/echo/echo --port {port}$perch_nagle"}
	PERCH_HTTPD=${PERCH_HTTPD:-"$BUILD/examples/httpd/httpd --port {port} --threads 1"}
	PERCH_RESP=${PERCH_RESP:-"$BUILD/examples/resp/resp --port {port} --threads 1"}
	PERCH_PROXY=${PERCH_PROXY:-"$BUILD/examples/proxy/proxy --port {port} --to 127.0.0.1:{up}"}
	PERCH_ECHO_MULTISHOT=${PERCH_ECHO_MULTISHOT:-"$PERCH_ECHO --backend uring --recv multishot"}
	PERCH_ECHO_SINGLESHOT=${PERCH_ECHO_SINGLESHOT:-"$PERCH_ECHO --backend uring --recv singleshot"}
	PERCH_ECHO_EPOLL=${PERCH_ECHO_EPOLL:-"$PERCH_ECHO --backend epoll"}
	URING_ECHO="$BUILD/bench/baseline_uring_echo --port {port}$baseline_nodelay"
	EPOLL_ECHO="$BUILD/bench/baseline_epoll_echo --port {port}$baseline_nodelay"
	# The same echo servers on a Unix socket ({unix}: a path in the temp dir); Nagle's algorithm does not apply there.
	PERCH_ECHO_UNIX=${PERCH_ECHO_UNIX:-"$BUILD/examples/echo/echo --listen unix:{unix}"}
	URING_ECHO_UNIX="$BUILD/bench/baseline_uring_echo --unix {unix}"
	EPOLL_ECHO_UNIX="$BUILD/bench/baseline_epoll_echo --unix {unix}"
	REDIS="redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no --protected-mode no --logfile ''"
	NGINX="nginx -p {dir} -c {dir}/nginx-{port}.conf -e {dir}/nginx-error.log"
	# TLS: the same certificate for both (ECDSA P-256, tests/tls_certs.sh into {dir}/certs).
	PERCH_HTTPS=${PERCH_HTTPS:-"$PERCH_HTTPD --tls-cert {dir}/certs/server.pem --tls-key {dir}/certs/server.key"}
	PERCH_RESP_TLS=${PERCH_RESP_TLS:-"$PERCH_RESP --tls-cert {dir}/certs/server.pem --tls-key {dir}/certs/server.key"}
	NGINX_TLS="nginx -p {dir} -c {dir}/nginx-tls-{port}.conf -e {dir}/nginx-error.log"
	REDIS_TLS="redis-server --port 0 --tls-port {port} --bind 127.0.0.1 --save '' --appendonly no --protected-mode no"
	REDIS_TLS+=" --logfile '' --tls-cert-file {dir}/certs/server.pem --tls-key-file {dir}/certs/server.key"
	REDIS_TLS+=" --tls-ca-cert-file {dir}/certs/ca.pem --tls-auth-clients no"
}

# The throwaway CA and server certificate the TLS scenarios share, made once a run in TMP/certs.
tls_certs() {
	[[ -f $TMP/certs/server.pem ]] || sh "$ROOT/tests/tls_certs.sh" "$TMP/certs" >/dev/null
}

# The program a command line runs (its first word), installed or built.
runnable() {
	local first
	read -r first _ <<<"$1"
	[[ -x $first ]] || have "$first"
}

# ---- servers ----

# nginx_conf NAME PORT [TLS-LINES]: one worker, no logging, keep-alive without a request limit, one fixed body
# (the same work as perch httpd's plaintext route), in TMP/NAME-PORT.conf; TLS-LINES make the listener TLS.
# NGINX_CONNS (worker_connections, 16384) and NGINX_KEEPALIVE (keepalive_timeout, 60s) for the scale scenario.
nginx_conf() {
	local listen="listen 127.0.0.1:$2${3:+ ssl}"
	cat >"$TMP/$1-$2.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/$1-$2.pid;
worker_rlimit_nofile $((2 * ${NGINX_CONNS:-16384}));
events { worker_connections ${NGINX_CONNS:-16384}; }
http {
	access_log off;
	default_type text/plain;
	keepalive_requests 100000000;
	keepalive_timeout ${NGINX_KEEPALIVE:-60s};
	client_body_temp_path $TMP/nginx-body;
	server {
		$listen;${3:+
$3}
		location / { return 200 "Hello, World!"; }
	}
}
EOF
}

# The TLS listener's lines: perch's certificate, TLS 1.2 and 1.3, a session cache and tickets (resumption).
nginx_tls_lines() {
	printf '\t\t%s\n' "ssl_certificate $TMP/certs/server.pem;" "ssl_certificate_key $TMP/certs/server.key;" \
		"ssl_protocols TLSv1.2 TLSv1.3;" "ssl_session_cache shared:SSL:10m;" "ssl_session_tickets on;"
}

# Whether the server just started accepts: a TCP connect to its port, or a round trip on its Unix socket.
server_accepts() { # port
	if [[ -n $UNIX_TARGET ]]; then
		"$BUILD/bench/echo_client" --unix "$UNIX_TARGET" --conns 1 --size 1 --count 1 --timeout 1 >/dev/null 2>&1
	else
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
	fi
}

# Starts the command line $1 on port $2 (or, with {unix}, on a Unix socket: UNIX_TARGET), pinned, and waits until it accepts.
start_server() {
	local cmd=${1//\{port\}/$2} port=$2 t rc
	UNIX_TARGET=""
	[[ $cmd != *"{unix}"* ]] || UNIX_TARGET=$TMP/unix-$port.sock
	cmd=${cmd//\{unix\}/$UNIX_TARGET}
	cmd=${cmd//\{dir\}/$TMP}
	if [[ $cmd == *nginx-tls-* ]]; then
		nginx_conf nginx-tls "$port" "$(nginx_tls_lines)"
	elif [[ $cmd == nginx* ]]; then
		nginx_conf nginx "$port"
	fi
	# With a quota (quota.sh) the subshell joins the cgroup before the exec, so the server's threads and children are in it.
	(
		[[ -z ${QUOTA_PROCS:-} ]] || echo "$BASHPID" >"$QUOTA_PROCS" || exit 97
		eval "exec taskset -c $SERVER_CPU $cmd"
	) </dev/null >>"$TMP/server.log" 2>&1 &
	SERVER_PID=$!
	for ((t = 0; t < 100; t++)); do
		if ! kill -0 "$SERVER_PID" 2>/dev/null; then
			rc=0
			wait "$SERVER_PID" 2>/dev/null || rc=$?
			((rc != 97)) || { echo "run.sh: cannot put the server in the quota's cgroup ($QUOTA_PROCS)" >&2; exit 1; }
			echo "run.sh: server exited at start: $cmd (log: tail of $TMP/server.log follows)" >&2
			tail -5 "$TMP/server.log" >&2
			SERVER_PID=""
			return 1
		fi
		server_accepts "$port" && { server_in_quota; return 0; }
		sleep 0.05
	done
	echo "run.sh: $cmd did not accept on port $port within 5 s" >&2
	stop_server
	return 1
}

# With a quota (quota.sh), ends the whole run unless the server is in its cgroup: never measure it unthrottled.
server_in_quota() {
	[[ -n ${QUOTA_DIR:-} ]] || return 0
	quota_holds "$SERVER_PID" && return 0
	echo "run.sh: server $SERVER_PID is not in the quota's cgroup $QUOTA_DIR (/proc/$SERVER_PID/cgroup:" \
		"$(tr '\n' ' ' <"/proc/$SERVER_PID/cgroup"))" >&2
	stop_server
	exit 1
}

stop_server() {
	[[ -n $SERVER_PID ]] || return 0
	kill "$SERVER_PID" 2>/dev/null || true
	for ((t = 0; t < 40; t++)); do
		kill -0 "$SERVER_PID" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$SERVER_PID" 2>/dev/null || true
	wait "$SERVER_PID" 2>/dev/null || true
	SERVER_PID=""
}

# utime and stime ticks of the server and its children (nginx's worker), e.g. "123 45".
server_cpu() {
	local pid u=0 s=0 stat f
	for pid in $SERVER_PID $(pgrep -P "$SERVER_PID" || true); do
		stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
		stat=${stat##*) } # fields after the command name, which may hold spaces
		read -r -a f <<<"$stat"
		u=$((u + f[11])) s=$((s + f[12]))
	done
	echo "$u $s"
}

# Busy and total ticks of core $1 so far (/proc/stat), e.g. "812 1000": whatever ran there, not only the client.
core_ticks() {
	awk -v c="cpu$1" '$1 == c { busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6 }' /proc/stat
}

# ---- clients: each prints "requests throughput p99_us errors" ----

client_echo() { # mode conns size port (the Unix socket UNIX_TARGET instead, when the server listens on one)
	local line where=(--port "$4")
	[[ -z ${UNIX_TARGET:-} ]] || where=(--unix "$UNIX_TARGET")
	line=$(taskset -c "$CLIENT_CPU" timeout $((${SECS%.*} + 30)) "$BUILD/bench/echo_client" --mode "$1" --conns "$2" \
		--size "$3" "${where[@]}" --duration "$SECS" --csv) || true
	[[ -n $line ]] || { echo "0 0 0 1"; return; }
	IFS=, read -r _ _ _ _ msgs mps _ _ p99 _ errs <<<"$line"
	echo "$msgs $mps $p99 $errs"
}

# wrk's "99%  1.23ms" in microseconds.
wrk_us() {
	awk '{ v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
	       m = (u == "us") ? 1 : (u == "ms") ? 1000 : (u == "s") ? 1000000 : 0; printf "%.1f", v * m }'
}

client_http() { # depth port
	local out req rps p99 errs
	if have wrk; then
		local script=()
		(($1 > 1)) && script=(-s "$ROOT/bench/pipeline.lua")
		out=$(taskset -c "$CLIENT_CPU" timeout $((${SECS%.*} + 30)) wrk -t1 -c"$HTTP_CONNS" -d"${SECS}s" --latency \
			"${script[@]}" "http://127.0.0.1:$2/plaintext" -- "$1") || true
		req=$(awk '/requests in/ { print $1 }' <<<"$out")
		rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
		p99=$(grep -E '^ +99%' <<<"$out" | wrk_us)
		errs=$(awk '/Non-2xx|Socket errors/ { n++ } END { print n + 0 }' <<<"$out")
		echo "${req:-0} ${rps:-0} ${p99:-0} $errs"
	else
		out=$(taskset -c "$CLIENT_CPU" timeout $((${SECS%.*} + 30)) "$BUILD/bench/http_client" --conns "$HTTP_CONNS" \
			--depth "$1" --port "$2" --duration "$SECS" --csv) || true
		IFS=, read -r _ _ _ req rps _ p99 _ non2xx errs <<<"$out"
		echo "${req:-0} ${rps:-0} ${p99:-0} $((${non2xx:-0} + ${errs:-1}))"
	fi
}

client_https() { # port: wrk over TLS, keep-alive (no verification: the client's work is the same for all)
	local out req rps p99 errs
	out=$(taskset -c "$CLIENT_CPU" timeout $((${SECS%.*} + 30)) wrk -t1 -c"$HTTP_CONNS" -d"${SECS}s" --latency \
		"https://127.0.0.1:$1/plaintext") || true
	req=$(awk '/requests in/ { print $1 }' <<<"$out")
	rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
	p99=$(grep -E '^ +99%' <<<"$out" | wrk_us)
	errs=$(awk '/Non-2xx|Socket errors/ { n++ } END { print n + 0 }' <<<"$out")
	echo "${req:-0} ${rps:-0} ${p99:-0} $errs"
}

# A connection a request, each with its handshake: full (-new) or resumed (-reuse), TLS 1.2 (whose
# resumption s_time does), openssl s_time GETting /plaintext; s_time gives no p99 (0).
client_handshakes() { # new|reuse port
	local out n secs
	out=$(taskset -c "$CLIENT_CPU" timeout $((${SECS%.*} + 30)) openssl s_time -connect "127.0.0.1:$2" -"$1" \
		-tls1_2 -time "${SECS%.*}" -www /plaintext 2>/dev/null) || true
	read -r n secs < <(awk '/connections in [0-9]+ real seconds/ { print $1, $4 }' <<<"$out") || true
	[[ -n ${n:-} && ${secs:-0} -gt 0 ]] || { echo "0 0 0 1"; return; }
	echo "$n $(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.1f", n / s }') 0 0"
}

client_resp_tls() { # test port
	local out
	out=$(taskset -c "$CLIENT_CPU" timeout 120 redis-benchmark --tls --cacert "$TMP/certs/ca.pem" --sni localhost \
		-p "$2" -t "$1" -n "$RESP_N1" -c 50 -P 1 --csv 2>/dev/null | tail -n +2 | head -1 | tr -d '"') || true
	IFS=, read -r _ rps _ _ _ _ p99 _ <<<"$out"
	[[ -n ${rps:-} ]] || { echo "0 0 0 1"; return; }
	echo "$RESP_N1 $rps $(awk -v m="$p99" 'BEGIN { printf "%.1f", m * 1000 }') 0"
}

client_resp() { # test pipeline port
	local n=$RESP_N1 out
	(($2 > 1)) && n=$RESP_N16
	out=$(taskset -c "$CLIENT_CPU" timeout 120 redis-benchmark -p "$3" -t "$1" -n "$n" -c 50 -P "$2" --csv 2>/dev/null |
		tail -n +2 | head -1 | tr -d '"') || true
	IFS=, read -r _ rps _ _ _ _ p99 _ <<<"$out"
	[[ -n ${rps:-} ]] || { echo "0 0 0 1"; return; }
	echo "$n $rps $(awk -v m="$p99" 'BEGIN { printf "%.1f", m * 1000 }') 0"
}


client_get_size() { # size port: sets the one key once, then GETs it ZC_BYTES / size times
	local n=$((ZC_BYTES / $1)) out
	((n > 0)) || n=1
	timeout 30 redis-benchmark -p "$2" -t set -d "$1" -n 1 -c 1 >/dev/null 2>&1 || true
	out=$(taskset -c "$CLIENT_CPU" timeout 120 redis-benchmark -p "$2" -t get -d "$1" -n "$n" -c "$ZC_CONNS" --csv \
		2>/dev/null | tail -n +2 | head -1 | tr -d '"') || true
	IFS=, read -r _ rps _ _ _ _ p99 _ <<<"$out"
	[[ -n ${rps:-} ]] || { echo "0 0 0 1"; return; }
	echo "$n $rps $(awk -v m="$p99" 'BEGIN { printf "%.1f", m * 1000 }') 0"
}
