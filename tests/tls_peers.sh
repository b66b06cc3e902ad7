#!/usr/bin/env bash
# tests/tls_peers.sh: the example servers with --tls-cert/--tls-key against real TLS clients (curl, openssl s_client, redis-cli --tls, Python's ssl), on io_uring and on epoll.
set -uo pipefail # no -e: each check reports its own failure (ok_if)

# Run by make check from the build directory, where the examples are built.
HTTPD=examples/httpd/httpd RESP=examples/resp/resp PROXY=examples/proxy/proxy ECHO=examples/echo/echo
CERTS=${TLS_CERTS_SCRIPT:-$(dirname "$0")/tls_certs.sh}
for tool in curl openssl redis-cli python3; do
	if ! command -v "$tool" >/dev/null; then
		echo "SKIP: $tool is not installed (./dev deps installs it)"
		exit 77
	fi
done
if ! grep -q -- '--tls' <<<"$(redis-cli --help 2>&1)"; then
	echo "SKIP: this redis-cli was built without TLS"
	exit 77
fi
for prog in "$HTTPD" "$RESP" "$PROXY" "$ECHO"; do
	[[ -x $prog ]] || { echo "FAIL: $prog is not built"; exit 1; }
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/perch-tls-peers.XXXXXX")
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fails=0
sh "$CERTS" "$dir/certs" || { echo "FAIL: $CERTS could not make the certificates"; exit 1; }
C=$dir/certs

ok_if() {
	local rc=$?
	if ((rc == 0)); then echo "ok: $1"; else echo "FAIL: not so: $1"; fails=$((fails + 1)); fi
}

# start NAME PROG ARGS...: starts a server on a port the kernel picks; sets PORT_NAME to it.
start() {
	local name=$1 out="$dir/$1.out"
	shift
	# Emptied here, not by the background job's redirection, which may come after the first look
	# below: the look would then read the line of the server this name had on the other backend.
	: >"$out"
	"$@" >"$out" 2>"$dir/$name.err" &
	pids+=($!)
	for _ in $(seq 100); do
		# The port counts once the ", " after it is there: a read may catch the line half written.
		local port
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\), .*/\1/p' "$out" 2>/dev/null)
		if [[ -n $port ]]; then
			printf -v "PORT_$name" '%s' "$port"
			return 0
		fi
		sleep 0.1
	done
	echo "FAIL: $name did not start: $(cat "$dir/$name.err")"
	return 1
}

stop() {
	for pid in "${pids[@]}"; do
		kill -TERM "$pid"
		timeout 10 tail --pid="$pid" -f /dev/null
		wait "$pid"
		ok_if "server $pid stopped cleanly on SIGTERM"
	done
	pids=()
}

# echo_through PORT BYTES [plain]: sends BYTES through 127.0.0.1:PORT (over Python's ssl,
# or plain TCP) and checks they come back whole; plain half-closes after them and needs a
# clean end after the last byte (the end passed on both ways). One thread sends and reads,
# non-blocking: an SSL object must not be written and read from two threads at once.
echo_through() {
	timeout 60 python3 - "$1" "$2" "$C/ca.pem" "${3:-tls}" <<'PY'
import os, select, socket, ssl, sys
port, n, ca, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port))
if mode == "tls":
    s = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="localhost")
s.setblocking(False)
data = os.urandom(n)
sent, got, ended = 0, bytearray(), False
want = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError)
while not ended and (len(got) < n or mode == "plain"):
    pending = mode == "tls" and s.pending() > 0
    r, w, _ = select.select([s], [s] if sent < n else [], [], 0 if pending else 30)
    if not (r or w or pending):
        sys.exit("no progress for 30 s")
    if w:
        try:
            sent += s.send(data[sent:sent + (1 << 16)])
        except want:
            pass
        if sent == n and mode == "plain":
            s.shutdown(socket.SHUT_WR)
    if r or pending:
        try:
            b = s.recv(1 << 16)
            ended = not b
            got += b
        except want:
            pass
