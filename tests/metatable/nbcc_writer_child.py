"""Child process: upsert random batches of overlapping keys until a deadline, journaling every commit.

usage: python -m tests.metatable.nbcc_writer_child ROOT JOURNAL SEED DEADLINE
Each committed upsert appends {"instant": ..., "rows": [...]} to JOURNAL; any failure ends the process
with a traceback (exit 1), which the test reports.
"""
from __future__ import annotations

import json
import random
import sys
import time

import pyarrow as pa

import metatable as mt

from .table_model import SCHEMA

KEYS = 120
BATCH = 25


def main() -> None:
    root, journal, seed, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    rng = random.Random(seed)
    table = mt.Table.open(root)
    step = 0
    with open(journal, "a") as out:
        while time.time() < deadline:
            ids = rng.sample(range(KEYS), BATCH)
            rows = [{"id": i, "p": f"p{i % 2}", "v": f"w{seed}-{step}", "ts": rng.randint(0, 3)} for i in ids]
            result = table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
            out.write(json.dumps({"instant": result.instant, "rows": rows}) + "\n")
            out.flush()
            step += 1


if __name__ == "__main__":
    main()
