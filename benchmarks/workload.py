"""metatable beside delta-rs on the shape users have (issue 42): many date partitions, a timestamp ordering
field, small mixed batches spread over every day, then point reads, a full read and a one-day read.

The data is generated here (not TPC-H): an `orders` table of `--rows` orders keyed by `order_id`,
partitioned by `order_date` over `--days` days, ordered by `updated_at` (a UTC timestamp). Then `--batches`
change batches, each of `--updates` updates of random live orders (a later `updated_at`, a new status and
amount), `--inserts` new orders on random days and `--deletes` deletes of random live orders, spread over
every day. metatable applies each batch as one `Table.apply_changes` (merge-on-read, bucket index,
`--buckets` buckets per day, so days x buckets file groups); delta-rs as one `merge` (delete when the change
says so, update when the change's `updated_at` is later, insert the rest), both in-process from pyarrow.
After the batches both must equal the expected state, which is computed apart from either, in numpy.

Steps, one JSON line each (seconds; rows): `load`, `batches` (all of them: total, first, last, slowest),
`full_read`, `day_read` (a filter on one `order_date`), `get_1000` (full rows of 1,000 live orders:
metatable's `get`, delta-rs an `isin` scan), `get_1000_new_process` (the same in a new process: the table's
open and the read, timed in that process after its imports, as the issue's target asks), `new_process_batch`
(one more batch, applied by a new process as a scheduled job applies its batch: the open and the write, timed
the same way) and `full_read_after` (the full read again: on metatable every file group now has a log to merge), then
`ratio` lines (delta-rs's time over metatable's: above 1, metatable is faster) and `target` lines (issue
42's acceptance, met or not).

    python benchmarks/workload.py [--rows 1500000] [--days 120] [--batches 20] [--systems metatable,delta]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402

SCHEMA = pa.schema([("order_id", pa.int64()), ("order_date", pa.date32()), ("updated_at", pa.timestamp("us", "UTC")),
                    ("customer_id", pa.int64()), ("status", pa.string()), ("amount", pa.float64()),
                    ("comment", pa.string())])
STATUSES = np.array(["open", "paid", "shipped", "delivered", "returned"], dtype=object)
FIRST_DAY = dt.date(2026, 1, 1)
EPOCH_US = int(dt.datetime(2026, 6, 1, tzinfo=dt.timezone.utc).timestamp() * 1_000_000)
RESULTS: dict[tuple[str, str], float] = {}


def emit(**fields: Any) -> None:
    print(json.dumps({"benchmark": "workload", **fields}), flush=True)


def timed(system: str, step: str, rows: int, fn: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - started
    RESULTS[(system, step)] = seconds
    emit(system=system, step=step, rows=rows, seconds=round(seconds, 3))
    return result


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"verification failed: {what}")


# -- the data and the expected state -----------------------------------------------------------------------
class Orders:
    """Every order ever written, as numpy columns indexed by `order_id`, with a live flag: the expected state,
    kept apart from both systems."""

    def __init__(self, rows: int, days: int, capacity: int, rng: np.random.Generator) -> None:
        self.rng, self.days, self.size = rng, days, rows
        self.live = np.zeros(capacity, dtype=bool)
        self.day = np.zeros(capacity, dtype=np.int32)
        self.updated = np.zeros(capacity, dtype=np.int64)
        self.customer = np.zeros(capacity, dtype=np.int64)
        self.status = np.zeros(capacity, dtype=np.int8)
        self.amount = np.zeros(capacity, dtype=np.float64)
        self._new(np.arange(rows), 0)

    def _new(self, ids: np.ndarray, clock: int) -> None:
        n = len(ids)
        self.live[ids] = True
        self.day[ids] = self.rng.integers(0, self.days, n)
        self.updated[ids] = EPOCH_US + clock * 1_000_000 + self.rng.integers(0, 1_000_000, n)
        self.customer[ids] = self.rng.integers(0, 200_000, n)
        self.status[ids] = 0
        self.amount[ids] = np.round(self.rng.uniform(1, 5_000, n), 2)

    def rows(self, ids: np.ndarray) -> pa.Table:
        dates = pa.array(np.datetime64(FIRST_DAY, "D") + self.day[ids], pa.date32())
        return pa.table([pa.array(ids, pa.int64()), dates, pa.array(self.updated[ids], pa.timestamp("us", "UTC")),
                         pa.array(self.customer[ids]), pa.array(STATUSES[self.status[ids]], pa.string()),
                         pa.array(self.amount[ids]),
                         pc.binary_join_element_wise("order ", pc.cast(pa.array(ids), pa.string()), "")],
                        schema=SCHEMA)

    def batch(self, number: int, updates: int, inserts: int, deletes: int) -> pa.Table:
        """One change batch with an `op` column ("u", "i", "d"), applied to the expected state."""
        live = np.flatnonzero(self.live[:self.size])
        chosen = self.rng.choice(live, updates + deletes, replace=False)
        updated, deleted = chosen[:updates], chosen[updates:]
        clock = 1_000 * (number + 1)
        self.updated[updated] = EPOCH_US + clock * 1_000_000 + self.rng.integers(0, 1_000_000, updates)
        self.status[updated] = self.rng.integers(1, len(STATUSES), updates)
        self.amount[updated] = np.round(self.rng.uniform(1, 5_000, updates), 2)
        new = np.arange(self.size, self.size + inserts)
        self.size += inserts
        self._new(new, clock)
        deleted_rows = self.rows(deleted)
        self.live[deleted] = False
        parts = [(self.rows(updated), "u"), (self.rows(new), "i"), (deleted_rows, "d")]
        batch = pa.concat_tables([t.append_column("op", pa.repeat(pa.scalar(op), t.num_rows)) for t, op in parts])
        return batch.take(pa.array(self.rng.permutation(batch.num_rows)))

    def expected(self) -> pa.Table:
        return self.rows(np.flatnonzero(self.live[:self.size]))


def same_rows(got: pa.Table, expected: pa.Table) -> bool:
    got = got.select(expected.column_names).cast(expected.schema).sort_by("order_id")
    return got.num_rows == expected.num_rows and got.equals(expected.sort_by("order_id"))


# -- the systems -----------------------------------------------------------------------------------------------
class Metatable:
    name = "metatable"

    def __init__(self, table: mt.Table) -> None:
        self.table = table

    @classmethod
    def create(cls, root: str, buckets: int, options: dict[str, Any]) -> Metatable:
        return cls(mt.Table.create(root, SCHEMA, "order_id", "order_date", "updated_at", table_type="merge_on_read",
                                   index=mt.IndexConfig(num_buckets=buckets), options=options))

    @classmethod
    def open(cls, root: str) -> Metatable:
        return cls(mt.Table.open(root))

    def load(self, rows: pa.Table) -> None:
        self.table.bulk_insert(rows)

    def apply(self, batch: pa.Table) -> None:
        self.table.apply_changes(batch, "op", ["d"])

    def read(self, filter: Any = None) -> pa.Table:
        table = mt.Table.open(self.table.path)
        rows = table.to_arrow(filter=filter)
        self.last_scan = table.last_scan
        return rows

    def get(self, ids: pa.Array) -> pa.Table:
        return mt.Table.open(self.table.path).get(pa.table({"order_id": ids}))


class Delta:
    name = "delta"

    def __init__(self, root: str) -> None:
        self.root = root

    @classmethod
    def create(cls, root: str, buckets: int, options: dict[str, Any]) -> Delta:
        return cls(root)

    @classmethod
    def open(cls, root: str) -> Delta:
        return cls(root)

    def load(self, rows: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.root, rows, partition_by=["order_date"])

    def apply(self, batch: pa.Table) -> None:
        from deltalake import DeltaTable

        (DeltaTable(self.root).merge(source=batch, source_alias="s", target_alias="t",
                                     predicate="t.order_id = s.order_id AND t.order_date = s.order_date")
         .when_matched_delete(predicate="s.op = 'd'")
         .when_matched_update(predicate="s.op <> 'd' AND s.updated_at > t.updated_at",
                              updates={c: f"s.{c}" for c in SCHEMA.names})
         .when_not_matched_insert(predicate="s.op <> 'd'", updates={c: f"s.{c}" for c in SCHEMA.names})
         .execute())

    def _dataset(self) -> Any:
        from deltalake import DeltaTable
        import pyarrow.fs as fs

        # a native file system: the default Python one is slower (clustering.py)
        return DeltaTable(self.root).to_pyarrow_dataset(
            filesystem=fs.SubTreeFileSystem(os.path.abspath(self.root), fs.LocalFileSystem()))

    def read(self, filter: Any = None) -> pa.Table:
        expression = None if filter is None else pc.field(filter[0][0]) == filter[0][2]
        return self._dataset().to_table(filter=expression)

    def get(self, ids: pa.Array) -> pa.Table:
        return self._dataset().to_table(filter=pc.field("order_id").isin(ids))


SYSTEMS: dict[str, tuple[type, dict[str, Any]]] = {
    "metatable": (Metatable, {}),
    "metatable-compact4": (Metatable, {"compaction.inline_every": 4}),
    "delta": (Delta, {}),
}


def run(system: str, args: argparse.Namespace, workdir: str) -> None:
    kind, options = SYSTEMS[system]
    root = os.path.join(workdir, system)
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(args.seed)  # every system gets the same data
    capacity = args.rows + (args.batches + 1) * args.inserts
    orders = Orders(args.rows, args.days, capacity, rng)
    target = kind.create(root, args.buckets, options)
    initial = orders.expected()
    timed(system, "load", initial.num_rows, lambda: target.load(initial))
    batches = [orders.batch(i, args.updates, args.inserts, args.deletes) for i in range(args.batches)]
    seconds = []
    for batch in batches:
        started = time.perf_counter()
        target.apply(batch)
        seconds.append(time.perf_counter() - started)
    RESULTS[(system, "batches")] = sum(seconds)
    emit(system=system, step="batches", rows=sum(b.num_rows for b in batches), seconds=round(sum(seconds), 3),
         first=round(seconds[0], 3), last=round(seconds[-1], 3), slowest=round(max(seconds), 3),
         each=[round(x, 2) for x in seconds])
    expected = orders.expected()
    full = timed(system, "full_read", expected.num_rows, target.read)
    check(same_rows(full, expected), f"{system}: the full read differs from the expected state")
    day = FIRST_DAY + dt.timedelta(days=args.days // 2)
    one_day = expected.filter(pc.equal(expected["order_date"], pa.scalar(day, pa.date32())))
    got = timed(system, "day_read", one_day.num_rows, lambda: target.read([("order_date", "==", day)]))
    check(same_rows(got, one_day), f"{system}: the one-day read differs")
    if isinstance(target, Metatable):
        scan = target.last_scan
        emit(kind="target", system=system, what="a one-day filter reads only that day's slices",
             met=scan["partitions_skipped"] == args.days - 1 and scan["file_slices"] - scan["skipped"] <= args.buckets,
             last_scan=scan)
    ids = pa.array(np.sort(rng.choice(expected["order_id"].to_numpy(), 1000, replace=False)))
    wanted = expected.filter(pc.is_in(expected["order_id"], value_set=ids))
    got = timed(system, "get_1000", wanted.num_rows, lambda: target.get(ids))
    check(same_rows(got, wanted), f"{system}: get returned other rows")
    got = in_a_new_process("get_1000_new_process", system, root, pa.table({"order_id": ids}), workdir)
    check(same_rows(got, wanted), f"{system}: get in a new process returned other rows")
    last = orders.batch(args.batches, args.updates, args.inserts, args.deletes)
    in_a_new_process("new_process_batch", system, root, last, workdir)
    expected = orders.expected()
    full = timed(system, "full_read_after", expected.num_rows, target.read)
    check(same_rows(full, expected), f"{system}: the full read after the last batch differs")


def in_a_new_process(step: str, system: str, root: str, data: pa.Table, workdir: str) -> pa.Table | None:
    """`step` run by a new process (`step_in_this_process`) on `data`: a batch it applies, or the keys it gets.
    Emits the seconds that process took for the table's open and the step, and returns what the step read."""
    path = os.path.join(workdir, f"{system}-{step}.parquet")
    out = path + ".out"
    pq.write_table(data, path)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--in-new-process", step, system, root, path,
                           out], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{system}: {step} in a new process failed:\n{done.stderr[-3000:]}")
    RESULTS[(system, step)] = seconds = float(done.stdout.split()[-1])
    emit(system=system, step=step, rows=data.num_rows, seconds=round(seconds, 3))
    return pq.read_table(out) if os.path.exists(out) else None


