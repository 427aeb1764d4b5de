"""Metadata table lookups: a 1M-key column_stats partition (SST base) plus 10 pending logs.

Prints JSON lines: build, batched lookups (cold and warm, microseconds per key),
a prefix scan, and compaction (seconds, peak RSS). Run: `python benchmarks/mdt_lookup.py [--keys N]`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from indexes.keys import column_stats_key, column_stats_prefix  # noqa: E402
from metatable.metadata.table import MetadataTable

from upsert import PeakRss  # noqa: E402


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "mdt_lookup", **fields}), flush=True)


def stats(column: str, partition: str, file_name: str, lo: int) -> dict:
    return {"file_name": file_name, "column_name": column, "min_value": lo, "max_value": lo + 1000,
            "null_count": 0, "value_count": 5000, "total_size": 40000, "is_deleted": False, "resets": False}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--logs", type=int, default=10)
    ap.add_argument("--log-records", type=int, default=10_000)
    ap.add_argument("--file-groups", type=int, default=4)
    args = ap.parse_args()
    rng = random.Random(7)
    workdir = tempfile.mkdtemp(prefix="mdt-bench-")
    try:
        columns = [f"col{c}" for c in range(10)]
        partitions = [f"2024-{p:02d}" for p in range(10)]
        per_pair = args.keys // (len(columns) * len(partitions))
        mdt = MetadataTable.create(os.path.join(workdir, "m"), {"column_stats": args.file_groups},
                                   options={"metadata.auto_compact": False})
        started = time.perf_counter()
        keys = []
        for chunk_start in range(0, len(partitions), 2):  # a few commits, to bound the memory of one batch
            batch = {}
            for p in partitions[chunk_start:chunk_start + 2]:
                for c in columns:
                    for f in range(per_pair):
                        name = f"file-{f:06d}.parquet"
                        key = column_stats_key(c, p, name)
                        batch[key] = stats(c, p, name, f)
            keys.extend(batch)
            mdt.commit({"column_stats": batch})
        commit_s = time.perf_counter() - started
        report = mdt.compact(force=True)
        emit(step="build_base", records=report.records, commit_s=round(commit_s, 2),
             compact_s=round(report.seconds, 2))

        for i in range(args.logs):
            batch = {}
            for key in rng.sample(keys, args.log_records):
                batch[key] = None if rng.random() < 0.1 else stats("c", "p", "f", i)
            for n in range(args.log_records // 10):
                batch[column_stats_key("new", "p", f"new-{i}-{n}")] = stats("new", "p", "f", n)
            mdt.commit({"column_stats": batch})
        emit(step="pending_logs", logs=args.logs, records_per_log=int(args.log_records * 1.1))

        reader = MetadataTable.open(mdt.root)
        absent = [column_stats_key("absent", "p", str(i)) for i in range(args.lookups // 5)]
        for label in ("cold", "warm", "warm"):
            probe = rng.sample(keys, args.lookups - len(absent)) + absent
            rng.shuffle(probe)
            t = time.perf_counter()
            found = reader.get_many("column_stats", probe)
            dt = time.perf_counter() - t
            emit(step=f"batched_lookup_{label}", keys=len(probe), found=len(found),
                 us_per_key=round(dt / len(probe) * 1e6, 2), seconds=round(dt, 3))

        t = time.perf_counter()
        scanned = sum(1 for _ in reader.scan("column_stats", column_stats_prefix("col3", "2024-05")))
        dt = time.perf_counter() - t
        emit(step="prefix_scan", records=scanned, seconds=round(dt, 4), us_per_record=round(dt / max(scanned, 1) * 1e6, 2))

        with PeakRss() as rss:
            report = mdt.compact(force=True)
        emit(step="compaction", records=report.records, seconds=round(report.seconds, 2),
             peak_rss_mb=round(rss.peak / 2**20, 1), rss_growth_mb=round((rss.peak - rss.start) / 2**20, 1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
