#!/usr/bin/env bash
# Every scenario of BENCHMARKS.md against direct, the floor, the peers and fleetgate in ONE run:
# each proxy alone on core 1 (taskset -c 1), the load driver and the upstreams on core 0, every
# proxy with one worker. Writes JSON under $OUT (default target/bench/all), an SVG chart per
# scenario under docs/charts/, and the tables with the goal ratios into docs/benchmarks.md between
# the markers `<!-- all.sh:begin -->` and `<!-- all.sh:end -->` (the rest of the file is kept).
#
#   benches/all.sh                      # every scenario
#   benches/all.sh small-get watch-idle # some of them
#   DURATION=10s WATCHES=8000 EVENT_WATCHES=500 CHURN=20 LATENCY_PAIRS=2 EXEC_STREAMS=4 benches/all.sh
#   FLEET_MEMBERS=100 FLEET_PODS=1000 FLEET_SCALES="1 10" FLEET_LIMIT=500 benches/all.sh fleet-list
#   SKIP_BUILD=1 (use the release binaries as they are)  BENCH_MD=FILE (write the tables there)
#
# Upstreams (core 0): a static nginx (a ~1 KiB ConfigMap JSON, and a ~90 MB LIST at /big) for the
# proxy-overhead scenarios; the simulated fleet with a plain-HTTP listener (`sim --plaintext`) for
# watches and exec, since the peers' upstream leg is plain HTTP/1.1.
# fleet-list starts its own simulated fleet (FLEET_MEMBERS members x FLEET_PODS pods, then again
# at each multiple of FLEET_SCALES; core 0) and a fleetgate on it (core 1); run alone, it starts
# nothing else.
# Targets: `direct` (the upstream itself), `floor` (small-get only: the byte pump is valid for
# small GETs only), `haproxy`, `nginx`, `goproxy` (../shared/peers/start.sh; `-tls` ones serve
# TLS + h2 with the sim's gateway certificate), and `fleetgate` (`serve --workers 1`).
# The auth-overhead pair (issue 6): the same small-get against fleetgate with authentication,
# policy and impersonation off, then on (bearer token, AccessPolicy, impersonation).
#
# Needs Debian's nginx-light haproxy golang-go (benches/install-peers.sh), python3, and
# ../shared/peers. Pinning needs 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
peers=${PEERS:-$repo/../shared/peers}
out=${OUT:-$repo/target/bench/all}
charts=${CHARTS:-$repo/docs/charts}
duration=${DURATION:-10s}
connections=${CONNECTIONS:-50}
watches=${WATCHES:-8000}
event_watches=${EVENT_WATCHES:-500}
churn=${CHURN:-20}
latency_pairs=${LATENCY_PAIRS:-2}
exec_streams=${EXEC_STREAMS:-4}
fleet_members=${FLEET_MEMBERS:-100}
fleet_pods=${FLEET_PODS:-1000}
fleet_scales=${FLEET_SCALES:-1 10}
fleet_limit=${FLEET_LIMIT:-500}
all=(small-get small-get-h2 big-list watch-idle watch-idle-tls watch-events watch-latency exec-stream portforward-stream reload-storm auth-overhead registry fleet-list)
scenarios=("$@"); [ ${#scenarios[@]} -gt 0 ] || scenarios=("${all[@]}")
# The shared upstreams, peers and gateways serve every scenario but fleet-list (its own fleet).
shared=0
for s in "${scenarios[@]}"; do [ "$s" = fleet-list ] || shared=1; done
mkdir -p "$out" "$charts"
# A full run starts from an empty results directory, so the report holds this run only; a run of
# some scenarios keeps the others' results (the report then mixes runs: rerun all to compare).
[ $# -eq 0 ] && rm -f "$out"/*.json "$out"/*.txt
# 8000 watches: the driver holds 8000 sockets and a proxy 16000 (client and upstream side).
ulimit -n "$(ulimit -H -n)"
work=$(mktemp -d /tmp/fleetgate-bench-all.XXXXXX)
chmod 755 "$work"  # the nginx workers (www-data) read the upstream's files from here
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
wait_ready() { # file what
  for _ in $(seq 300); do grep -q '^ready' "$1" && return 0; sleep 0.1; done
  echo "$2 never became ready:" >&2; cat "$1" "${1%.out}.err" >&2 2>/dev/null || true; return 1
}

md=${BENCH_MD:-$repo/docs/benchmarks.md}
if [ -z "${SKIP_BUILD:-}" ]; then
  echo "== building (release)"
  (cd "$repo" && cargo build --release -q -p fleetgate -p fleetgate-loadtest)
fi
fg=$repo/target/release/fleetgate
lt=$repo/target/release/fleetgate-loadtest

declare -A url pid
admin_token=  # the shared sim's, elided from the printed commands
# Not indented, so the heredocs below keep their text at column 0.
if [ $shared = 1 ]; then
echo "== static upstream (nginx, core 0)"
mkdir -p "$work/www"
python3 - "$work/www" <<'PY'
import json, sys
d = sys.argv[1]
cm = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "bench", "namespace": "default",
      "uid": "6d0c1d0e-3a8e-4c7b-9d55-0a5f8f5b7c11", "resourceVersion": "1000",
      "creationTimestamp": "2026-11-22T10:00:00Z"}, "data": {"k": "v" * 780}}
open(f"{d}/small.json", "w").write(json.dumps(cm, separators=(",", ":")) + "\n")
items = [dict(cm, metadata=dict(cm["metadata"], name=f"bench-{i}")) for i in range(100_000)]
open(f"{d}/big.json", "w").write(json.dumps({"kind": "ConfigMapList", "apiVersion": "v1",
     "metadata": {"resourceVersion": "1000"}, "items": items}, separators=(",", ":")) + "\n")
PY
up_port=$(free_port)
sed -e "s|@LISTEN@|127.0.0.1:$up_port|" -e "s|@WORK@|$work|g" "$here/upstream-nginx.conf.in" >"$work/upstream.conf"
taskset -c 0 nginx -c "$work/upstream.conf"
wait_port "$up_port"
pids+=("$(cat "$work/upstream.pid")")
static=http://127.0.0.1:$up_port

echo "== simulated fleet (one member, plain listener too, core 0)"
fg_tls_port=$(free_port)
sim_dir=$work/sim
taskset -c 0 "$lt" sim --dir "$sim_dir" --clusters 1 --objects 100 --churn "$churn" --plaintext \
  --gateway-listen "127.0.0.1:$fg_tls_port" >"$work/sim.out" 2>"$work/sim.err" &
sim_pid=$!
pids+=("$sim_pid")
wait_ready "$work/sim.out" "the simulated fleet"
sim_plain=$(sed -n 's/^member1=//p' "$sim_dir/plaintext-members")
admin_token=$(cat "$sim_dir/users/admin.token")

url[direct]=$static
url[direct-sim]=$sim_plain
pid[direct-sim]=$sim_pid
start_peer() { # peer set upstream [tls]
  local name=$1-$2 port; port=$(free_port)
  [ "$2" = static ] && name=$1
  local p
  if [ -n "${4:-}" ]; then
    p=$(TLS_CERT=$sim_dir/pki/gateway.crt TLS_KEY=$sim_dir/pki/gateway.key \
      taskset -c 1 "$peers/start.sh" "$1" "127.0.0.1:$port" "$3" "$work/$name")
    url[$name]=https://127.0.0.1:$port/clusters/member1
  else
    p=$(taskset -c 1 "$peers/start.sh" "$1" "127.0.0.1:$port" "$3" "$work/$name")
    url[$name]=http://127.0.0.1:$port/clusters/member1
  fi
  pids+=("$p")
  wait_port "$port"
  pid[$name]=$p
  # nginx: the worker does the proxying
  [ -f "$work/$name/worker.pid" ] && pid[$name]=$(cat "$work/$name/worker.pid")
  return 0
}
echo "== peers (core 1)"
start_peer floor static "$static"
for peer in haproxy nginx goproxy; do
  start_peer "$peer" static "$static"
  start_peer "$peer" tls "$static" tls
  start_peer "$peer" sim "$sim_plain"
done

# Without spec.auth the gateway denies anonymous requests (AccessPolicy mode): the proxy-overhead
# gateways run with authentication, policy and impersonation off, as the peers do.
gateway_auth=${GATEWAY_AUTH:-"auth: {authorizationMode: AlwaysAllow}"}
gateway_yaml() { # plain-port admin-port [tls-port]; spec.auth from $gateway_auth
  cat <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata: {name: bench}
spec:
  workers: 1
  $gateway_auth
  # Every benchmark client comes from 127.0.0.1: the per-address cap (default 4096) would refuse
  # the 8000 watches of watch-idle with 429.
  limits: {maxMemberConnectionsPerClient: 20000}
  admin: {address: "127.0.0.1:$2"}
  listeners:
  - {name: plain, address: "127.0.0.1:$1", tls: false}
YAML
  if [ -n "${3:-}" ]; then
    cat <<YAML
  - {name: https, address: "127.0.0.1:$3", tls: true}
  tls:
    certFile: $sim_dir/pki/gateway.crt
    keyFile: $sim_dir/pki/gateway.key
    clientCAFile: $sim_dir/pki/gateway-ca.crt
YAML
  fi
}
start_fleetgate() { # name config-dir plain-port
  taskset -c 1 "$fg" serve --config "$2" --workers 1 --driver epoll >"$work/$1.out" 2>"$work/$1.err" &
  local p=$!
  pids+=("$p")
  wait_ready "$work/$1.out" "$1" || return 1
  url[$1]=http://127.0.0.1:$3/clusters/member1
  pid[$1]=$p
}
echo "== fleetgate (core 1, one worker each)"
# In front of the static upstream: plain listener, TLS + h2 listener, admin; its config directory
# is the one reload-storm rewrites.
fs_port=$(free_port) fs_admin=$(free_port)
mkdir -p "$work/fg-static"
gateway_yaml "$fs_port" "$fs_admin" "$fg_tls_port" >"$work/fg-static/gateway.yaml"
cat >"$work/fg-static/member1.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member1}
spec:
  server: $static
  impersonation: false
YAML
start_fleetgate fleetgate "$work/fg-static" "$fs_port"
fg_admin_url=http://127.0.0.1:$fs_admin
# In front of the simulated member's plain listener, with the admin token as its credentials.
fsim_port=$(free_port) fsim_admin=$(free_port)
mkdir -p "$work/fg-sim"
gateway_yaml "$fsim_port" "$fsim_admin" >"$work/fg-sim/gateway.yaml"
cat >"$work/fg-sim/member1.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member1}
spec:
  server: $sim_plain
  credentials: {token: "$admin_token"}
  impersonation: false
YAML
start_fleetgate fleetgate-sim "$work/fg-sim" "$fsim_port"

# The simulated member wants a bearer token; fleetgate-sim holds its own (credentials) and
# refuses tokens it does not know, so the token goes to the other sim-backed targets only, through
# a kubeconfig with one context per target (the kubeconfig target form sends a context's token).
sim_kubeconfig=$work/sim-targets.kubeconfig
{
  echo "apiVersion: v1"; echo "kind: Config"; echo "clusters:"
  for t in direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim; do
    printf -- '- name: %s\n  cluster: {server: "%s"}\n' "$t" "${url[$t]}"
  done
  printf 'users:\n- name: admin\n  user: {token: "%s"}\n- name: none\n  user: {}\ncontexts:\n' "$admin_token"
  for t in direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim; do
    user=admin; [ $t = fleetgate-sim ] && user=none
    printf -- '- name: %s\n  context: {cluster: %s, user: %s}\n' "$t" "$t" "$user"
  done
} >"$sim_kubeconfig"
for t in direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim; do url[$t]=kubeconfig:$sim_kubeconfig:$t; done
fi # shared

targets() { # names...
  local t
  for t in "$@"; do
    args+=(--target "$t=${url[$t]}")
    [ -n "${pid[$t]:-}" ] && args+=(--pid "$t=${pid[$t]}")
  done
  return 0
}
# HAProxy does not read from a client while it waits for the server's next bytes, so it keeps both
# sides of an idle watch its client closed until `timeout server` (an hour here). Events on the
# watched collection make it write: the first write to a closed client still succeeds (the kernel
# answers it with a reset), the second fails and HAProxy lets go. Without this the simulated member
# runs out of descriptors a few thousand watches later.
poke_idle_watches() {
  local i
  for i in 1 2; do
    curl -sf -o /dev/null -X POST -H "Authorization: Bearer $admin_token" -H "Content-Type: application/json" \
      --data "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"poke-$RANDOM$RANDOM\"}}" \
      "$sim_plain/api/v1/namespaces/kube-public/configmaps"
    sleep 1 # the member's fan-out to 8000 watches, and HAProxy's writes, before the next event
  done
}
measure() { # name scenario [extra args...]   (name: the JSON, table and chart file names)
  local name=$1 scenario=$2; shift 2
  echo "== $name"
  commands+=("fleetgate-loadtest run --scenario $scenario ${args[*]//$admin_token/TOKEN} ${*//$admin_token/TOKEN}")
  taskset -c 0 "$lt" run --scenario "$scenario" "${args[@]}" "$@" --duration "$duration" \
    --json "$out/$name.json" --chart "$charts/$name.svg" | tee "$out/$name.txt"
}
commands=()
for scenario in "${scenarios[@]}"; do
  args=()
  case $scenario in
  small-get)
    targets direct floor haproxy nginx goproxy fleetgate
    measure small-get small-get --path /api/v1/namespaces/default/configmaps/bench --connections "$connections"
    ;;
  small-get-h2)
    targets haproxy-tls nginx-tls goproxy-tls
    args+=(--target "fleetgate=kubeconfig:$sim_dir/gateway.kubeconfig:member1" --pid "fleetgate=${pid[fleetgate]}")
    measure small-get-h2 small-get-h2 --insecure --path /api/v1/namespaces/default/configmaps/bench --connections 10 --streams 10
    ;;
  big-list)
    targets direct haproxy nginx goproxy fleetgate
    measure big-list big-list --path /big
    ;;
  watch-idle)
    targets direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim
    measure watch-idle watch-idle --watches "$watches" --warmup 3s \
      --path "/api/v1/namespaces/kube-public/configmaps?watch=1"
    poke_idle_watches
    ;;
  watch-idle-tls)
    # TLS on both legs, each proxy configured the same way: client certificates verified against
    # the gateway CA, the member reached over TLS (its CA verified) with the proxy's own bearer
    # token. fleetgate runs as users run it: the simulated fleet's gateway.yaml (authentication,
    # AccessPolicy, impersonation), one worker.
    tls_dir=$work/fg-sim-tls
    mkdir -p "$tls_dir"
    ln -sfn "$sim_dir/pki" "$tls_dir/pki"
    ln -sfn "$sim_dir/users" "$tls_dir/users"
    cp "$sim_dir/policies.yaml" "$sim_dir/clusters/member1.yaml" "$tls_dir/"
    fgt_port=$(free_port)
    sed -e "s|address: 127.0.0.1:$fg_tls_port|address: 127.0.0.1:$fgt_port|" -e "s|workers: 0|workers: 1|" \
      -e "s|^  limits:$|  limits:\n    maxMemberConnectionsPerClient: 20000|" \
      "$sim_dir/gateway.yaml" >"$tls_dir/gateway.yaml"
    grep -q "127.0.0.1:$fgt_port" "$tls_dir/gateway.yaml" && grep -q "maxMemberConnectionsPerClient" "$tls_dir/gateway.yaml" ||
      { echo "sim gateway.yaml changed shape" >&2; exit 1; }
    start_fleetgate fleetgate-sim-tls "$tls_dir" "$fgt_port"
    sim_tls=$(sed -n 's|^  server: \(https://.*\)$|\1|p' "$sim_dir/clusters/member1.yaml")
    hat_port=$(free_port)
    mkdir -p "$work/haproxy-sim-tls"
    cat "$sim_dir/pki/gateway.crt" "$sim_dir/pki/gateway.key" >"$work/haproxy-sim-tls/gateway.pem"
    cat >"$work/haproxy-sim-tls/haproxy.cfg" <<CFG
