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
#   TUNNEL_ROUNDS=3 TUNNEL_WATCHES=4000 TUNNEL_AGENT_CORE=1 TUNNEL_MEMBERS="plain tls" TUNNEL_HOP=1 benches/all.sh tunnel
#   WATCHES=8000 FANOUT_CHURN=20 FANOUT_REOPEN=10 FANOUT_SHARDS="1 2" [FANOUT_H2=10] benches/all.sh watch-fanout
#   CACHE_MEMBERS=100 CACHE_PODS=1000 CACHE_SCALES="1 10" CACHE_INFORMERS=1000 CACHE_STORM_OBJECTS=100 benches/all.sh cache
#   SKIP_BUILD=1 (use the release binaries as they are)  BENCH_MD=FILE (write the tables there)
#   KEEP_WORK=1 (keep the /tmp work directory: configs, logs, the simulated fleet)
#
# Upstreams (core 0): a static nginx (a ~1 KiB ConfigMap JSON, and a ~90 MB LIST at /big) for the
# proxy-overhead scenarios; the simulated fleet with a plain-HTTP listener (`sim --plaintext`) for
# watches and exec, since the peers' upstream leg is plain HTTP/1.1.
# fleet-list starts its own simulated fleet (FLEET_MEMBERS members x FLEET_PODS pods, then again
# at each multiple of FLEET_SCALES; core 0) and a fleetgate on it (core 1); run alone, it starts
# nothing else.
# tunnel (issue 14 item 7) starts one fleetgate (core 1) serving each upstream twice, as a Direct
# cluster and as a Tunnel cluster whose `fleetgate agent` (TUNNEL_AGENT_CORE, default 1: beside
# the gateway, so the system under test has core 1 and the driver and upstreams core 0 in both
# measurements; on core 0 the agent fights the driver for it) dials the gateway's tunnel listener; it needs
# the static nginx and the simulated member but no peer, so run alone it starts no peer. With
# TUNNEL_HOP=1 (the default) each scenario but idle watches is measured through one more proxy hop
# too (`fg-hop`: HAProxy, TLS from the gateway, the upstream's own leg after it; on the agent's
# core): what any extra hop of the tunnel's security costs here, the floor under its ratios.
# watch-fanout (issue 15 item 7) starts its own simulated fleet (2 members, TLS, core 0) and, one
# after the other and each fresh, HAProxy and fleetgate with and without spec.sharedWatches
# (core 1) in front of it; run alone, it starts nothing else. It ends with send-floor.py, the
# kernel's cost of one small send per client connection (the floor under CPU per event).
# cache (issue 34) runs `fleetgate-loadtest run --scenario cache` once per multiple of
# CACHE_SCALES: it starts its own simulated fleet (CACHE_MEMBERS members x CACHE_PODS pods times
# the multiple; a child of the driver, core 0) and its gateways (one worker, core 1), without
# and with spec.cache, one after the other; the relist storm of CACHE_INFORMERS informers at the
# first multiple only. Run alone, it starts nothing else.
# Targets: `direct` (the upstream itself), `floor` (small-get only: the byte pump is valid for
# small GETs only), `haproxy`, `nginx`, `goproxy` ($PEERS/start.sh; `-tls` ones serve
# TLS + h2 with the sim's gateway certificate), and `fleetgate` (`serve --workers 1`).
# The auth-overhead pair (issue 6): the same small-get against fleetgate with authentication,
# policy and impersonation off, then on (bearer token, AccessPolicy, impersonation).
#
# Needs Debian's nginx-light haproxy golang-go (benches/install-peers.sh), python3, and
# the benchmark peers in $PEERS (shared/peers of the workspace). Pinning needs 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
peers=${PEERS:?"set PEERS to the benchmark peers folder (shared/peers of the workspace)"}
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
tunnel_rounds=${TUNNEL_ROUNDS:-1}
tunnel_watches=${TUNNEL_WATCHES:-4000}
tunnel_agent_core=${TUNNEL_AGENT_CORE:-1}
tunnel_members=${TUNNEL_MEMBERS:-plain tls}
tunnel_hop=${TUNNEL_HOP:-1}
cache_members=${CACHE_MEMBERS:-100}
cache_pods=${CACHE_PODS:-1000}
cache_scales=${CACHE_SCALES:-1 10}
cache_informers=${CACHE_INFORMERS:-1000}
cache_storm_objects=${CACHE_STORM_OBJECTS:-100}
all=(small-get small-get-h2 big-list watch-idle watch-idle-tls watch-events watch-latency exec-stream portforward-stream reload-storm auth-overhead registry fleet-list tunnel watch-fanout cache)
scenarios=("$@"); [ ${#scenarios[@]} -gt 0 ] || scenarios=("${all[@]}")
# The shared upstreams serve every scenario but fleet-list (its own fleet); the peers and their
# gateways every one but fleet-list and tunnel (its own gateway and agents).
shared=0 peered=0
for s in "${scenarios[@]}"; do
  case $s in fleet-list | watch-fanout | cache) ;; *) shared=1 ;; esac
  case $s in fleet-list | tunnel | watch-fanout | cache) ;; *) peered=1 ;; esac
