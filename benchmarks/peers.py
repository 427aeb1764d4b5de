"""metatable beside delta-rs, step by step, on TPC-H lineitem in one run (the workload of issue 12).

Systems: metatable in-process and on Spark (merge-on-read and copy-on-write; bucket, bloom,
consistent-hashing and record-level indexes) and delta-rs (`write_deltalake`, `DeltaTable.merge` on the record key). The
`-uncounted` systems set `write.count_updates` false: their upserts do not read the keys the file groups
hold, so they count rows as upserted instead of inserted or updated. Steps:

- bulk_load: the whole table from one Parquet file (with the partition column `ship_year`): in-process
  `bulk_insert(path)` streams it; on Spark `bulk_insert(spark.read.parquet(path))`; delta-rs writes a
  dataset over the same file.
- upsert: 5% of the rows (or `--batch-rows`), 90% updates and 10% new keys; upsert_skewed: the same size,
  80% of it in ship year 1995. Every system reads the same batch files (into memory before the clock
  starts). `--batch-rows 300000` at SF 10 keeps SF 1's batch: an upsert's cost should follow the batch.
- get_1000: full rows of 1,000 random existing keys, in a fresh process, opening the table included
  (`Table.get`; delta-rs: a filtered read of the key columns' values, then the exact pairs).
- peak_rss_mb of every step: this process and its children (the JVM and Spark's Python workers); start_rss_mb:
  what they held when the step began (the floor a step cannot go under), once their resident memory stopped
  falling (`PeakRss.settle`: allocators give freed pages back after a step ends, for every system alike).

Every step is verified: counts of the write, then rows read back equal the expected rows. One JSON line per
measurement, then `ratio` lines (delta-rs time over metatable's for writes and gets: above 1 is faster;
metatable's peak memory over delta-rs's) and `target` lines (issue 12's targets, met or not).

    python benchmarks/peers.py [--scale-factor 1] [--batch-rows N] [--systems delta,inproc-mor-bucket,...]
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
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY, generate_lineitem  # noqa: E402

from upsert import PeakRss, warm_up  # noqa: E402

UNCOUNTED = {"write.count_updates": False}  # upserts append logs without reading the keys file groups hold
SYSTEMS = {  # name -> (engine, table type, index, options)
    "inproc-mor-bucket": ("inproc", "merge_on_read", dict(type="bucket"), {}),
    "inproc-mor-bucket-uncounted": ("inproc", "merge_on_read", dict(type="bucket"), UNCOUNTED),
    "inproc-cow-bucket": ("inproc", "copy_on_write", dict(type="bucket"), {}),
    "inproc-mor-ch": ("inproc", "merge_on_read", dict(type="bucket", engine="consistent_hashing"), {}),
    "inproc-mor-bloom": ("inproc", "merge_on_read", dict(type="bloom"), {}),
    "inproc-mor-record": ("inproc", "merge_on_read", dict(type="record"), {}),
    "spark-mor-bucket": ("spark", "merge_on_read", dict(type="bucket"), {}),
    "spark-mor-bucket-uncounted": ("spark", "merge_on_read", dict(type="bucket"), UNCOUNTED),
    "spark-cow-bucket": ("spark", "copy_on_write", dict(type="bucket"), {}),
    "spark-mor-bloom": ("spark", "merge_on_read", dict(type="bloom"), {}),
}
RESULTS: dict[tuple[str, str], dict] = {}
GET_SCRIPT = r"""
import json, os, sys, time
system, root, keys_path, out_path = sys.argv[1:5]
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
keys = pq.read_table(keys_path)
if system == "delta":
    from deltalake import DeltaTable
    import pyarrow.fs as fs
    started = time.perf_counter()
    # a native filesystem: the default Python one is slower and can abort the process at exit (clustering.py)
    data = DeltaTable(root).to_pyarrow_dataset(filesystem=fs.SubTreeFileSystem(os.path.abspath(root), fs.LocalFileSystem()))
    rows = data.to_table(filter=pc.field("l_orderkey").isin(keys["l_orderkey"].unique()))
    rows = rows.join(keys, ["l_orderkey", "l_linenumber"], join_type="inner")
