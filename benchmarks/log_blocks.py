"""Data log block encodings: Avro records (one per row) vs one Parquet file in an Avro container.

Writes and reads a lineitem-shaped block of N rows both ways; prints JSON lines. This measurement decides
the default of `write.log.block_format` (docs/design-notes.md).

    python benchmarks/log_blocks.py [--rows 5000] [--scale-factor 0.1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from metatable.data_log import read_data_log, write_data_log  # noqa: E402
from metatable.demo import generate_lineitem  # noqa: E402
from metatable.storage import LocalStorage  # noqa: E402
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, normalize_schema  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--scale-factor", type=float, default=0.1)
    ap.add_argument("--workdir", default="bench-data")
    args = ap.parse_args()
    data = pq.read_table(generate_lineitem(args.workdir, args.scale_factor)).slice(0, args.rows)
    data = data.cast(normalize_schema(data.schema))
    keys = pc.binary_join_element_wise(pc.cast(data["l_orderkey"], pa.string()),
                                       pc.cast(data["l_linenumber"], pa.string()), ",")
    block = data.append_column(KEY_COLUMN, keys).append_column(DELETED_COLUMN, pa.array([False] * data.num_rows))
    storage = LocalStorage()
    with tempfile.TemporaryDirectory() as d:
        for fmt in ("avro", "parquet"):
            path = os.path.join(d, fmt)
            started = time.perf_counter()
            for _ in range(3):
                write_data_log(storage, path, "20240101000000000", block, fmt)
            write_s = (time.perf_counter() - started) / 3
            started = time.perf_counter()
            for _ in range(3):
                read_data_log(storage, path, block.schema)
            read_s = (time.perf_counter() - started) / 3
            print(json.dumps({"benchmark": "log_blocks", "format": fmt, "rows": block.num_rows,
                              "write_us_per_row": round(write_s / block.num_rows * 1e6, 2),
                              "read_us_per_row": round(read_s / block.num_rows * 1e6, 2),
                              "bytes": os.path.getsize(path)}), flush=True)


if __name__ == "__main__":
    main()
