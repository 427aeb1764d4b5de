"""Resizing a consistent-hashing table under a skewed TPC-H load, while a writer keeps writing.

The load is lineitem partitioned by ship year, with one year (1995) whole and the others sampled down to
10%: that year's buckets outgrow the split threshold, the others stay small. Reported as JSON lines:

- the resize's time, and file-group sizes before and after it (largest / write.target_file_size, per
  partition), with the split point given (`quantile` converges in one round; `--split-point middle` for
  RFC-42's two-way split);
- a writer's upsert throughput (1% batches, in-process) with the resize planned but not yet running (the
  dual write alone: RFC-42 expects it to cost up to ~50%), and while the resize runs in another process
  (dual writes plus the resize's own use of the machine's cores), each over the same writer's throughput
  without a resize; target >= 0.7.

    python benchmarks/resize.py [--scale-factor 1] [--table-type merge_on_read]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY, generate_lineitem  # noqa: E402
from metatable.table_config import normalize_schema  # noqa: E402


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "resize", **fields}), flush=True)


def skewed_lineitem(source: str) -> pa.Table:
    data = pq.read_table(source)
    data = data.cast(normalize_schema(data.schema))  # tpchgen writes string_view columns
    data = data.append_column("ship_year", pc.year(data["l_shipdate"]).cast(pa.int32()))
    rng = np.random.default_rng(7)
    keep = pc.or_(pc.equal(data["ship_year"], 1995), pa.array(rng.random(data.num_rows) < 0.1))
    return data.filter(keep)


def largest_over_target(table: mt.Table, target: int) -> dict[str, float]:
    return {r["partition"]: round(r["largest_bytes"] / target, 2) for r in table.rings()}


def upsert_batches(data: pa.Table, n: int, fraction: float, seed: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = data.take(pa.array(rng.choice(data.num_rows, int(data.num_rows * fraction), replace=False)))
        out.append(rows.set_column(rows.schema.get_field_index("l_comment"), "l_comment",
                                   pa.array(np.full(rows.num_rows, "upserted by the resize benchmark"))))
    return out


def write_until(table: mt.Table, batches: list[pa.Table], done) -> tuple[int, float, int]:
    """Upsert batches in turn until `done()` (and at least one); returns (rows, seconds, commits)."""
    rows, commits, started = 0, 0, time.perf_counter()
    while True:
        batch = batches[commits % len(batches)]
        table.upsert(batch)
        rows += batch.num_rows
        commits += 1
        if done(commits):
            return rows, time.perf_counter() - started, commits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--table-type", default="merge_on_read", choices=["merge_on_read", "copy_on_write"])
    ap.add_argument("--split-point", default="quantile", choices=["quantile", "middle"])
    ap.add_argument("--target-mb", type=float, default=4.0, help="write.target_file_size in MiB")
    ap.add_argument("--workdir", default="bench-data")
    args = ap.parse_args()
    source = generate_lineitem(args.workdir, args.scale_factor)
    data = skewed_lineitem(source)
    root = os.path.join(args.workdir, f"resize-sf{args.scale_factor:g}-{args.table_type}")
    shutil.rmtree(root, ignore_errors=True)
    target = int(args.target_mb * 2**20)
    options = {"write.target_file_size": target, "bucket.split_point": args.split_point, "clean.inline": False}
    table = mt.Table.create(root, data.schema, KEY, ["ship_year"], table_type=args.table_type,
                            index=mt.IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=2),
                            options=options)
    started = time.perf_counter()
    table.insert(data)
    emit(step="load", rows=data.num_rows, seconds=round(time.perf_counter() - started, 2),
         buckets=sum(r["buckets"] for r in table.rings()))
    before = largest_over_target(table, target)
    batches = upsert_batches(data, 4, 0.01, seed=3)
    # the writer without a resize writes to a twin of the table: a merge-on-read upsert reads the keys of
    # every log of its slices, so each phase must start from the same logs to compare
    twin_root = root + "-twin"
    shutil.rmtree(twin_root, ignore_errors=True)
    shutil.copytree(root, twin_root)
    twin = mt.Table.open(twin_root)

    baseline_rows, baseline_s, baseline_n = write_until(twin, batches, lambda n: n >= 6)
    baseline = baseline_rows / baseline_s
    emit(step="writer_without_resize", commits=baseline_n, rows=baseline_rows, seconds=round(baseline_s, 2),
         rows_per_s=round(baseline))

    instant = table.schedule_clustering()
    buckets_before = sum(r["buckets"] for r in table.rings())
    dual_rows, dual_s, dual_n = write_until(table, batches, lambda n: n >= 6)
    emit(step="writer_with_pending_resize", commits=dual_n, rows=dual_rows, seconds=round(dual_s, 2),
         rows_per_s=round(dual_rows / dual_s))
    emit(ratio="writer_throughput_dual_writing/without", value=round(dual_rows / dual_s / baseline, 3), target=0.7)
    resizer = subprocess.Popen([sys.executable, "-m", "metatable.cli", "cluster", "run", root, "--instant", instant],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.perf_counter()
    during_rows, during_s, during_n = write_until(table, batches, lambda n: resizer.poll() is not None)
    _, err = resizer.communicate()
    resize_s = time.perf_counter() - started
    if resizer.returncode != 0:
        raise SystemExit(f"the resize failed:\n{err}")
    during = during_rows / during_s
    twin_rows, twin_s, _ = write_until(twin, batches, lambda n: n >= during_n)  # the same commits, no resize
    after = largest_over_target(table, target)
    emit(step="resize", instant=instant, seconds=round(resize_s, 2), split_point=args.split_point,
         buckets_before=buckets_before, buckets_after=sum(r["buckets"] for r in table.rings()),
         largest_over_target_before=before, largest_over_target_after=after)
    emit(step="writer_during_resize", commits=during_n, rows=during_rows, seconds=round(during_s, 2),
         rows_per_s=round(during))
    emit(ratio="writer_throughput_during_resize/without", value=round(during / (twin_rows / twin_s), 3),
         target=0.7)
    if table.to_arrow().num_rows != data.num_rows:
        raise SystemExit("rows were lost or duplicated")


if __name__ == "__main__":
    main()
