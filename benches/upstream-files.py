#!/usr/bin/env python3
"""Writes the static upstream's files for the benchmarks: small.json (one ConfigMap of about
1 KiB) and big.json (a ConfigMapList of COUNT copies of it), compact JSON, into DIR.

    benches/upstream-files.py DIR COUNT [--bare]

--bare leaves out the uid and creationTimestamp (profile.sh's smaller upstream).
Called by benches/all.sh, benches/run.sh and benches/profile.sh.
"""
import json
import sys

d, count = sys.argv[1], int(sys.argv[2])
bare = "--bare" in sys.argv[3:]
meta = {"name": "bench", "namespace": "default"}
if not bare:
    meta["uid"] = "6d0c1d0e-3a8e-4c7b-9d55-0a5f8f5b7c11"
meta["resourceVersion"] = "1000"
if not bare:
    meta["creationTimestamp"] = "2026-11-22T10:00:00Z"
cm = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta, "data": {"k": "v" * 780}}
open(f"{d}/small.json", "w").write(json.dumps(cm, separators=(",", ":")) + "\n")
items = [dict(cm, metadata=dict(cm["metadata"], name=f"bench-{i}")) for i in range(count)]
open(f"{d}/big.json", "w").write(json.dumps({"kind": "ConfigMapList", "apiVersion": "v1",
     "metadata": {"resourceVersion": "1000"}, "items": items}, separators=(",", ":")) + "\n")
