"""`metatable demo`: the main job on an embedded default (local Spark, local files).

TPC-H lineitem from tpchgen-cli is bulk-loaded into a merge-on-read table keyed by
(l_orderkey, l_linenumber), partitioned by ship year, with a bucket index; then a
5% upsert batch (90% updates, 10% new keys), 1,000 deletes, a check of the whole
snapshot against the expected rows computed independently in Spark, a compaction,
a clustering that doubles the buckets, and a summary.

Then the same data into a table with a consistent-hashing index that starts with 2 buckets per partition:
its buckets outgrow the split threshold, a resize runs in another process (`metatable cluster run`) while
the upsert batch is written, and the snapshot is checked again; the summary shows the bucket counts before
and after.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from metatable.table import Table
from metatable.table_config import IndexConfig

log = logging.getLogger(__name__)

KEY = ["l_orderkey", "l_linenumber"]


@dataclass
class Step:
    name: str
    rows: int
    seconds: float
    detail: str = ""


def generate_lineitem(workdir: str, scale_factor: float) -> str:
    """lineitem.parquet from tpchgen-cli (kept between runs of the same scale factor)."""
    out = os.path.join(workdir, f"tpch-sf{scale_factor:g}")
    path = os.path.join(out, "lineitem.parquet")
    if not os.path.exists(path):
        tool = shutil.which("tpchgen-cli") or os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
        print(f"generating TPC-H lineitem at scale factor {scale_factor:g} ...", file=sys.stderr, flush=True)
        subprocess.run([tool, "parquet", "-s", f"{scale_factor:g}", "--tables=lineitem", f"--output-dir={out}"],
                       check=True)
    return path


def run_demo(workdir: str, scale_factor: float = 0.1, buckets: int = 4) -> list[Step]:
    from pyspark.sql import functions as F

    from metatable.spark.session import arrow_schema_of, spark_session

    os.makedirs(workdir, exist_ok=True)
    source = generate_lineitem(workdir, scale_factor)
    spark = spark_session(app_name="metatable-demo", shuffle_partitions=8,
                          **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    steps: list[Step] = []

    def timed(name: str, rows: int, fn, detail=lambda r: "") -> object:
        print(f"[{len(steps) + 1}] {name} ...", flush=True)
        started = time.perf_counter()
        result = fn()
        steps.append(Step(name, rows, time.perf_counter() - started, detail(result)))
        print(f"    {steps[-1].seconds:.1f}s {steps[-1].detail}", flush=True)
        return result

    lineitem = spark.read.parquet(source).withColumn("ship_year", F.year("l_shipdate"))
    total = lineitem.count()
    root = os.path.join(workdir, "lineitem")
    shutil.rmtree(root, ignore_errors=True)
    table = Table.create(root, arrow_schema_of(lineitem), KEY, ["ship_year"], table_type="merge_on_read",
                         index=IndexConfig(type="bucket", num_buckets=buckets),
                         metadata_indexes=["column_stats"])

    def describe(r) -> str:
        return (f"instant {r.instant}: {r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
                f"{r.files_written} files")

    timed("bulk load", total, lambda: table.insert(lineitem), describe)

    # the 5% batch: 90% updates of existing keys, 10% new keys
    sample = lineitem.sample(fraction=0.05, seed=42).cache()
    max_order = lineitem.agg(F.max("l_orderkey")).first()[0]
    updates = sample.sample(fraction=0.9, seed=7).withColumn("l_quantity", F.col("l_quantity") + F.lit(1)) \
        .withColumn("l_comment", F.lit("updated by the demo"))
    new_rows = sample.join(updates.select(*KEY), KEY, "left_anti") \
        .withColumn("l_orderkey", F.col("l_orderkey") + F.lit(max_order)) \
        .withColumn("l_comment", F.lit("inserted by the demo"))
    batch = updates.unionByName(new_rows).cache()
    batch_rows = batch.count()
    # the async indexer builds the bloom filters, the record index and a secondary index on l_partkey (in another
    # process) while the upsert runs
    indexing = table.schedule_indexing(["bloom_filter", "record_index"], secondary={"by_part": ["l_partkey"]})
    print(f"scheduled indexing {indexing} of bloom_filter, record_index and secondary index by_part (l_partkey), "
          "built in another process", flush=True)
    timed("upsert 5% (90% updates, 10% new) while the indexer runs",
          batch_rows, lambda: while_running(["index", "run", root, "--instant", indexing], lambda: table.upsert(batch)),
          describe)
    table = Table.open(root)
    status = table.index_status()
    print("    index status: " + "; ".join(f"{s['partition']} {s['state']} ({s['records']:,} records, "
                                           f"{s['file_groups']} file groups)" for s in status), flush=True)
    probe = batch.select(*KEY).limit(1000).toArrow()
    timed("lookup 1,000 keys through the record index", probe.num_rows, lambda: table.lookup(probe, explain=True),
          lambda r: f"{r[0].num_rows - r[0]['file_id'].null_count} found, index {r[1]['index']}")
    part = batch.select("l_partkey").first()[0]
    timed(f"rows of l_partkey {part} through the secondary index", 1,
          lambda: table.get_by("by_part", [part], explain=True),
          lambda r: f"{r[1]['rows']} rows from {r[1]['file_slices']} file slices ({r[1]['entries']} entries of "
                    f"{r[1]['index']})")

    doomed = lineitem.select(*KEY, "ship_year").orderBy(F.rand(3)).limit(1000).cache()
    timed("delete 1,000 keys", 1000, lambda: table.delete(doomed), describe)

    expected = lineitem.join(batch.select(*KEY), KEY, "left_anti").unionByName(batch) \
        .join(doomed.select(*KEY), KEY, "left_anti").select(*lineitem.columns)  # joins move keys first

    def verify(table: Table = table) -> int:
        actual = table.read()
        n = actual.count()
        want = expected.count()
        if n != want:
            raise AssertionError(f"snapshot has {n} rows, expected {want}")
        missing = expected.exceptAll(actual).count()
        extra = actual.exceptAll(expected).count()
        if missing or extra:
            raise AssertionError(f"snapshot differs from the expected rows: {missing} missing, {extra} unexpected")
        return n

    rows = timed("verify the snapshot (every row)", total, verify, lambda n: f"{n} rows, all as expected")
    timed("compact", rows, table.compact, lambda instant: f"instant {instant}")
    timed("verify after compaction (every row)", rows, verify, lambda n: f"{n} rows, all as expected")

    def files() -> str:
        view = table.context.view()
        return f"{len(view.file_slices)} file groups, {sum(map(len, view.live_files.values()))} data files on disk"

    before = files()
    timed(f"cluster: {buckets} -> {buckets * 2} buckets, sorted by l_shipdate (Spark)", rows,
          lambda: table.cluster(num_buckets=buckets * 2, sort_columns=["l_shipdate"], spark=spark),
          lambda instant: f"instant {instant}: {before} -> {files()}")
    timed("verify after clustering (every row)", rows, verify, lambda n: f"{n} rows, all as expected")

    resized = resize_demo(lineitem, batch, doomed, verify, timed, workdir, total, scale_factor)

    stats = table.stats()
    print()
    print(f"metatable demo: TPC-H lineitem SF {scale_factor:g} ({total:,} rows) at {root}")
    print(f"{'step':<62} {'rows':>10} {'seconds':>8} {'rows/s':>10}")
    for s in steps:
        print(f"{s.name:<62} {s.rows:>10,} {s.seconds:>8.1f} {s.rows / s.seconds if s.seconds else 0:>10,.0f}")
    print(f"\ntable: {len(stats)} file groups in {len({s['partition'] for s in stats})} partitions, "
          f"{sum(s['base_rows'] for s in stats):,} rows, "
          f"{sum(s['base_bytes'] for s in stats) / 2**20:.1f} MiB of base files, "
          f"{sum(s['logs'] for s in stats)} logs pending")
    print("timeline:")
    for instant in table.timeline():
        print(f"  {instant.time}  {instant.action.value:<12} {instant.state.value}")
    print("metadata indexes:")
    statuses = table.index_status()
    width = max((len(s["partition"]) for s in statuses), default=0)
    for s in statuses:
        print(f"  {s['partition']:<{width}}  {s['state']:<9} {s['file_groups']} file groups, {s['records']:,} "
              f"records, current to {s['current_to']}")
    print("metadata table timeline (last 5):")
    for instant in table.metadata.timeline.instants()[-5:]:
        print(f"  {instant.time}  {instant.action.value:<12} {instant.state.value}")
    print(f"\nconsistent hashing at {resized.path}: {resized.detail}")
    spark.stop()
    return steps


def while_running(command: list[str], fn: Callable[[], Any]) -> Any:
    """`fn()` while `metatable <command>` runs in another process; fails if that command fails."""
    process = subprocess.Popen([sys.executable, "-m", "metatable.cli", *command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    result = fn()
    _, err = process.communicate(timeout=1800)
    if process.returncode != 0:
        raise AssertionError(f"metatable {' '.join(command)} failed: {err}")
    return result


@dataclass
class Resized:
    path: str
    detail: str


def resize_demo(lineitem, batch, doomed, verify, timed, workdir: str, total: int, scale_factor: float) -> Resized:
    """A consistent-hashing table outgrows its 2 buckets per partition and is resized (in another process)
    while the upsert batch is written; after the same deletes, `verify` checks it against the same expected
    rows as the first table."""
    from metatable.spark.session import arrow_schema_of

    root = os.path.join(workdir, "lineitem_consistent_hashing")
    shutil.rmtree(root, ignore_errors=True)
    # a target that the 2 initial buckets per partition outgrow about 3-fold at any scale factor
    options = {"write.target_file_size": int(5 * 2**20 * scale_factor), "bucket.split_threshold": 2.0}
    table = Table.create(root, arrow_schema_of(lineitem), KEY, ["ship_year"], table_type="merge_on_read",
                         index=IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=2),
                         metadata_indexes=["column_stats"], options=options)

    def buckets() -> int:
        return sum(r["buckets"] for r in table.rings())

    timed("consistent hashing: bulk load into 2 buckets per partition", total, lambda: table.insert(lineitem),
          lambda r: f"{buckets()} buckets, largest {max(r['largest_bytes'] for r in table.rings()) / 2**20:.1f} MiB "
                    f"(split threshold {2 * options['write.target_file_size'] / 2**20:.1f} MiB)")
    before = buckets()
    instant = table.schedule_clustering()
    if instant is None:
        raise AssertionError("the consistent-hashing table should have outgrown its buckets")
    timed(f"upsert while resize {instant} runs in another process", batch.count(),
          lambda: while_running(["cluster", "run", root, "--instant", instant], lambda: table.upsert(batch)),
          lambda r: f"instant {r.instant}: {r.inserted} inserted, {r.updated} updated; "
                    f"buckets {before} -> {buckets()}")
    table.delete(doomed)
    timed("verify the resized table (every row)", total, lambda: verify(table), lambda n: f"{n} rows, all as expected")
    return Resized(root, f"{before} buckets before the resize, {buckets()} after "
                         f"(ring seq_no per partition: {sorted({r['seq_no'] for r in table.rings()})})")
