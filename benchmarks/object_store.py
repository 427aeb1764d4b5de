"""metatable and delta-rs on the same S3 server in one run: time and requests by kind, step by step (issue 38).

The server is a local Ceph RGW (`devtools.local_s3`, started here unless AWS_ENDPOINT_URL names one), reached
by both systems through a proxy that counts every request by kind (`devtools.s3_proxy`: GET, GET_RANGE,
PUT, LIST, HEAD, DELETE, COPY, MULTIPART). Data: TPC-H lineitem with `ship_year` (as `peers.py`), partitioned
by it; metatable merge-on-read with a bucket index and the record index. Steps, each verified:

- bulk_load: the whole table from the local Parquet file;
- open: a fresh `Table.open` / `DeltaTable(uri)` (the table's latest state read);
- upsert: 5% of the rows (90% updates, 10% new keys); upsert_1000: 1,000 of them again (updates);
- delete: 1% of the keys;
- get_1000: full rows of 1,000 random keys (delta-rs: a filtered read, then the exact pairs), table open;
- lookup_1000: where the keys live, through the record index, its SSTs already in the local cache
  (metatable only: delta-rs has no index); `metadata_file_groups` says how many file groups it read;
- upsert_1000_warm (metatable only): the same 1,000 rows updated once more by the table that looked them up,
  which has read its record index: it asks the index which keys exist instead of reading the base files'
  keys (a writer that has not read it, as in upsert_1000, reads the slices);
- get_1000_fresh_process (metatable only): the same `get` by a new process, which opens the table and has
  read nothing: every request of that process (a reader: no capability check, which a process's first write
  makes);
- upsert_1000_fresh_process (metatable only): the 1,000 rows updated once more by a new process, which opens
  the table (and checks the store: `ObjectStorage.check`) and has read nothing: every request of that process
  (its inline compaction off: this fifth log of each file group makes one due, whose requests are not the
  upsert's);
- filtered_read: `ship_year = 1995 AND l_linenumber >= 6` (a partition and a column condition);
- compaction: `compact()` / `optimize.compact()`; clustering: `cluster(sort_columns=...)` /
  `optimize.z_order(...)`.

One JSON line per step and system (seconds, requests by kind), then `ratio` and `target` lines (the issue's
targets: upsert >= 3x faster than delta-rs; a 1,000-row upsert <= 30 requests, with the record index unread
and read, and in a new process (open included); the lookup <= 1 request per metadata file group read, no
LIST; the get reads only the file slices that hold the keys).

    python benchmarks/object_store.py [--scale-factors 0.1,1] [--workdir bench-data] [--trace upsert_1000]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import metatable as mt  # noqa: E402
from devtools import local_s3  # noqa: E402
from devtools.s3_proxy import S3Proxy  # noqa: E402
from metatable.demo import KEY  # noqa: E402

from peers import make_batches, same_rows, source_with_year  # noqa: E402

BUCKET = "bench"
KINDS = ("GET", "GET_RANGE", "PUT", "LIST", "HEAD", "DELETE", "COPY", "MULTIPART")
FILTER = (pc.field("ship_year") == 1995) & (pc.field("l_linenumber") >= 6)
RESULTS: dict[tuple[float, str, str], dict] = {}
FRESH_GET = """import json, sys
import pyarrow.parquet as pq
import metatable as mt
table = mt.Table.open(sys.argv[1], storage_options=json.loads(sys.argv[2]))
pq.write_table(table.get(pq.read_table(sys.argv[3])), sys.argv[4])
"""
FRESH_UPSERT = """import json, sys
import pyarrow.parquet as pq
import metatable as mt
table = mt.Table.open(sys.argv[1], storage_options=json.loads(sys.argv[2]), options={"compaction.mode": "off"})
print(table.upsert(pq.read_table(sys.argv[3])).updated)
"""


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "object_store", **fields}), flush=True)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"verification failed: {what}")


class Steps:
    """Runs and reports steps: the proxy's counts are reset before each and read after it."""

    def __init__(self, proxy: S3Proxy, scale_factor: float, trace: str | None = None) -> None:
        self.proxy = proxy
        self.scale_factor = scale_factor
        self.trace = trace  # a step whose requests are printed one by one

    def run(self, system: str, step: str, fn, **extra):
        self.proxy.reset()
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
        counts = self.proxy.counts()
        requests = {kind: counts.get(kind, 0) for kind in KINDS if counts.get(kind)}
        if step == self.trace and self.proxy.trace is not None:
            emit(scale_factor=self.scale_factor, system=system, step=step, trace=list(self.proxy.trace))
        record = {"scale_factor": self.scale_factor, "system": system, "step": step, "seconds": round(seconds, 3),
                  "requests": requests, "total_requests": sum(requests.values()), **extra}
        RESULTS[(self.scale_factor, system, step)] = record
        emit(**record)
        return result


