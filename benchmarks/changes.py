"""Incremental reads (issue 40): `Table.changes()` over the last commits of a table, against a full-snapshot
diff and against delta-rs's change data feed, on the same data in one run.

Data: TPC-H lineitem with `ship_year` (as `peers.py`), partitioned by it. Then 20 upserts of the same batch
size at every scale factor (0.5% of SF 1's rows: ~30,000; 90% updates of random existing keys, 10% new keys),
each a commit. Then the changes of the last 5 commits, read three ways:
- `metatable`: `Table.changes(start)` (merge-on-read, bucket index): the keys the 5 commits' logs hold, their
  rows as of start from the before-images the writes kept (`changes.before_images`, as Delta's table below
  keeps its change data; `--before-images off`: read from the table's pages as of start), and as of end
  merged from the logs (`read.changes`);
- `metatable_every_version`: `Table.changes(start, every_version=True)`: each write's own change records,
  the change files the writes kept beside their before-images (one per write), as Delta's feed gives them;
  checked against the net changes (the first and last row of each record);
- `snapshot_diff`: what a user without change records does: the snapshot as of start and the latest, both read
  whole (`to_arrow`), compared by key (the same vectorized comparison `changes` uses);
- `delta`: delta-rs `load_cdf(starting_version, ending_version)` of a table written with
  `delta.enableChangeDataFeed` by the same upserts (`merge`), read into Arrow. Delta writes the change
  records during each merge (its `_change_data` files); it gives every version, not the net change.
The metatable result is checked against the snapshot diff, record for record.

The 20 upserts are timed too (`upserts`), on each system: what keeping the change data costs the writes.

One JSON line per measurement, then `ratio` and `target` lines: >= 10x faster than the snapshot diff, faster
than delta-rs, and a cost that follows the changed rows, not the table (SF 3 against SF 1 with the same batch).

    python benchmarks/changes.py [--scale-factors 1,3] [--workdir bench-data] [--before-images on|off]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
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
from metatable.read.changes import rows_differ  # noqa: E402

from peers import default_buckets, source_with_year  # noqa: E402

UPSERTS, WINDOW = 20, 5
SF1_ROWS = 6_001_215
RESULTS: dict[tuple[float, str], float] = {}


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "changes", **fields}), flush=True)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"verification failed: {what}")


def timed(scale_factor: float, system: str, fn, **extra):
    started = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - started
    RESULTS[(scale_factor, system)] = seconds
    emit(scale_factor=scale_factor, system=system, seconds=round(seconds, 3), **extra)
    return result


def make_batches(source: str, workdir: str, scale_factor: float, rows: int) -> list[str]:
    """`UPSERTS` batches of `rows` rows each: 90% updates of random existing keys (quantity and comment
    changed), 10% new keys; written once, read by both systems."""
    paths = [os.path.join(workdir, f"changes-sf{scale_factor:g}-{n}.parquet") for n in range(UPSERTS)]
    if all(os.path.exists(p) for p in paths):
        return paths
    data = ds.dataset(source)
    total = data.count_rows()
    max_order = pc.max(data.to_table(columns=["l_orderkey"])["l_orderkey"]).as_py()
    rng = np.random.default_rng(11)
    rows = min(rows, total // 10)  # a small scale factor's smoke run
    for n, path in enumerate(paths):
        picked = data.take(np.sort(rng.choice(total, rows, replace=False)))
        new = rng.random(rows) >= 0.9
        orderkey = picked["l_orderkey"].to_numpy() + np.where(new, max_order * (n + 1), 0)
        picked = picked.set_column(0, "l_orderkey", pa.array(orderkey, pa.int64()))
        comment = picked.schema.get_field_index("l_comment")
        picked = picked.set_column(comment, "l_comment", pa.array([f"upsert {n}"] * rows, pa.string()))
        quantity = picked.schema.get_field_index("l_quantity")
        picked = picked.set_column(quantity, "l_quantity", pc.add(picked["l_quantity"], pa.scalar(
            n + 1, picked["l_quantity"].type)).cast(picked["l_quantity"].type))
        pq.write_table(picked.cast(data.schema), path)
    return paths


def snapshot_diff(table: mt.Table, start: str) -> pa.Table:
    """The changes as the difference of two whole snapshots, by key: (inserted, deleted, updated) counts and the
    changed rows."""
    before, after = table.to_arrow(as_of=start), table.to_arrow()

    def ids(t: pa.Table) -> pa.Array:
        return pc.binary_join_element_wise(pc.cast(t["l_orderkey"], pa.string()),
                                           pc.cast(t["l_linenumber"], pa.string()), ":").combine_chunks()
    b_ids, a_ids = ids(before), ids(after)
    at = pc.index_in(a_ids, value_set=b_ids)
    matched = pc.is_valid(at)
    inserted = after.filter(pc.invert(matched))
    deleted = before.filter(pc.invert(pc.is_in(b_ids, value_set=a_ids)))
    both_after = after.filter(matched)
    both_before = before.take(at.filter(matched))
    differs = pa.array(rows_differ(both_after, both_before))
    return pa.concat_tables([
        inserted.append_column("_change_type", pa.repeat(pa.scalar("insert"), inserted.num_rows)),
        deleted.append_column("_change_type", pa.repeat(pa.scalar("delete"), deleted.num_rows)),
        both_before.filter(differs).append_column("_change_type", pa.repeat(
            pa.scalar("update_preimage"), pc.sum(differs).as_py() or 0)),
        both_after.filter(differs).append_column("_change_type", pa.repeat(
            pa.scalar("update_postimage"), pc.sum(differs).as_py() or 0))])


def comparable(changes: pa.Table) -> list[tuple]:
    columns = [c for c in changes.column_names if c not in ("_commit_instant", "_commit_seq")]
    return sorted(tuple(r.values()) for r in changes.select(columns).to_pylist())


def ends(changes: pa.Table) -> dict[tuple, tuple]:
    """Per record, from change records in the order they were made (every version, or the net change): its row
    before its first change (None: absent) and after its last, for the records whose rows differ."""
    columns = [c for c in changes.column_names if not c.startswith("_")]
    first, last = {}, {}
    for row in changes.to_pylist():
        key, kind = (row["l_orderkey"], row["l_linenumber"]), row["_change_type"]
        values = tuple(row[c] for c in columns)
        first.setdefault(key, None if kind == "insert" else values)
        if kind != "update_preimage":
            last[key] = None if kind == "delete" else values
    return {key: (was, last[key]) for key, was in first.items() if was != last[key]}


def bench(scale_factor: float, workdir: str, with_delta: bool, before_images: bool) -> None:
    source = source_with_year(workdir, scale_factor)
    batch_rows = int(SF1_ROWS * 0.005)
    batches = make_batches(source, workdir, scale_factor, batch_rows)
    root = os.path.join(workdir, f"changes-metatable-sf{scale_factor:g}")
    shutil.rmtree(root, ignore_errors=True)
    table = mt.Table.create(root, ds.dataset(source).schema, KEY, ["ship_year"],
                            index=mt.IndexConfig(num_buckets=default_buckets(scale_factor)),
                            options={"clean.retain_commits": 30, "changes.before_images": before_images})
    table.bulk_insert(source)
    instants = timed(scale_factor, "metatable_upserts", lambda: [table.upsert(pq.read_table(path)).instant
                                                                 for path in batches])
    start = instants[-WINDOW - 1]
    rows = timed(scale_factor, "metatable", lambda: table.changes(start))
    emit(scale_factor=scale_factor, system="metatable", change_records=rows.num_rows,
         table_rows=table.to_arrow(columns=["l_orderkey"]).num_rows)
    feed = timed(scale_factor, "metatable_every_version", lambda: table.changes(start, every_version=True))
    emit(scale_factor=scale_factor, system="metatable_every_version", change_records=feed.num_rows)
    diff = timed(scale_factor, "snapshot_diff", lambda: snapshot_diff(table, start))
    check(comparable(rows) == comparable(diff), "changes() and the snapshot diff differ")
    check(ends(feed) == ends(rows), "every version, collapsed per record, differs from the net changes")
    check(set(pc.unique(rows["_commit_instant"]).to_pylist()) <= set(instants[-WINDOW:]), "commit instants")
    if with_delta:
        bench_delta(scale_factor, workdir, source, batches, rows.num_rows)


def bench_delta(scale_factor: float, workdir: str, source: str, batches: list[str], ours: int) -> None:
    from deltalake import DeltaTable, write_deltalake

    root = os.path.join(workdir, f"changes-delta-sf{scale_factor:g}")
    shutil.rmtree(root, ignore_errors=True)
    write_deltalake(root, ds.dataset(source).scanner().to_reader(), partition_by=["ship_year"],
                    configuration={"delta.enableChangeDataFeed": "true"})

    def merges() -> None:
        for path in batches:
            (DeltaTable(root).merge(source=pq.read_table(path), source_alias="s", target_alias="t",
                                    predicate="t.l_orderkey = s.l_orderkey AND t.l_linenumber = s.l_linenumber")
             .when_matched_update_all().when_not_matched_insert_all().execute())
    timed(scale_factor, "delta_upserts", merges)
    version = DeltaTable(root).version()

    def read_cdf() -> pa.Table:
        return pa.table(DeltaTable(root).load_cdf(starting_version=version - WINDOW + 1,
                                                  ending_version=version).read_all())
    feed = timed(scale_factor, "delta_cdf", read_cdf)
    emit(scale_factor=scale_factor, system="delta_cdf", change_records=feed.num_rows,
         note="every version of each changed row (no net change); metatable gives " + str(ours))


def verdict(scale_factors: list[float]) -> None:
    for sf in scale_factors:
        for ours in ("metatable", "metatable_every_version"):
            for peer, bound in (("snapshot_diff", 10.0), ("delta_cdf", 1.0)):
                if (sf, peer) in RESULTS:
                    value = RESULTS[(sf, peer)] / RESULTS[(sf, ours)]
                    emit(ratio=f"{peer}/{ours} seconds", scale_factor=sf, value=round(value, 2))
                    emit(target=f"speedup of {ours} over {peer} >= {bound}", scale_factor=sf, value=round(value, 2),
                         met=value >= bound)
        if (sf, "delta_upserts") in RESULTS:
            emit(ratio="delta_upserts/metatable_upserts seconds (the 20 writes)", scale_factor=sf,
                 value=round(RESULTS[(sf, "delta_upserts")] / RESULTS[(sf, "metatable_upserts")], 2))
    if len(scale_factors) > 1:
        small, large = min(scale_factors), max(scale_factors)
        table_growth = large / small
        for ours in ("metatable", "metatable_every_version"):
            growth = RESULTS[(large, ours)] / RESULTS[(small, ours)]
            emit(ratio=f"{ours} seconds, largest over smallest scale factor", value=round(growth, 2),
                 table_growth=table_growth)
            emit(target=f"{ours} cost follows the changed rows (same batch): grows < half as fast as the table",
                 value=round(growth, 2), met=growth < 1 + (table_growth - 1) / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale-factors", default="1,3")
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--no-delta", action="store_true", help="metatable and the snapshot diff only")
    parser.add_argument("--before-images", choices=("on", "off"), default="on",
                        help="whether metatable's writes keep before-images (changes.before_images)")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    scale_factors = [float(s) for s in args.scale_factors.split(",")]
    for sf in scale_factors:
        bench(sf, args.workdir, not args.no_delta, args.before_images == "on")
    verdict(scale_factors)


if __name__ == "__main__":
    main()
