#!/usr/bin/env bash
# Make the development TLS certificates and APNs key for Squelch.
#
#   ./certs/make-dev-certs.sh [--force] [--name NAME]... [DIR]
#
# DIR defaults to the directory holding this script. Files that already exist
# are kept; missing ones are made. --force regenerates everything.
# See certs/README.md for what each file is for.
set -euo pipefail

usage() {
    echo "usage: $0 [--force] [--name NAME]... [DIR]" >&2
    echo "  Makes a dev CA, server and APNs-simulator certificates and an APNs .p8 key in DIR" >&2
    echo "  (default: $(dirname "$0")). Existing files are kept unless --force is given." >&2
    echo "  --name adds a DNS name or IP address to the server certificate (besides localhost," >&2
    echo "  127.0.0.1 and ::1), for clients on other machines; a server.pem without it is re-issued" >&2
    echo "  with the names of this run only, so give every name each time." >&2
}

force=0
dir=""
names=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --force) force=1 ;;
        --name)
            if [[ $# -lt 2 || -z "$2" || "$2" == -* ]]; then echo "--name needs a DNS name or IP address" >&2; usage; exit 2; fi
            # No wildcards: openssl's -checkhost can't confirm one, so the certificate would be re-issued every run.
            if [[ ! "$2" =~ ^[A-Za-z0-9.:-]+$ ]]; then echo "--name '$2' is not a DNS name or IP address (no ports, no wildcards)" >&2; exit 2; fi
            names+=("$2"); shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "unknown option: $1" >&2; usage; exit 2 ;;
        *)
            if [[ -n "$dir" ]]; then echo "only one DIR may be given" >&2; usage; exit 2; fi
            dir="$1"
            ;;
    esac
    shift
done

# The server certificate's subject alternative names: the loopback ones, then each --name (an IP
# address if it parses as one, else a DNS name).
server_san="DNS:localhost, IP:127.0.0.1, IP:::1"
for n in "${names[@]}"; do
    if [[ "$n" =~ ^[0-9.]+$ || "$n" == *:* ]]; then server_san+=", IP:$n"; else server_san+=", DNS:$n"; fi
done

if ! command -v openssl >/dev/null 2>&1; then
    echo "openssl not found: install it with 'sudo apt-get install openssl' (or run 'make deps')" >&2
    exit 1
fi

if [[ -z "$dir" ]]; then
    dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

# Names and lifetimes.
CA_DAYS=3650      # 10 years
LEAF_DAYS=825     # the longest lifetime Apple platforms accept for TLS server certificates
APNS_KEY_ID="DEVKEY0001"
APNS_TEAM_ID="DEVTEAM001"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/squelch-certs.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# A tiny openssl config, so the host's openssl.cnf adds nothing of its own.
cat >"$tmp/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt             = no
utf8               = yes

[dn]
CN = placeholder

[v3_ca]
basicConstraints       = critical, CA:TRUE
keyUsage               = critical, keyCertSign, cRLSign
subjectKeyIdentifier   = hash

[v3_leaf]
basicConstraints       = CA:FALSE
keyUsage               = critical, digitalSignature
extendedKeyUsage       = serverAuth
subjectAltName         = SAN_PLACEHOLDER
subjectKeyIdentifier   = hash
authorityKeyIdentifier = keyid:always
EOF

made=()   # files made in this run

say()      { echo "$1 $2"; }
was_made() { local f; for f in "${made[@]}"; do [[ "$f" == "$1" ]] && return 0; done; return 1; }
# Need to (re)make $1? Yes if --force or it is missing.
need()     { [[ $force -eq 1 || ! -e "$dir/$1" ]]; }

# Public key of a certificate or private key, for comparing the two.
cert_pub() { openssl x509 -in "$1" -noout -pubkey 2>/dev/null; }
key_pub()  { openssl pkey -in "$1" -pubout 2>/dev/null; }

# quiet CMD... — run CMD, showing its stderr only if it fails.
quiet() {
    if ! "$@" 2>"$tmp/stderr"; then
        cat "$tmp/stderr" >&2
        echo "ERROR: $1 failed: $*" >&2
        exit 1
    fi
}

serial() { echo "0x$(openssl rand -hex 16)"; }

# make_key FILE — ECDSA P-256 private key, PKCS#8 PEM, mode 0600.
make_key() {
    local f="$1"
    if need "$f"; then
        (umask 077 && quiet openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
            -out "$tmp/$f")
        chmod 600 "$tmp/$f"
        mv -f "$tmp/$f" "$dir/$f"
        made+=("$f"); say made "$f"
    else
        chmod 600 "$dir/$f"
        say kept "$f"
    fi
}

# conf_for CN SAN — a one-off config with that common name and those subject alternative names.
conf_for() {
    local cn="$1" san="${2:-DNS:localhost, IP:127.0.0.1, IP:::1}" out="$tmp/req-$RANDOM.cnf"
    sed -e "s|^CN = placeholder\$|CN = $cn|" -e "s|SAN_PLACEHOLDER|$san|" "$tmp/openssl.cnf" >"$out"
    echo "$out"
}

# lacks_name CERT — the first --name CERT is not valid for, if any.
lacks_name() {
    local n
    for n in "${names[@]}"; do
        local check=-checkhost
        if [[ "$n" =~ ^[0-9.]+$ || "$n" == *:* ]]; then check=-checkip; fi
        local answer
        answer="$(openssl x509 -in "$1" -noout "$check" "$n" 2>/dev/null || true)"
        if [[ "$answer" != *"does match"* ]]; then echo "$n"; return 0; fi
    done
    return 1
}

# make_ca — ca.pem, self-signed with ca.key.
make_ca() {
    local why=""
    if need ca.pem; then why="new"
    elif was_made ca.key; then why="new key"
    elif [[ "$(cert_pub "$dir/ca.pem")" != "$(key_pub "$dir/ca.key")" ]]; then why="did not match ca.key"
    fi
    if [[ -n "$why" ]]; then
        local conf; conf="$(conf_for "Squelch Dev CA")"
        openssl req -new -x509 -config "$conf" -extensions v3_ca \
            -key "$dir/ca.key" -sha256 -days "$CA_DAYS" -set_serial "$(serial)" \
            -out "$tmp/ca.pem"
        chmod 644 "$tmp/ca.pem"
        mv -f "$tmp/ca.pem" "$dir/ca.pem"
        made+=(ca.pem)
        if [[ "$why" == "new" ]]; then say made ca.pem; else say made "ca.pem ($why)"; fi
    else
        say kept ca.pem
    fi
}

# make_leaf NAME CN [SAN] — NAME.pem for NAME.key, signed by the CA.
make_leaf() {
    local name="$1" cn="$2" san="${3:-}" why="" missing=""
    local cert="$name.pem" key="$name.key"
    if need "$cert"; then why="new"
    elif was_made "$key"; then why="new key"
    elif was_made ca.pem; then why="new CA"
    elif [[ "$(cert_pub "$dir/$cert")" != "$(key_pub "$dir/$key")" ]]; then why="did not match $key"
    elif ! openssl verify -CAfile "$dir/ca.pem" "$dir/$cert" >/dev/null 2>&1; then why="not signed by ca.pem"
    elif [[ -n "$san" ]] && missing="$(lacks_name "$dir/$cert")"; then why="had no $missing"
    fi
    if [[ -n "$why" ]]; then
        local conf; conf="$(conf_for "$cn" "$san")"
        openssl req -new -config "$conf" -key "$dir/$key" -sha256 -out "$tmp/$name.csr"
        quiet openssl x509 -req -in "$tmp/$name.csr" \
            -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -set_serial "$(serial)" \
            -sha256 -days "$LEAF_DAYS" -extfile "$conf" -extensions v3_leaf \
            -out "$tmp/$cert"
        chmod 644 "$tmp/$cert"
        mv -f "$tmp/$cert" "$dir/$cert"
        made+=("$cert")
        if [[ "$why" == "new" ]]; then say made "$cert"; else say made "$cert ($why)"; fi
    else
        say kept "$cert"
    fi
}

# make_file NAME — write stdin to NAME unless an identical file is already there.
make_file() {
    local f="$1"
    cat >"$tmp/$f"
    if [[ $force -eq 0 && -e "$dir/$f" ]] && cmp -s "$tmp/$f" "$dir/$f"; then
        rm -f "$tmp/$f"; say kept "$f"
    else
        chmod 644 "$tmp/$f"
        mv -f "$tmp/$f" "$dir/$f"
        made+=("$f"); say made "$f"
    fi
}

echo "dev certificates in $dir"

# 1. The dev CA.
make_key ca.key
make_ca

# 2. The server certificate, and its chain for squelchd's --cert.
make_key server.key
make_leaf server "squelchd (dev)" "$server_san"
cat "$dir/server.pem" "$dir/ca.pem" | make_file server-chain.pem

# 3. The APNs simulator's TLS certificate.
make_key apns-sim.key
make_leaf apns-sim "APNs simulator (dev)"

# 4. An APNs provider signing key in Apple's format: EC P-256, PKCS#8 PEM.
make_key "AuthKey_${APNS_KEY_ID}.p8"
printf '{"keyId":"%s","teamId":"%s"}\n' "$APNS_KEY_ID" "$APNS_TEAM_ID" | make_file apns-provider.json

# 5. Check the result.
if ! (cd "$dir" && openssl verify -CAfile ca.pem server.pem apns-sim.pem); then
    echo "ERROR: server.pem / apns-sim.pem do not verify against ca.pem in $dir" >&2
    echo "       rerun with --force to make a fresh set" >&2
    exit 1
fi