def step_in_this_process(step: str, system: str, root: str, path: str, out: str) -> None:
    """The child of `in_a_new_process`: prints the seconds of the open and the step, its imports done (reading
    the input imports pyarrow's dataset layer, and with it pandas, before the clock starts too)."""
    import deltalake  # noqa: F401  (both systems' modules loaded before the clock starts)
    import metatable.table  # noqa: F401  (`mt.Table` loads the facade's modules on first use)

    data = pq.read_table(path)
    started = time.perf_counter()
    table = SYSTEMS[system][0].open(root)
    read = table.apply(data) if step == "new_process_batch" else table.get(data["order_id"].combine_chunks())
    seconds = time.perf_counter() - started
    if read is not None:
        pq.write_table(read, out)
    print(seconds)


def verdict(systems: list[str]) -> None:
    if "delta" not in systems:
        return
    for system in (s for s in systems if s != "delta"):
        for step in ("load", "batches", "full_read", "day_read", "get_1000", "get_1000_new_process",
                     "new_process_batch", "full_read_after"):
            if (system, step) in RESULTS:
                emit(kind="ratio", system=system, step=step,
                     delta_over_metatable=round(RESULTS[("delta", step)] / RESULTS[(system, step)], 2))
    if "metatable" in systems:
        ratio = {step: RESULTS[("delta", step)] / RESULTS[("metatable", step)]
                 for step in ("batches", "full_read", "get_1000_new_process")}
        emit(kind="target", what="20 batches >= 2x faster than delta-rs", met=ratio["batches"] >= 2,
             ratio=round(ratio["batches"], 2))
        emit(kind="target", what="full read no slower than delta-rs", met=ratio["full_read"] >= 1,
             ratio=round(ratio["full_read"], 2))
        emit(kind="target", what="get of 1,000 keys >= 10x faster than delta-rs, in a new process",
             met=ratio["get_1000_new_process"] >= 10, ratio=round(ratio["get_1000_new_process"], 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--days", type=int, default=120)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--inserts", type=int, default=10_000)
    parser.add_argument("--deletes", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--systems", default="metatable,delta")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--in-new-process", nargs=5, metavar=("STEP", "SYSTEM", "ROOT", "INPUT", "OUTPUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_new_process:
        step_in_this_process(*args.in_new_process)
        return
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {sorted(SYSTEMS)}")
    workdir = args.workdir or tempfile.mkdtemp(prefix="metatable-workload-")
    os.makedirs(workdir, exist_ok=True)
    for system in systems:
        run(system, args, workdir)
    verdict(systems)


if __name__ == "__main__":
    main()
