#!/usr/bin/env bash
# The soak (issue 16 item 4, docs/benchmarks.md "Soak"): 30 minutes of mixed load through one
# gateway against the simulated fleet, as users run it (the fleet's gateway.yaml: TLS, token
# authentication, AccessPolicy, impersonation), watching the gateway's resident memory, open
# descriptors, errors and latency over time.
#
#   benches/soak.sh                      # 3 min warm-up + 27 min measured, release build
#   DURATION=2m WARMUP=30s RESTART_EVERY=40s benches/soak.sh   # a short one
#
# Load (fleetgate-loadtest run --scenario soak, loadtest/src/run/soak.rs): small GETs, lists,
# 2000 watches over the members' churned configmaps (resumed from their resourceVersion when a
# stream ends, some reopened on purpose), exec sessions opening and closing, a configuration
# change every 5 s, and one member restarted (down 5 s) every 3 minutes. Output: the table, the
# goals the run missed (none when it passes), $OUT/soak.json and the chart docs/charts/soak.svg.
# Exits non-zero when a goal is missed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

duration=${DURATION:-27m}
warmup=${WARMUP:-3m}
watches=${WATCHES:-2000}
restart_every=${RESTART_EVERY:-3m}
restart_down=${RESTART_DOWN:-5s}
sample_every=${SAMPLE_EVERY:-10s}
workers=${WORKERS:-2}
out=${OUT:-$repo/target/bench/soak}
chart=${CHART:-$repo/docs/charts/soak.svg}

if [ -z "${SKIP_BUILD:-}" ]; then
  echo "== building (release)"
  (cd "$repo" && cargo build --release -q -p fleetgate -p fleetgate-loadtest)
fi
bin=${BIN_DIR:-$repo/target/release}
fg=$bin/fleetgate
lt=$bin/fleetgate-loadtest

mkdir -p "$out" "$(dirname "$chart")"
# 2000 watches: the driver holds 2000 sockets, the gateway 2000 and their member connections.
ulimit -n "$(ulimit -H -n)"
work=$(mktemp -d /tmp/fleetgate-soak.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
wait_ready() { # file what
  for _ in $(seq 600); do grep -qs '^ready' "$1" && return 0; sleep 0.1; done
  echo "$2 never became ready:" >&2; cat "$1" "${1%.out}.err" >&2 2>/dev/null || true; return 1
}

echo "== simulated fleet: 2 members, 1000 configmaps each, 5 changes a second each"
"$lt" sim --dir "$work/sim" --clusters 2 --objects 1000 --churn 5 --restart-down "$restart_down" \
  --gateway-listen 127.0.0.1:0 >"$work/sim.out" 2>"$work/sim.err" &
sim=$!
pids+=("$sim")
wait_ready "$work/sim.out" "the simulated fleet"

echo "== fleetgate serve ($workers workers) on the fleet's gateway.yaml"
# The driver's 2000 watches come from one address, where a real fleet's come from many: lift the
# per-address cap on member connections (4096 split between the shards) above them.
sed -i 's/^  limits:$/&\n    maxMemberConnectionsPerClient: 20000/' "$work/sim/gateway.yaml"
grep -q 'maxMemberConnectionsPerClient: 20000' "$work/sim/gateway.yaml" || { echo "the sim's gateway.yaml changed shape" >&2; exit 1; }
"$fg" serve --config "$work/sim" --workers "$workers" >"$work/gateway.out" 2>"$work/gateway.err" &
gw=$!
pids+=("$gw")
wait_ready "$work/gateway.out" "fleetgate"
https=$(sed -n 's/^ready.* https=\([0-9.:]*\).*/\1/p' "$work/gateway.out")
admin=$(sed -n 's/^ready.* admin=\([0-9.:]*\).*/\1/p' "$work/gateway.out")
sed "s|https://127.0.0.1:0/|https://$https/|" "$work/sim/gateway.kubeconfig" >"$work/gateway.kubeconfig"

echo "== soak: $warmup warm-up + $duration, $watches watches, a member restart every $restart_every"
status=0
"$lt" run --scenario soak --threads 2 \
  --target "fleetgate=kubeconfig:$work/gateway.kubeconfig:member*" --pid "fleetgate=$gw" \
  --sim-pid "$sim" --restart-every "$restart_every" --restart-down "$restart_down" \
  --config-dir "$work/sim" --admin-url "http://$admin" --reload-every 5s \
  --watches "$watches" --reopen-per-sec 2 --connections 8 --get-rate 200 --list-rate 5 \
  --exec-rate 1 --sample-every "$sample_every" --warmup "$warmup" --duration "$duration" \
  --json "$out/soak.json" --chart "$chart" || status=$?
# The gateway's warnings and errors, counted by message (timestamps and addresses cut).
grep -E " (WARN|ERROR) " "$work/gateway.err" | sed -E 's/^[0-9TZ:.-]+ +//; s/127\.0\.0\.1:[0-9]+/ADDR/g' |
  sort | uniq -c | sort -rn | head -30 >"$out/gateway-warnings.txt" || true
echo "gateway warnings (counted): $out/gateway-warnings.txt"
echo "results: $out/soak.json, chart $chart"
exit $status
