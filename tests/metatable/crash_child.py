"""Child process for crash tests: deterministic commits until killed.

usage: python -m tests.metatable.crash_child ROOT JOURNAL N [rollback]
Each begun instant is journaled as "<i> <time>" before its records are written.
"""
from __future__ import annotations

import os
import sys

from metatable.metadata.table import MetadataTable


def batch(i: int) -> dict:
    files = {f"p{(i + j) % 7}": {"files": {f"f{i}-{j}": {"size": 10 + j, "is_deleted": False},
                                          f"f{i - 3}-{j}": {"size": 0, "is_deleted": True}},
                                "is_deleted": False} for j in range(4)}
    stats = {f"c{(i * 3 + j) % 11}": {"file_name": "f", "column_name": "c", "min_value": i - j, "max_value": i + j,
                                      "null_count": 0, "value_count": 1, "total_size": 5, "is_deleted": False,
                                      "resets": False} for j in range(3)}
    if i % 4 == 3:
        stats[f"c{i % 11}"] = None
    return {"files": files, "column_stats": stats}


def main() -> None:
    root, journal, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    mdt = MetadataTable.open(root)
    with open(journal, "a") as out:
        for i in range(n):
            time = mdt.begin()
            out.write(f"{i} {time}\n")
            out.flush()
            os.fsync(out.fileno())
            mdt.write(time, batch(i))
            if mode == "rollback" and i == 2:
                mdt.rollback(time)
                continue
            mdt.complete(time)
            mdt.refresh()
            mdt.maintain()


if __name__ == "__main__":
    main()
