"""Child process for table concurrency tests: one action from JSON arguments, result on stdout.

usage: python -m tests.metatable.table_writer_child ROOT OPERATION ROWS_JSON [OPTIONS_JSON [GO_FILE]]
OPERATION: upsert, insert, delete, or a Table method without arguments (compact, clean, rebuild_metadata...).
GO_FILE: once the table is open the child prints `ready` and waits for this file to exist, so that several
children act at once (`release` in the tests) without a fixed head start.
exit 0: done (prints the WriteResult or the instants as JSON); exit 3: ConflictError (prints the message).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pyarrow as pa

import metatable as mt
from metatable.errors import ConflictError

from .table_model import SCHEMA


def main() -> None:
    root, operation, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    table = mt.Table.open(root, options=options)
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    if len(sys.argv) > 5:
        print("ready", flush=True)
        while not os.path.exists(sys.argv[5]):
            time.sleep(0.001)
    try:
        if operation in ("upsert", "insert", "delete"):
            result = getattr(table, operation)(data if operation != "delete" else data.select(["id", "p"]))
            print(json.dumps(dataclasses.asdict(result)))
        else:
            done = getattr(table, operation)()
            print(json.dumps(dataclasses.asdict(done) if dataclasses.is_dataclass(done) else done))
    except ConflictError as e:
        print(str(e))
        sys.exit(3)


if __name__ == "__main__":
    main()
