"""Secondary indexes on TPC-H lineitem (issue 39), beside delta-rs on the same data in the same run.

Tables: lineitem by ship year, merge-on-read, bucket index (the demo's layout), loaded in-process; delta-rs
partitioned alike. Steps, each verified (every query's rows equal a filter of the source file):

- build: `schedule_indexing(secondary={"by_part": ["l_partkey"], "by_supp_date": ["l_suppkey", "l_shipdate"]})`
  then `run_indexing()`, in a fresh process (`build_scale`: that process's peak resident memory, as the issue
  compares it between scale factors; `--build-only` stops there);
- query_part: `get_by("by_part", [v])` for `--queries` values of l_partkey (about 30 rows each at SF 1), in a
  fresh process (opening the table included) and then warm in the same process; query_supp_date: the same for
  (l_suppkey, l_shipdate) pairs;
- the same queries as filters: metatable's `to_arrow(filter=...)` on the indexed table (`metatable-filter`:
  through the index), and without an index on the table without the indexes, and delta-rs's filtered read
  (`to_pyarrow_dataset().to_table(filter=...)`), on `--scan-queries` of the values (a scan costs the same
  whatever the value);
- bytes read by this process for each (`rchar` of /proc/self/io: page-cache hits included; with the bytes
  metatable read from memory-mapped files, `local.mapped_bytes_read`, which `rchar` does not count);
- upsert: the 5% batch of `peers.py` into the table with `by_part`, and into a copy without it;
- query_part_as_of_N_since: after N (100, then 1,000) of the batch's rows changed again in both,
  `to_arrow(as_of=the 5% upsert, filter=...)` on `--scan-queries` values, through the index of now and the
  records written since, and by stats on the table without it (the same rows, checked).

One JSON line per measurement, then `ratio` and `target` lines (the issue's targets).

    python benchmarks/secondary_index.py [--scale-factor 1] [--queries 100] [--scan-queries 5] [--build-only]
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
from metatable.demo import KEY  # noqa: E402

from peers import make_batches, source_with_year  # noqa: E402
from upsert import PeakRss  # noqa: E402

SECONDARY = {"by_part": ["l_partkey"], "by_supp_date": ["l_suppkey", "l_shipdate"]}
RESULTS: dict[tuple[str, str], dict] = {}

QUERY_SCRIPT = r"""
import json, os, sys, time
system, root, values_path, index, out_path = sys.argv[1:6]
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq


def bytes_read():
    with open("/proc/self/io") as f:
        read = int(next(line for line in f if line.startswith("rchar")).split()[1])
    if system == "delta":
        return read
    from metatable.storage.local import mapped_bytes_read
    return read + mapped_bytes_read()


values = pq.read_table(values_path)
columns = values.column_names
tuples = list(zip(*(values[c].to_pylist() for c in columns)))
if system == "delta":
    from deltalake import DeltaTable
    import pyarrow.fs as fs
    open_ = lambda: DeltaTable(root).to_pyarrow_dataset(
        filesystem=fs.SubTreeFileSystem(os.path.abspath(root), fs.LocalFileSystem()))
    def query(data, value):
        condition = None
        for c, v in zip(columns, value):
            term = pc.field(c) == pa.scalar(v, values.schema.field(c).type)
            condition = term if condition is None else condition & term
        return data.to_table(filter=condition)
else:
    from metatable import Table
    open_ = lambda: Table.open(root)
    if index == "scan":
        query = lambda t, value: t.to_arrow(filter=[(c, "==", v) for c, v in zip(columns, value)])
    else:
        query = lambda t, value: t.get_by(index, [value if len(value) > 1 else value[0]])
out = {}
for run in ("fresh", "warm"):
    read_before = bytes_read()
    started = time.perf_counter()
    data = open_()
    results = [query(data, value) for value in tuples]
    out[run] = {"seconds": time.perf_counter() - started, "bytes": bytes_read() - read_before}
