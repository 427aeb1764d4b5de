"""Locating keys in TPC-H lineitem: the table's lookups against a full scan of the key column, in one run.

Builds (or reuses) two merge-on-read tables with column_stats and bloom_filter, partitioned by ship year:
one with the bloom index (a file group per partition at the default target file size), one with 8
buckets per partition (56 file groups). On each it locates 1,000 and 100,000 random keys (80% present)
through the table's index and through the three-level metadata lookup, with per-level candidate
counts, bytes read and time, and as the baseline reads every base file's key column. A process's first
lookup parses the page indexes of the files it touches (`first_call_seconds`); the following ones
reuse them, as a long-lived process does: these alternate with scans, 7 rounds, and the median
round is reported. Prints JSON lines.

    python benchmarks/lookup.py [--scale-factor 1]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY, generate_lineitem  # noqa: E402
from metatable.formats.key_pages import key_pages
from metatable.file_group.slice_reader import base_path
from metatable.spark.session import arrow_schema_of


ROUNDS = 7


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "lookup", **fields}), flush=True)


def build(workdir: str, scale_factor: float, index: mt.IndexConfig) -> mt.Table:
    root = os.path.join(workdir, f"lookup-sf{scale_factor:g}-{index.type}")
    if os.path.exists(os.path.join(root, ".metatable", "table.json")):
        return mt.Table.open(root)
    from pyspark.sql import functions as F

    spark = mt.spark_session(app_name="metatable-lookup-bench", shuffle_partitions=8,
                             **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    lineitem = spark.read.parquet(generate_lineitem(workdir, scale_factor)).withColumn("ship_year", F.year("l_shipdate"))
    table = mt.Table.create(root, arrow_schema_of(lineitem), KEY, ["ship_year"], index=index,
                            metadata_indexes=["column_stats", "bloom_filter"])
    started = time.perf_counter()
    table.insert(lineitem)
    emit(step="build", index=index.type, rows=lineitem.count(), seconds=round(time.perf_counter() - started, 1))
    return table


def sample_keys(table: mt.Table, n: int, rng: random.Random) -> pa.Table:
    """n keys, 80% present (uniform over the table's rows, so spread over all its files; at most every row of
    a small table), the rest absent."""
    paths = [base_path(table.context.paths, fs) for fs in table.file_slices().values()]
    sizes = [pq.read_metadata(p).num_rows for p in paths]
    chosen_rows = sorted(rng.sample(range(sum(sizes)), min(int(n * 0.8), sum(sizes))))
    present, start, cursor = [], 0, 0
    for path, size in zip(paths, sizes):
        local = []
        while cursor < len(chosen_rows) and chosen_rows[cursor] < start + size:
            local.append(chosen_rows[cursor] - start)
            cursor += 1
        if local:
            present += pq.read_table(path, columns=KEY).take(local).to_pylist()
        start += size
    absent = [{"l_orderkey": 10**12 + i, "l_linenumber": 1} for i in range(n - len(present))]
    rows = present + absent
    rng.shuffle(rows)
    schema = table.config.schema
    return pa.Table.from_pylist(rows, schema=pa.schema([schema.field(k) for k in KEY]))


def full_scan(table: mt.Table, keys: pa.Table) -> tuple[int, int, int]:
    """(keys found, files read, bytes read): every base file's key column, probed for the keys."""
    from indexes.arrow_keys import record_keys
    from metatable.file_group.slice_reader import key_column, members

    wanted = record_keys(keys, KEY)
    found = files = read = 0
    for fs in table.file_slices().values():
        column, size = key_column(table.storage, base_path(table.context.paths, fs))
        found += int(members(wanted, column).sum())
        files += 1
        read += size
    return found, files, read


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--workdir", default="bench-data")
    args = ap.parse_args()
    for index in (mt.IndexConfig(type="bloom"), mt.IndexConfig(num_buckets=args.buckets)):
        measure(build(args.workdir, args.scale_factor, index))


def measure(table: mt.Table) -> None:
    """Scans and lookups alternate, so that each ratio compares runs made in the same state of this
    (noisy, shared) machine; the reported speedup is the median of the rounds' ratios."""
    slices = table.file_slices().values()
    index = table.config.index.type
    total_files = len(slices)
    data_bytes = sum(os.path.getsize(base_path(table.context.paths, fs)) for fs in slices)
    rng = random.Random(11)
    for n in (1_000, 100_000):
        keys = sample_keys(table, n, rng)
        found, files, read = full_scan(table, keys)  # warms the page cache for both sides
        for using in ("index", "metadata") if index == "bucket" else ("index",):
            key_pages.cache_clear()
            started = time.perf_counter()
            table.lookup(keys, using=using)
            first = time.perf_counter() - started
            scans, lookups = [], []
            for _ in range(ROUNDS):
                started = time.perf_counter()
                full_scan(table, keys)
                scans.append(time.perf_counter() - started)
                started = time.perf_counter()
                result, report = table.lookup(keys, explain=True, using=using)
                lookups.append(time.perf_counter() - started)
                assert n - result["file_id"].null_count == found, (result, found)
            emit(step="full_scan", table=index, keys=n, found=found, files_read=files, bytes_read=read,
                 data_bytes=data_bytes, share_of_data_read=round(read / data_bytes, 4),
                 seconds=round(statistics.median(scans), 3))
            emit(step=f"lookup_{using}", table=index, keys=n, found=found, files_total=total_files,
                 first_call_seconds=round(first, 4), seconds=round(statistics.median(lookups), 4),
                 speedup_vs_scan=round(statistics.median(s / t for s, t in zip(scans, lookups)), 1),
                 first_call_speedup=round(statistics.median(scans) / first, 1),
                 share_of_data_read=round(report["base_bytes_read"] / data_bytes, 4), **report)


if __name__ == "__main__":
    main()
