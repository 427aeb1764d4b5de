"""Child process for archival crash tests: deterministic upserts (`commit_rows(i)`) until killed.

usage: python -m tests.metatable.archive_child ROOT FIRST COUNT OPTIONS_JSON
"""
from __future__ import annotations

import json
import sys

import pyarrow as pa

import metatable as mt

from .table_model import SCHEMA


def commit_rows(i: int) -> list[dict]:
    """Commit i's rows: a few keys of a small key space, so later commits update earlier ones."""
    return [{"id": (i * 7 + j) % 23, "p": "ab"[(i + j) % 2], "v": f"c{i}", "ts": i} for j in range(3)]


def main() -> None:
    root, first, count, options = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    table = mt.Table.open(root, options=options)
    for i in range(first, first + count):
        table.upsert(pa.Table.from_pylist(commit_rows(i), schema=SCHEMA))


if __name__ == "__main__":
    main()