global
  nbthread 1
  maxconn 9000
defaults
  mode http
  option http-no-delay
  timeout connect 5s
  timeout client 1h
  timeout server 1h
frontend fe
  bind 127.0.0.1:$hat_port ssl crt $work/haproxy-sim-tls/gateway.pem ca-file $sim_dir/pki/gateway-ca.crt verify required alpn http/1.1
  use_backend member1 if { path_beg /clusters/member1/ }
backend member1
  http-request replace-path /clusters/member1(/.*) \1
  http-request set-header Authorization "Bearer $admin_token"
  http-reuse always
  server s1 ${sim_tls#https://} ssl verify required ca-file $sim_dir/pki/fleet-ca.crt sni str(localhost)
CFG
    taskset -c 1 haproxy -D -p "$work/haproxy-sim-tls/haproxy.pid" -f "$work/haproxy-sim-tls/haproxy.cfg" \
      2>"$work/haproxy-sim-tls/haproxy.log"
    wait_port "$hat_port"
    pids+=("$(cat "$work/haproxy-sim-tls/haproxy.pid")")
    pid[haproxy-sim-tls]=$(cat "$work/haproxy-sim-tls/haproxy.pid")
    tls_kubeconfig=$work/tls-targets.kubeconfig
    cp "$sim_dir/gateway.kubeconfig" "$tls_kubeconfig"
    for t in haproxy-sim-tls:$hat_port fleetgate-sim-tls:$fgt_port; do
      kubectl config --kubeconfig "$tls_kubeconfig" set-cluster "${t%%:*}" \
        --server "https://127.0.0.1:${t##*:}/clusters/member1" \
        --certificate-authority "$sim_dir/pki/gateway-ca.crt" --embed-certs >/dev/null
      kubectl config --kubeconfig "$tls_kubeconfig" set-context "${t%%:*}" \
        --cluster "${t%%:*}" --user admin >/dev/null
      url[${t%%:*}]=kubeconfig:$tls_kubeconfig:${t%%:*}
    done
    targets haproxy-sim-tls fleetgate-sim-tls
    measure watch-idle-tls watch-idle --watches "$watches" --warmup 3s \
      --path "/api/v1/namespaces/kube-public/configmaps?watch=1"
    poke_idle_watches
    ;;
  watch-events)
    targets direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim
    measure watch-events watch-events --watches "$event_watches" --warmup 2s --path /api/v1/configmaps
    ;;
  watch-latency)
    # Paired streams (one through the target, one direct) with few watchers: the added latency of
    # each event without the member's fan-out; direct-sim first, paired with itself, is the floor.
    targets direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim
    measure watch-latency watch-latency --reference direct-sim --watches "$latency_pairs" --warmup 2s --path /api/v1/configmaps
    ;;
  exec-stream)
    targets direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim
    measure exec-stream exec-stream --streams "$exec_streams"
    ;;
  portforward-stream)
    targets direct-sim haproxy-sim nginx-sim goproxy-sim fleetgate-sim
    measure portforward-stream portforward-stream --streams "$exec_streams"
    ;;
  reload-storm)
    targets fleetgate
    measure reload-storm reload-storm --path /api/v1/namespaces/default/configmaps/bench --connections "$connections" \
      --config-dir "$work/fg-static" --admin-url "$fg_admin_url" --changes-per-sec 100
    ;;
  auth-overhead)
    # The same small GET. Off: `spec.auth.authorizationMode:
    # AlwaysAllow`, no token file, `impersonation: false`. On: a token file, an AccessPolicy
    # granting the user get/list/watch on every cluster, and impersonation of that user.
    for mode in off on; do
      port=$(free_port) admin=$(free_port)
      dir=$work/fg-auth-$mode
      mkdir -p "$dir"
      if [ $mode = off ]; then
        gateway_yaml "$port" "$admin" >"$dir/gateway.yaml"
        impersonation=false
      else
        printf 'bench-token-0123456789,bench,bench-uid,"bench-group"\n' >"$dir/tokens.csv"
        gateway_auth="auth: {tokenFile: tokens.csv, authorizationMode: AccessPolicy}" \
          gateway_yaml "$port" "$admin" >"$dir/gateway.yaml"
        cat >"$dir/policy.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: bench}