done
mkdir -p "$out" "$charts"
# A full run starts from an empty results directory, so the report holds this run only; a run of
# some scenarios keeps the others' results (the report then mixes runs: rerun all to compare).
[ $# -eq 0 ] && rm -f "$out"/*.json "$out"/*.txt
# 8000 watches: the driver holds 8000 sockets and a proxy 16000 (client and upstream side).
ulimit -n "$(ulimit -H -n)"
work=$(mktemp -d /tmp/fleetgate-bench-all.XXXXXX)
chmod 755 "$work"  # the nginx workers (www-data) read the upstream's files from here
# shellcheck source=benches/common.sh
. "$here/common.sh"
wait_ready() { # file what
  for _ in $(seq 300); do grep -qs '^ready' "$1" && return 0; sleep 0.1; done
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

echo "== static upstream (nginx, core 0)"
mkdir -p "$work/www"
"$here/upstream-files.py" "$work/www" 100000
up_port=$(free_port) up_tls_port=$(free_port)
# A TLS listener too (the tunnel scenario's members over TLS), with the sim's gateway certificate.
sed -e "s|^\( *\)listen @LISTEN@;|&\n\1listen 127.0.0.1:$up_tls_port ssl; ssl_certificate $sim_dir/pki/gateway.crt; ssl_certificate_key $sim_dir/pki/gateway.key;|" \
  -e "s|@LISTEN@|127.0.0.1:$up_port|" -e "s|@WORK@|$work|g" "$here/upstream-nginx.conf.in" >"$work/upstream.conf"
grep -q "listen 127.0.0.1:$up_tls_port ssl;" "$work/upstream.conf" || { echo "upstream-nginx.conf.in changed shape" >&2; exit 1; }
taskset -c 0 nginx -c "$work/upstream.conf"
wait_port "$up_port"
pids+=("$(cat "$work/upstream.pid")")
static=http://127.0.0.1:$up_port
static_tls=https://127.0.0.1:$up_tls_port

url[direct]=$static
url[direct-sim]=$sim_plain
pid[direct-sim]=$sim_pid
fi # shared
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
if [ $peered = 1 ]; then
echo "== peers (core 1)"
start_peer floor static "$static"
for peer in haproxy nginx goproxy; do
  start_peer "$peer" static "$static"
  start_peer "$peer" tls "$static" tls
  start_peer "$peer" sim "$sim_plain"
done
fi # peered

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
start_fleetgate() { # name config-dir plain-port [serve args...]
  local name=$1 dir=$2 port=$3; shift 3
  taskset -c 1 "$fg" serve --config "$dir" --workers 1 --driver epoll "$@" >"$work/$name.out" 2>"$work/$name.err" &
  local p=$!
  pids+=("$p")
  wait_ready "$work/$name.out" "$name" || return 1
  url[$name]=http://127.0.0.1:$port/clusters/member1
  pid[$name]=$p
}
if [ $peered = 1 ]; then
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
fi # peered

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
  local name=$1 scenario=$2 chart=(); shift 2
  echo "== $name"
  commands+=("fleetgate-loadtest run --scenario $scenario ${args[*]//$admin_token/TOKEN} ${*//$admin_token/TOKEN}")
  # chart_name: the chart's file name when not $name; none at all when it is `-`.
  [ "${chart_name:-}" = - ] || chart=(--chart "$charts/${chart_name:-$name}.svg")
  taskset -c 0 "$lt" run --scenario "$scenario" "${args[@]}" "$@" --duration "$duration" \
    --json "$out/$name.json" "${chart[@]}" | tee "$out/$name.txt"
}
# The machine's CPU ticks now, all busy ones and this script's own (its descendants, waited ones
# included, and the daemons in $pids with theirs), so that a round can say how many cores other
# work (the other builds on a shared machine) kept busy meanwhile: `busy ours` on one line.
cpu_ticks() {
  python3 - "$$" "${pids[@]}" <<'PY'
import os, sys
roots = {int(p) for p in sys.argv[1:]}
procs = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # ppid; utime + stime + cutime + cstime (a waited child's time is in its parent's)
        procs[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]))