pq.write_table(pa.concat_tables([r.select(sorted(r.column_names)) for r in results]), out_path)
print(json.dumps(out))
"""


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "secondary_index", **fields}), flush=True)


def measure(system: str, step: str, fn) -> object:
    PeakRss().settle()
    with PeakRss() as rss:
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
    RESULTS[(system, step)] = {"seconds": seconds, "peak_rss_mb": rss.peak / 2**20}
    emit(system=system, step=step, seconds=round(seconds, 3), peak_rss_mb=round(rss.peak / 2**20),
         start_rss_mb=round(rss.start / 2**20))
    return result


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"verification failed: {what}")


def queries(source: str, workdir: str, n: int) -> dict[str, str]:
    """`n` l_partkey values and `n` (l_suppkey, l_shipdate) pairs of existing rows, each in a Parquet file."""
    data = ds.dataset(source)
    rng = np.random.default_rng(5)
    picked = data.take(np.sort(rng.choice(data.count_rows(), n, replace=False)),
                       columns=["l_partkey", "l_suppkey", "l_shipdate"])
    out = {}
    for index, columns in SECONDARY.items():
        out[index] = os.path.join(workdir, f"values-{index}.parquet")
        pq.write_table(picked.select(columns), out[index])
    return out


def expected_rows(source: str, values_path: str) -> int:
    values = pq.read_table(values_path)
    data = pq.read_table(source, columns=values.column_names)
    return data.join(values, values.column_names, join_type="left semi").num_rows


def run_queries(system: str, root: str, values_path: str, index: str, workdir: str, source: str, step: str,
                limit: int | None = None) -> None:
    """The queries in a fresh process, then warm in it; verified against the source (no batch applied yet)."""
    if limit is not None:
        limited = os.path.join(workdir, f"values-{step}-{limit}.parquet")
        pq.write_table(pq.read_table(values_path).slice(0, limit), limited)
        values_path = limited
    out = os.path.join(workdir, f"rows-{system}-{step}.parquet")
    done = subprocess.run([sys.executable, "-c", QUERY_SCRIPT, system, root, values_path, index, out],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    check(done.returncode == 0, f"{system} {step}: {done.stderr[-2000:]}")
    found = pq.read_table(out).num_rows
    want = expected_rows(source, values_path)
    check(found == want, f"{system} {step}: {found} rows, expected {want}")
    timings = json.loads(done.stdout.strip().splitlines()[-1])
    count = pq.read_table(values_path).num_rows
    for run, t in timings.items():
        RESULTS[(system, f"{step}_{run}")] = {"per_query": t["seconds"] / count, "bytes": t["bytes"] / count}
        emit(system=system, step=f"{step}_{run}", queries=count, rows=found, seconds=round(t["seconds"], 3),
             per_query_ms=round(1000 * t["seconds"] / count, 2), bytes_per_query=round(t["bytes"] / count))


def build_in_a_fresh_process(root: str) -> int:
    """The build in a process of its own; returns that process's peak resident memory (bytes), which is the
    build's: the benchmark's own process holds what its loads left. Its `VmHWM`, not `getrusage`'s
    `ru_maxrss`, which after the exec still counts the forking process's (1.7 GB after an SF 1 load)."""
    script = ("import sys, metatable as mt; t = mt.Table.open(sys.argv[1]); "
              f"t.schedule_indexing(secondary={SECONDARY!r}); t.run_indexing(); "
              "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM')).split()[1])")
    done = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    check(done.returncode == 0, f"build: {done.stderr[-2000:]}")
    return int(done.stdout.split()[-1]) << 10  # Linux reports kilobytes