sys.exit(0 if bytes(got) == data else 1)
PY
}

TLS=(--tls-cert "$C/server.pem" --tls-key "$C/server.key")
for backend in uring epoll; do
	echo "# backend $backend"
	start httpd "$HTTPD" --port 0 --backend "$backend" "${TLS[@]}" || { fails=$((fails + 1)); continue; }
	start resp "$RESP" --port 0 --backend "$backend" "${TLS[@]}" || { fails=$((fails + 1)); stop; continue; }
	start echo "$ECHO" --port 0 --backend "$backend" || { fails=$((fails + 1)); stop; continue; }
	start proxy "$PROXY" --port 0 --to "127.0.0.1:$PORT_echo" --backend "$backend" "${TLS[@]}" ||
		{ fails=$((fails + 1)); stop; continue; }
	start plainhttpd "$HTTPD" --port 0 --backend "$backend" || { fails=$((fails + 1)); stop; continue; }
	start httpproxy "$PROXY" --port 0 --to "127.0.0.1:$PORT_plainhttpd" --backend "$backend" "${TLS[@]}" ||
		{ fails=$((fails + 1)); stop; continue; }
	start tlsecho "$ECHO" --port 0 --backend "$backend" "${TLS[@]}" || { fails=$((fails + 1)); stop; continue; }
	UP=(--to-tls --ca "$C/ca.pem")
	start toproxy "$PROXY" --port 0 --to "127.0.0.1:$PORT_httpd" --backend "$backend" "${UP[@]}" ||
		{ fails=$((fails + 1)); stop; continue; }
	start toecho "$PROXY" --port 0 --to "127.0.0.1:$PORT_tlsecho" --backend "$backend" "${UP[@]}" ||
		{ fails=$((fails + 1)); stop; continue; }
	start bothproxy "$PROXY" --port 0 --to "127.0.0.1:$PORT_tlsecho" --backend "$backend" "${TLS[@]}" "${UP[@]}" \
		--to-name localhost || { fails=$((fails + 1)); stop; continue; }
	start wrongca "$PROXY" --port 0 --to "127.0.0.1:$PORT_httpd" --backend "$backend" --to-tls --ca "$C/other-ca.pem" ||
		{ fails=$((fails + 1)); stop; continue; }
	start wrongname "$PROXY" --port 0 --to "127.0.0.1:$PORT_httpd" --backend "$backend" "${UP[@]}" \
		--to-name other.test || { fails=$((fails + 1)); stop; continue; }
	start expired "$HTTPD" --port 0 --backend "$backend" --tls-cert "$C/expired.pem" --tls-key "$C/expired.key" ||
		{ fails=$((fails + 1)); stop; continue; }
	h=$PORT_httpd
	grep -q "listening on 127.0.0.1:$h, 1 thread, .*, TLS" "$dir/httpd.out"
	ok_if "httpd says it speaks TLS"

	# curl: GET, a 1 MiB POST (httpd's body limit) back whole, keep-alive, ALPN.
	[[ $(timeout 10 curl -sS --cacert "$C/ca.pem" "https://localhost:$h/plaintext") == "Hello, World!" ]]
	ok_if "curl --cacert GET /plaintext over TLS: Hello, World!"
	head -c 1048576 /dev/urandom >"$dir/body"
	timeout 20 curl -sS --cacert "$C/ca.pem" --data-binary "@$dir/body" -o "$dir/back" "https://localhost:$h/echo" &&
		cmp -s "$dir/body" "$dir/back"
	ok_if "curl POST /echo of 1 MiB over TLS: the body back, byte for byte"
	[[ $(timeout 10 curl -sS --cacert "$C/ca.pem" -o /dev/null -o /dev/null -o /dev/null -w '%{num_connects}' \
		"https://localhost:$h/plaintext" "https://localhost:$h/json" "https://localhost:$h/plaintext") == "100" ]]
	ok_if "curl over TLS: three requests, one connection"
	out=$(timeout 10 curl -sS -v --cacert "$C/ca.pem" -o /dev/null "https://localhost:$h/json" 2>&1)
	grep -q "ALPN: server accepted http/1.1" <<<"$out"
	ok_if "ALPN: httpd accepts http/1.1"

	# Refusals, each with the reason a client prints.
	out=$(timeout 10 curl -sS --cacert "$C/other-ca.pem" "https://localhost:$h/plaintext" 2>&1)
	grep -q "unable to get local issuer" <<<"$out"
	ok_if "a client trusting another CA refuses the server"
	out=$(timeout 10 curl -sS --cacert "$C/ca.pem" --resolve "other.test:$h:127.0.0.1" "https://other.test:$h/plaintext" 2>&1)
	grep -qi "no alternative certificate subject name matches\|does not match" <<<"$out"
	ok_if "a client asking for another name refuses the certificate"
	out=$(timeout 10 curl -sS --cacert "$C/ca.pem" "https://localhost:$PORT_expired/plaintext" 2>&1)
	grep -q "expired" <<<"$out"
	ok_if "a client refuses the expired certificate"
	! timeout 10 curl -sS "http://127.0.0.1:$h/plaintext" >"$dir/plain.out" 2>&1 && ! grep -q "Hello" "$dir/plain.out"
	ok_if "plaintext HTTP to the TLS port gets no answer"
	! (sleep 0.3) | timeout 10 openssl s_client -connect "127.0.0.1:$h" -tls1_2 -cipher ECDHE-RSA-AES128-GCM-SHA256 \
		>"$dir/nocipher.out" 2>&1
	ok_if "no shared cipher: the handshake fails"
	(sleep 0.3) | timeout 10 openssl s_client -connect "127.0.0.1:$h" -tls1_1 >/dev/null 2>&1
	(($? != 0))
	ok_if "TLS 1.1 is refused"

	# openssl s_client: verification, SNI, ALPN, then resumption with the ticket it kept.
	(sleep 0.5) | timeout 10 openssl s_client -connect "127.0.0.1:$h" -servername localhost -CAfile "$C/ca.pem" \
		-alpn http/1.1 -sess_out "$dir/sess.pem" >"$dir/s1.out" 2>&1
	grep -q "Verify return code: 0 (ok)" "$dir/s1.out" && grep -q "ALPN protocol: http/1.1" "$dir/s1.out" &&
		grep -q "^New, TLSv1.3" "$dir/s1.out"
	ok_if "s_client -servername localhost: verified, ALPN http/1.1, a new TLS 1.3 session"
	(sleep 0.5) | timeout 10 openssl s_client -connect "127.0.0.1:$h" -servername localhost -CAfile "$C/ca.pem" \
		-sess_in "$dir/sess.pem" >"$dir/s2.out" 2>&1
	grep -q "^Reused, TLSv1.3" "$dir/s2.out"
	ok_if "s_client -sess_in: the session resumed"
	(sleep 0.5) | timeout 10 openssl s_client -connect "127.0.0.1:$h" -tls1_2 -CAfile "$C/ca.pem" \
		-sess_out "$dir/sess12.pem" >"$dir/s3.out" 2>&1
	(sleep 0.5) | timeout 10 openssl s_client -connect "127.0.0.1:$h" -tls1_2 -CAfile "$C/ca.pem" \
		-sess_in "$dir/sess12.pem" >"$dir/s4.out" 2>&1
	grep -q "^New, TLSv1.2" "$dir/s3.out" && grep -q "^Reused, TLSv1.2" "$dir/s4.out"
	ok_if "TLS 1.2: a new session, then resumed with its ticket"

	# A session the server ends (HTTP/1.0) says close_notify before its FIN; s_time -reuse resumes then.
	printf 'GET /plaintext HTTP/1.0\r\n\r\n' | timeout 10 openssl s_client -connect "127.0.0.1:$h" -ign_eof -msg \
		>"$dir/cn.out" 2>&1
	grep -q "^<<< .*Alert.*close_notify" "$dir/cn.out" && ! grep -q "unexpected eof" "$dir/cn.out"
	ok_if "httpd ends a session with close_notify, not a bare FIN"

	# The TLS-ending proxy passes the upstream's end (httpd closing after HTTP/1.0) on as close_notify.
	printf 'GET /plaintext HTTP/1.0\r\n\r\n' | timeout 10 openssl s_client -connect "127.0.0.1:$PORT_httpproxy" \
		-ign_eof -msg >"$dir/pcn.out" 2>&1
	grep -q "Hello, World!" "$dir/pcn.out" && grep -q "^<<< .*Alert.*close_notify" "$dir/pcn.out" &&
		! grep -q "unexpected eof" "$dir/pcn.out"
	ok_if "the proxy passes its upstream's end to a TLS client as close_notify"

	# redis-cli --tls against resp.
	rc=(timeout 10 redis-cli --tls --cacert "$C/ca.pem" --sni localhost -h 127.0.0.1 -p "$PORT_resp")
	[[ $("${rc[@]}" PING) == "PONG" ]]
	ok_if "redis-cli --tls PING: PONG"
	[[ $("${rc[@]}" SET greeting "over tls") == "OK" && $("${rc[@]}" GET greeting) == "over tls" ]]
	ok_if "redis-cli --tls SET then GET: the value back"

	# The proxy ends TLS towards its clients and speaks plain TCP to echo.
	echo_through "$PORT_proxy" $((16 << 20))
	ok_if "16 MiB each way through the TLS-terminating proxy, whole"

	# The proxy originating TLS (--to-tls --ca): plain clients, a TLS upstream.
	[[ $(timeout 10 curl -sS "http://127.0.0.1:$PORT_toproxy/plaintext") == "Hello, World!" ]]
	ok_if "curl through proxy --to-tls to httpd over TLS: Hello, World!"
	timeout 20 curl -sS --data-binary "@$dir/body" -o "$dir/back2" "http://127.0.0.1:$PORT_toproxy/echo" &&
		cmp -s "$dir/body" "$dir/back2"
	ok_if "curl POST /echo of 1 MiB through proxy --to-tls: the body back, byte for byte"
	[[ $(printf 'GET /plaintext HTTP/1.0\r\n\r\n' | timeout 10 python3 -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(sys.stdin.buffer.read())
got = b""
while (b := s.recv(65536)):
    got += b
print(got.decode().split("\r\n\r\n", 1)[1])' "$PORT_toproxy") == "Hello, World!" ]]
	ok_if "an upstream's close_notify reaches a plain client as a clean end after the answer"
	echo_through "$PORT_toecho" $((16 << 20)) plain
	ok_if "16 MiB each way through proxy --to-tls, each end passed on (FIN to close_notify and back)"
	echo_through "$PORT_bothproxy" $((16 << 20))
	ok_if "16 MiB each way through a proxy speaking TLS on both sides (--to-name localhost)"
	! timeout 10 curl -sS "http://127.0.0.1:$PORT_wrongca/plaintext" >/dev/null 2>&1 &&
		grep -q "upstream 127.0.0.1:$h: TLS: certificate verify failed: unable to get local issuer" "$dir/wrongca.err"
	ok_if "proxy --to-tls with another CA resets its client and says why"
	! timeout 10 curl -sS "http://127.0.0.1:$PORT_wrongname/plaintext" >/dev/null 2>&1 &&
		grep -q "TLS: certificate verify failed: hostname mismatch" "$dir/wrongname.err"
	ok_if "proxy --to-tls --to-name other.test refuses the upstream's certificate"
	stop
done
echo "# $fails failed"
((fails == 0))
