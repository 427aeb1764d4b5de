"""Clustering on TPC-H lineitem: many small files from many small commits, clustered by l_shipdate.

Loads lineitem as `--commits` small insert commits into a copy-on-write bloom-indexed table, then measures,
before and after clustering (sorted by l_shipdate): the file count, a filtered read of one month (files read
and time), and the same upsert batch. Clustering runs in-process on one copy of the table and on Spark (one
task per group) on another. The peer is delta-rs, loaded with the same commits and Z-ordered by l_shipdate
(`optimize.z_order`), with the same filtered read. Prints one JSON line per measurement.

    python benchmarks/clustering.py [--scale-factor 1] [--commits 200]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as fs
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY, generate_lineitem  # noqa: E402
from metatable.table_config import normalize_schema  # noqa: E402

MONTH = [("l_shipdate", ">=", dt.date(1995, 3, 1)), ("l_shipdate", "<", dt.date(1995, 4, 1))]
LOAD_OPTIONS = {"write.target_file_size": 2 << 20, "clean.inline": False}
CLUSTER_OPTIONS = {"write.target_file_size": 32 << 20, "clustering.sort_columns": "l_shipdate"}


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "clustering", **fields}), flush=True)


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def data_files(table: mt.Table) -> int:
    return sum(len(names) for names in table.context.view().live_files.values())


def filtered_read(system: str, stage: str, table: mt.Table) -> None:
    result, seconds = timed(lambda: table.to_arrow(filter=MONTH))
    scanned = table.last_scan["file_slices"] - table.last_scan["skipped"]
    emit(system=system, step=f"filtered_read_{stage}", rows=result.num_rows, files_read=scanned,
         file_slices=table.last_scan["file_slices"], seconds=round(seconds, 3))


def upsert(system: str, stage: str, table: mt.Table, batch: pa.Table) -> None:
    result, seconds = timed(lambda: table.upsert(batch))
    emit(system=system, step=f"upsert_{stage}", rows=batch.num_rows, updated=result.updated,
         files_written=result.files_written, seconds=round(seconds, 2))


def bench_metatable(lineitem: pa.Table, batch: pa.Table, workdir: str, commits: int) -> float:
    system = "metatable"
    root = os.path.join(workdir, "metatable")
    shutil.rmtree(root, ignore_errors=True)
    table = mt.Table.create(root, lineitem.schema, KEY, table_type="copy_on_write", index=mt.IndexConfig(type="bloom"),
                            metadata_indexes=["column_stats", "bloom_filter"], options=LOAD_OPTIONS)
    per = -(-lineitem.num_rows // commits)
    _, seconds = timed(lambda: [table.insert(lineitem.slice(i * per, per)) for i in range(commits)])
    emit(system=system, step="load", commits=commits, rows=lineitem.num_rows, seconds=round(seconds, 1))
    emit(system=system, step="files_before", file_groups=len(table.file_slices()), data_files=data_files(table))
    filtered_read(system, "before", table)
    upsert(system, "before", table, batch)
    spark_root = root + "-spark"
    shutil.rmtree(spark_root, ignore_errors=True)
    shutil.copytree(root, spark_root)

    local = mt.Table.open(root, options=CLUSTER_OPTIONS)
    rows = sum(r["base_rows"] for r in local.stats())
    instant, seconds = timed(local.cluster)
    cores = os.cpu_count() or 1
    emit(system=system, step="cluster_in_process", instant=instant, rows=rows, seconds=round(seconds, 2),
         rows_per_s=round(rows / seconds), rows_per_s_per_core=round(rows / seconds / cores), cores=cores)
    spark = mt.spark_session(app_name="metatable-bench-clustering",
                             **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    on_spark = mt.Table.open(spark_root, options=CLUSTER_OPTIONS)
    instant, spark_seconds = timed(lambda: on_spark.cluster(spark=spark))
    emit(system=system, step="cluster_spark", instant=instant, rows=rows, seconds=round(spark_seconds, 2),
         rows_per_s=round(rows / spark_seconds))
    spark.stop()
    local = mt.Table.open(root)
    emit(system=system, step="files_after", file_groups=len(local.file_slices()),
         plan_groups=len(local.clustering_plans()[-1]["groups"]))
    filtered_read(system, "after", local)
    upsert(system, "after", local, batch)
    return seconds


def bench_delta(lineitem: pa.Table, workdir: str, commits: int) -> float:
    from deltalake import DeltaTable, write_deltalake

    system = "delta-rs"
    root = os.path.join(workdir, "delta")
    shutil.rmtree(root, ignore_errors=True)
    per = -(-lineitem.num_rows // commits)
    _, seconds = timed(lambda: [write_deltalake(root, lineitem.slice(i * per, per), mode="append")
                                for i in range(commits)])
    emit(system=system, step="load", commits=commits, rows=lineitem.num_rows, seconds=round(seconds, 1))

    def read(stage: str) -> None:
        table = DeltaTable(root)
        # A native filesystem: delta-rs's default is a Python one (`PyFileSystem`), slower, and its buffers,
        # when a pre-buffered read that was never consumed lets go of them on an Arrow I/O thread during
        # interpreter exit, abort the process ("terminate called without an active exception").
        native = fs.SubTreeFileSystem(os.path.abspath(root), fs.LocalFileSystem())
        result, seconds = timed(lambda: table.to_pyarrow_table(filters=MONTH, filesystem=native))
        emit(system=system, step=f"filtered_read_{stage}", rows=result.num_rows, data_files=len(table.file_uris()),
             seconds=round(seconds, 3))

    read("before")
    _, seconds = timed(lambda: DeltaTable(root).optimize.z_order(["l_shipdate"]))
    emit(system=system, step="z_order", rows=lineitem.num_rows, seconds=round(seconds, 2),
         rows_per_s=round(lineitem.num_rows / seconds))
    read("after")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--only", default="metatable,delta")
    args = ap.parse_args()
    source = generate_lineitem(args.workdir, args.scale_factor)
    lineitem = pq.read_table(source)
    lineitem = lineitem.cast(normalize_schema(lineitem.schema))
    workdir = os.path.join(args.workdir, f"clustering-sf{args.scale_factor:g}")
    os.makedirs(workdir, exist_ok=True)
    sample = lineitem.take(pc.indices_nonzero(pc.equal(pc.bit_wise_and(lineitem["l_orderkey"], 31), 7)))
    batch = sample.set_column(sample.schema.get_field_index("l_comment"), "l_comment",
                              pa.array(["clustered"] * sample.num_rows, pa.string()))
    only = set(args.only.split(","))
    mine = bench_metatable(lineitem, batch, workdir, args.commits) if "metatable" in only else None
    peer = bench_delta(lineitem, workdir, args.commits) if "delta" in only else None
    if mine and peer:
        emit(system="metatable", step="cluster_vs_delta_z_order", ratio=round(mine / peer, 2),
             note="in-process clustering seconds / delta-rs z_order seconds; < 1 is faster")


if __name__ == "__main__":
    main()