def query_as_of(plain: str, indexed: str, upserted: dict[str, str], batch: pa.Table, parts: pa.Array) -> None:
    """`to_arrow(as_of=, filter=)` as of each table's upsert, after 100 and then 1,000 of its rows changed again:
    through the index on `indexed`, by stats on `plain`; the same rows from both."""
    order = [(k, "ascending") for k in KEY]
    for changed in (100, 1000):
        again = batch.slice(0, changed)
        again = again.set_column(again.schema.get_field_index("l_comment"), "l_comment",
                                 pa.array([f"again {changed}"] * changed, again.schema.field("l_comment").type))
        step = f"query_part_as_of_{changed}_since"
        found = {}
        for system, root in (("metatable-scan", plain), ("metatable", indexed)):
            table = mt.Table.open(root)
            table.upsert(again)
            started = time.perf_counter()
            found[system] = [table.to_arrow(as_of=upserted[root], filter=[("l_partkey", "==", v)])
                             for v in parts.to_pylist()]
            seconds = time.perf_counter() - started
            RESULTS[(system, step)] = {"per_query": seconds / len(parts)}
            emit(system=system, step=step, queries=len(parts), rows=sum(t.num_rows for t in found[system]),
                 per_query_ms=round(1000 * seconds / len(parts), 2),
                 secondary_index=table.last_scan.get("secondary_index"))
        for scanned, through_index in zip(found["metatable-scan"], found["metatable"]):
            check(scanned.sort_by(order).equals(through_index.sort_by(order)), f"{step}: index and scan differ")
        scan, mine = (RESULTS[(system, step)]["per_query"] for system in ("metatable-scan", "metatable"))
        emit(ratio=step, against="metatable-scan", speedup=round(scan / mine, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale-factor", type=float, default=1.0)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--scan-queries", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--workdir", default="bench-data/secondary")
    parser.add_argument("--build-only", action="store_true",
                        help="load and build only (the build's memory at a scale factor, as the issue compares them)")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    source = source_with_year(args.workdir, args.scale_factor)
    batch_path = make_batches(source, args.workdir)["upsert"]
    values = queries(source, args.workdir, args.queries)
    schema = ds.dataset(source).schema

    indexed, plain = os.path.join(args.workdir, "indexed"), os.path.join(args.workdir, "plain")
    for root in (indexed,) if args.build_only else (indexed, plain):
        shutil.rmtree(root, ignore_errors=True)
        table = mt.Table.create(root, schema, KEY, ["ship_year"], index=mt.IndexConfig(num_buckets=args.buckets),
                                options={"clean.inline": False})
        measure("metatable", "bulk_load", lambda: table.bulk_insert(source))
    built_peak = measure("metatable", "build", lambda: build_in_a_fresh_process(indexed))
    emit(system="metatable", step="build_scale", rows=ds.dataset(source).count_rows(),
         scale_factor=args.scale_factor, build_process_peak_rss_mb=round(built_peak / 2**20))
    if args.build_only:
        return

    from deltalake import write_deltalake
    delta = os.path.join(args.workdir, "delta")
    shutil.rmtree(delta, ignore_errors=True)
    measure("delta", "bulk_load", lambda: write_deltalake(delta, ds.dataset(source).scanner().to_reader(),
                                                          partition_by=["ship_year"]))

    steps = {"by_part": "query_part", "by_supp_date": "query_supp_date"}
    for index, step in steps.items():
        run_queries("metatable", indexed, values[index], index, args.workdir, source, step)
        run_queries("metatable-filter", indexed, values[index], "scan", args.workdir, source, step)
        run_queries("metatable-scan", plain, values[index], "scan", args.workdir, source, step, args.scan_queries)
        run_queries("delta", delta, values[index], "scan", args.workdir, source, step, args.scan_queries)

    batch = pq.read_table(batch_path)
    only_part = os.path.join(args.workdir, "by_part_only")  # the plain table with one index, built
    shutil.rmtree(only_part, ignore_errors=True)
    shutil.copytree(plain, only_part)
    table = mt.Table.open(only_part)
    table.schedule_indexing(secondary={"by_part": ["l_partkey"]})
    table.run_indexing()
    upserted = {}
    for system, root in (("metatable", plain), ("metatable-by_part", only_part)):
        result = measure(system, "upsert", lambda root=root: mt.Table.open(root).upsert(batch))
        check(result.inserted + result.updated == batch.num_rows, f"{system} upsert counts")
        upserted[root] = result.instant
    updated = batch.slice(0, 20)  # the batch's rows are found by their parts, and no other version is
    got = mt.Table.open(only_part).get_by("by_part", updated["l_partkey"].to_pylist())
    want = pc.sum(pc.is_in(pq.read_table(source, columns=["l_partkey"])["l_partkey"], updated["l_partkey"])).as_py()
    parts = pc.is_in(batch["l_partkey"], updated["l_partkey"])
    new = pc.sum(pc.and_(parts, pc.equal(batch["l_comment"], "new"))).as_py()
    check(got.num_rows == want + new, f"get_by after the upsert: {got.num_rows} rows, expected {want + new}")
    query_as_of(plain, only_part, upserted, batch, pq.read_table(values["by_part"])["l_partkey"][:args.scan_queries])

    for step in steps.values():
        for run in ("fresh", "warm"):
            for system in ("metatable", "metatable-filter"):  # get_by, and to_arrow(filter=) through the index
                mine = RESULTS[(system, f"{step}_{run}")]
                for peer in ("metatable-scan", "delta"):
                    theirs = RESULTS[(peer, f"{step}_{run}")]
                    emit(ratio=f"{step}_{run}", system=system, against=peer,
                         speedup=round(theirs["per_query"] / mine["per_query"], 1),
                         bytes_fewer=round(1 - mine["bytes"] / max(theirs["bytes"], 1), 4))
    cost = RESULTS[("metatable-by_part", "upsert")]["seconds"] / RESULTS[("metatable", "upsert")]["seconds"]
    emit(ratio="upsert_with_by_part", cost=round(cost, 2))
    for step in steps.values():
        for run in ("fresh", "warm"):
            mine = RESULTS[("metatable", f"{step}_{run}")]["per_query"]
            scan, delta_ = (RESULTS[(p, f"{step}_{run}")]["per_query"] for p in ("metatable-scan", "delta"))
            emit(target=f"{step}_{run} >= 50x the filtered scan", met=scan / mine >= 50)
            emit(target=f"{step}_{run} >= 20x delta-rs", met=delta_ / mine >= 20)
            scan_bytes = RESULTS[("metatable-scan", f"{step}_{run}")]["bytes"]
            emit(target=f"{step}_{run} bytes >= 99% fewer than the scan",
                 met=RESULTS[("metatable", f"{step}_{run}")]["bytes"] <= 0.01 * scan_bytes)
    emit(target="upsert with one secondary index <= 1.3x", met=cost <= 1.3)


if __name__ == "__main__":
    main()
