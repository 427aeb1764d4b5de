"""Bulk load of TPC-H lineitem from a Parquet path at several scale factors: time and peak memory.

Issue 12 asks that a bulk load of SF 10 (60M rows) from a Parquet path peak at no more than 4 GB resident,
in-process and on Spark, and the same at SF 1 and SF 10: memory set by the chunk and file-group sizes, not by
the input. The bucket count grows with the scale factor (`--buckets-per-sf`), so a file group holds as many
rows at SF 10 as at SF 1.

Each load runs in a process of its own (an Arrow memory pool keeps what earlier loads freed); peak memory
is that process's and its children's (the JVM, Spark's Python workers). Every load is verified: the rows
inserted and the rows a read counts equal the source's. One JSON line per load, then `target` lines.

    python benchmarks/bulk_load.py [--scale-factors 1,10] [--engines inproc,spark]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY  # noqa: E402

from peers import source_with_year  # noqa: E402
from upsert import PeakRss  # noqa: E402

LIMIT_MB = 4096


def load_once(engine: str, scale_factor: float, buckets: int, workdir: str) -> dict:
    source = source_with_year(workdir, scale_factor)
    root = os.path.join(workdir, f"bulk-load-{engine}-sf{scale_factor:g}")
    shutil.rmtree(root, ignore_errors=True)
    total = ds.dataset(source).count_rows()
    table = mt.Table.create(root, ds.dataset(source).schema, KEY, ["ship_year"], table_type="merge_on_read",
                            index=mt.IndexConfig(type="bucket", num_buckets=buckets),
                            options={"clean.inline": False})
    spark = None
    if engine == "spark":
        spark = mt.spark_session(app_name="metatable-bulk-load", shuffle_partitions=8,
                                 **{"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        spark.range(10).count()  # the JVM is up before the clock
    with PeakRss() as rss:
        started = time.perf_counter()
        result = table.bulk_insert(spark.read.parquet(source) if spark else source)
        seconds = time.perf_counter() - started
    if result.inserted != total:
        raise SystemExit(f"verification failed: {engine} SF {scale_factor:g} inserted {result.inserted} of {total}")
    slices = mt.Table.open(root).file_slices()
    footers = sum(pq.ParquetFile(os.path.join(root, s.partition, s.base.file_name)).metadata.num_rows
                  for s in slices.values() if s.base)
    if footers != total:
        raise SystemExit(f"verification failed: {engine} SF {scale_factor:g}: base files hold {footers} of {total}")
    if spark is not None:
        spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    return {"engine": engine, "scale_factor": scale_factor, "buckets": buckets, "rows": total,
            "seconds": round(seconds, 1), "peak_rss_mb": round(rss.peak / 2**20)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factors", default="1,10")
    ap.add_argument("--engines", default="inproc,spark")
    ap.add_argument("--buckets-per-sf", type=int, default=8)
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # engine:scale factor, run in this process
    args = ap.parse_args()
    if args.one:
        engine, scale_factor = args.one.split(":")
        buckets = max(1, round(args.buckets_per_sf * float(scale_factor)))
        print(json.dumps({"benchmark": "bulk_load", **load_once(engine, float(scale_factor), buckets, args.workdir)}))
        return
    os.makedirs(args.workdir, exist_ok=True)
    peaks: dict[str, list[int]] = {}
    for scale_factor in args.scale_factors.split(","):
        source_with_year(args.workdir, float(scale_factor))  # prepared outside the measured processes
        for engine in args.engines.split(","):
            run = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", f"{engine}:{scale_factor}"],
                                 stdout=subprocess.PIPE, text=True)
            if run.returncode:
                raise SystemExit(f"{engine} SF {scale_factor} exited with {run.returncode}")
            line = run.stdout.strip().splitlines()[-1]
            print(line, flush=True)
            peaks.setdefault(engine, []).append(json.loads(line)["peak_rss_mb"])
    for engine, values in peaks.items():
        print(json.dumps({"benchmark": "bulk_load", "target": f"peak RSS <= {LIMIT_MB} MB", "engine": engine,
                          "value": max(values), "met": max(values) <= LIMIT_MB}))
        print(json.dumps({"benchmark": "bulk_load", "ratio": "largest/smallest scale factor's peak RSS",
                          "engine": engine, "value": round(values[-1] / values[0], 2)}))


if __name__ == "__main__":
    main()