else:
    from metatable import Table  # imported before the clock, as delta-rs's DeltaTable is
    started = time.perf_counter()
    rows = Table.open(root).get(keys)
seconds = time.perf_counter() - started
pq.write_table(rows, out_path)
print(json.dumps({"seconds": seconds}))
"""


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "peers", **fields}), flush=True)


def measure(system: str, step: str, rows: int, fn) -> object:
    PeakRss().settle()  # the previous step's freed pages are given back before this one is measured
    with PeakRss() as rss:  # rss.start: what the processes hold already (a JVM, Python workers, the batch)
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
    emit(system=system, step=step, rows=rows, seconds=round(seconds, 3), peak_rss_mb=round(rss.peak / 2**20),
         start_rss_mb=round(rss.start / 2**20))
    return result


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"verification failed: {what}")


# -- the data ----------------------------------------------------------------------------------------
def plain_types(schema: pa.Schema) -> pa.Schema:
    """tpchgen writes string_view columns; every system here gets plain strings."""
    return pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type) for f in schema])


def source_with_year(workdir: str, scale_factor: float) -> str:
    """lineitem with `ship_year`, written once, batch by batch."""
    out = os.path.join(workdir, f"lineitem-sf{scale_factor:g}-year.parquet")
    if os.path.exists(out):
        return out
    raw = pq.ParquetFile(generate_lineitem(workdir, scale_factor))
    writer = None
    for batch in raw.iter_batches(batch_size=1 << 20):
        table = pa.Table.from_batches([batch])
        table = table.append_column("ship_year", pc.year(table["l_shipdate"]).cast(pa.int32()))
        table = table.cast(plain_types(table.schema))
        writer = writer or pq.ParquetWriter(out + ".tmp", table.schema)
        writer.write_table(table)
    writer.close()
    os.replace(out + ".tmp", out)
    return out


def make_batches(source: str, workdir: str, batch_rows: int = 0) -> dict[str, str]:
    """The upsert batch (5% of the rows, or about `batch_rows`) and the skewed batch of the same size (80% from
    ship year 1995), sampled batch by batch with a fixed seed: 90% updates (quantity + 1, comment
    "updated"), 10% new keys (order key shifted past the max)."""
    of = os.path.basename(source).removesuffix(".parquet") + (f"-{batch_rows}" if batch_rows else "")
    paths = {"upsert": os.path.join(workdir, f"batch-{of}.parquet"),  # named by what they were made of: a work
             "upsert_skewed": os.path.join(workdir, f"batch_skewed-{of}.parquet")}  # directory has several
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    data = ds.dataset(source)
    total = data.count_rows()
    hot = data.count_rows(filter=pc.field("ship_year") == 1995)
    max_order = pc.max(data.to_table(columns=["l_orderkey"])["l_orderkey"]).as_py()
    for seed, (step, path) in enumerate(paths.items(), start=1):
        rng = np.random.default_rng(seed)
        share = batch_rows or 0.05 * total
        parts = []
        for batch in data.to_batches():
            if step == "upsert":
                p = np.full(batch.num_rows, share / total)
            else:
                in_hot = pc.equal(batch["ship_year"], 1995).to_numpy(zero_copy_only=False)
                p = np.where(in_hot, min(1.0, 0.8 * share / hot), 0.2 * share / (total - hot))
            picked = pa.Table.from_batches([batch]).filter(pa.array(rng.random(batch.num_rows) < p))
            new = rng.random(picked.num_rows) >= 0.9
            comment = pa.array(np.where(new, "new", "updated"))
            picked = picked.set_column(picked.schema.get_field_index("l_comment"), "l_comment", comment)
            quantity = picked["l_quantity"]
            picked = picked.set_column(picked.schema.get_field_index("l_quantity"), "l_quantity",
                                       pc.add(quantity, pa.scalar(1, quantity.type)).cast(quantity.type))
            orderkey = picked["l_orderkey"].to_numpy() + np.where(new, max_order * seed, 0)
            parts.append(picked.set_column(0, "l_orderkey", pa.array(orderkey, pa.int64())).cast(batch.schema))
        pq.write_table(pa.concat_tables(parts), path)
    return paths


def sample_keys(source: str, batches: dict[str, str], n: int, workdir: str) -> tuple[str, pa.Table]:
    """`n` random existing keys and their expected rows (the latest version: from a batch if it updated it)."""
    data = ds.dataset(source)
    rng = np.random.default_rng(7)
    picked = data.take(np.sort(rng.choice(data.count_rows(), n, replace=False)))
    expected = picked
    for path in batches.values():  # a later batch's version replaces the earlier one
        batch = pq.read_table(path).cast(picked.schema)
        updated = batch.join(picked.select(KEY), KEY, join_type="left semi")
        kept = expected.join(updated.select(KEY), KEY, join_type="left anti")
        expected = pa.concat_tables([kept.select(picked.column_names), updated.select(picked.column_names)])
    keys_path = os.path.join(workdir, "get_keys.parquet")
    pq.write_table(picked.select(KEY), keys_path)
    return keys_path, expected


def same_rows(got: pa.Table, expected: pa.Table) -> bool:
    order = [(k, "ascending") for k in KEY]
    got = got.select(expected.column_names).cast(expected.schema)
    return got.num_rows == expected.num_rows and got.sort_by(order).equals(expected.sort_by(order))


def fresh_get(system: str, root: str, keys_path: str, expected: pa.Table, workdir: str) -> None:
    """`get` (or delta-rs's filtered read) of the keys in a new Python process; the time it reports covers
    opening the table and reading the rows, after the imports."""
    out = os.path.join(workdir, f"get-{system}.parquet")
    with PeakRss() as rss:
        done = subprocess.run([sys.executable, "-c", GET_SCRIPT, system, root, keys_path, out],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    check(done.returncode == 0, f"{system} get: {done.stderr[-2000:]}")
    seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    emit(system=system, step="get_1000", rows=expected.num_rows, seconds=round(seconds, 3),
         peak_rss_mb=round(rss.peak / 2**20))
    check(same_rows(pq.read_table(out), expected), f"{system}: get returned other rows than expected")


# -- the systems -------------------------------------------------------------------------------------
def bench_delta(source: str, batches: dict[str, str], keys_path: str, expected: pa.Table, workdir: str) -> None:
    from deltalake import DeltaTable, write_deltalake

    root = os.path.join(workdir, "delta")
    shutil.rmtree(root, ignore_errors=True)
    total = ds.dataset(source).count_rows()
    measure("delta", "bulk_load", total, lambda: write_deltalake(root, ds.dataset(source).scanner().to_reader(),
                                                             partition_by=["ship_year"]))
    check(DeltaTable(root).to_pyarrow_dataset().count_rows() == total, "delta load count")
    for step, path in batches.items():
        batch = pq.read_table(path)
        total += pc.sum(pc.equal(batch["l_comment"], "new")).as_py()

        def merge(batch=batch):
            (DeltaTable(root).merge(source=batch, source_alias="s", target_alias="t",
                                    predicate="t.l_orderkey = s.l_orderkey AND t.l_linenumber = s.l_linenumber")
             .when_matched_update_all().when_not_matched_insert_all().execute())
        measure("delta", step, batch.num_rows, merge)
        check(DeltaTable(root).to_pyarrow_dataset().count_rows() == total, f"delta {step} count")
    fresh_get("delta", root, keys_path, expected, workdir)


def bench_metatable(system: str, source: str, batches: dict[str, str], keys_path: str, expected: pa.Table,
                    workdir: str, spark, buckets: int) -> None:
    engine, table_type, index, options = SYSTEMS[system]
    root = os.path.join(workdir, system)
    shutil.rmtree(root, ignore_errors=True)
    schema = ds.dataset(source).schema
    table = mt.Table.create(root, schema, KEY, ["ship_year"], table_type=table_type,
                            index=mt.IndexConfig(**index, num_buckets=buckets),
                            metadata_indexes=["column_stats", "bloom_filter"] if index["type"] == "bloom"
                            else ["column_stats"], options={"clean.inline": False, **options})
    total = ds.dataset(source).count_rows()
    load = (lambda: table.bulk_insert(spark.read.parquet(source))) if engine == "spark" \
        else (lambda: table.bulk_insert(source))
    result = measure(system, "bulk_load", total, load)
    check(result.inserted == total, f"{system} load inserted {result.inserted} of {total}")
    for step, path in batches.items():
        batch = spark.read.parquet(path) if engine == "spark" else pq.read_table(path)
        rows = pq.read_table(path)
        new = pc.sum(pc.equal(rows["l_comment"], "new")).as_py()
        if engine == "spark":
            batch.cache().count()
        result = measure(system, step, rows.num_rows, lambda batch=batch: table.upsert(batch))
        counted = (result.inserted, result.updated, result.upserted)
        check(counted == ((new, rows.num_rows - new, 0) if options.get("write.count_updates", True)
                          else (0, 0, rows.num_rows)),  # every file group holds rows: none is told apart
              f"{system} {step}: (inserted, updated, upserted) {counted}; {new} of {rows.num_rows} are new")
        sample = rows.take(np.random.default_rng(3).choice(rows.num_rows, 200, replace=False))
        check(same_rows(table.get(sample.select(KEY)), sample), f"{system} {step}: rows read back differ")
        if engine == "spark":
            batch.unpersist()
    fresh_get(system, root, keys_path, expected, workdir)


# -- the verdict -------------------------------------------------------------------------------------
SMALL_TARGETS = [  # at SF 0.01 (below SF 0.1): no slower than delta-rs
    ("inproc-mor-bucket", "upsert", "speedup", 1.0), ("inproc-mor-bucket", "upsert_skewed", "speedup", 1.0),
    ("inproc-mor-bucket", "get_1000", "speedup", 1.0),
]
TARGETS = [  # at SF 1 and above: (system, step, measure, bound), speedup = delta seconds / system seconds
    ("inproc-mor-bucket", "upsert", "speedup", 3.0), ("inproc-mor-bucket", "upsert_skewed", "speedup", 3.0),
    ("inproc-mor-bucket", "bulk_load", "speedup", 1.0), ("inproc-mor-bucket", "get_1000", "speedup", 10.0),
    ("spark-mor-bucket", "upsert", "speedup", 2.0), ("spark-mor-bucket", "upsert_skewed", "speedup", 2.0),
    ("spark-mor-bucket", "bulk_load", "speedup", 0.5),
    ("spark-mor-bloom", "upsert", "speedup", 1.0), ("spark-mor-bloom", "upsert_skewed", "speedup", 1.0),
    # the same upsert targets where upserts do not tell inserts from updates (`write.count_updates` false)
    ("inproc-mor-bucket-uncounted", "upsert", "speedup", 3.0),
    ("inproc-mor-bucket-uncounted", "upsert_skewed", "speedup", 3.0),
    ("spark-mor-bucket-uncounted", "upsert", "speedup", 2.0),
    ("spark-mor-bucket-uncounted", "upsert_skewed", "speedup", 2.0),
]


def default_buckets(scale_factor: float) -> int:
    """Buckets per partition when `--buckets` is not given: a file group of ~100k rows, as at SF 1 with 8
    buckets, and 8 at most (more add only parallelism that 2 cores do not have). A table is bucketed for its
    size (Hudi leaves the count to the user); 8 buckets at SF 0.01 make 56 file groups of ~1,000 rows, and
    an upsert then pays a file group's fixed costs (a log, a marker, a key read: ~9 ms of CPU) 56 times."""
    return max(1, min(8, round(8 * scale_factor)))


def verdict(scale_factor: float) -> None:
    for (system, step), r in sorted(RESULTS.items()):
        base = RESULTS.get(("delta", step))
        if system == "delta" or base is None:
            continue
        emit(ratio="delta/metatable seconds", system=system, step=step, value=round(base["seconds"] / r["seconds"], 2))
        if step.startswith("upsert"):
            emit(ratio="metatable/delta peak memory", system=system, step=step,
                 value=round(r["peak_rss_mb"] / base["peak_rss_mb"], 2))
            emit(target="upsert peak memory <= delta-rs's", system=system, step=step,
                 met=r["peak_rss_mb"] <= base["peak_rss_mb"])
    for system, step, _, bound in (SMALL_TARGETS if scale_factor < 0.1 else TARGETS):
        if (system, step) in RESULTS and ("delta", step) in RESULTS:
            value = RESULTS[("delta", step)]["seconds"] / RESULTS[(system, step)]["seconds"]
            emit(target=f"speedup over delta-rs >= {bound}", system=system, step=step, value=round(value, 2),
                 met=value >= bound)


def work_dir(args: argparse.Namespace) -> str:
    return os.path.join(args.workdir, f"peers-sf{args.scale_factor:g}" + (f"-b{args.batch_rows}" if args.batch_rows else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--systems", default=",".join(["delta", *SYSTEMS]), help=f"of delta, {', '.join(SYSTEMS)}")
    ap.add_argument("--buckets", type=int, help="buckets per partition (default: 8 from SF 1, fewer below)")
    ap.add_argument("--batch-rows", type=int, default=0, help="upsert batch size (default: 5%% of the table)")
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one system in this process (see below)
    args = ap.parse_args()
    systems = args.systems.split(",")
    args.buckets = args.buckets or default_buckets(args.scale_factor)
    unknown = set(systems) - {"delta", *SYSTEMS}
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}")
    if not args.one:
        # every system in a process of its own, so that its peak memory is its own (an Arrow memory pool
        # keeps what earlier systems freed); the data is prepared once, here
        os.makedirs(args.workdir, exist_ok=True)
        source = source_with_year(args.workdir, args.scale_factor)
        workdir = work_dir(args)
        os.makedirs(workdir, exist_ok=True)
        make_batches(source, workdir, args.batch_rows)
        emit(scale_factor=args.scale_factor, buckets=args.buckets, batch_rows=args.batch_rows or None)
        for system in systems:
            run = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", system], stdout=subprocess.PIPE,
                                 text=True)
            for line in run.stdout.splitlines():
                print(line, flush=True)
                record = json.loads(line)
                if "seconds" in record:
                    RESULTS[(record["system"], record["step"])] = {"seconds": record["seconds"],
                                                                   "peak_rss_mb": record["peak_rss_mb"]}
            check(run.returncode == 0, f"{system} exited with {run.returncode}")
        verdict(args.scale_factor)
        return
    systems = [args.one]
    os.makedirs(args.workdir, exist_ok=True)
    source = source_with_year(args.workdir, args.scale_factor)
    workdir = work_dir(args)
    os.makedirs(workdir, exist_ok=True)
    batches = make_batches(source, workdir, args.batch_rows)
    keys_path, expected = sample_keys(source, batches, 1000, workdir)
    spark = None
    if any(SYSTEMS[s][0] == "spark" for s in systems if s in SYSTEMS):
        spark = mt.spark_session(app_name="metatable-peers", shuffle_partitions=8,
                                 **{"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        warm_up(spark, spark.read.parquet(source), workdir)  # the JVM and Python workers start before any clock
    if "delta" in systems:
        bench_delta(source, batches, keys_path, expected, workdir)
    for system in systems:
        if system != "delta":
            bench_metatable(system, source, batches, keys_path, expected, workdir, spark, args.buckets)
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
