"""Child process for storage fault tests, run inside its own mount namespace (`unshare -Urm`) over a small
tmpfs at ROOT: the file system fills up, or turns read-only, under a live table. Prints one JSON line per
step: {"step", "ok"} or {"step", "error": type name, "message"}.

usage: python -m tests.metatable.storage_child ROOT full|readonly
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pyarrow as pa

import metatable as mt
from metatable import cli

from .table_model import SCHEMA, TableModel, sort_rows

OPTIONS = {"heartbeat.interval_s": 0.1, "heartbeat.tolerable_misses": 3}


def report(step: str, action) -> object:
    try:
        result = action()
    except Exception as e:  # noqa: BLE001 - what the test looks at is which error, by name
        print(json.dumps({"step": step, "error": type(e).__name__, "message": str(e)}), flush=True)
        return None
    print(json.dumps({"step": step, "ok": True}), flush=True)
    return result


def batch(rng: random.Random, start: int, n: int, ts: int) -> list[dict]:
    return [{"id": i, "p": "ab"[i % 2], "v": rng.randbytes(40).hex(), "ts": ts} for i in range(start, start + n)]


def check(step: str, table_path: str, model: TableModel) -> None:
    got = sort_rows(mt.Table.open(table_path).to_arrow().to_pylist())
    print(json.dumps({"step": step, "ok": got == model.expected(), "rows": len(got)}), flush=True)


def full(root: str) -> None:
    path = os.path.join(root, "t")
    filler = os.path.join(root, "filler")
    with open(filler, "wb") as f:  # room to give back once the disk is full
        f.write(os.urandom(1 << 20))
    t = mt.Table.create(path, SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2), options=OPTIONS)
    model, rng = TableModel(True), random.Random(7)
    for step in range(200):
        rows = batch(rng, step * 1500, 1500, step)  # new keys: the table grows until the disk is full
        if report(f"upsert {step}", lambda: t.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))) is None:
            break
        model.apply("upsert", rows)
    check("acknowledged writes only", path, model)
    os.unlink(filler)
    fresh = mt.Table.open(path, options=OPTIONS)
    report("rollback after freeing space", lambda: fresh.rollback())
    rows = batch(rng, 0, 100, 1000)
    if report("upsert after freeing space", lambda: fresh.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))):
        model.apply("upsert", rows)
    check("after", path, model)
    print(json.dumps({"step": "fsck", "ok": mt.Table.open(path).fsck().healthy}), flush=True)


def readonly(root: str) -> None:
    path = os.path.join(root, "t")
    t = mt.Table.create(path, SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                        metadata_indexes=["column_stats", "record_index"], options=OPTIONS)
    model, rng = TableModel(True), random.Random(3)
    for step in range(3):
        rows = batch(rng, step * 50, 200, step)
        t.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
        model.apply("upsert", rows)
    subprocess.run(["mount", "-o", "remount,ro", root], check=True)
    data = pa.Table.from_pylist(batch(rng, 0, 5, 99), schema=SCHEMA)
    keys = pa.table({"id": [1, 2], "p": ["b", "a"]})
    ro = mt.Table.open(path, options=OPTIONS)
    for name, action in [("upsert", lambda: ro.upsert(data)), ("delete", lambda: ro.delete(keys)),
                         ("compact", ro.compact), ("clean", ro.clean), ("cluster", ro.cluster),
                         ("rollback", ro.rollback), ("schedule_indexing", lambda: ro.schedule_indexing(["bloom_filter"])),
                         ("drop_index", lambda: ro.drop_index("record_index")), ("rebuild_metadata", ro.rebuild_metadata),
                         ("fsck --repair", lambda: ro.fsck(repair=True)),
                         ("get", lambda: ro.get(keys)), ("lookup", lambda: ro.lookup(keys)), ("fsck", ro.fsck)]:
        report(name, action)
    check("reads", path, model)
    code = cli.main(["upsert", path, os.path.join(root, "none.json")])
    print(json.dumps({"step": "cli upsert", "ok": code == 0, "code": code}), flush=True)


if __name__ == "__main__":
    {"full": full, "readonly": readonly}[sys.argv[2]](sys.argv[1])
