#!/usr/bin/env bash
# Capacity of one simulated member (issue: the sim must never be a benchmark's bottleneck):
#   1. small GETs over TLS straight to member1: CPU per request and req/s of the sim process;
#   2. WATCHES (default 10000) idle watch streams held open on member1: resident memory per
#      watch, CPU at rest, and that every one of them was accepted.
# The sim runs on core 1, the driver on core 0. Prints the tables; JSON under $OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${OUT:-$repo/target/bench}
watches=${WATCHES:-10000}
duration=${DURATION:-10s}
mkdir -p "$out"
ulimit -n "$(ulimit -H -n)"
(cd "$repo" && cargo build --release -q -p fleetgate-loadtest)
lt=$repo/target/release/fleetgate-loadtest
dir=$(mktemp -d /tmp/sim-capacity.XXXXXX)
taskset -c 1 "$lt" sim --dir "$dir" --clusters 1 --objects 100 >"$dir/sim.out" 2>"$dir/sim.err" &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q ready "$dir/sim.out" && break; sleep 0.1; done
grep -q ready "$dir/sim.out" || { cat "$dir/sim.err"; exit 1; }
target="member1=kubeconfig:$dir/kubeconfig:member1"

echo "== small GET over TLS, straight to the simulated member (sim on core 1)"
taskset -c 0 "$lt" run --scenario small-get --target "$target" --pid "member1=$sim" \
  --path /api/v1/namespaces/load-0/configmaps/load-cm-0 --duration "$duration" --connections 50 \
  --json "$out/sim-small-get.json"

echo "== $watches idle watches on one simulated member"
taskset -c 0 "$lt" run --scenario watch-idle --target "$target" --pid "member1=$sim" \
  --path "/api/v1/namespaces/kube-public/configmaps?watch=1" --watches "$watches" \
  --duration "$duration" --warmup 2s --json "$out/sim-watch-idle.json"
