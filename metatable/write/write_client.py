"""The write client: one keyed write (upsert, insert, delete, or a mix of upserts and deletes: a conditional
merge or a change feed's batch), from input to commit.

1. Conform the input to the table once: schema errors surface before anything is written.
2. Begin the transaction and take the view it starts from (under one lock hold, so the view is exactly
   the completed instants it will later be checked against).
3. Plan with the table's index: the bucket index pins the bucket layout (count and file group of each bucket);
   the bloom index pins every base file's key range and, per partition, the file groups new keys go to
   (never one that a pending clustering rewrites).
4. Run the engine: Spark for a DataFrame, in-process for Arrow. Both tag rows through the index's
   assigner and write each file group (`write_engine`).
5. Commit: conflict check, metadata deltacommit at the same instant, complete (`data_commit`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from indexes.arrow_keys import partition_paths
from indexes.bloom_index import BloomPlan, insert_slots
from indexes.keys import column_stats_key

from metatable.arrow_input import arrow_table
from metatable.commit.conflicts import Committer
from metatable.commit.context import TableContext
from metatable.commit.data_commit import Commit, commit
from metatable.commit.dual_writes import DUAL
from metatable.commit.timeline_view import TimelineView, group_name
from metatable.errors import InvalidInputError
from metatable.faults import crash_point
from metatable.file_group.before_images import CHANGES_KEY, IMAGES_KEY, write_change_file
from metatable.file_group.written import WrittenFile, absent_deletes, counts, written_files
from metatable.read.changes import own_changes
from metatable.read.key_lookup import get_rows
from metatable.read.locator import MetadataIndex
from metatable.read.reads import filtered
from metatable.read.scan_filter import coerced, parse_filter
from metatable.schema_evolution import check_changes, merged_write_schema
from metatable.spark.session import arrow_schema_of, is_dataframe
from metatable.table_config import KEY_COLUMN, TableConfig
from metatable.timeline.instant import WRITE_ACTIONS, Action, Instant
from metatable.write.conditional_merge import MergeClauses, decide, unique_keys
from metatable.write.spark_write import conform_dataframe, partition_counts, run_spark
from metatable.write.write_engine import run_local
from metatable.write.write_input import WriteStream, as_input, conform
from metatable.write.write_task import WriteTask, record_index_may_answer

log = logging.getLogger(__name__)

DEFAULT_BYTES_PER_ROW = 100.0  # until a table has files to measure
CHANGE_FILE_ROWS = 1 << 20  # a write of more rows keeps no change file: its change records would be held whole
SCHEMA_MODES = (None, "merge")  # merge: the data's new columns are added to the table


@dataclass(frozen=True)
class Txn:
    """An idempotent write's identity (Delta Lake's txnAppId and txnVersion): a write whose application has
    already committed this version or a later one is skipped, so a replayed batch lands once. Versions only
    grow: a stream's batch ids."""

    app: str
    version: int

    def applied_by(self, context: TableContext) -> str | None:
        """The completed commit that applied this version or a later one of the application, if any (the
        archive carries each application's last, for one that has not written lately)."""
        timeline = context.timeline
        for instant in reversed(timeline.completed(WRITE_ACTIONS)):
            txn = timeline.read_json(instant).get("txn")
            if txn and txn["app"] == self.app:
                return instant.time if txn["version"] >= self.version else None
        version, time = timeline.archived.carried.get("txns", {}).get(self.app, (-1, None))
        return time if version >= self.version else None


@dataclass(frozen=True)
class WriteResult:
    instant: str
    operation: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: int = 0  # inserts of keys that already existed; a merge's source rows that no clause took
    stale: int = 0  # updates whose ordering value loses to the stored row's (the stored row stays; a merge
    # does not write them, an upsert does: see `FileGroupWriter._stale`); not counted with `upserted`
    upserted: int = 0  # upserted rows not told apart into inserted and updated (`write.count_updates` false)
    files_written: int = 0
    seconds: float = 0.0


def assigned(rows: pa.Table, assignments: Mapping[str, Any]) -> pa.Table:
    """The rows with the columns of `assignments` set to its values (already of the columns' types)."""
    for name, value in assignments.items():
        i = rows.schema.get_field_index(name)
        rows = rows.set_column(i, name, pa.repeat(pa.scalar(value, rows.schema.field(i).type), rows.num_rows))
    return rows