ours = 0
for pid, (ppid, ticks) in procs.items():
    seen, p = set(), pid
    while p in procs and p not in roots and p not in seen:
        seen.add(p)
        p = procs[p][0]
    if p in roots:
        ours += ticks
cpu = open("/proc/stat").readline().split()[1:]
busy = sum(int(cpu[i]) for i in (0, 1, 2, 5, 6, 7))  # user nice system irq softirq steal
print(busy, ours)
PY
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
  tunnel)
    # Issue 14 item 7: pull mode against the direct path, in one gateway (core 1, one worker)
    # serving each upstream twice: `static-d` / `member-d` as Direct clusters, `static-t` /
    # `member-t` as Tunnel clusters whose agents (TUNNEL_AGENT_CORE) dial its tunnel listener and
    # reach the same upstream; with TUNNEL_MEMBERS=tls (default "plain tls") the same four again,
    # `-tls`, reaching the upstreams over TLS as production members are. Each scenario measures
    # fleetgate direct, through the tunnel, and direct again (the method's floor: how far the same
    # path moves by itself); the tunnel's CPU is the gateway's plus its agent's (`--pid
    # NAME=GATEWAY,AGENT`). TUNNEL_ROUNDS rounds, each recording the cores other work kept busy
    # meanwhile (tunnel-rN.load).
    tdir=$work/fg-tunnel agents=$work/agents
    mkdir -p "$tdir"
    t_port=$(free_port) t_admin=$(free_port)
    # spec.tls: the tunnel listener serves the Gateway's certificate.
    gateway_yaml "$t_port" "$t_admin" "$(free_port)" >"$tdir/gateway.yaml"
    sim_tls=$(sed -n 's|^  server: \(https://.*\)$|\1|p' "$sim_dir/clusters/member1.yaml")
    declare -A server ca agent
    server[static]=$static server[member]=$sim_plain
    server[static-tls]=$static_tls ca[static-tls]=$sim_dir/pki/gateway-ca.crt
    server[member-tls]=$sim_tls ca[member-tls]=$sim_dir/pki/fleet-ca.crt
    # A Cluster of the tunnel scenario: NAME UP (static: no credentials) SERVER (none: a Tunnel
    # cluster) CA (a file, or none: the server is plain HTTP).
    tunnel_cluster() {
      {
        printf 'apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: %s}\nspec:\n' "$1"
        if [ -z "$3" ]; then
          echo "  connectMode: Tunnel"
        else
          echo "  server: $3"
          [ -z "$4" ] || { echo "  caData: |"; sed 's/^/    /' "$4"; }
        fi
        [ "$2" = static ] || echo "  credentials: {token: \"$admin_token\"}"
        echo "  impersonation: false"
      } >"$tdir/$1.yaml"
    }
    for mode in $tunnel_members; do
      suffix=; [ "$mode" = plain ] || suffix=-$mode
      for up in static member; do
        tunnel_cluster "$up-d$suffix" "$up" "${server[$up$suffix]}" "${ca[$up$suffix]:-}"
        tunnel_cluster "$up-t$suffix" "$up" "" ""
        "$fg" certs issue-agent --dir "$agents" --cluster "$up-t$suffix" >/dev/null
      done
    done
    # The method's floor for the tunnel's extra hop (TUNNEL_HOP=1, the default): the same upstream
    # reached directly, but through one more proxy with the tunnel's security, HAProxy (one thread,
    # mode tcp, on the agent's core): the gateway's TLS ends there and the upstream's own leg (plain,
    # or TLS verifying its CA) starts, as at the agent, without the tunnel's multiplexing. Direct
    # clusters `static-h` / `member-h` (`-tls`); `fg-hop`'s CPU is the gateway's plus HAProxy's.
    hop_pid=
    if [ "$tunnel_hop" = 1 ]; then
      hop=$work/hop
      mkdir -p "$hop"
      cat "$sim_dir/pki/gateway.crt" "$sim_dir/pki/gateway.key" >"$hop/gateway.pem"
      printf 'global\n  nbthread 1\n  maxconn 9000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n' >"$hop/haproxy.cfg"
      hop_ports=()
      for mode in $tunnel_members; do
        suffix=; [ "$mode" = plain ] || suffix=-$mode
        for up in static member; do
          name=$up-h$suffix hop_port=$(free_port) member_tls=
          hop_ports+=("$hop_port")
          [ -z "$suffix" ] || member_tls=" ssl verify required ca-file ${ca[$up$suffix]} sni str(localhost)"
          upstream=${server[$up$suffix]#*://}
          printf 'frontend f-%s\n  bind 127.0.0.1:%s ssl crt %s alpn http/1.1\n  default_backend b-%s\nbackend b-%s\n  server s1 %s%s\n' \
            "$name" "$hop_port" "$hop/gateway.pem" "$name" "$name" "${upstream%%/*}" "$member_tls" >>"$hop/haproxy.cfg"
          tunnel_cluster "$name" "$up" "https://127.0.0.1:$hop_port" "$sim_dir/pki/gateway-ca.crt"
        done
      done
      taskset -c "$tunnel_agent_core" haproxy -D -p "$hop/haproxy.pid" -f "$hop/haproxy.cfg" 2>"$hop/haproxy.log"
      for p in "${hop_ports[@]}"; do wait_port "$p"; done
      hop_pid=$(cat "$hop/haproxy.pid")
      pids+=("$hop_pid")
    fi
    # The gateway and its agents, started afresh before each idle-watch measurement: resident
    # memory a process freed is reused before it grows, so only a fresh process's growth is the
    # cost of the watches it holds. The tunnel listener keeps its port, the agents their names.
    tunnel_port=$(free_port)
    tunnel_up() {
      local mode suffix up name member_ca keep=() p
      for p in "${pids[@]}"; do [ "$p" = "${gw:-}" ] || [[ " ${agent[*]} " == *" $p "* ]] || keep+=("$p"); done
      [ -z "${gw:-}" ] || { kill "$gw" "${agent[@]}" 2>/dev/null; wait "$gw" "${agent[@]}" 2>/dev/null || true; }
      pids=("${keep[@]}")
      start_fleetgate fleetgate-tunnel "$tdir" "$t_port" --tunnel-listen "127.0.0.1:$tunnel_port" --agent-ca "$agents/agent-ca.crt"
      gw=${pid[fleetgate-tunnel]}
      for mode in $tunnel_members; do
        suffix=; [ "$mode" = plain ] || suffix=-$mode
        for up in static member; do
          name=$up-t$suffix member_ca=()
          [ -z "$suffix" ] || member_ca=(--kube-ca "${ca[$up$suffix]}")
          taskset -c "$tunnel_agent_core" "$fg" agent --gateway "https://127.0.0.1:$tunnel_port" --cluster "$name" \
            --cert "$agents/agent-$name.crt" --key "$agents/agent-$name.key" --ca "$sim_dir/pki/gateway-ca.crt" \
            --kube-server "${server[$up$suffix]}" "${member_ca[@]}" >"$work/agent-$name.out" 2>"$work/agent-$name.err" &
          agent[$name]=$!
          pids+=("${agent[$name]}")
          wait_ready "$work/agent-$name.out" "the agent of $name"
        done
      done
    }
    gw=
    tunnel_up
    base=http://127.0.0.1:$t_port/clusters
    rm -f "$out"/tunnel-*
    for round in $(seq "$tunnel_rounds"); do
      load0=$(cut -d' ' -f1-3 /proc/loadavg) ticks0=$(cpu_ticks) t0=$(date +%s.%N)
      echo "== tunnel round $round of $tunnel_rounds (load average $load0)"
      for mode in $tunnel_members; do
        suffix=; [ "$mode" = plain ] || suffix=-$mode
        for part in watch-idle small-get big-list watch-events exec-stream; do
          up=member; case $part in small-get | big-list) up=static ;; esac
          args=(--target "fg-direct=$base/$up-d$suffix" --pid "fg-direct=$gw"
            --target "fg-tunnel=$base/$up-t$suffix" --pid "fg-tunnel=$gw,${agent[$up-t$suffix]}")
          [ -z "$hop_pid" ] || [ $part = watch-idle ] || args+=(--target "fg-hop=$base/$up-h$suffix" --pid "fg-hop=$gw,$hop_pid")
          args+=(--target "fg-direct-2=$base/$up-d$suffix" --pid "fg-direct-2=$gw")
          case $part in
          watch-idle) extra=(--watches "$tunnel_watches" --warmup 3s --path "/api/v1/namespaces/kube-public/configmaps?watch=1") ;;
          small-get) extra=(--path /api/v1/namespaces/default/configmaps/bench --connections "$connections") ;;
          big-list) extra=(--path /big) ;;
          watch-events) extra=(--watches "$event_watches" --warmup 2s --path /api/v1/configmaps) ;;
          exec-stream) extra=(--streams "$exec_streams") ;;
          esac
          # A chart of the last round only.
          chart_name=-; [ "$round" = "$tunnel_rounds" ] && chart_name=tunnel-$mode-$part
          if [ $part != watch-idle ]; then
            measure "tunnel-$mode-$part-r$round" "$part" "${extra[@]}"
            continue
          fi
          # Idle watches: each target alone in a fresh gateway (and agents), then one JSON.
          all_args=("${args[@]}") parts=()
          for t in fg-direct fg-tunnel fg-direct-2; do
            tunnel_up
            args=(--target "$t=$base/member-d$suffix" --pid "$t=$gw")
            [ $t != fg-tunnel ] || args=(--target "$t=$base/member-t$suffix" --pid "$t=$gw,${agent[member-t$suffix]}")
            chart_name=- measure "tunnel-$mode-$part-r$round-$t" "$part" "${extra[@]}"
            parts+=("$out/tunnel-$mode-$part-r$round-$t.json")
          done
          python3 -c 'import json, sys; json.dump([r for f in sys.argv[2:] for r in json.load(open(f))], open(sys.argv[1], "w"), indent=1)' \
            "$out/tunnel-$mode-$part-r$round.json" "${parts[@]}"
          rm -f "${parts[@]}"
          args=("${all_args[@]}")
        done
      done
      chart_name=
      python3 - "$ticks0" "$(cpu_ticks)" "$t0" "$(date +%s.%N)" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        "$tunnel_agent_core" >"$out/tunnel-r$round.load" <<'PY'
