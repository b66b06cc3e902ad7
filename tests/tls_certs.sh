#!/bin/sh
# tests/tls_certs.sh: makes a throwaway CA and certificates (ECDSA P-256) in DIR for the TLS tests, bench and demo.
# Usage: tests/tls_certs.sh DIR. Writes ca.pem, server.pem/.key (localhost, 127.0.0.1, ::1),
# client.pem/.key, expired.pem/.key (valid only in 2020) and other-ca.pem (a CA that signed none of them).
# No key is ever committed: every run makes new ones.
set -eu
dir=${1:?usage: tls_certs.sh DIR}
command -v openssl >/dev/null || { echo "tls_certs.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { # NAME SUBJECT
	key "$1.key"
	openssl req -x509 -new -key "$1.key" -subj "$2" -days 30 -out "$1.pem" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() { # NAME CN SAN
	key "$1.key"
	openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
	printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$3" >"$1.ext"
	openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
		-extfile "$1.ext" -out "$1.pem" 2>/dev/null
	rm -f "$1.csr" "$1.ext"
}
ca ca "/CN=perch test CA"
ca other-ca "/CN=perch other CA"
leaf server localhost "DNS:localhost,IP:127.0.0.1,IP:::1"
leaf client "perch test client" "DNS:client.test"
# Expired: openssl ca takes explicit dates, which x509 -req cannot.
key expired.key
openssl req -new -key expired.key -subj /CN=localhost -out expired.csr
mkdir -p ca.db
: >ca.db/index
cat >ca.cnf <<CNF
[ca]
default_ca = t
[t]
database = ca.db/index
new_certs_dir = ca.db
serial = ca.db/serial
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = ext
[any]
commonName = supplied
[ext]
subjectAltName = DNS:localhost,IP:127.0.0.1
CNF
echo 01 >ca.db/serial
openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr -out expired.pem \
	-startdate 20200101000000Z -enddate 20200102000000Z -notext 2>/dev/null
rm -rf ca.db ca.cnf expired.csr ca.srl
