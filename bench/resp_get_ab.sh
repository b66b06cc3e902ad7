#!/bin/bash
# bench/resp_get_ab.sh: two resp builds side by side, alternating runs: GETs of one value of SIZE bytes (the figures of #20 and #22's notes).
# usage: bench/resp_get_ab.sh OLD_RESP NEW_RESP SIZE [ROUNDS]   (N=GETs a run, default 2000)
# Prints "old|new req/s server-cpu-ticks" per run: server pinned to CPU 1, redis-benchmark -c 8 to CPU 0.
set -u
old=$1 new=$2 size=$3 rounds=${4:-3}
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is not installed (./dev bench-deps)" >&2; exit 2; }
run() { # BIN PORT -> "req/s ticks"
	local bin=$1 port=$2
	taskset -c 1 "$bin" --port "$port" >/dev/null 2>&1 &
	local pid=$!
	sleep 0.3
	redis-benchmark -p "$port" -t set -d "$size" -n 10 -c 1 >/dev/null 2>&1
	local t0 t1 out
	t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
	out=$(taskset -c 0 redis-benchmark -p "$port" -c 8 -n "${N:-2000}" -d "$size" -t get --csv 2>/dev/null | grep -i '"GET"')
	t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
	kill "$pid"
	wait "$pid" 2>/dev/null
	echo "$(echo "$out" | awk -F'"' '{print $4}') $((t1 - t0))"
}
for _ in $(seq 1 "$rounds"); do
	echo "old $(run "$old" 7401)"
	echo "new $(run "$new" 7402)"
done