def bench_metatable(steps: Steps, source: str, batches: dict[str, str], keys: pa.Table, expected: pa.Table,
                    doomed: pa.Table, root: str, options: dict[str, str], buckets: int) -> None:
    schema = ds.dataset(source).schema
    total = ds.dataset(source).count_rows()
    table = mt.Table.create(root, schema, KEY, ["ship_year"], index=mt.IndexConfig(num_buckets=buckets),
                            metadata_indexes=["column_stats", "record_index"], storage_options=options,
                            options={"clean.inline": False})
    result = steps.run("metatable", "bulk_load", lambda: table.bulk_insert(source))
    check(result.inserted == total, f"metatable loaded {result.inserted} of {total}")
    table = steps.run("metatable", "open", lambda: mt.Table.open(root, storage_options=options))
    batch, small = pq.read_table(batches["upsert"]), again(pq.read_table(batches["upsert"]))
    result = steps.run("metatable", "upsert", lambda: table.upsert(batch))
    check(result.inserted + result.updated == batch.num_rows, f"metatable upsert {result}")
    result = steps.run("metatable", "upsert_1000", lambda: table.upsert(small))
    check(result.updated == small.num_rows, f"metatable upsert_1000 {result}")
    result = steps.run("metatable", "delete", lambda: table.delete(doomed))
    check(result.deleted == doomed.num_rows, f"metatable deleted {result.deleted} of {doomed.num_rows}")
    fresh = mt.Table.open(root, storage_options=options)
    got = steps.run("metatable", "get_1000", lambda: fresh.get(keys))
    check(same_rows(got, expected), "metatable get returned other rows")
    with tempfile.TemporaryDirectory() as scratch:
        keys_path, rows_path = os.path.join(scratch, "keys.parquet"), os.path.join(scratch, "rows.parquet")
        pq.write_table(keys, keys_path)
        steps.run("metatable", "get_1000_fresh_process", lambda: subprocess.run(
            [sys.executable, "-c", FRESH_GET, root, json.dumps(options), keys_path, rows_path], check=True,
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}))
        check(same_rows(pq.read_table(rows_path), expected), "metatable get_1000_fresh_process returned other rows")
    fresh.lookup(keys)  # the record index's SSTs in the local cache: the next lookup is warm
    located = steps.run("metatable", "lookup_1000", lambda: fresh.lookup(keys))
    groups = fresh.metadata.partitions["record_index"]
    RESULTS[(steps.scale_factor, "metatable", "lookup_1000")]["metadata_file_groups"] = groups
    check(located["file_id"].null_count == keys.num_rows - expected.num_rows, "metatable lookup found other keys")
    warm = small.set_column(small.schema.get_field_index("l_comment"), "l_comment", pa.array(["warm"] * len(small)))
    result = steps.run("metatable", "upsert_1000_warm", lambda: fresh.upsert(warm))
    check(result.updated == warm.num_rows, f"metatable upsert_1000_warm {result}")
    with tempfile.TemporaryDirectory() as scratch:
        batch_path = os.path.join(scratch, "upsert_1000.parquet")
        pq.write_table(small.set_column(small.schema.get_field_index("l_comment"), "l_comment",
                                        pa.array(["fresh"] * len(small))), batch_path)
        out = steps.run("metatable", "upsert_1000_fresh_process", lambda: subprocess.run(
            [sys.executable, "-c", FRESH_UPSERT, root, json.dumps(options), batch_path], check=True,
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout)
    check(out.split() == [str(small.num_rows)], f"metatable upsert_1000_fresh_process updated {out}")
    rows = steps.run("metatable", "filtered_read", lambda: fresh.to_arrow(filter=[("ship_year", "==", 1995),
                                                                                  ("l_linenumber", ">=", 6)]))
    check(rows.num_rows == fresh.to_arrow().filter(FILTER).num_rows, "metatable filtered read")
    steps.run("metatable", "compaction", lambda: fresh.compact())
    steps.run("metatable", "clustering", lambda: fresh.cluster(sort_columns=["l_shipdate"]))
    check(mt.Table.open(root, storage_options=options).to_arrow().num_rows == total + new_keys(batch)
          - doomed.num_rows, "metatable rows after clustering")


def bench_delta(steps: Steps, source: str, batches: dict[str, str], keys: pa.Table, expected: pa.Table,
                doomed: pa.Table, root: str, options: dict[str, str]) -> None:
    from deltalake import DeltaTable, write_deltalake

    opts = {"AWS_ENDPOINT_URL": options["endpoint"], "AWS_ACCESS_KEY_ID": options["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": options["secret_access_key"], "AWS_REGION": options["region"],
            "AWS_ALLOW_HTTP": "true"}
    total = ds.dataset(source).count_rows()
    steps.run("delta", "bulk_load", lambda: write_deltalake(root, ds.dataset(source).scanner().to_reader(),
                                                            partition_by=["ship_year"], storage_options=opts))
    table = steps.run("delta", "open", lambda: DeltaTable(root, storage_options=opts))
    on_key = "t.l_orderkey = s.l_orderkey AND t.l_linenumber = s.l_linenumber"

    def upsert(rows: pa.Table) -> None:
        DeltaTable(root, storage_options=opts).merge(source=rows, source_alias="s", target_alias="t",
                                                     predicate=on_key) \
            .when_matched_update_all().when_not_matched_insert_all().execute()

    batch, small = pq.read_table(batches["upsert"]), again(pq.read_table(batches["upsert"]))
    steps.run("delta", "upsert", lambda: upsert(batch))
    steps.run("delta", "upsert_1000", lambda: upsert(small))
    steps.run("delta", "delete", lambda: DeltaTable(root, storage_options=opts).merge(
        source=doomed, source_alias="s", target_alias="t", predicate=on_key + " AND t.ship_year = s.ship_year")
        .when_matched_delete().execute())

    def get() -> pa.Table:
        data = DeltaTable(root, storage_options=opts).to_pyarrow_dataset()
        rows = data.to_table(filter=pc.field("l_orderkey").isin(keys["l_orderkey"].unique()))
        return rows.join(keys.select(KEY), KEY, join_type="inner")

    check(same_rows(steps.run("delta", "get_1000", get), expected), "delta get returned other rows")
    rows = steps.run("delta", "filtered_read",
                     lambda: DeltaTable(root, storage_options=opts).to_pyarrow_dataset().to_table(filter=FILTER))
    check(rows.num_rows == DeltaTable(root, storage_options=opts).to_pyarrow_dataset().to_table().filter(
        FILTER).num_rows, "delta filtered read")
    steps.run("delta", "compaction", lambda: DeltaTable(root, storage_options=opts).optimize.compact())
    steps.run("delta", "clustering", lambda: DeltaTable(root, storage_options=opts).optimize.z_order(["l_shipdate"]))
    check(DeltaTable(root, storage_options=opts).to_pyarrow_dataset().count_rows() == total + new_keys(batch)
          - doomed.num_rows, "delta rows after clustering")
    del table


def again(batch: pa.Table) -> pa.Table:
    """1,000 of the batch's updates, updated again."""
    small = batch.filter(pc.equal(batch["l_comment"], "updated")).slice(0, 1000)
    return small.set_column(small.schema.get_field_index("l_comment"), "l_comment",
                            pa.array(["again"] * small.num_rows))


def sample(source: str, batch: pa.Table, small: pa.Table, doomed: pa.Table, n: int) -> tuple[pa.Table, pa.Table]:
    """`n` random keys of the table (with their partition column), and the rows they hold after the upsert,
    the 1,000-row upsert and the delete (a deleted key has none)."""
    data = ds.dataset(source)
    picked = data.take(np.sort(np.random.default_rng(7).choice(data.count_rows(), n, replace=False)))
    expected = picked
    for rows in (batch, small):
        updated = rows.cast(picked.schema).join(picked.select(KEY), KEY, join_type="left semi")
        kept = expected.join(updated.select(KEY), KEY, join_type="left anti")
        expected = pa.concat_tables([kept.select(picked.column_names), updated.select(picked.column_names)])
    expected = expected.join(doomed.select(KEY), KEY, join_type="left anti").select(picked.column_names)
    return picked.select([*KEY, "ship_year"]), expected


def new_keys(batch: pa.Table) -> int:
    return pc.sum(pc.equal(batch["l_comment"], "new")).as_py()


def doomed_keys(source: str, batch: pa.Table, share: float) -> pa.Table:
    """`share` of the table's keys (none the upsert touches), with their partition column."""
    data = ds.dataset(source).to_table(columns=[*KEY, "ship_year"])
    data = data.join(batch.select(KEY), KEY, join_type="left anti")
    picks = np.sort(np.random.default_rng(11).choice(data.num_rows, int(share * data.num_rows), replace=False))
    return data.take(pa.array(picks))


def verdict(scale_factor: float) -> None:
    def got(system: str, step: str) -> dict | None:
        return RESULTS.get((scale_factor, system, step))

    for step in ("bulk_load", "open", "upsert", "upsert_1000", "delete", "get_1000", "filtered_read", "compaction",
                 "clustering"):
        ours, theirs = got("metatable", step), got("delta", step)
        if ours and theirs:
            emit(scale_factor=scale_factor, ratio="delta/metatable seconds", step=step,
                 value=round(theirs["seconds"] / max(ours["seconds"], 1e-6), 2),
                 requests={"metatable": ours["total_requests"], "delta": theirs["total_requests"]})
    upsert, theirs = got("metatable", "upsert"), got("delta", "upsert")
    if upsert and theirs:
        speedup = theirs["seconds"] / upsert["seconds"]
        emit(scale_factor=scale_factor, target="upsert >= 3x faster than delta-rs", value=round(speedup, 2),
             met=speedup >= 3)
    for step, which in (("upsert_1000", "record index unread"), ("upsert_1000_warm", "record index read"),
                        ("upsert_1000_fresh_process", "a new process, open included")):
        small = got("metatable", step)
        if small:
            emit(scale_factor=scale_factor, target=f"1,000-row upsert <= 30 requests ({which})",
                 value=small["total_requests"], met=small["total_requests"] <= 30)
    lookup = got("metatable", "lookup_1000")
    if lookup:
        groups = lookup.get("metadata_file_groups") or 0
        emit(scale_factor=scale_factor, target="warm lookup <= 1 request per metadata file group, no LIST",
             value=lookup["requests"], metadata_file_groups=groups,
             met=lookup["total_requests"] <= groups and not lookup["requests"].get("LIST"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factors", default="0.1,1")
    ap.add_argument("--buckets", type=int, help="buckets per partition (default: 8 at SF 1, fewer below)")
    ap.add_argument("--systems", default="metatable,delta")
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--trace", help="a step whose requests to print one by one (kind and target), e.g. upsert_1000")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    server = None
    if os.environ.get("AWS_ENDPOINT_URL"):
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        options = {"endpoint": endpoint, "access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
                   "secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
                   "region": os.environ.get("AWS_REGION", "us-east-1")}
    else:
        server = local_s3.start(memory_bytes=12 << 30)
        endpoint, options = server.endpoint, server.storage_options
    try:
        local_s3.create_bucket(options, BUCKET)
        proxy = S3Proxy(endpoint, trace=[] if args.trace else None).start()
        options = {**options, "endpoint": proxy.endpoint}
        for scale_factor in [float(s) for s in args.scale_factors.split(",")]:
            run_scale(scale_factor, args, options, proxy)
        proxy.stop()
    finally:
        if server is not None:
            server.stop()


def run_scale(scale_factor: float, args: argparse.Namespace, options: dict[str, str], proxy: S3Proxy) -> None:
    source = source_with_year(args.workdir, scale_factor)
    workdir = os.path.join(args.workdir, f"object-store-sf{scale_factor:g}")
    os.makedirs(workdir, exist_ok=True)
    batches = make_batches(source, workdir)
    batch = pq.read_table(batches["upsert"])
    doomed = doomed_keys(source, batch, 0.01)
    keys, expected = sample(source, batch, again(batch), doomed, min(1000, ds.dataset(source).count_rows() // 10))
    buckets = args.buckets or max(1, min(8, round(8 * scale_factor)))
    prefix = f"s3://{BUCKET}/sf{scale_factor:g}-{time.time_ns()}"
    emit(scale_factor=scale_factor, buckets=buckets, rows=ds.dataset(source).count_rows())
    steps = Steps(proxy, scale_factor, args.trace)
    if "metatable" in args.systems:
        bench_metatable(steps, source, batches, keys, expected, doomed, f"{prefix}/metatable", options, buckets)
    if "delta" in args.systems:
        bench_delta(steps, source, batches, keys, expected, doomed, f"{prefix}/delta", options)
    verdict(scale_factor)


if __name__ == "__main__":
    main()
