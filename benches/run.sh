#!/usr/bin/env bash
# Whole-system comparison of fleetgate against direct, the byte-pump floor and the peers
# (HAProxy, nginx, Go ReverseProxy) in ONE run, per BENCHMARKS.md: each proxy alone on core 1
# (taskset -c 1), the load driver and the upstream on core 0, every proxy with one worker.
# Prints the tables and writes JSON under $OUT (default target/bench).
#
#   benches/run.sh [small-get] [big-list]      (default: small-get)
#   DURATION=10s CONNECTIONS=50 ROUNDS=3 benches/run.sh small-get
#
# Needs Debian's nginx-light haproxy golang-go (benches/install-peers.sh) and
# the benchmark peers in $PEERS (shared/peers of the workspace).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
peers=${PEERS:?"set PEERS to the benchmark peers folder (shared/peers of the workspace)"}
out=${OUT:-$repo/target/bench}
duration=${DURATION:-10s}
connections=${CONNECTIONS:-50}
rounds=${ROUNDS:-3}
scenarios=("$@"); [ ${#scenarios[@]} -gt 0 ] || scenarios=(small-get)
mkdir -p "$out"
work=$(mktemp -d /tmp/fleetgate-bench.XXXXXX)
chmod 755 "$work"  # the nginx workers (www-data) read the upstream's files from here
# shellcheck source=benches/common.sh
. "$here/common.sh"

echo "== building (release)"
(cd "$repo" && cargo build --release -q -p fleetgate -p fleetgate-loadtest)
fg=$repo/target/release/fleetgate
lt=$repo/target/release/fleetgate-loadtest

echo "== upstream (nginx, core 0)"
mkdir -p "$work/www"
"$here/upstream-files.py" "$work/www" 100000
up_port=$(free_port)
sed -e "s|@LISTEN@|127.0.0.1:$up_port|" -e "s|@WORK@|$work|g" "$here/upstream-nginx.conf.in" >"$work/upstream.conf"
taskset -c 0 nginx -c "$work/upstream.conf"
wait_port "$up_port"
pids+=("$(cat "$work/upstream.pid")")
upstream=http://127.0.0.1:$up_port

declare -A url pid
url[direct]=$upstream
start_peer() { # name
  local port; port=$(free_port)
  local p; p=$(taskset -c 1 "$peers/start.sh" "$1" "127.0.0.1:$port" "$upstream" "$work/$1")
  pids+=("$p")
  wait_port "$port"
  url[$1]=http://127.0.0.1:$port/clusters/member1
  pid[$1]=$p
  # nginx: the worker does the proxying
  [ -f "$work/$1/worker.pid" ] && pid[$1]=$(cat "$work/$1/worker.pid")
  return 0
}
echo "== peers (core 1)"
for peer in floor haproxy nginx goproxy; do start_peer "$peer"; done

echo "== fleetgate (core 1, one worker)"
fg_port=$(free_port) fg_admin=$(free_port)
mkdir -p "$work/fleetgate"
cat >"$work/fleetgate/gateway.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata: {name: bench}
spec:
  workers: 1
  # authentication, policy and impersonation off, as the peers do (no spec.auth = deny anonymous)
  auth: {authorizationMode: AlwaysAllow}
  listeners:
  - {name: plain, address: "127.0.0.1:$fg_port", tls: false}
  admin: {address: "127.0.0.1:$fg_admin"}
---
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member1}
spec:
  server: $upstream
  impersonation: false
YAML
start_fleetgate() { # driver
  local port=$fg_port
  sed -i "s|127.0.0.1:[0-9]*\", tls: false|127.0.0.1:$port\", tls: false|" "$work/fleetgate/gateway.yaml"
  taskset -c 1 "$fg" serve --config "$work/fleetgate/gateway.yaml" --workers 1 --driver "$1" \
    >"$work/fleetgate/$1.out" 2>"$work/fleetgate/$1.err" &
  local p=$!
  pids+=("$p")
  for _ in $(seq 100); do grep -q ready "$work/fleetgate/$1.out" && break; sleep 0.1; done
  grep -q ready "$work/fleetgate/$1.out" || { cat "$work/fleetgate/$1.err" >&2; exit 1; }
  url[fleetgate-$1]=http://127.0.0.1:$port/clusters/member1
  pid[fleetgate-$1]=$p
}
start_fleetgate epoll
fg_port=$(free_port) fg_admin=$(free_port)
sed -i "s|address: \"127.0.0.1:[0-9]*\"}|address: \"127.0.0.1:$fg_admin\"}|" "$work/fleetgate/gateway.yaml"
start_fleetgate uring

order=(direct floor haproxy nginx goproxy fleetgate-epoll fleetgate-uring)
for scenario in "${scenarios[@]}"; do
  case $scenario in
  small-get) path=/api/v1/namespaces/default/configmaps/bench ;;
  big-list) path=/big ;;
  *) echo "unknown scenario $scenario" >&2; exit 2 ;;
  esac
  for round in $(seq "$rounds"); do
    args=()
    for t in "${order[@]}"; do
      args+=(--target "$t=${url[$t]}")
      [ -n "${pid[$t]:-}" ] && args+=(--pid "$t=${pid[$t]}")
    done
    echo "== $scenario round $round"
    taskset -c 0 "$lt" run --scenario "$scenario" "${args[@]}" --path "$path" \
      --duration "$duration" --connections "$connections" --json "$out/$scenario-$round.json"
  done
done
echo "results: $out"
