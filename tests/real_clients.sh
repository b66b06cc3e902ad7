#!/usr/bin/env bash
# tests/real_clients.sh: the example servers on Unix sockets, driven by real clients: curl --unix-socket (httpd, and through the proxy's --to unix:) and redis-cli -s (resp), on io_uring and on epoll.
set -uo pipefail # no -e: each check reports its own failure (ok_if)

# Run by make check from the build directory, where the examples are built.
HTTPD=examples/httpd/httpd RESP=examples/resp/resp PROXY=examples/proxy/proxy
for tool in curl redis-cli; do
	if ! command -v "$tool" >/dev/null; then
		echo "SKIP: $tool is not installed (./dev deps installs it)"
		exit 77
	fi
done
for prog in "$HTTPD" "$RESP" "$PROXY"; do
	[[ -x $prog ]] || { echo "FAIL: $prog is not built"; exit 1; }
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/perch-real-clients.XXXXXX")
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fails=0

# ok_if WHAT: reports the last command's outcome (0: ok) as WHAT holding.
ok_if() {
	local rc=$?
	if ((rc == 0)); then echo "ok: $1"; else echo "FAIL: not so: $1"; fails=$((fails + 1)); fi
}

# start NAME PROG ARGS...: starts a server, waits (at most 10 s) for its "listening" line in $dir/NAME.out.
start() {
	local name=$1 out="$dir/$1.out"
	shift
	# Emptied here, not by the background job's redirection, which may come after the first look
	# below: the look would then read the line of the server this name had on the other backend.
	: >"$out"
	"$@" >"$out" 2>"$dir/$name.err" &
	pids+=($!)
	for _ in $(seq 100); do
		# Whole up to its thread count: a read may catch the line half written.
		grep -q "listening on .*, [0-9]* threads*, " "$out" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "FAIL: $name did not start: $(cat "$dir/$name.err")"
	return 1
}

# stop: SIGTERM to every server started, each must exit 0 within 10 s.
stop() {
	for pid in "${pids[@]}"; do
		kill -TERM "$pid"
		timeout 10 tail --pid="$pid" -f /dev/null
		wait "$pid"
		ok_if "server $pid stopped cleanly on SIGTERM"
	done
	pids=()
}

for backend in uring epoll; do
	echo "# backend $backend"
	h="$dir/httpd-$backend.sock" r="$dir/resp-$backend.sock"
	start httpd "$HTTPD" --listen "unix:$h" --backend "$backend" || { fails=$((fails + 1)); continue; }
	start resp "$RESP" --listen "unix:$r" --backend "$backend" || { fails=$((fails + 1)); stop; continue; }
	start proxy "$PROXY" --to "unix:$h" --backend "$backend" || { fails=$((fails + 1)); stop; continue; }
	line=$(grep "listening on" "$dir/proxy.out")
	port=${line##*:}
	port=${port%%,*}

	want=$([[ $backend == uring ]] && echo io_uring || echo epoll)
	# On io_uring the line says whether the ring has a registered file table (Linux 6.13+).
	files=$([[ $backend == uring ]] && echo ' (\(no \)\?registered files)' || echo '')
	grep -q "listening on unix:$h, 1 thread, backend $want$files, " "$dir/httpd.out"
	ok_if "httpd says it listens on unix:$h on $want"
	[[ $(timeout 10 curl -sS --unix-socket "$h" http://localhost/plaintext) == "Hello, World!" ]]
	ok_if "curl --unix-socket GET /plaintext: Hello, World!"
	[[ $(timeout 10 curl -sS --unix-socket "$h" --data-binary 'a body' http://localhost/echo) == "a body" ]]
	ok_if "curl --unix-socket POST /echo: the body back"
	# Keep-alive: three requests on one connection (curl reuses it; -w counts the new ones).
	[[ $(timeout 10 curl -sS --unix-socket "$h" -o /dev/null -o /dev/null -o /dev/null -w '%{num_connects}' \
		http://localhost/plaintext http://localhost/json http://localhost/plaintext) == "100" ]]
	ok_if "curl --unix-socket: three requests, one connection"
	[[ $(timeout 10 curl -sS "http://127.0.0.1:$port/plaintext") == "Hello, World!" ]]
	ok_if "curl through the proxy (TCP) to httpd on unix:: Hello, World!"

	[[ $(timeout 10 redis-cli -s "$r" PING) == "PONG" ]]
	ok_if "redis-cli -s PING: PONG"
	[[ $(timeout 10 redis-cli -s "$r" SET greeting "over a unix socket") == "OK" ]]
	ok_if "redis-cli -s SET: OK"
	[[ $(timeout 10 redis-cli -s "$r" GET greeting) == "over a unix socket" ]]
	ok_if "redis-cli -s GET: the value SET"
	[[ $(timeout 10 redis-cli -s "$r" INCR n; timeout 10 redis-cli -s "$r" INCR n) == $'1\n2' ]]
	ok_if "redis-cli -s INCR twice: 1 then 2"
	stop
done
((fails == 0)) && echo "all passed" || echo "$fails failed"
((fails == 0))
