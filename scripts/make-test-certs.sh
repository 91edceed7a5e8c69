#!/usr/bin/env bash
# Makes a test CA and per-host certificates for castmesh's mutual TLS
# (docs/security.md), with the openssl command-line tool. For tests and for
# trying TLS out; a real deployment uses its own PKI.
#
#   scripts/make-test-certs.sh DIR [HOST...]
#
# DIR gets (keys mode 0600, everything else 0644):
#   ca.crt ca.key                    the test CA
#   HOST.crt HOST.key                one per HOST (default: "localhost"),
#                                    valid now for 30 days, usable as
#                                    client and server; HOST goes into the
#                                    subject and subjectAltName (DNS or IP)
#   expired.crt/.key                 signed by the CA, expired in 2020
#   not-yet-valid.crt/.key           signed by the CA, valid from 2099
#   other-ca.crt other-ca.key        a second, unrelated CA
#   other-ca-host.crt/.key           signed by the other CA
# EC P-256 keys: generating them takes milliseconds (RSA takes seconds).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [HOST...]" >&2
  exit 2
fi
out=$1
shift
hosts=("$@")
[[ ${#hosts[@]} -gt 0 ]] || hosts=(localhost)
mkdir -p "$out"
cd "$out"
umask 077  # keys are born private; certificates are opened up below

work=$(mktemp -d .ca-work.XXXXXX)
trap 'rm -rf "$work"' EXIT

new_ca() {  # NAME CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 3650 \
    -subj "/CN=$2" -keyout "$1.key" -out "$1.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

# `openssl ca` is the one 3.0 tool that signs with explicit start and end
# dates (expired and not-yet-valid certificates without faking the clock).
ca_config() {  # CA_NAME -> config path
  local dir="$work/$1"
  mkdir -p "$dir/new"
  : >"$dir/index.txt"
  echo 1000 >"$dir/serial"
  cat >"$dir/ca.cnf" <<CNF
[ ca ]
default_ca = castmesh_test_ca
[ castmesh_test_ca ]
database = $dir/index.txt
new_certs_dir = $dir/new
serial = $dir/serial
certificate = $PWD/$1.crt
private_key = $PWD/$1.key
default_md = sha256
policy = any_name
unique_subject = no
copy_extensions = none
[ any_name ]
commonName = supplied
CNF
  echo "$dir/ca.cnf"
}

# NAME CA_NAME SUBJECT_ALT_NAME [DATES...]: a leaf key and certificate.
new_leaf() {
  local name=$1 ca=$2 san=$3
  shift 3
  local config ext
  config=$(ca_config "$ca")
  ext="$work/$name.ext"
  cat >"$ext" <<EXT
[ leaf ]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = $san
EXT
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
    -keyout "$name.key" -out "$work/$name.csr" 2>/dev/null
  openssl ca -batch -notext -config "$config" -extfile "$ext" -extensions leaf \
    -in "$work/$name.csr" -out "$name.crt" "$@" 2>/dev/null
}

san_of() {  # HOST -> subjectAltName value
  if [[ $1 =~ ^[0-9.]+$ || $1 == *:* ]]; then echo "IP:$1"; else echo "DNS:$1"; fi
}

new_ca ca "castmesh test CA"
new_ca other-ca "castmesh other test CA"
for host in "${hosts[@]}"; do
  new_leaf "$host" ca "$(san_of "$host")" -days 30
done
new_leaf expired ca "DNS:expired" -startdate 20200101000000Z -enddate 20200201000000Z
new_leaf not-yet-valid ca "DNS:not-yet-valid" -startdate 20990101000000Z -enddate 20990201000000Z
new_leaf other-ca-host other-ca "DNS:other-ca-host" -days 30

chmod 0600 ./*.key
chmod 0644 ./*.crt
echo "castmesh test certificates in $PWD: ca.crt, ${hosts[*]/%/.crt}, expired, not-yet-valid, other-ca-host"