def checked_assignments(config: TableConfig, assignments: Mapping[str, Any]) -> dict[str, Any]:
    """An update's `set`, each value converted to its column's type; the key and partition columns are
    refused (a row changes key or partition by a delete and an upsert)."""
    if not isinstance(assignments, Mapping) or not assignments:
        raise InvalidInputError(f"update takes set={{column: value, ...}}, got {assignments!r}")
    fixed = [c for c in assignments if c in (*config.record_key, *config.partition_by)]
    unknown = [c for c in assignments if c not in config.schema.names]
    if fixed or unknown:
        raise InvalidInputError(f"update cannot set {fixed + unknown}: " + (
            f"{fixed} are record key or partition columns; " if fixed else "") + (
            f"{unknown} are not columns of the table ({config.schema.names})" if unknown else ""))
    return {c: coerced(c, config.schema.field(c).type, v) for c, v in assignments.items()}


class WriteClient:
    def __init__(self, context: TableContext, index: MetadataIndex) -> None:
        self.context = context
        self.index = index  # the metadata index's cache of key ranges and bloom filters

    @property
    def action(self) -> Action:
        return Action.DELTACOMMIT if self.context.config.merge_on_read else Action.COMMIT

    def write(self, data: Any, operation: str, txn: Txn | None = None, schema_mode: str | None = None,
              where: Any = None, assignments: Mapping[str, Any] | None = None) -> WriteResult:
        """`where`, without `data`: the rows that match this filter in the write's own snapshot are the input:
        a delete deletes them, an upsert writes them with `assignments` (column -> value) set."""
        started = time.monotonic()
        if schema_mode not in SCHEMA_MODES:
            raise InvalidInputError(f"schema_mode must be one of {list(SCHEMA_MODES)}, got {schema_mode!r}")
        on_spark = is_dataframe(data)
        merging = schema_mode == "merge" and operation != "delete"
        config = self.context.current_config()
        if where is not None:  # a bad filter or assignment is refused before anything is written
            parse_filter(where, config.schema)
            assignments = checked_assignments(config, assignments) if operation != "delete" else None
        else:
            data = data if on_spark else as_input(data)
            config = self.with_data_columns(config, data) if merging else config
            data = self.conformed(data, config, operation)

        def rows_of(view: TimelineView) -> tuple[TableConfig, Any, dict[str, int]]:
            # the schema written: the snapshot's (a column may have been added since the data was conformed),
            # with what this write adds to it
            written = self.with_data_columns(view.config, config.schema) if merging else view.config
            if where is not None:
                keys = list(dict.fromkeys([*written.record_key, *written.partition_by]))
                rows = filtered(self.context, view, where, keys if operation == "delete" else None)
                return written, self.conformed(assigned(rows, assignments or {}), written, operation), {}
            if not written.schema.equals(config.schema):
                return written, self.conformed(data, written, operation), {}
            return written, data, {}
        return self.run(operation, txn, rows_of, on_spark, started)

    def merge(self, source: Any, clauses: MergeClauses, txn: Txn | None = None) -> WriteResult:
        """A conditional merge in one commit (`conditional_merge`): the table's rows of the source's keys are
        read through the index from the snapshot the write begins from, and decide, with the clauses, which
        source rows update, delete or insert."""
        started = time.monotonic()
        if is_dataframe(source):
            raise InvalidInputError("merge takes local data (a pyarrow Table, a pandas or Polars DataFrame); a Spark "
                                    "DataFrame that fits in memory can be given as df.toArrow(), a larger one "
                                    "written with upsert and delete")
        source = arrow_table(source, "a merge's source")  # read whole: its rows decide together
        config = self.context.current_config()
        clauses.check(source.schema, config)
        own = [c for c in source.column_names if c in config.schema.names]
        data = self.conformed(source.select(own), config, "upsert" if clauses.writes_rows else "delete")
        extra = source.select([c for c in source.column_names if c not in data.column_names])  # for conditions
        unique_keys(data, config)

        def rows_of(view: TimelineView) -> tuple[TableConfig, Any, dict[str, int]]:
            written = view.config
            rows = data if written.schema.equals(config.schema) else \
                self.conformed(data, written, "upsert" if clauses.writes_rows else "delete")
            keys = list(written.record_key) + ([] if written.keys_unique_across_partitions
                                               else list(written.partition_by))
            target = get_rows(self.context, self.index, rows.select(list(dict.fromkeys(keys))), view)
            decided = decide(rows, extra, target, written, clauses)
            return written, decided.rows, {"skipped": decided.skipped, "stale": decided.stale}
        return self.run("merge", txn, rows_of, False, started)

    def run(self, operation: str, txn: Txn | None,
            rows_of: Callable[[TimelineView], tuple[TableConfig, Any, dict[str, int]]], on_spark: bool,
            started: float) -> WriteResult:
        """Begin the instant, take from `rows_of(view)` the config written, the rows and counts of rows that
        will not be written, then tag, write and commit."""
        context = self.context
        transactions = context.transactions
        with transactions.lock.held():
            done = txn.applied_by(context) if txn else None
            if done is not None:
                log.info("%s of %s version %d skipped: commit %s applied it", operation, txn.app, txn.version, done)
                return WriteResult(done, operation, seconds=time.monotonic() - started)
            instant, view = self.begin(operation)
            # under the lock: the listings its reading takes are those the holding keeps (`MetadataLayout.sizes`)
            asks_record_index = not on_spark and record_index_may_answer(view.config, operation, context.storage) \
                and context.metadata.is_read("record_index")
        with transactions.running(instant):
            written, data, unwritten = rows_of(view)
            plan = view.index_plan(written.index) if written.index.type == "bucket" \
                else self.bloom_plan(view, data, operation, instant.time)
            task = WriteTask(context.paths, context.storage, written, instant.time, operation, view.file_slices,
                             view.log_base_instants(), plan, asks_record_index)
            if on_spark:
                stats, stored = run_spark(task, data), None
            else:
                stream = data if isinstance(data, pa.Table) else data.chunks(written.options["write.chunk_rows"])
                local = run_local(task, stream, context.storage.scratch(context.paths.spill(instant.time)),
                                  context.metadata)
                stats, stored = local.stats, local.stored
            rows = stats.to_pylist()
            crash_point("table.write.files")
            files, tally, absent = written_files(rows), counts(rows), absent_deletes(rows)
            for name, n in unwritten.items():
                tally[name] = tally.get(name, 0) + n
            evolves = not written.schema.equals(view.config.schema)
            kept = keep_change_file(context, view, written, instant.time, files) \
                if not on_spark and not evolves else {}
            commit(context, Commit(instant, Committer.of(self.action, written), files, view.completed_times,
                                   {"operation": operation, **tally, **({"txn": asdict(txn)} if txn else {}),
                                    **({IMAGES_KEY: True} if written.keeps_before_images else {}), **kept},
                                   schema=written.schema if evolves else None, absent_deletes=absent,
                                   marked_here=not on_spark, stored=stored))
        result = WriteResult(instant.time, operation, files_written=len(files), seconds=time.monotonic() - started,
                             **tally)
        log.info("%s %s: %d inserted, %d updated, %d upserted, %d deleted, %d skipped, %d stale, %d files in %.2fs",
                 operation, result.instant, result.inserted, result.updated, result.upserted, result.deleted,
                 result.skipped, result.stale, result.files_written, result.seconds)
        return result

    def add_columns(self, fields: Sequence[pa.Field]) -> str | None:
        """Commit a schema change without data: the fields added (or widening their columns). Refused before
        anything is written when a field narrows, retypes or drops. Returns the instant, None when the table
        already has every field as given."""
        context = self.context
        config = context.current_config()
        fixed = (*config.record_key, *config.partition_by)
        if check_changes(config.schema, fields, fixed).equals(config.schema):
            return None
        transactions = context.transactions
        with transactions.lock.held():
            instant, view = self.begin("add_columns")
        with transactions.running(instant):
            written = view.config.with_schema(check_changes(view.config.schema, fields, fixed))
            commit(context, Commit(instant, Committer.of(self.action, written), (), view.completed_times,
                                   {"operation": "add_columns", "columns": [f"{f.name} {f.type}" for f in fields]},
                                   schema=written.schema))
        log.info("%s: columns %s", instant.time, ", ".join(f"{f.name} {f.type}" for f in fields))
        return instant.time

    def begin(self, operation: str) -> tuple[Instant, TimelineView]:
        """Under the lock: begin the instant and take the view it starts from, so the view is exactly the
        completed instants it will be checked against."""
        transactions = self.context.transactions
        instant = transactions.begin(self.action, {"operation": operation})
        try:
            return instant, self.context.view()
        except BaseException:
            transactions.abort(instant)
            raise

    @staticmethod
    def with_data_columns(config: TableConfig, data: Any) -> TableConfig:
        """`schema_mode="merge"`: the config with the data's new columns added."""
        schema = data if isinstance(data, pa.Schema) else \
            arrow_schema_of(data) if is_dataframe(data) else data.schema
        return config.with_schema(merged_write_schema(config.schema, schema, (*config.record_key, *config.partition_by)))

    @staticmethod
    def conformed(data: Any, config: TableConfig, operation: str) -> Any:
        """The input in the table's columns and types, checked before anything is written."""
        if is_dataframe(data):
            return conform_dataframe(data, config, operation)
        return conform(data, config, operation) if isinstance(data, pa.Table) else data.conformed(config, operation)

    def bloom_plan(self, view: TimelineView, data: Any, operation: str, instant: str) -> BloomPlan:
        """Pin each base file's key range, and plan where each partition's new keys may go."""
        config = view.config
        names: dict[str, list[str]] = {}
        for (partition, _), fs in view.file_slices.items():
            if fs.base:
                names.setdefault(partition, []).append(fs.base.file_name)
        ranges: dict[str, dict[str, tuple]] = {p: {} for p in names}
        if config.index.type == "bloom":  # the record index needs no key ranges
            for (p, n), bounds in self.index.ranges([(p, n) for p, ns in names.items() for n in ns],
                                                    view.config.metadata_indexes).items():
                ranges[p][n] = bounds
        global_scope = config.index.scope == "global"
        if operation == "delete":
            return BloomPlan(ranges, {}, global_scope)  # a delete of an absent key goes nowhere
        sizes = view.sizes()
        total_bytes = sum(sum(s.values()) for s in sizes.values())
        busy = view.busy()  # inserts never go to a file group that a pending clustering rewrites
        sizes = {p: {fid: size for fid, size in s.items() if group_name(p, fid) not in busy} for p, s in sizes.items()}
        stats = self.context.metadata.get_many("column_stats", [column_stats_key(KEY_COLUMN, p, n)
                                                                for p, ns in names.items() for n in ns]) \
            if "column_stats" in config.metadata_indexes else {}
        rows = sum(r["value_count"] for r in stats.values())
        bytes_per_row = total_bytes / rows if rows else DEFAULT_BYTES_PER_ROW
        slots = insert_slots(self.partition_rows(data, instant), sizes, bytes_per_row,
                             config.options["write.target_file_size"], instant)
        return BloomPlan(ranges, slots, global_scope, moves=global_scope and operation in ("upsert", "merge")
                         and bool(config.partition_by))

    def partition_rows(self, data: Any, instant: str) -> dict[str, int]:
        """Rows per partition path in the batch: a small aggregation over the partition columns only."""
        config = self.context.config
        cols = list(config.partition_by)
        if is_dataframe(data):
            tally = partition_counts(data, cols)
        elif isinstance(data, WriteStream):
            spool = self.context.storage.scratch(self.context.paths.spooled_input(instant))
            tally = data.partition_counts(cols, spool)
        elif cols:
            tally = data.group_by(cols).aggregate([([], "count_all")]).rename_columns([*cols, "count"])
        else:
            tally = pa.table({"count": [data.num_rows]})
        typed = pa.table({c: tally[c].cast(config.schema.field(c).type) for c in cols}) if cols else tally
        paths = partition_paths(typed, config.partition_by).to_pylist()
        return dict(zip(paths, tally["count"].to_pylist()))


def keep_change_file(context: TableContext, view: TimelineView, config: TableConfig, instant: str,
                     files: Sequence[WrittenFile]) -> dict[str, bool]:
    """With before-images kept, an in-process merge-on-read write also keeps its change records
    (`read.changes.own_changes`) in a change file: the commit metadata that says so, or nothing. Not where it
    rewrote bases (copy-on-write: that would read the old and new bases again), dual-wrote into a resize (its
    images do not hold), or wrote more than CHANGE_FILE_ROWS rows; nor (the caller's part) a Spark write, whose
    records would be gathered on the driver, or one that changes the schema. A read of every version computes
    the changes of such a write from its files."""
    if not (config.keeps_before_images and config.merge_on_read) or not files or \
            any(f.kind == DUAL for f in files) or sum(f.rows for f in files) > CHANGE_FILE_ROWS:
        return {}
    changes = own_changes(context, view, config, instant, [f.relative for f in files])
    write_change_file(context.storage, context.paths, config, instant, changes)
    crash_point("table.write.change_file")
    return {CHANGES_KEY: True}