spec:
  subjects: [{kind: User, name: bench}]
  clusters: {names: ["*"]}
  rules: [{verbs: [get, list, watch]}]
YAML
        impersonation=true
      fi
      cat >"$dir/member1.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member1}
spec:
  server: $static
  credentials: {token: gateway-credential}
  impersonation: $impersonation
YAML
      if ! start_fleetgate "fleetgate-auth-$mode" "$dir" "$port"; then
        echo "== auth-overhead: this fleetgate does not take the auth configuration (above); skipped"
        continue 2
      fi
    done
    # Off has no authenticator (an unknown bearer token would be refused), so only on gets the
    # token: through a kubeconfig context, as kubectl would send it.
    cat >"$work/auth.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: on, cluster: {server: "${url[fleetgate-auth-on]}"}}]
users: [{name: bench, user: {token: bench-token-0123456789}}]
contexts: [{name: on, context: {cluster: on, user: bench}}]
YAML
    url[fleetgate-auth-on]=kubeconfig:$work/auth.kubeconfig:on
    targets fleetgate-auth-off fleetgate-auth-on
    measure auth-overhead small-get --path /api/v1/namespaces/default/configmaps/bench \
      --connections "$connections" ||
      echo "== auth-overhead: a gateway refused the bearer token (is the auth data path in?)"
    ;;
  registry)
    # Issue 5: building a 10,000-cluster table (goal under 50 ms) and, where the example exists,
    # memory per cluster entry. Not a proxy scenario: the config-watcher's examples, on core 1.
    echo "== registry"
    (cd "$repo" && taskset -c 1 cargo run --release -q -p fleetgate-config-watcher --example table_build 10000) |
      tee "$out/registry.txt"
    if [ -f "$repo/config-watcher/examples/table-memory.rs" ]; then
      (cd "$repo" && taskset -c 1 cargo run --release -q -p fleetgate-config-watcher --example table-memory) |
        tee -a "$out/registry.txt" || echo "(table-memory example did not run)"
    fi
    ;;
  fleet-list)
    # Issue 13 item 8: one LIST of every member's pods through /fleet, unpaged and paged (limit,
    # following continue tokens), against the same lists asked of each member direct, one
    # after the other (the baseline). At each multiple of the pod count a new fleet and a new
    # gateway (fleetgate's peak RSS is its VmHWM since it started: it must not grow with the
    # objects). The gateway runs as users run it (the fleet's gateway.yaml: TLS, authentication,
    # AccessPolicy, impersonation of the admin at every member), with one worker.
    for scale in $fleet_scales; do
      fdir=$work/fleet-${scale}x
      per=$((fleet_pods * scale))
      echo "== simulated fleet: $fleet_members members x $per pods (core 0)"
      taskset -c 0 "$lt" sim --dir "$fdir" --clusters "$fleet_members" --pods-per-member "$per" \
        --gateway-listen 127.0.0.1:0 >"$work/fleet-${scale}x.out" 2>"$work/fleet-${scale}x.err" &
      fsim=$!
      pids+=("$fsim")
      # Seeding a million pods takes a while: up to 10 minutes.
      for _ in $(seq 6000); do grep -q '^ready' "$work/fleet-${scale}x.out" && break; sleep 0.1; done
      wait_ready "$work/fleet-${scale}x.out" "the simulated fleet (x$scale)"
      echo "   sim RSS after seeding: $(($(awk '/^VmRSS/ {print $2}' "/proc/$fsim/status") / 1024)) MiB"
      taskset -c 1 "$fg" serve --config "$fdir" --workers 1 >"$work/fleetgate-fleet.out" 2>"$work/fleetgate-fleet.err" &
      fgw=$!
      pids+=("$fgw")
      wait_ready "$work/fleetgate-fleet.out" "fleetgate on the fleet"
      https=$(sed -n 's/^ready.* https=\([0-9.:]*\).*/\1/p' "$work/fleetgate-fleet.out")
      sed "s|https://127.0.0.1:0/|https://$https/|" "$fdir/gateway.kubeconfig" >"$work/fleet-${scale}x-gateway.kubeconfig"
      url[direct-members]="kubeconfig:$fdir/kubeconfig:member*"
      url[fleetgate-fleet]="kubeconfig:$work/fleet-${scale}x-gateway.kubeconfig:fleet"
      pid[fleetgate-fleet]=$fgw
      for limit in 0 "$fleet_limit"; do
        name=fleet-list-${scale}x; [ "$limit" = 0 ] || name=$name-paged
        args=()
        targets direct-members fleetgate-fleet
        measure "$name" fleet-list --path /api/v1/pods --limit "$limit" --upstream-pid "$fsim"
      done
      # Both go before the next count's fleet (the 10x one holds ~8 GiB).
      kill "$fgw" "$fsim" 2>/dev/null || true
      wait "$fgw" "$fsim" 2>/dev/null || true
    done
    ;;
  *) echo "unknown scenario $scenario (${all[*]})" >&2; exit 2 ;;
  esac
done

echo "== machine load during the run: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${commands[@]}" >"$out/commands.txt"
python3 "$here/report.py" "$out" "$md" "$(git -C "$repo" rev-parse --short HEAD)" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$duration" "$watches" "$event_watches" "$churn" "$exec_streams" \
  "$fleet_members" "$fleet_pods" "$fleet_limit"
echo "results: $out; docs/benchmarks.md updated between its all.sh markers"
