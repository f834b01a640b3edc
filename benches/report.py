#!/usr/bin/env python3
"""Turns the JSON of one benches/all.sh run into markdown tables with every goal of issues 4-7 as
a ratio from that run, and writes them into docs/benchmarks.md between the markers
`<!-- all.sh:begin -->` and `<!-- all.sh:end -->` (appended when the markers are missing; the
rest of the file is kept as it is).

    report.py OUT_DIR BENCHMARKS_MD COMMIT LOADAVG DURATION WATCHES EVENT_WATCHES CHURN EXEC_STREAMS \
        [FLEET_MEMBERS FLEET_PODS FLEET_LIMIT]
"""
import glob
import datetime
import json
import os
import platform
import re
import subprocess
import sys

BEGIN, END = "<!-- all.sh:begin -->", "<!-- all.sh:end -->"


def load(out, name):
    path = os.path.join(out, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return {r["target"]: r for r in json.load(f)}


def fmt(v, d=1):
    return "-" if v is None else f"{v:,.{d}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def verdict(value, limit, at_most=True):
    if value is None:
        return "not measured"
    ok = value <= limit if at_most else value >= limit
    return "**met**" if ok else "**missed**"


def table(rows, columns):
    head = "| target | " + " | ".join(c for c, _ in columns) + " |"
    sep = "|---|" + "---|" * len(columns)
    lines = [head, sep]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f(r) for _, f in columns) + " |")
    return "\n".join(lines)


def best_peer(rows, key, peers):
    vals = [(p, rows[p].get(key)) for p in peers if p in rows and rows[p].get(key) is not None]
    return min(vals, key=lambda pv: pv[1]) if vals else (None, None)


def latency_goals(goals, fg, best_p99, source):
    """The two watch-event latency goals from fleetgate's added (p50, p99) and the best peer's
    added p99, in microseconds."""
    goals.append(("12", f"added watch-event latency <= 50 us at p50 ({source})", f"{fmt(fg and fg[0], 0)} us", verdict(fg and fg[0], 50)))
    if best_p99 is not None and best_p99 <= 0:
        goals.append(("12", f"added p99 <= half the best peer's ({source})", f"fleetgate {fmt(fg and fg[1], 0)} us, best peer {fmt(best_p99, 0)} us (no added latency to halve)", "not decidable"))
    else:
        goals.append(("12", f"added p99 <= half the best peer's ({source})", f"{fmt(ratio(fg and fg[1], best_p99), 2)}x", verdict(ratio(fg and fg[1], best_p99), 0.5)))