import json, os, sys, time
(b0, o0), (b1, o1) = (map(int, a.split()) for a in sys.argv[1:3])
t0, t1 = float(sys.argv[3]), float(sys.argv[4])
hz = os.sysconf("SC_CLK_TCK")
print(json.dumps({"start": time.strftime("%H:%M UTC", time.gmtime(t0)), "seconds": round(t1 - t0),
                  "loadavg_start": sys.argv[5], "loadavg_end": sys.argv[6], "agent_core": sys.argv[7],
                  "bench_cores": round((o1 - o0) / hz / (t1 - t0), 2),
                  "other_cores": round(max(0, (b1 - b0) - (o1 - o0)) / hz / (t1 - t0), 2)}))
PY
      echo "== tunnel round $round: $(cat "$out/tunnel-r$round.load")"
    done
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
  watch-fanout)
    # Issue 15 item 7: WATCHES client watches (8000) spread over 10 resources on 2 members, with
    # churn (FANOUT_CHURN writes/s on the members, FANOUT_REOPEN client watches closed and opened
    # again a second), through: the members direct (the floor of the latency), HAProxy (the
    # baseline: one member watch per client watch), and fleetgate without and with
    # spec.sharedWatches for the 10 resources, at each shard count of FANOUT_SHARDS (default
    # "1 2": one worker, and two, this machine's default of one per core; all on core 1, so two
    # shards share it), and beyond one shard with sharing per gateway (`scope: Gateway`) too. TLS on both legs for every proxy, configured alike: client certificates
    # verified against the gateway CA, the members over TLS (their CA verified) with the admin's
    # token for HAProxy; fleetgate as users run it (authentication, AccessPolicy, impersonation:
    # a watch is shared only when the member sees the user). Each proxy is started fresh just
    # before its measurement and stopped after it, so its memory growth is the watches' and the
    # members hold no watch of an earlier target.
    # FANOUT_H2=N: the client watches as streams of h2 connections, N on each (each of another
    # resource of one member, as a controller's informers); unset: each its own HTTP/1.1 one.
    fanout_shards=${FANOUT_SHARDS:-1 2}
    fan_layout=() fan_alpn=http/1.1
    if [ -n "${FANOUT_H2:-}" ]; then fan_layout=(--h2-watches "$FANOUT_H2") fan_alpn=h2,http/1.1; fi
    fdir=$work/fanout
    echo "== simulated fleet for watch-fanout: 2 members (core 0)"
    : >"$work/fanout-sim.out"  # there before wait_ready reads it
    taskset -c 0 "$lt" sim --dir "$fdir/sim" --clusters 2 --gateway-listen "127.0.0.1:$(free_port)" \
      >"$work/fanout-sim.out" 2>"$work/fanout-sim.err" &
    pids+=("$!")
    wait_ready "$work/fanout-sim.out" "the simulated fleet for watch-fanout"
    fsim=$fdir/sim
    fkc=$work/fanout-targets.kubeconfig
    cp "$fsim/gateway.kubeconfig" "$fkc"
    fan_target() { # name port: contexts NAME-member1, NAME-member2 through 127.0.0.1:PORT as admin
      local m
      for m in member1 member2; do
        kubectl config --kubeconfig "$fkc" set-cluster "$1-$m" --server "https://127.0.0.1:$2/clusters/$m" \
          --certificate-authority "$fsim/pki/gateway-ca.crt" --embed-certs >/dev/null
        kubectl config --kubeconfig "$fkc" set-context "$1-$m" --cluster "$1-$m" --user admin >/dev/null
      done
    }
    fan_measure() { # name pid: one target, its own JSON
      args=(--target "$1=kubeconfig:$fkc:$1-member*")
      [ -z "${2:-}" ] || args+=(--pid "$1=$2")
      chart_name=- measure "watch-fanout-$1" watch-fanout --members "kubeconfig:$fsim/kubeconfig:member*" \
        --watches "$watches" --churn "${FANOUT_CHURN:-20}" --reopen-per-sec "${FANOUT_REOPEN:-10}" --warmup 3s "${fan_layout[@]}"
      parts+=("$out/watch-fanout-$1.json")
    }
    fan_stop() { # pid
      local keep=() p
      kill "$1" 2>/dev/null || true
      while kill -0 "$1" 2>/dev/null; do sleep 0.1; done
      for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
      pids=("${keep[@]}")
    }
    parts=()
    rm -f "$out"/watch-fanout*.json
    # The members direct: the floor of the write-to-delivery latency (no proxy, no process charged).
    args=(--target "direct=kubeconfig:$fsim/kubeconfig:member*")
    chart_name=- measure watch-fanout-direct watch-fanout --members "kubeconfig:$fsim/kubeconfig:member*" \
      --watches "$watches" --churn "${FANOUT_CHURN:-20}" --reopen-per-sec "${FANOUT_REOPEN:-10}" --warmup 3s "${fan_layout[@]}"
    parts+=("$out/watch-fanout-direct.json")
    # HAProxy, one thread, both members behind one TLS frontend.
    ha_port=$(free_port) ha=$fdir/haproxy
    mkdir -p "$ha"
    cat "$fsim/pki/gateway.crt" "$fsim/pki/gateway.key" >"$ha/gateway.pem"
    fan_token=$(cat "$fsim/users/admin.token")
    {
      printf 'global\n  nbthread 1\n  maxconn 9000\ndefaults\n  mode http\n  option http-no-delay\n'
      printf '  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\nfrontend fe\n'
      printf '  bind 127.0.0.1:%s ssl crt %s ca-file %s verify required alpn %s\n' "$ha_port" "$ha/gateway.pem" "$fsim/pki/gateway-ca.crt" "$fan_alpn"
      for m in member1 member2; do printf '  use_backend %s if { path_beg /clusters/%s/ }\n' $m $m; done
      for m in member1 member2; do
        server=$(sed -n 's|^  server: https://\(.*\)$|\1|p' "$fsim/clusters/$m.yaml")
        printf 'backend %s\n  http-request replace-path /clusters/%s(/.*) \\1\n' $m $m
        printf '  http-request set-header Authorization "Bearer %s"\n  http-reuse always\n' "$fan_token"
        printf '  server s1 %s ssl verify required ca-file %s sni str(localhost)\n' "$server" "$fsim/pki/fleet-ca.crt"
      done
    } >"$ha/haproxy.cfg"
    taskset -c 1 haproxy -D -p "$ha/haproxy.pid" -f "$ha/haproxy.cfg" 2>"$ha/haproxy.log"
    wait_port "$ha_port"
    ha_pid=$(cat "$ha/haproxy.pid")
    pids+=("$ha_pid")
    fan_target haproxy "$ha_port"
    fan_measure haproxy "$ha_pid"
    fan_stop "$ha_pid"
    # fleetgate: the simulated fleet's own configuration (TLS, tokens, AccessPolicy, the members
    # with impersonation), on its own port, with or without sharedWatches for the 10 resources.
    for shards in $fanout_shards; do
      # Beyond one shard, sharing per gateway too (scope: Gateway: one member watch per key,
      # fed to the other shard) beside per shard.
      sharings="off on"; [ "$shards" = 1 ] || sharings="off on gateway"
      for sharing in $sharings; do
        case $sharing in
        off) name=fleetgate-unshared-w$shards ;;
        on) name=fleetgate-shared-w$shards ;;
        gateway) name=fleetgate-gateway-w$shards ;;
        esac
        gdir=$fdir/$name port=$(free_port)
        mkdir -p "$gdir/clusters"
        ln -sfn "$fsim/pki" "$gdir/pki"
        ln -sfn "$fsim/users" "$gdir/users"
        cp "$fsim/policies.yaml" "$gdir/"
        cp "$fsim/clusters/"*.yaml "$gdir/clusters/"
        cat >"$gdir/gateway.yaml" <<YAML
apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata: {name: fanout}
spec:
  workers: $shards
  listeners: [{name: https, address: "127.0.0.1:$port", tls: true}]
  tls: {certFile: pki/gateway.crt, keyFile: pki/gateway.key, clientCAFile: pki/gateway-ca.crt}
  admin: {address: "127.0.0.1:$(free_port)"}
  limits: {maxMemberConnectionsPerClient: 20000, shutdownGraceSeconds: 5}
  auth: {tokenFile: users/tokens.csv}
YAML
        if [ $sharing != off ]; then
          {
            echo "  sharedWatches:"
            [ $sharing != gateway ] || echo "    scope: Gateway"
            echo "    resources:"
            for r in configmaps secrets services serviceaccounts events pods; do echo "    - {group: '', version: v1, resource: $r}"; done
            for r in deployments replicasets statefulsets daemonsets; do echo "    - {group: apps, version: v1, resource: $r}"; done
          } >>"$gdir/gateway.yaml"
        fi
        taskset -c 1 "$fg" serve --config "$gdir" --workers "$shards" >"$work/$name.out" 2>"$work/$name.err" &
        gw=$!
        pids+=("$gw")
        wait_ready "$work/$name.out" "$name"
        fan_target "$name" "$port"
        fan_measure "$name" "$gw"
        fan_stop "$gw"
      done
    done
    # The kernel's floor under the CPU figure: one 1 KiB send to each client connection (core 1),
    # its reader waiting in epoll (core 0), as a proxy delivering one event makes.
    python3 "$here/send-floor.py" "$watches" 30 1024 1 0 "$out/watch-fanout-floor.json"
    python3 -c 'import json, sys; json.dump([r for f in sys.argv[2:] for r in json.load(open(f))], open(sys.argv[1], "w"), indent=1)' \
      "$out/watch-fanout.json" "${parts[@]}"
    rm -f "${parts[@]}"
    chart_name=
    ;;
  cache)
    # Issue 34's benchmark (docs/cache.md, loadtest/src/run/cache.rs): a relist storm of
    # CACHE_INFORMERS informers, the LIST of every pod through /fleet at resourceVersion=0 and
    # consistent, and memory per cached object, with the cache off then on, and the members'
    # own lists direct, in one run of the driver. The driver and the simulated fleet it starts
    # on core 0; its gateways on core 1, through a wrapper that pins them (same pid: exec).
    printf '#!/bin/sh\nexec taskset -c 1 "%s" "$@"\n' "$fg" >"$work/fleetgate-core1"
    chmod +x "$work/fleetgate-core1"
    rm -f "$out"/cache-*.json
    for scale in $cache_scales; do
      informers=$cache_informers; [ "$scale" = 1 ] || informers=0
      args=()
      chart_name=- measure "cache-${scale}x" cache --cache-members "$cache_members" \
        --cache-pods $((cache_pods * scale)) --informers "$informers" \
        --storm-objects "$cache_storm_objects" --gateway-bin "$work/fleetgate-core1" \
        --work-dir "$work/cache-${scale}x"
      # The fleet's files and logs go with the run (a million pods' worth is not kept).
      [ -n "${KEEP_WORK:-}" ] || rm -rf "$work/cache-${scale}x"
    done
    chart_name=
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
