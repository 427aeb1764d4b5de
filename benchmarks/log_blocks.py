"""Data log block encodings: Avro records (one per row) vs one Parquet file vs one Arrow IPC file (zstd, lz4,
uncompressed) in an Avro container.

Writes and reads a lineitem-shaped block of N rows each way; prints JSON lines, each with its write and read
speed relative to the Parquet block. This measurement decides the defaults of `write.log.block_format` and
`write.log.compression` (docs/design-notes.md).

    python benchmarks/log_blocks.py [--rows 5000] [--scale-factor 0.1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from metatable.formats.data_log import read_data_log, write_data_log
from metatable.demo import generate_lineitem  # noqa: E402
from metatable.storage.local import LocalStorage
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, normalize_schema  # noqa: E402

ENCODINGS = [("avro", "snappy"), ("parquet", "snappy"), ("arrow", "zstd"), ("arrow", "lz4"), ("arrow", "none")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--scale-factor", type=float, default=0.1)
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--repeat", type=int, default=7, help="runs of each encoding; the medians are reported")
    args = ap.parse_args()
    data = pq.read_table(generate_lineitem(args.workdir, args.scale_factor)).slice(0, args.rows)
    data = data.cast(normalize_schema(data.schema))
    keys = pc.binary_join_element_wise(pc.cast(data["l_orderkey"], pa.string()),
                                       pc.cast(data["l_linenumber"], pa.string()), ",")
    block = data.append_column(KEY_COLUMN, keys).append_column(DELETED_COLUMN, pa.array([False] * data.num_rows))
    storage = LocalStorage()
    with tempfile.TemporaryDirectory() as d:
        results = {}
        for fmt, codec in ENCODINGS:
            path = os.path.join(d, f"{fmt}-{codec}")
            write_s, read_s = [], []
            for _ in range(args.repeat):
                started = time.perf_counter()
                write_data_log(storage, path, "20240101000000000", block, fmt, codec)
                write_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                read_data_log(storage, path, block.schema)
                read_s.append(time.perf_counter() - started)
            results[fmt, codec] = (statistics.median(write_s), statistics.median(read_s))
            print(json.dumps({"benchmark": "log_blocks", "format": fmt, "codec": codec, "rows": block.num_rows,
                              "write_us_per_row": round(results[fmt, codec][0] / block.num_rows * 1e6, 2),
                              "read_us_per_row": round(results[fmt, codec][1] / block.num_rows * 1e6, 2),
                              "bytes": os.path.getsize(path)}), flush=True)
        parquet_write, parquet_read = results["parquet", "snappy"]
        for (fmt, codec), (write, read) in results.items():
            print(json.dumps({"benchmark": "log_blocks", "format": fmt, "codec": codec,
                              "ratio": "parquet/this seconds", "write": round(parquet_write / write, 2),
                              "read": round(parquet_read / read, 2)}), flush=True)


if __name__ == "__main__":
    main()
