"""Child process for clustering tests: a writer loop or a clustering loop, until a deadline.

usage: python -m tests.metatable.clustering_child ROOT ROLE JOURNAL SEED DEADLINE OPTIONS_JSON
ROLE "write": upsert random batches into partition p<SEED>, journaling {"instant", "rows"} per commit and
{"rejected": message, "clustering": instant} per ClusteringConflict; any other failure ends the process
with a traceback (exit 1). ROLE "cluster": cluster repeatedly, journaling {"clustered": instant}; a
clustering that loses to writes (a conflict, or rolled back by a writer) is journaled as {"lost": message}.
ROLE "read": read snapshots, journaling {"ok": ...} per read: no key twice and no partition smaller than in
the previous read (writers only upsert).
"""
from __future__ import annotations

import json
import random
import sys
import time

import pyarrow as pa

import metatable as mt
from metatable.errors import ClusteringConflict, ConflictError, TimelineError

from .table_model import SCHEMA

KEYS = 300
BATCH = 30


def write(table: mt.Table, out, seed: int, deadline: float) -> None:
    rng = random.Random(seed)
    step = 0
    while time.time() < deadline:
        ids = rng.sample(range(KEYS), BATCH)
        rows = [{"id": i, "p": f"p{seed}", "v": f"w{seed}-{step}", "ts": rng.randint(0, 3)} for i in ids]
        try:
            result = table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
            out.write(json.dumps({"instant": result.instant, "rows": rows}) + "\n")
        except ClusteringConflict as e:
            out.write(json.dumps({"rejected": str(e), "clustering": e.clustering}) + "\n")
        out.flush()
        step += 1
        time.sleep(0.1)


def cluster(table: mt.Table, out, deadline: float) -> None:
    while time.time() < deadline:
        try:
            done = table.cluster()
            out.write(json.dumps({"clustered": done}) + "\n")
        except (ConflictError, TimelineError) as e:
            out.write(json.dumps({"lost": str(e)}) + "\n")
        out.flush()
        time.sleep(0.3)


def read(table: mt.Table, out, deadline: float) -> None:
    sizes: dict[str, int] = {}
    while time.time() < deadline:
        rows = table.to_arrow().select(["p", "id"]).to_pylist()
        keys = [(r["p"], r["id"]) for r in rows]
        now: dict[str, int] = {}
        for p, _ in keys:
            now[p] = now.get(p, 0) + 1
        ok = len(keys) == len(set(keys)) and all(now.get(p, 0) >= n for p, n in sizes.items())
        out.write(json.dumps({"ok": ok, "rows": len(keys), "sizes": now, "before": sizes}) + "\n")
        out.flush()
        sizes = now
        time.sleep(0.2)


def main() -> None:
    root, role, journal, seed, deadline, options = sys.argv[1:7]
    table = mt.Table.open(root, options=json.loads(options))
    with open(journal, "a") as out:
        if role == "write":
            write(table, out, int(seed), float(deadline))
        elif role == "read":
            read(table, out, float(deadline))
        else:
            cluster(table, out, float(deadline))


if __name__ == "__main__":
    main()
