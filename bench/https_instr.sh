#!/usr/bin/env bash
# bench/https_instr.sh: callgrind instructions per HTTPS keep-alive request of examples/httpd on epoll (valgrind cannot run io_uring), by where they run.
# Usage: bench/https_instr.sh [BUILD_DIR]   (default: build)
# One TLS 1.3 connection (python3's ssl, a throwaway CA from tests/tls_certs.sh)
# sends GET /plaintext and reads the answer, N1 times in one run and N2 times in
# another; the difference over the N2 - N1 extra requests leaves out start-up,
# the handshake and shut-down. Prints the whole server's instructions a request,
# then perch's own (functions under lib/ and pipes/, with the ConcurrencyKit
# atomics inlined there), the example's, the allocator's, and the rest: OpenSSL
# (libssl and libcrypto have no debug info here) and the rest of libc. Then
# perch's atomic read-modify-writes a request (bench/callgrind_atomics.py): each
# counts as one instruction above and costs, as a full barrier, several.
set -euo pipefail
build=${1:-build}
n1=${N1:-2000} n2=${N2:-6000}
for tool in valgrind callgrind_annotate python3 objdump openssl; do
	command -v "$tool" >/dev/null || { echo "https_instr.sh: $tool is not installed (./dev bench-deps)" >&2; exit 1; }
done
make -s -C "$build" examples/httpd/httpd
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/listen_port.sh
source "$here/bench/listen_port.sh"
out=$(mktemp -d)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$out"' EXIT
sh "$here/tests/tls_certs.sh" "$out/certs" >/dev/null

# N sequential requests on one connection; every answer read whole (Content-Length).
cat >"$out/client.py" <<'PY'
import socket, ssl, sys
port, n, ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=60), server_hostname="localhost")
req = b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"
for _ in range(n):
    s.sendall(req)
    buf = b""
    while b"\r\n\r\n" not in buf:
        more = s.recv(4096)
        if not more:
            sys.exit("https_instr.sh: the server closed the connection")
        buf += more
    head, _, body = buf.partition(b"\r\n\r\n")
    length = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
    want = int(length[0].split(b":")[1])
    while len(body) < want:
        body += s.recv(4096)
s.close()
PY

# One whole server run of $1 requests, its callgrind profile in $2.
server_run() {
	valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$2" "$build/examples/httpd/httpd" --port 0 \
		--threads 1 --backend epoll --tls-cert "$out/certs/server.pem" \
		--tls-key "$out/certs/server.key" >"$out/server.out" 2>"$out/server.err" &
	local pid=$! port
	port=$(listen_port https_instr.sh "$out/server.out" "$out/server.err" "$pid")
	timeout 300 python3 "$out/client.py" "$port" "$1" "$out/certs/ca.pem"
	kill -INT "$pid"
	wait "$pid" || true
}

# Self instructions by function, "file:function count" lines.
by_function() {
	callgrind_annotate --threshold=100 --inclusive=no --auto=no "$1" |
		awk '$1 ~ /^[0-9,]+$/ && $NF ~ /^\[/ { n = $1; gsub(",", "", n); print $(NF-1), n }'
}

server_run "$n1" "$out/a"
server_run "$n2" "$out/b"
by_function "$out/a" >"$out/a.fn"
by_function "$out/b" >"$out/b.fn"
awk -v n=$((n2 - n1)) '
	FNR == NR { a[$1] += $2; next }
	{ d = $2 - a[$1]; all += d
	  file = $1; sub(/:[^:]*$/, "", file); fn = substr($1, length(file) + 2)
	  # By the source file (any prefix: the build names it as configured), or by the
	  # name where callgrind found no file for a function of perch.
	  if (file ~ /(^|\/)(lib|pipes)\/[^\/]+$/ || file ~ /ck_pr\.h$/ || fn ~ /^perch_/) perch += d
	  else if (file ~ /(^|\/)examples\//) app += d
	  else if ($1 ~ /malloc/) alloc += d
	  else rest += d }
	END {
	  printf "instructions per request (one connection, GET /plaintext, %d requests): %.0f\n", n, all / n
	  printf "  perch (lib/, pipes/) %.0f (%.1f%%)\n", perch / n, 100 * perch / all
	  printf "  examples/httpd %.0f, the allocator %.0f, OpenSSL and the rest %.0f\n", app / n, alloc / n, rest / n
	}' "$out/a.fn" "$out/b.fn"
printf "atomic read-modify-writes per request, "
python3 "$here/bench/callgrind_atomics.py" --per $((n2 - n1)) "$out/a" "$out/b" "$build/examples/httpd/httpd"
