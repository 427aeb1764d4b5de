"""Child process: upsert random batches of overlapping keys until a deadline, journaling every commit.

usage: python -m tests.metatable.nbcc_writer_child ROOT JOURNAL SEED DEADLINE [MIN_COMMITS]
Each committed upsert appends {"instant": ..., "rows": [...]} to JOURNAL; any failure ends the process
with a traceback (exit 1), which the test reports. With MIN_COMMITS, it goes on past the deadline (for up
to OVERTIME_S more) until its siblings' journals (JOURNAL's name up to its last `-`, then anything) hold
that many commits together: a busy machine made too few in the time, and the test needs enough of them.
"""
from __future__ import annotations

import glob
import json
import random
import sys
import time

import pyarrow as pa

import metatable as mt

from .table_model import SCHEMA

KEYS = 120
BATCH = 25
OVERTIME_S = 50.0


def enough(journal: str, deadline: float, min_commits: int) -> bool:
    if time.time() < deadline:
        return False
    if time.time() >= deadline + OVERTIME_S:
        return True
    return sum(1 for path in glob.glob(journal.rpartition("-")[0] + "-*") for _ in open(path)) >= min_commits


def main() -> None:
    root, journal, seed, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    min_commits = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    rng = random.Random(seed)
    table = mt.Table.open(root)
    step = 0
    with open(journal, "a") as out:
        while not enough(journal, deadline, min_commits):
            ids = rng.sample(range(KEYS), BATCH)
            rows = [{"id": i, "p": f"p{i % 2}", "v": f"w{seed}-{step}", "ts": rng.randint(0, 3)} for i in ids]
            result = table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
            out.write(json.dumps({"instant": result.instant, "rows": rows}) + "\n")
            out.flush()
            step += 1


if __name__ == "__main__":
    main()
