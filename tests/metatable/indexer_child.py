"""Child process for indexer tests: schedule and/or run an indexing, or drop an index.

usage: python -m tests.metatable.indexer_child ROOT ACTION OPTIONS_JSON [ARG...]
ACTION: "schedule", "run", "schedule_run" or "drop" (ARGs: partitions, and secondary indexes as name=col,...);
"write" (ARGs: SEED DEADLINE): upsert
random batches into partition p<SEED>, deleting some keys every third step, until the wall-clock DEADLINE, or
until a file exists when DEADLINE is its path (once at least);
any failure ends it with a traceback (exit 1). Prints the result as JSON; exit 4 on IndexingAborted (prints
the message). METATABLE_CRASH_AT / METATABLE_PAUSE_AT hold or kill it at a named point.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

import pyarrow as pa

import metatable as mt
from metatable.errors import IndexingAborted

from .table_model import SCHEMA

KEYS = 400


def write(table: mt.Table, seed: int, deadline: str) -> int:
    rng = random.Random(seed)
    commits = 0
    until = (lambda: not os.path.exists(deadline)) if os.sep in deadline else \
        (lambda: time.time() < float(deadline))
    while commits == 0 or until():  # one write at least, however slow the start
        ids = rng.sample(range(KEYS), 40)
        if commits % 3 == 2:
            table.delete(pa.table({"id": pa.array(ids[:8], pa.int64()), "p": [f"p{seed}"] * 8}))
        else:
            rows = [{"id": i, "p": f"p{seed}", "v": f"w{seed}-{commits}", "ts": rng.randint(0, 3)} for i in ids]
            table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
        commits += 1
        time.sleep(0.05)
    return commits


def main() -> None:
    root, action, options, partitions = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
    table = mt.Table.open(root, options=options)
    if action == "write":
        print(json.dumps(write(table, int(partitions[0]), partitions[1])))
        return
    try:
        if action == "drop":
            print(json.dumps(table.drop_index(partitions[0])))
            return
        secondary = {arg.split("=")[0]: arg.split("=")[1].split(",") for arg in partitions if "=" in arg}
        partitions = [arg for arg in partitions if "=" not in arg]
        scheduled = table.schedule_indexing(partitions, secondary) if action.startswith("schedule") else None
        done = table.run_indexing() if action.endswith("run") else []
        print(json.dumps({"scheduled": scheduled, "done": done}))
    except IndexingAborted as e:
        print(str(e))
        sys.exit(4)


if __name__ == "__main__":
    main()