def fleet_list(out, s, goals, members, pods, limit):
    """fleet-list (issue 13 item 8): every fleet-list-SCALEx[-paged].json of the run, one table."""
    runs = []
    for path in glob.glob(os.path.join(out, "fleet-list-*x*.json")):
        m = re.fullmatch(r"fleet-list-(\d+)x(-paged)?\.json", os.path.basename(path))
        if m:
            runs.append((int(m.group(1)), bool(m.group(2)), load(out, os.path.basename(path)[:-5])))
    if not runs:
        return
    runs.sort(key=lambda r: (r[0], r[1]))
    s += ["", f"### fleet-list ({members} members x {pods} pods each, and at each multiple; one LIST of every pod through `/fleet`, unpaged and paged with `limit={limit}`, against the same lists asked of each member direct, one after the other)", "",
          "fleetgate as users run it (the simulated fleet's gateway.yaml: TLS, authentication, AccessPolicy, impersonation at every member; `spec.fleet` defaults: pages of 500 asked of members, 16 members at once), one worker, alone on core 1; the simulated fleet and the driver on core 0. "
          "TTFB: first request to its response head; total: to the end of the last page (medians over the lists of the run). CPU per object: the gateway's (`/proc/PID/stat`), the simulated fleet's (all members, one process) and the driver's. "
          "Peak RSS: the gateway's resident memory sampled every 10 ms during the lists, and its VmHWM (highest since it started).", "",
          " ".join(f"![fleet-list-{sc}x{'-paged' if pg else ''}](charts/fleet-list-{sc}x{'-paged' if pg else ''}.svg)" for sc, pg, _ in runs), "",
          "| pods | list | target | objects | MB | pages | TTFB ms | total ms | gateway CPU us/obj | members CPU us/obj | driver CPU us/obj | RSS peak MiB | VmHWM MiB |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    mib = lambda k: fmt(k and k / 1024)
    worst = None
    for scale, paged, rows in runs:
        direct = rows.get("direct-members", {})
        for name, x in rows.items():
            s.append(f"| {members} x {pods * scale:,} | {'limit ' + str(x.get('limit')) if paged else 'unpaged'} | {name} | {fmt(x.get('objects'), 0)} | "
                     f"{fmt(x.get('bytes', 0) / 1e6, 0)} | {fmt(x.get('pages'), 0)} | {fmt(x.get('ttfb_ms'))} | {fmt(x.get('total_ms'), 0)} | "
                     f"{fmt(x.get('cpu_us_per_object'), 2)} | {fmt(x.get('upstream_cpu_us_per_object'), 2)} | {fmt(x.get('driver_cpu_us_per_object'), 2)} | "
                     f"{mib(x.get('rss_peak_kib'))} | {mib(x.get('rss_hwm_kib'))} |")
        fg = rows.get("fleetgate-fleet", {})
        if fg.get("rss_hwm_kib") is not None and (worst is None or fg["rss_hwm_kib"] > worst[0]):
            worst = (fg["rss_hwm_kib"], scale)
        r = ratio(fg.get("cpu_us_per_object"), direct.get("upstream_cpu_us_per_object"))
        goals.append(("13", f"fleet-list {members} x {pods * scale:,} pods, {'paged' if paged else 'unpaged'}: gateway CPU per object against the members' for the same lists direct", f"{fmt(r, 2)}x", "informational"))
    objects = max(rows.get("fleetgate-fleet", {}).get("objects") or 0 for _, _, rows in runs)
    goals.append(("13", "fleet-list: gateway peak RSS under 64 MiB whatever the object count",
                  f"{fmt(worst[0] / 1024)} MiB VmHWM at its highest ({members} x {pods * worst[1]:,} pods), lists of up to {objects:,} objects" if worst else "-",
                  verdict(worst and worst[0] / 1024, 64)))


def cache_rows(runs, part):
    """(name, row, its cache report) of every row of `part` (list, memory, storm) in `runs`."""
    for _, rows in runs:
        for name, x in rows.items():
            c = x.get("cache") or {}
            if c.get("part") == part:
                yield name, x, c


def cache(out, s, goals):
    """cache (issue 34): every cache-SCALEx.json of the run: the lists, the memory, the storm."""
    runs = []
    for path in glob.glob(os.path.join(out, "cache-*x.json")):
        m = re.fullmatch(r"cache-(\d+)x\.json", os.path.basename(path))
        if m:
            runs.append((int(m.group(1)), load(out, os.path.basename(path)[:-5])))
    if not runs:
        return
    runs.sort(key=lambda r: r[0])
    mib = lambda k: fmt(k and k / 1024)
    s += ["", "### cache (issue 34: LISTs from the gateway's memory, against the same load with the cache off, in one run)", "",
          "The driver starts a simulated fleet (a child process on core 0, beside the driver) and, one after the other, a gateway without and with `spec.cache` for pods and configmaps "
          "(one worker, core 1; the fleet's own gateway.yaml: TLS, authentication, AccessPolicy, impersonation). Lists: every pod through `/fleet` at `resourceVersion=0` (`rv0`) and consistent "
          "(no resourceVersion), medians over the run; `direct` lists each member one after the other. CPU per object: the gateway's, the members' (the fleet's process), the driver's.", "",
          "| objects | target | objects listed | TTFB ms | total ms | gateway CPU us/obj | members CPU us/obj | driver CPU us/obj |",
          "|---|---|---|---|---|---|---|---|"]
    for name, x, _ in cache_rows(runs, "list"):
        s.append(f"| {fmt(x.get('objects'), 0)} | {name} | {fmt(x.get('objects'), 0)} | {fmt(x.get('ttfb_ms'))} | {fmt(x.get('total_ms'), 0)} | "
                 f"{fmt(x.get('cpu_us_per_object'), 2)} | {fmt(x.get('upstream_cpu_us_per_object'), 2)} | {fmt(x.get('driver_cpu_us_per_object'), 2)} |")
    s += ["", "Memory: the gateway's RSS after it opened its member connections, again after an idle second (the floor: what an idle gateway's RSS moves by itself), "
          "then after a LIST of each member's pods through `/clusters/NAME` (`resourceVersion=0`, nothing selected: with the cache on, every pod is listed into the cache). "
          "JSON: the members' own list bytes per object. Off: the same requests without the cache (what they cost besides it).", "",
          "| objects | gateway | JSON bytes/obj | RSS idle MiB | RSS filled MiB | fill s | bytes/obj | x JSON | floor bytes/obj |",
          "|---|---|---|---|---|---|---|---|---|"]
    for name, _, c in cache_rows(runs, "memory"):
        m = c["memory"]
        s.append(f"| {fmt(m['objects'], 0)} | {name} | {fmt(m['json_bytes_per_object'], 0)} | {mib(m['rss_idle_kib'])} | {mib(m['rss_filled_kib'])} | "
                 f"{fmt(m['fill_s'])} | {fmt(m['bytes_per_object'], 0)} | {fmt(m['ratio_to_json'], 2)} | {fmt(m['idle_bytes_per_object'], 1)} |")
    for _, rows in runs:
        on = (rows.get("cache-on-memory", {}).get("cache") or {}).get("memory")
        if on:
            goals.append(("34", f"memory per cached object <= 1.3x its JSON ({on['objects']:,} objects)", f"{fmt(on['ratio_to_json'], 2)}x ({fmt(on['bytes_per_object'], 0)} of {fmt(on['json_bytes_per_object'], 0)} bytes)", verdict(on["ratio_to_json"], 1.3)))
        direct = {r: rows.get(f"direct-{r}", {}).get("upstream_cpu_us_per_object") for r in ("rv0", "consistent")}
        for r in ("rv0", "consistent"):
            x = rows.get(f"cache-on-{r}", {})
            if x.get("total_ms") is None:
                continue
            goals.append(("34", f"fleet LIST of {fmt(x.get('objects'), 0)} pods from the cache ({r}) in under 1 s", f"{fmt(x['total_ms'], 0)} ms", verdict(x["total_ms"], 1000)))
            rr = ratio(x.get("cpu_us_per_object"), direct[r])
            goals.append(("34", f"fleet LIST from the cache ({r}): gateway CPU per object <= 0.2x the members' for the same lists direct", f"{fmt(rr, 2)}x", verdict(rr, 0.2)))
    storms = list(cache_rows(runs, "storm"))
    if storms:
        s += ["", "Relist storm: informers (LIST, WATCH, LIST again after a 410) round robin over every member's configmaps of one namespace through a front that keeps the gateway's address; once they all watch, the gateway is killed, "
              "the members written to past their history, and a new gateway started: every informer gets a 410 and lists again. From the new gateway's start until every informer watches again past the last write: "
              "the members' LISTs (`limit=1`: the cache's questions for the member's current resourceVersion), their CPU, the new gateway's CPU and peak RSS (VmHWM).", "",
              "| gateway | informers | keys | start LISTs (limit=1) | storm LISTs | of which limit=1 | others per key | relists | seconds | members CPU ms | gateway CPU ms | gateway peak RSS MiB | stalled |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, _, c in storms:
            t = c["storm"]
            s.append(f"| {name} | {t['informers']} | {t['keys']} | {t['start_lists']} ({t['start_short_lists']}) | {t['lists']} | {t['short_lists']} | {fmt(t['full_lists_per_key'], 2)} | "
                     f"{t['relists']} | {fmt(t['storm_s'])} | {fmt(t['member_cpu_ms'], 0)} | {fmt(t['gateway_cpu_ms'], 0)} | {mib(t['gateway_hwm_kib'])} | {t['stalled']} |")
            if name == "cache-on-storm":
                goals.append(("34", f"relist storm of {t['informers']} informers: at most one LIST per key at the members", f"{fmt(t['full_lists_per_key'], 2)} full LISTs per key, besides {t['short_lists']} limit=1 questions", verdict(t["full_lists_per_key"], 1)))


TUNNEL_PARTS = [
    # part, throughput (label, key or function), cost (label, key)
    ("small-get", ("req/s", lambda x: x.get("req_per_sec")), ("CPU us/req", "cpu_us_per_request")),
    ("big-list", ("MB/s", lambda x: x.get("mb_per_sec")), ("CPU ms/MB", "cpu_ms_per_mb")),
    ("watch-events", ("events/s", lambda x: x.get("events") and x["events"] / x["seconds"]), ("CPU us/event", "cpu_us_per_event")),
    ("exec-stream", ("MB/s", lambda x: x.get("mb_per_sec")), ("CPU ms/MB", "cpu_ms_per_mb")),
]


def bracketed(d1, d2):
    """The mean of a figure (`f` of a measurement) over the two direct measurements that bracket
    the others of a round; None when either lacks it."""
    return lambda f: None if f(d1) is None or f(d2) is None else (f(d1) + f(d2)) / 2


def cpu_split(x, cost):
    """` (A + B)`: a two-process target's `cost` split by its processes' CPU shares, or ""."""
    share = x.get("cpu_share")
    if not share or x.get(cost) is None:
        return ""
    return f" ({fmt(share[0] * x[cost], 2)} + {fmt(share[1] * x[cost], 2)})"


def tunnel_mode(out, s, goals, mode, rounds, loads, event_watches, churn, exec_streams):
    """One member mode of the tunnel scenario: every round of tunnel-MODE-PART-rN.json."""
    agent_core = next((l.get("agent_core") for l in loads.values() if l.get("agent_core")), "?")
    legs = "plain HTTP" if mode == "plain" else "TLS (the agent and the gateway verify the upstream's CA)"
    s += ["", f"### tunnel, upstreams over {legs} (issue 14: small-get, big-list, watch-events, exec-stream and idle watches through a pull-mode tunnel against the same upstream direct; {len(rounds)} round(s))", "",
          "One fleetgate (one worker, core 1) serves each upstream as a Direct cluster and as a Tunnel cluster whose "
          f"`fleetgate agent` (core {agent_core}) dials the gateway's tunnel listener. Each figure is measured direct "
          "(`fg-direct`), through the tunnel (`fg-tunnel`), through one more proxy hop when the run has it (`fg-hop`, below), "
          "and direct again (`fg-direct-2`). Ratio: tunnel over the mean "
          "of the two direct figures; floor: the second direct over the first (how far the same path moves by itself). "
          "The tunnel's CPU is the gateway's plus the agent's (`/proc/PID/stat`), split in brackets. "
          "Other load: cores busy with work other than this benchmark's processes during the round (the machine is shared).", "",
          " ".join(f"![tunnel-{mode}-{p}](charts/tunnel-{mode}-{p}.svg)" for p, _, _ in TUNNEL_PARTS), "",
          "| round | start | other load (cores) | scenario | throughput direct | tunnel | direct 2 | ratio | floor | cost direct | tunnel (gateway + agent) | direct 2 | ratio | floor |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    worst_tp, worst_cpu = {}, {}
    for n in rounds:
        l = loads[n]
        for part, (tp_label, tp), (cost_label, cost) in TUNNEL_PARTS:
            r = load(out, f"tunnel-{mode}-{part}-r{n}")
            if not r:
                continue
            d1, t, d2 = (r.get(k, {}) for k in ("fg-direct", "fg-tunnel", "fg-direct-2"))
            mean = bracketed(d1, d2)
            tpr, cr = ratio(tp(t), mean(tp)), ratio(t.get(cost), mean(lambda x: x.get(cost)))
            split = cpu_split(t, cost)
            s.append(f"| {n} | {l.get('start', '-')} | {fmt(l.get('other_cores'), 2)} | {part} | "
                     f"{fmt(tp(d1))} {tp_label} | {fmt(tp(t))} | {fmt(tp(d2))} | **{fmt(tpr, 2)}x** | {fmt(ratio(tp(d2), tp(d1)), 2)}x | "
                     f"{fmt(d1.get(cost), 2)} {cost_label} | {fmt(t.get(cost), 2)}{split} | {fmt(d2.get(cost), 2)} | **{fmt(cr, 2)}x** | {fmt(ratio(d2.get(cost), d1.get(cost)), 2)}x |")
            if tpr is not None:
                worst_tp[part] = min(worst_tp.get(part, tpr), tpr)
            if cr is not None:
                worst_cpu[part] = max(worst_cpu.get(part, cr), cr)
    tunnel_hop(out, s, mode, rounds)
    s += ["", f"watch-events: {event_watches} watches, the member changes {churn} objects/s (its event rate sets the "
          f"throughput; the latency shows the tunnel's cost). exec-stream: {exec_streams} WebSocket exec sessions of `cat`.", "",
          "| round | target | watch-events p50 us | p99 us | errors (all scenarios) |", "|---|---|---|---|---|"]
    for n in rounds:
        r = load(out, f"tunnel-{mode}-watch-events-r{n}") or {}
        for name, x in r.items():
            errs = sum((load(out, f"tunnel-{mode}-{p}-r{n}") or {}).get(name, {}).get("errors", 0) for p, _, _ in TUNNEL_PARTS)
            s.append(f"| {n} | {name} | {fmt(x.get('p50_us'), 0)} | {fmt(x.get('p99_us'), 0)} | {errs} |")
    s += ["", "Idle watches (on a quiet collection, held for the run's duration): resident memory per watch, "
          "the tunnel's split gateway + agent.", "",
          "| round | watches | direct KiB/watch | tunnel KiB/watch (gateway + agent) | direct 2 KiB/watch | tunnel CPU at rest % |",
          "|---|---|---|---|---|---|"]
    idle = []
    for n in rounds:
        r = load(out, f"tunnel-{mode}-watch-idle-r{n}")
        if not r:
            continue
        d1, t, d2 = (r.get(k, {}) for k in ("fg-direct", "fg-tunnel", "fg-direct-2"))
        each = t.get("kib_per_watch_each")
        each = f" ({fmt(each[0], 2)} + {fmt(each[1], 2)})" if each else ""
        s.append(f"| {n} | {t.get('watches', '-')} | {fmt(d1.get('kib_per_watch'), 2)} | {fmt(t.get('kib_per_watch'), 2)}{each} | "
                 f"{fmt(d2.get('kib_per_watch'), 2)} | {fmt(t.get('idle_cpu_percent'), 2)} |")
        if t.get("kib_per_watch") is not None:
            idle.append(t["kib_per_watch"])
    for part, worst in worst_tp.items():
        goals.append(("14", f"{part} through the tunnel, upstream over {mode}: throughput >= 0.8x direct (lowest of {len(rounds)} round(s))", f"{fmt(worst, 2)}x", verdict(worst, 0.8, at_most=False)))
    for part, worst in worst_cpu.items():
        goals.append(("14", f"{part} through the tunnel, upstream over {mode}: CPU (gateway + agent) <= 1.5x direct (highest of {len(rounds)} round(s))", f"{fmt(worst, 2)}x", verdict(worst, 1.5)))
    if idle:
        goals.append(("14", f"memory per idle tunnelled watch (gateway + agent), upstream over {mode}, reported", f"{fmt(min(idle), 2)}-{fmt(max(idle), 2)} KiB", "reported"))


def tunnel_hop(out, s, mode, rounds):
    """The tunnel's figures against the same upstream behind one more proxy hop of the tunnel's
    security (`fg-hop`: HAProxy, TLS from the gateway terminated, the upstream's own leg after it),
    when the run measured it: what any extra hop costs, the floor under the tunnel's ratio."""
    rows = []
    for n in rounds:
        for part, (tp_label, tp), (cost_label, cost) in TUNNEL_PARTS:
            r = load(out, f"tunnel-{mode}-{part}-r{n}") or {}
            if "fg-hop" not in r:
                continue
            d1, t, h, d2 = (r.get(k, {}) for k in ("fg-direct", "fg-tunnel", "fg-hop", "fg-direct-2"))
            mean = bracketed(d1, d2)
            split = cpu_split(h, cost)
            rows.append(f"| {n} | {part} | {fmt(tp(h))} {tp_label} | **{fmt(ratio(tp(h), mean(tp)), 2)}x** | {fmt(ratio(tp(t), tp(h)), 2)}x | "
                        f"{fmt(h.get(cost), 2)} {cost_label}{split} | **{fmt(ratio(h.get(cost), mean(lambda x: x.get(cost))), 2)}x** | "
                        f"**{fmt(ratio(t.get(cost), h.get(cost)), 2)}x** |")
    if not rows:
        return
    s += ["", "The same upstream direct but behind one more proxy with the tunnel's security (`fg-hop`: HAProxy, one "
          "thread, mode tcp, on the agent's core; the gateway's TLS ends there and the upstream's own leg starts, as at "
          "the agent): what one extra hop costs on this machine, the floor under the tunnel's ratios. Its CPU is the "
          "gateway's plus HAProxy's, split in brackets; ratios against the mean of the two direct figures, and the "
          "tunnel's against the hop's.", "",
          "| round | scenario | throughput hop | hop / direct | tunnel / hop | cost hop (gateway + HAProxy) | hop / direct | tunnel / hop |",
          "|---|---|---|---|---|---|---|---|"] + rows


def tunnel(out, s, goals, event_watches, churn, exec_streams):
    """tunnel (issue 14 item 7): every round of tunnel-MODE-PART-rN.json, per member mode (plain,
    tls), the tunnel's figures against the mean of the two direct measurements that bracket it,
    and the second direct against the first (the method's floor)."""
    found = {}
    for p in glob.glob(os.path.join(out, "tunnel-*-r*.json")):
        m = re.fullmatch(r"tunnel-([a-z]+)-.*-r(\d+)\.json", os.path.basename(p))
        if m:
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    loads = {}
    for n in set().union(*found.values()) if found else ():
        path = os.path.join(out, f"tunnel-r{n}.load")
        loads[n] = json.load(open(path)) if os.path.exists(path) else {}
    for mode in [m for m in ("plain", "tls") if m in found] + sorted(set(found) - {"plain", "tls"}):
        tunnel_mode(out, s, goals, mode, sorted(found[mode]), loads, event_watches, churn, exec_streams)


def watch_fanout(out, s, goals):
    """watch-fanout (issue 15 item 7): client watches on 10 resources across 2 members, with
    churn, direct, through HAProxy and through fleetgate without and with sharedWatches, per
    shard count (targets named fleetgate-(un)shared-wN), and shared per gateway beyond one shard
    (fleetgate-gateway-wN)."""
    r = load(out, "watch-fanout")
    if not r:
        return
    shards = lambda name: int(name.rsplit("-w", 1)[1]) if re.search(r"-w\d+$", name) else None
    on_members = lambda x: " + ".join(str(v) for v in (x.get("member_watches") or {}).values()) or "-"
    anyx = next(iter(r.values()))
    per_sec = lambda x: x["events"] / x["seconds"] if x.get("events") and x.get("seconds") else None
    layout = (f"{anyx['streams']} watches per h2 connection, each of another resource of one member, as a controller's informers share its connection"
              if anyx.get("streams") else "each watch its own HTTP/1.1 connection")
    s += ["", f"### watch-fanout ({anyx.get('watches')} client watches, cluster-wide, spread evenly over 10 resources on 2 simulated members, with churn; {layout}; issue 15)", "",
          "Each target alone and fresh, TLS on both legs (client certificates verified, the members over TLS); HAProxy and fleetgate on core 1, "
          "the members and the driver on core 0 (fleetgate with 2 shards has both on core 1). The driver writes to the members direct "
          f"(about {fmt(anyx.get('requests', 0) / max(anyx.get('seconds') or 1, 1e-9), 0)} writes/s in all, each stamped with its send time: merge patches, every fourth a create) "
          "and closes and reopens client watches from their last resourceVersion. Member watches: each member's `fleetgate_sim_open_watches` summed over the 10 resources, "
          "near the end of the measured phase. Latency: write to delivery, events written after the stream opened. Memory: the proxy's RSS growth "
          "from before the watches opened to after they and the warm-up, per client watch. CPU: the proxy's (`/proc/PID/stat`) over the measured phase, per stamped event delivered.", "",
          table(r, [("shards", lambda x: str(shards(x["target"]) or "-")),
                    ("member watches", on_members),
                    ("events", lambda x: fmt(x.get("events"), 0)),
                    ("events/s", lambda x: fmt(per_sec(x), 0)),
                    ("CPU us/event", lambda x: fmt(x.get("cpu_us_per_event"), 2)),
                    ("p50 us", lambda x: fmt(x.get("p50_us"), 0)),
                    ("p99 us", lambda x: fmt(x.get("p99_us"), 0)),
                    ("KiB/client watch", lambda x: fmt(x.get("kib_per_watch"), 2)),
                    ("reopens", lambda x: fmt(x.get("reopens"), 0)),
                    ("errors", lambda x: str(x.get("errors")))])]
    floor_path = os.path.join(out, "watch-fanout-floor.json")
    floor = json.load(open(floor_path)) if os.path.exists(floor_path) else {}
    floor_us = floor.get("sys_us_per_send")
    if floor_us is not None:
        s += ["", f"Floor (benches/send-floor.py): one send() of {floor['bytes']} bytes to each of {floor['connections']:,} loopback connections, "
              f"their reader waiting in epoll on the other core, costs the sender {fmt(floor_us, 2)} us in the kernel "
              "(on loopback the receiving side's TCP work and wake-up are charged to the sender). "
              "A proxy makes at least one such send per delivered event, plus its TLS record."]
    ha = r.get("haproxy", {})
    direct_p99 = r.get("direct", {}).get("p99_us")
    for name, x in r.items():
        n = shards(name)
        if n is None or not name.startswith(("fleetgate-shared", "fleetgate-gateway")):
            continue
        most = max((x.get("member_watches") or {}).values(), default=None)
        if name.startswith("fleetgate-gateway"):
            label = f"{n} shards, shared per gateway"
            goals.append(("15", f"watch-fanout, {label}: watches on each member <= 10 (one per key)", f"{most} at most ({on_members(x)})", verdict(most, 10)))
        else:
            label = f"{n} shard(s)"
            goals.append(("15", f"watch-fanout, {label}: watches on each member <= 10 x shards ({10 * n})", f"{most} at most ({on_members(x)})", verdict(most, 10 * n)))
        cr = ratio(x.get("cpu_us_per_event"), ha.get("cpu_us_per_event"))
        floor_note = "" if floor_us is None or not ha.get("cpu_us_per_event") else \
            f"; the kernel's floor of one send per event is {fmt(floor_us, 2)} us = {fmt(floor_us / ha['cpu_us_per_event'], 2)}x HAProxy's"
        goals.append(("15", f"watch-fanout, {label}: CPU per delivered event <= 0.25x HAProxy's", f"{fmt(cr, 2)}x ({fmt(x.get('cpu_us_per_event'), 2)} vs {fmt(ha.get('cpu_us_per_event'), 2)} us{floor_note})", verdict(cr, 0.25)))
        mr = ratio(x.get("kib_per_watch"), ha.get("kib_per_watch"))
        goals.append(("15", f"watch-fanout, {label}: memory per client watch <= 0.5x HAProxy's", f"{fmt(mr, 2)}x ({fmt(x.get('kib_per_watch'), 2)} vs {fmt(ha.get('kib_per_watch'), 2)} KiB)", verdict(mr, 0.5)))
        added = lambda y: None if y.get("p99_us") is None or direct_p99 is None else y["p99_us"] - direct_p99
        p99_ok = None if x.get("p99_us") is None or ha.get("p99_us") is None else x["p99_us"] - ha["p99_us"]
        goals.append(("15", f"watch-fanout, {label}: added p99 <= HAProxy's (write to delivery, the members direct as the floor)",
                      f"{fmt(x.get('p99_us'), 0)} vs {fmt(ha.get('p99_us'), 0)} us (added over direct: {fmt(added(x), 0)} vs {fmt(added(ha), 0)} us)", verdict(p99_ok, 0)))


def request_section(s, r, name, what):
    """The section of one request scenario (small-get, small-get-h2): req/s, CPU per request,
    p50, p99 and errors per target."""
    s += ["", f"### {name} ({what})", "",
          f"![{name}](charts/{name}.svg)", "",
          table(r, [("req/s", lambda x: fmt(x["req_per_sec"], 0)),
                    ("CPU us/req", lambda x: fmt(x["cpu_us_per_request"])),
                    ("p50 us", lambda x: fmt(x["p50_us"], 0)), ("p99 us", lambda x: fmt(x["p99_us"], 0)),
                    ("errors", lambda x: str(x["errors"]))])]


def stream_mb(out, s, goals, name, what, notes, goal):
    """The section of one streaming scenario (exec-stream, portforward-stream): MB/s, CPU per MB
    and errors per target, and goal 4 (fleetgate's MB/s at least 0.9x direct's)."""
    r = load(out, name)
    if not r:
        return
    s += ["", f"### {name} ({what})", "", *notes,
          f"![{name}](charts/{name}.svg)", "",
          table(r, [("MB/s", lambda x: fmt(x["mb_per_sec"])),
                    ("CPU ms/MB", lambda x: fmt(x["cpu_ms_per_mb"], 2)),
                    ("errors", lambda x: str(x["errors"]))])]
    fg = r.get("fleetgate-sim", {}).get("mb_per_sec")
    direct = r.get("direct-sim", {}).get("mb_per_sec")
    goals.append(("4", goal, f"{fmt(ratio(fg, direct), 2)}x", verdict(ratio(fg, direct), 0.9, at_most=False)))


def main():
    out, md, commit, loadavg, duration, watches, event_watches, churn, exec_streams = sys.argv[1:10]
    fleet_members, fleet_pods, fleet_limit = (sys.argv[10:13] + ["100", "1000", "500"][len(sys.argv[10:13]):])
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    s = [BEGIN, "", f"## Every scenario in one run ({now})", ""]
    s.append(
        f"Generated by `benches/all.sh` at commit {commit} on {os.cpu_count()} cores ({cpu}), "
        f"{mem:.0f} GiB, kernel {platform.release()}, {rustc}. Load average at the end: {loadavg} "
        f"(the machine is shared with other builds; absolute figures move, the ratios are what to "
        f"read). Each target is measured for {duration} after a warm-up, one after the other; every "
        f"proxy alone on core 1 with one worker, the driver and the upstreams on core 0."
    )
    goals = []

    r = load(out, "small-get")
    if r:
        request_section(s, r, "small-get", "HTTP/1.1, 50 keep-alive connections, ~1 KiB ConfigMap from a static nginx")
        fg = r.get("fleetgate", {}).get("cpu_us_per_request")
        peer, best = best_peer(r, "cpu_us_per_request", ["haproxy", "nginx", "goproxy"])
        floor = r.get("floor", {}).get("cpu_us_per_request")
        goals.append(("7", "CPU per small GET <= 0.9x the best peer's", f"{fmt(ratio(fg, best), 2)}x {peer}", verdict(ratio(fg, best), 0.9)))
        goals.append(("7", "CPU per small GET <= 1.05x the floor's", f"{fmt(ratio(fg, floor), 2)}x", verdict(ratio(fg, floor), 1.05)))

    r = load(out, "small-get-h2")
    if r:
        request_section(s, r, "small-get-h2", "TLS + h2 to the proxy, 10 connections x 10 streams; HTTP/1.1 to the static nginx")
        fg = r.get("fleetgate", {}).get("cpu_us_per_request")
        ha = r.get("haproxy-tls", {}).get("cpu_us_per_request")
        goals.append(("4, 7", "CPU per request over TLS + h2 <= 0.7x HAProxy's", f"{fmt(ratio(fg, ha), 2)}x", verdict(ratio(fg, ha), 0.7)))

    r = load(out, "big-list")
    if r:
        s += ["", "### big-list (one connection reading a ~90 MB LIST from the static nginx, again and again)", "",
              "![big-list](charts/big-list.svg)", "",
              table(r, [("MB/s", lambda x: fmt(x["mb_per_sec"])),
                        ("CPU ms/MB", lambda x: fmt(x["cpu_ms_per_mb"], 2)),
                        ("peak RSS MiB", lambda x: fmt(x["rss_peak_kib"] and x["rss_peak_kib"] / 1024)),
                        ("lists", lambda x: str(x["requests"]))])]
        fg = r.get("fleetgate", {})
        peer, best = best_peer(r, "cpu_ms_per_mb", ["haproxy", "nginx", "goproxy"])
        goals.append(("7", "big-list CPU per MB <= 0.5x the best peer's", f"{fmt(ratio(fg.get('cpu_ms_per_mb'), best), 2)}x {peer}", verdict(ratio(fg.get("cpu_ms_per_mb"), best), 0.5)))
        direct = r.get("direct", {}).get("mb_per_sec")
        goals.append(("7", "big-list MB/s >= 0.9x direct", f"{fmt(ratio(fg.get('mb_per_sec'), direct), 2)}x", verdict(ratio(fg.get("mb_per_sec"), direct), 0.9, at_most=False)))

    idle = [("watch-idle", f"{watches} idle watches through each target; upstream: the simulated member, plain HTTP",
             "fleetgate-sim", "haproxy-sim", ("7", "memory per open watch <= 0.5x HAProxy's")),
            ("watch-idle-tls", f"{watches} idle watches, TLS on both legs: client certificates verified, the member over TLS with the proxy's own token; fleetgate with authentication, AccessPolicy and impersonation",
             "fleetgate-sim-tls", "haproxy-sim-tls", ("12", "memory per open watch, TLS on both legs, <= 0.5x HAProxy's"))]
    for name, title, ours, theirs, (issue, goal) in idle:
        r = load(out, name)
        if not r:
            continue
        s += ["", f"### {name} ({title})", "", f"![{name}](charts/{name}.svg)", "",
              table(r, [("watches", lambda x: str(x["watches"])),
                        ("KiB per watch", lambda x: fmt(x["kib_per_watch"], 2)),
                        ("RSS before MiB", lambda x: fmt(x["rss_base_kib"] and x["rss_base_kib"] / 1024)),
                        ("RSS held MiB", lambda x: fmt(x["rss_peak_kib"] and x["rss_peak_kib"] / 1024)),
                        ("CPU at rest %", lambda x: fmt(x["idle_cpu_percent"], 2))])]
        fg = r.get(ours, {}).get("kib_per_watch")
        ha = r.get(theirs, {}).get("kib_per_watch")
        goals.append((issue, goal, f"{fmt(ratio(fg, ha), 2)}x", verdict(ratio(fg, ha), 0.5)))

    r = load(out, "watch-events")
    if r:
        s += ["", f"### watch-events ({event_watches} watches on all ConfigMaps; the member changes {churn} objects/s, each event stamped with its send time)", "",
              "![watch-events](charts/watch-events.svg)", "",
              table(r, [("events", lambda x: fmt(x["events"], 0)),
                        ("p50 us", lambda x: fmt(x["p50_us"], 0)), ("p99 us", lambda x: fmt(x["p99_us"], 0)),
                        ("CPU us/event", lambda x: fmt(x["cpu_us_per_event"], 2))])]
        d = r.get("direct-sim", {})
        added = {}
        for name, x in r.items():
            if name != "direct-sim" and x.get("p50_us") is not None and d.get("p50_us") is not None:
                added[name] = (x["p50_us"] - d["p50_us"], x["p99_us"] - d["p99_us"])
        if added:
            s += ["", "Added latency against direct: " + "; ".join(
                f"{n} p50 {fmt(a[0], 0)} us, p99 {fmt(a[1], 0)} us" for n, a in added.items()) + "."]
        latency = load(out, "watch-latency")
        if not latency:
            # No paired measurement in this run: the goals from the difference of distributions.
            fg = added.get("fleetgate-sim")
            peers = [added[p][1] for p in ("haproxy-sim", "nginx-sim", "goproxy-sim") if p in added]
            latency_goals(goals, fg, min(peers) if peers else None, "watch-events")

    r = load(out, "watch-latency")
    if r:
        pairs = next(iter(r.values())).get("watches")
        s += ["", f"### watch-latency ({pairs} pairs of watches on all ConfigMaps, one stream through the target and one direct, from the same resourceVersion; the member changes {churn} objects/s)", "",
              "Each event's arrival on the target's stream minus its arrival on the direct stream of its pair, in the same driver thread: the member's own fan-out drops out. The `direct-sim` row pairs two direct streams: the method's floor.", "",
              "![watch-latency](charts/watch-latency.svg)", "",
              table(r, [("events paired", lambda x: fmt(x["events"], 0)),
                        ("added p50 us", lambda x: fmt(x["p50_us"], 0)), ("added p99 us", lambda x: fmt(x["p99_us"], 0)),
                        ("unpaired", lambda x: fmt(x["errors"], 0)),
                        ("CPU us/event", lambda x: fmt(x["cpu_us_per_event"], 2))])]
        fg = r.get("fleetgate-sim", {})
        fg = fg.get("p50_us") is not None and (fg["p50_us"], fg["p99_us"]) or None
        peers = [r[p]["p99_us"] for p in ("haproxy-sim", "nginx-sim", "goproxy-sim") if r.get(p, {}).get("p99_us") is not None]
        latency_goals(goals, fg, min(peers) if peers else None, "watch-latency")

    stream_mb(out, s, goals, "exec-stream",
              f"{exec_streams} WebSocket exec sessions of `cat` on the simulated member, stdin pushed and stdout read back",
              ["MB/s counts the bytes echoed back; each crossed the proxy twice (once each way).", ""],
              "exec-stream MB/s >= 0.9x direct")
    stream_mb(out, s, goals, "portforward-stream",
              f"{exec_streams} WebSocket port-forwards to the simulated pod's echoing port", [],
              "port-forward MB/s >= 0.9x direct (the exec goal applied to port-forward)")

    r = load(out, "reload-storm")
    if r:
        s += ["", "### reload-storm (small-get on member1 while 100 Cluster-file changes a second land in the config directory)", "",
              table(r, [("requests", lambda x: fmt(x["requests"], 0)), ("failed", lambda x: str(x["errors"])),
                        ("p99 us quiet", lambda x: fmt(x["p99_no_storm_us"], 0)),
                        ("p99 us storm", lambda x: fmt(x["p99_us"], 0)),
                        ("CPU us/req quiet", lambda x: fmt(x["cpu_us_per_request_no_storm"])),
                        ("CPU us/req storm", lambda x: fmt(x["cpu_us_per_request"])),
                        ("changes written", lambda x: str(x["changes_written"])),
                        ("reloads applied", lambda x: str(x["reloads_applied"])),
                        ("reloads rejected", lambda x: str(x["reloads_failed"]))])]
        x = r.get("fleetgate", {})
        goals.append(("5", "reload-storm: zero failed requests", f"{x.get('errors')} failed of {x.get('requests')}", verdict(x.get("errors"), 0)))

    r = load(out, "auth-overhead")
    if r:
        s += ["", "### auth-overhead (the same small-get; authentication, AccessPolicy and impersonation off vs on)", "",
              table(r, [("req/s", lambda x: fmt(x["req_per_sec"], 0)),
                        ("CPU us/req", lambda x: fmt(x["cpu_us_per_request"])),
                        ("p99 us", lambda x: fmt(x["p99_us"], 0)), ("errors", lambda x: str(x["errors"]))])]
        on = r.get("fleetgate-auth-on", {}).get("cpu_us_per_request")
        off = r.get("fleetgate-auth-off", {}).get("cpu_us_per_request")
        rr = ratio(on, off)
        goals.append(("6", "auth + policy + impersonation overhead < 10%", f"{fmt(rr and (rr - 1) * 100, 1)}%", verdict(rr, 1.10)))

    reg = os.path.join(out, "registry.txt")
    if os.path.exists(reg):
        text = open(reg).read()
        s += ["", "### registry (issue 5: the config-watcher's examples `table_build` and `table-memory`)", "", "```"]
        s += [line.rstrip() for line in text.splitlines() if line.strip()]
        s += ["```"]
        m = re.search(r"build: (\d+) clusters in ([\d.]+) ms", text)
        if m:
            ms = float(m.group(2))
            goals.append(("5", f"building a table of {int(m.group(1)):,} clusters < 50 ms", f"{ms:.1f} ms ({ms / 50:.2f}x the limit)", verdict(ms, 50)))

    fleet_list(out, s, goals, int(fleet_members), int(fleet_pods), fleet_limit)
    tunnel(out, s, goals, event_watches, churn, exec_streams)
    watch_fanout(out, s, goals)
    cache(out, s, goals)

    s += ["", "### Goals, each a ratio from this run", "", "| issue | goal | this run | verdict |", "|---|---|---|---|"]
    s += [f"| {i} | {g} | {v} | {ok} |" for i, g, v, ok in goals]
    cmds = os.path.join(out, "commands.txt")
    if os.path.exists(cmds):
        s += ["", "Driver commands of this run (tokens elided):", "", "```"]
        s += [line.rstrip() for line in open(cmds) if line.strip()]
        s += ["```"]
    s += ["", END]
    block = "\n".join(s) + "\n"
    text = open(md).read() if os.path.exists(md) else "# Benchmarks\n"
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1].lstrip("\n")
        text = before + block + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    with open(md, "w") as f:
        f.write(text)
    print(block)


if __name__ == "__main__":
    main()
