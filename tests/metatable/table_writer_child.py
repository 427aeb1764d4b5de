"""Child process for table concurrency tests: one write from JSON rows, result on stdout.

usage: python -m tests.metatable.table_writer_child ROOT OPERATION ROWS_JSON
exit 0: committed (prints the WriteResult as JSON); exit 3: ConflictError (prints the message).
"""
from __future__ import annotations

import dataclasses
import json
import sys

import pyarrow as pa

import metatable as mt
from metatable.errors import ConflictError

from .table_model import SCHEMA


def main() -> None:
    root, operation, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    table = mt.Table.open(root)
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    try:
        result = getattr(table, operation)(data if operation != "delete" else data.select(["id", "p"]))
    except ConflictError as e:
        print(str(e))
        sys.exit(3)
    print(json.dumps(dataclasses.asdict(result)))


if __name__ == "__main__":
    main()
