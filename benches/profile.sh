#!/usr/bin/env bash
# Where fleetgate's CPU goes in one scenario, on machines where `perf stat -e instructions` is not
# supported (no hardware counters in the VM): fleetgate (release, one worker) under
# `valgrind --tool=callgrind` in front of a static nginx, a short small load from
# fleetgate-loadtest, then the functions with the most instructions (self and inclusive).
# Instruction counts do not depend on the machine's load, so this runs fine on a busy machine.
#
#   benches/profile.sh small-get | small-get-h2 | big-list     (output under $OUT, default target/bench/profile)
#   DURATION=5s benches/profile.sh small-get-h2
#
# Needs valgrind, nginx (nginx-light), python3; uses the release binaries as they are.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
scenario=${1:-small-get}
out=${OUT:-$repo/target/bench/profile}
duration=${DURATION:-5s}
mkdir -p "$out"
fg=$repo/target/release/fleetgate
lt=$repo/target/release/fleetgate-loadtest
work=$(mktemp -d /tmp/fleetgate-profile.XXXXXX)
chmod 755 "$work"
pids=()
# The work directory goes with the processes (KEEP_WORK=1 keeps it to look into).
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

mkdir -p "$work/www"
"$here/upstream-files.py" "$work/www" 20000 --bare
up_port=$(free_port)
sed -e "s|@LISTEN@|127.0.0.1:$up_port|" -e "s|@WORK@|$work|g" "$here/upstream-nginx.conf.in" >"$work/upstream.conf"
nginx -c "$work/upstream.conf"
wait_port "$up_port"
pids+=("$(cat "$work/upstream.pid")")

# TLS material for the h2 listener: a self-signed certificate (the driver does not verify it).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
port=$(free_port) tls_port=$(free_port) admin=$(free_port)
mkdir -p "$work/config"
# A TLS listener needs client certificates or bearer tokens; a token it is (sent on every request).
printf 'profile-token-0123456789,profile,profile-uid,"profile"\n' >"$work/config/tokens.csv"
cat >"$work/config/gateway.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata: {name: profile}
spec:
  workers: 1
  auth: {tokenFile: tokens.csv, authorizationMode: AlwaysAllow}
  admin: {address: "127.0.0.1:$admin"}
  listeners:
  - {name: plain, address: "127.0.0.1:$port", tls: false}
  - {name: https, address: "127.0.0.1:$tls_port", tls: true}
  tls: {certFile: $work/cert.pem, keyFile: $work/key.pem}
---
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member1}
spec:
  server: http://127.0.0.1:$up_port
  impersonation: false
YAML
valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$scenario.out" \
  "$fg" serve --config "$work/config" --workers 1 --driver epoll >"$work/fg.out" 2>"$work/fg.err" &
vg=$!
pids+=("$vg")
for _ in $(seq 600); do grep -q '^ready' "$work/fg.out" && break; sleep 0.1; done
grep -q '^ready' "$work/fg.out" || { cat "$work/fg.err" >&2; exit 1; }
case $scenario in
small-get) args=(--target "fleetgate=http://127.0.0.1:$port/clusters/member1" --connections 10
  --path /api/v1/namespaces/default/configmaps/bench) ;;
small-get-h2) args=(--target "fleetgate=https://127.0.0.1:$tls_port/clusters/member1" --insecure
  --connections 2 --streams 10 --path /api/v1/namespaces/default/configmaps/bench) ;;
big-list) args=(--target "fleetgate=http://127.0.0.1:$port/clusters/member1" --path /big) ;;
*) echo "unknown scenario $scenario (small-get, small-get-h2, big-list)" >&2; exit 2 ;;
esac
"$lt" run --scenario "$scenario" "${args[@]}" --header "Authorization: Bearer profile-token-0123456789" --pid "fleetgate=$vg" --duration "$duration" --warmup 2s \
  | tee "$out/$scenario.txt"
kill -TERM "$vg"
wait "$vg" || true
callgrind_annotate "$out/callgrind.$scenario.out" 2>/dev/null | head -60 >"$out/$scenario.self.txt" || true
callgrind_annotate --inclusive=yes "$out/callgrind.$scenario.out" 2>/dev/null | head -80 >"$out/$scenario.inclusive.txt" || true
cat "$out/$scenario.self.txt"
echo "full: $out/callgrind.$scenario.out (callgrind_annotate, kcachegrind)"
