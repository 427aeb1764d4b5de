"""A keyed data table: writes by key, snapshot reads, and its table services.

Commit protocol (DESIGN.md): under the lock, make instant T (requested); write
the data files (inflight, heartbeat running, a marker before every file); under
the lock again, check conflicts (two writers conflict only on a shared file
group), write the metadata table's deltacommit at T, complete T. Readers see
completed instants only; the file system view comes from the metadata table's
`files` partition, never from listing directories.
"""
from __future__ import annotations

import logging
import os
import pickle
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import pyarrow as pa

from indexes.arrow_keys import partition_paths
from indexes.bloom import FILTER_TYPE
from indexes.keys import ALL_PARTITIONS_KEY, bloom_filter_key, column_stats_key

from . import markers, table_services
from .table_services import DATA_ACTIONS, files_record
from .errors import (ConflictError, InvalidInputError, MetatableError, RollbackError, TableExistsError,
                     TableNotFoundError)
from .faults import crash_point
from .file_slice import FileSlice, latest_slice, parse_names
from .instant import Action, Instant, State
from .lock import TableLock
from .metadata_table import MetadataTable
from .scan_filter import Conjunct, may_match, row_mask, spark_condition, validate
from .slice_reader import read_slice
from .spark_pipeline import arrow_schema_of, is_dataframe, read_dataframe, write_dataframe
from .storage import LocalStorage, Storage
from .table_config import KEY_COLUMN, IndexConfig, TableConfig, as_tuple, normalize_schema
from .table_lookup import MetadataIndex
from .tagging import BloomPlan, insert_slots
from .timeline import META_DIR, Timeline
from .write_path import PARQUET, WriteTask, conform, write_local

log = logging.getLogger(__name__)

TABLE_FILE = "table.json"
DEFAULT_BYTES_PER_ROW = 100.0  # until a table has files to measure
WRITE_ACTIONS = (Action.COMMIT, Action.DELTACOMMIT)


@dataclass(frozen=True)
class WriteResult:
    instant: str
    operation: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: int = 0  # inserts of keys that already existed
    files_written: int = 0
    seconds: float = 0.0


def _as_arrow(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    raise InvalidInputError(f"write data must be a Spark DataFrame or a pyarrow Table, got {type(data).__name__}")


class Table:
    def __init__(self, path: str, *, storage: Storage | None = None, options: Mapping[str, Any] | None = None) -> None:
        self.path = os.path.abspath(path)
        self.storage = storage or LocalStorage()
        config_path = os.path.join(self.path, META_DIR, TABLE_FILE)
        if not self.storage.exists(config_path):
            raise TableNotFoundError(f"no metatable table at {path} (missing {config_path}); use Table.create")
        self.config = TableConfig.from_json(self.storage.read(config_path).decode(), options)
        self.last_scan: dict[str, int] = {}
        opts = self.config.options
        lock = TableLock(os.path.join(self.path, META_DIR, "lock"), opts["lock.timeout_s"])
        self._timeline = Timeline(self.storage, self.path, lock, opts["heartbeat.interval_s"],
                                  opts["heartbeat.tolerable_misses"])
        mdt_root = os.path.join(self.path, META_DIR, "metadata")
        mdt_options = {k: v for k, v in opts.items() if k.startswith(("metadata.", "heartbeat.", "lock."))}
        try:
            self.metadata = MetadataTable(mdt_root, storage=self.storage, options=mdt_options,
                                          authority=self._timeline)
        except TableNotFoundError:  # a create that died between its two steps: finish it
            self.metadata = MetadataTable.create(mdt_root, self.config.metadata_partitions(), options=mdt_options,
                                                 storage=self.storage, authority=self._timeline)
        self.metadata_index = MetadataIndex(self.metadata, self.config)  # key ranges and bloom filters

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, schema: pa.Schema, record_key: str | Sequence[str],
               partition_by: str | Sequence[str] | None = None, ordering_field: str | None = None,
               table_type: str = "merge_on_read", index: IndexConfig | None = None,
               metadata_indexes: Sequence[str] = ("column_stats",), options: Mapping[str, Any] | None = None,
               storage: Storage | None = None) -> Table:
        storage = storage or LocalStorage()
        if not isinstance(schema, pa.Schema):
            raise InvalidInputError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        config = TableConfig(normalize_schema(schema), as_tuple(record_key), as_tuple(partition_by), ordering_field,
                             table_type, index or IndexConfig(), tuple(metadata_indexes), dict(options or {}))
        path = os.path.abspath(path)
        if not storage.create_exclusive(os.path.join(path, META_DIR, TABLE_FILE), config.to_json().encode()):
            raise TableExistsError(f"a table already exists at {path}")
        log.info("created %s table at %s", config.table_type, path)
        return cls(path, storage=storage)

    @classmethod
    def open(cls, path: str, options: Mapping[str, Any] | None = None, storage: Storage | None = None) -> Table:
        return cls(path, storage=storage, options=options)

    def timeline(self) -> list[Instant]:
        """Instants, oldest first."""
        return self._timeline.instants()

    # -- writes -------------------------------------------------------------------------------------
    def upsert(self, data: Any) -> WriteResult:
        """Insert new keys, update existing ones (the greatest ordering value wins)."""
        return self._write(data, "upsert")

    def insert(self, data: Any) -> WriteResult:
        """Insert new keys; rows whose key already exists are skipped (counted in `skipped`)."""
        return self._write(data, "insert")

    def delete(self, keys: Any) -> WriteResult:
        """Delete by key: the record key columns (and partition columns, for a partitioned table)."""
        return self._write(keys, "delete")

    def _write(self, data: Any, operation: str) -> WriteResult:
        started = time.monotonic()
        config = self.config
        on_spark = is_dataframe(data)
        if not on_spark:
            data = _as_arrow(data)
        schema = arrow_schema_of(data) if on_spark else data.schema
        conform(schema.empty_table(), config, operation)  # schema errors before anything is written
        action = Action.DELTACOMMIT if config.merge_on_read else Action.COMMIT
        with self._timeline.lock.held():
            self._recover()
            instant = self._timeline.request(action, plan={"operation": operation}, others=[self.metadata.timeline])
            seen = {i.time for i in self._timeline.completed()}
            instant = self._timeline.start(instant)
        try:
            with self._timeline.heartbeat(instant):
                slices = self.file_slices()
                bloom = self._bloom_plan(data, operation, slices, instant.time) if config.index.type == "bloom" else None
                task = WriteTask(self.path, config, instant.time, operation, slices, self._log_base_instants(), bloom)
                stats = write_dataframe(task, data) if on_spark else write_local(task, data)
                crash_point("table.write.files")
                result = self._commit(instant, operation, stats, seen)
        except BaseException:
            self._abort(instant)
            raise
        self._after_commit(action)
        result = replace(result, seconds=time.monotonic() - started)
        log.info("%s %s: %d inserted, %d updated, %d deleted, %d skipped, %d files in %.2fs", operation,
                 result.instant, result.inserted, result.updated, result.deleted, result.skipped,
                 result.files_written, result.seconds)
        return result

    def _bloom_plan(self, data: Any, operation: str, slices: Mapping[tuple[str, str], FileSlice],
                    instant: str) -> BloomPlan:
        """Pin each base file's key range, and plan where each partition's new keys may go."""
        config = self.config
        index = self.metadata_index
        names: dict[str, list[str]] = {}
        sizes: dict[str, dict[str, int]] = {}
        recorded = self._live_files()  # sizes as committed, no file system calls
        for (partition, file_id), fs in slices.items():
            if fs.base:
                names.setdefault(partition, []).append(fs.base.file_name)
                sizes.setdefault(partition, {})[file_id] = recorded[partition][fs.base.file_name]
        pinned = index.ranges([(p, n) for p, ns in names.items() for n in ns])
        ranges: dict[str, dict[str, tuple]] = {p: {} for p in names}
        for (p, n), bounds in pinned.items():
            ranges[p][n] = bounds
        if operation == "delete":
            return BloomPlan(ranges, {})
        counts = self._partition_counts(data)
        total_bytes = sum(sum(s.values()) for s in sizes.values())
        stats = self.metadata.get_many("column_stats", [column_stats_key(KEY_COLUMN, p, n)
                                                        for p, ns in names.items() for n in ns])
        rows = sum(r["value_count"] for r in stats.values())
        bytes_per_row = total_bytes / rows if rows else DEFAULT_BYTES_PER_ROW
        slots = insert_slots(counts, sizes, bytes_per_row, config.options["write.target_file_size"], instant)
        return BloomPlan(ranges, slots)

    def _partition_counts(self, data: Any) -> dict[str, int]:
        """Rows per partition path in the batch: a small aggregation (only the partition columns)."""
        cols = list(self.config.partition_by)
        if is_dataframe(data):
            counts = data.groupBy(*cols).count().toArrow() if cols else pa.table({"count": [data.count()]})
        else:
            counts = data.group_by(cols).aggregate([([], "count_all")]).rename_columns([*cols, "count"]) if cols \
                else pa.table({"count": [data.num_rows]})
        typed = pa.table({c: counts[c].cast(self.config.schema.field(c).type) for c in cols}) if cols else counts
        paths = partition_paths(typed, self.config.partition_by).to_pylist()
        return dict(zip(paths, counts["count"].to_pylist()))

    def _commit(self, instant: Instant, operation: str, stats: pa.Table, seen: set[str]) -> WriteResult:
        rows = stats.to_pylist()
        written = [r for r in rows if r["file_name"]]
        touched = sorted({f"{r['partition']}/{r['file_id']}" for r in written})
        logged = {f"{r['partition']}/{r['file_id']}" for r in written if r["kind"] == "log"}
        counts = {k: sum(r[k] for r in rows) for k in ("inserted", "updated", "deleted", "skipped")}
        records = self._metadata_records(written, instant.time)
        with self._timeline.lock.held():
            self._check_conflicts(instant, set(touched), logged, seen)
            self.metadata.begin(instant.time)
            self.metadata.write(instant.time, records)
            crash_point("table.commit.metadata")
            self.metadata.complete(instant.time)
            self._timeline.complete(instant, {"operation": operation, "file_groups": touched,
                                              "files": [f"{r['partition']}/{r['file_name']}" for r in written],
                                              **counts})
        markers.clear(self.storage, self.path, instant.time)
        return WriteResult(instant.time, operation, files_written=len(written), **counts)

    def _metadata_records(self, written: list[dict], instant: str) -> dict[str, dict[str, Any]]:
        by_partition: dict[str, dict[str, int]] = {}
        stats: dict[str, Any] = {}
        blooms: dict[str, Any] = {}
        for r in written:
            by_partition.setdefault(r["partition"], {})[r["file_name"]] = r["size"]
            if r.get("column_stats"):
                stats.update(pickle.loads(r["column_stats"]))
            if r.get("bloom_filter"):
                blooms[bloom_filter_key(r["partition"], r["file_name"])] = {
                    "file_name": r["file_name"], "filter_type": FILTER_TYPE, "instant": instant,
                    "bloom_filter": r["bloom_filter"], "is_deleted": False}
        records: dict[str, dict[str, Any]] = {"files": {p: files_record(f) for p, f in by_partition.items()}}
        if by_partition:
            records["files"][ALL_PARTITIONS_KEY] = files_record({p: 0 for p in by_partition})
        if stats:
            records["column_stats"] = stats
        if blooms:
            records["bloom_filter"] = blooms
        return records

    def _check_conflicts(self, instant: Instant, touched: set[str], logged: set[str], seen: set[str]) -> None:
        """Fail if a write that completed since ours began touched one of our file groups, or a compaction
        scheduled since then will rewrite a file group we appended logs to."""
        for other in self._timeline.instants():
            if other.time == instant.time or other.action not in DATA_ACTIONS:
                continue
            if other.is_completed and other.time not in seen:
                theirs = set(self._timeline.read_json(other).get("file_groups", []))
                if theirs & touched:
                    raise ConflictError(
                        f"instant {instant.time} conflicts with {other.action.value} {other.time}, which committed "
                        f"first to file groups {sorted(theirs & touched)[:5]}; nothing of {instant.time} is "
                        "visible, retry the write")
            if other.action is Action.COMPACTION and other.time > instant.time and logged:
                planned = set(self._timeline.plan(other).get("file_groups", {}))
                if planned & logged:
                    raise ConflictError(f"instant {instant.time} appended logs to file groups that compaction "
                                        f"{other.time} (scheduled meanwhile) rewrites; retry the write")

    def _abort(self, instant: Instant) -> None:
        with self._timeline.lock.held():
            current = self._timeline.get(instant.time, instant.action)
            if current is not None and not current.is_completed:
                self._rollback_instant(current)

    def _after_commit(self, action: Action) -> None:
        self.metadata.refresh()
        if self.config.options["metadata.auto_compact"]:
            self.metadata.maintain()
        every = self.config.options["compaction.inline_every"]
        if every and action is Action.DELTACOMMIT and self.config.merge_on_read:
            since = 0
            for i in reversed(self._timeline.completed(DATA_ACTIONS)):
                if i.action is Action.COMPACTION:
                    break
                since += i.action is Action.DELTACOMMIT
            if since >= every:
                self.compact()
        if self.config.options["clean.inline"]:
            self.clean()

    # -- recovery and rollback ------------------------------------------------------------------------
    def _recover(self) -> list[str]:
        """Finish interrupted rollbacks; roll back writes whose writer stopped beating (under the lock)."""
        for rb in self._timeline.pending([Action.ROLLBACK]):
            target = self._timeline.plan(rb)["target"]
            pending = [i for i in self._timeline.instants() if i.time == target and not i.is_completed]
            self._execute_rollback(rb, pending[0] if pending else None)
        gone = []
        for instant in self._timeline.pending(WRITE_ACTIONS):
            if self._timeline.is_expired(instant):
                log.warning("rolling back %s %s: its writer stopped", instant.action.value, instant.time)
                self._rollback_instant(instant)
                gone.append(instant.time)
        return gone

    def rollback(self, instant: str | None = None, force: bool = False) -> list[str]:
        """Roll back failed writes: every expired pending write, or the given pending instant
        (`force` rolls it back even if its writer still beats). Completed instants stay."""
        with self._timeline.lock.held():
            if instant is None:
                return self._recover()
            found = self._timeline.get(instant)
            if found is None:
                raise RollbackError(f"no instant {instant} on the timeline of {self.path}")
            if found.is_completed:
                raise RollbackError(f"instant {instant} is completed; metatable rolls back only failed writes "
                                    "(restoring a completed commit is not supported)")
            if not force and not self._timeline.is_expired(found):
                raise RollbackError(f"instant {instant} is still running (its writer beats); pass force to "
                                    "roll it back anyway")
            self._rollback_instant(found)
            return [instant]

    def _rollback_instant(self, instant: Instant) -> None:
        rb = self._timeline.request(Action.ROLLBACK, plan={"target": instant.time}, others=[self.metadata.timeline])
        self._execute_rollback(rb, instant)

    def _execute_rollback(self, rb: Instant, target: Instant | None) -> None:
        """Idempotent: delete the marked files, undo the metadata deltacommit, drop the instant."""
        if rb.state is State.REQUESTED:
            rb = self._timeline.start(rb)
        time_ = self._timeline.plan(rb)["target"]
        files = markers.marked_files(self.storage, self.path, time_)
        for relative in files:
            self.storage.delete(os.path.join(self.path, relative))
        self.metadata.rollback(time_)
        crash_point("table.rollback")
        markers.clear(self.storage, self.path, time_)
        if target is not None:
            self._timeline.remove(target)
        self._timeline.complete(rb, {"target": time_, "deleted": files})
        self.metadata.refresh()

    # -- the file system view -------------------------------------------------------------------------
    def partitions(self) -> list[str]:
        record = self.metadata.get("files", ALL_PARTITIONS_KEY)
        return sorted(record["files"]) if record else []

    def _live_files(self) -> dict[str, dict[str, int]]:
        """partition -> every live file name -> its size, from the `files` partition."""
        self.metadata.refresh()
        return {p: {name: e["size"] for name, e in sorted(r["files"].items())}
                for p, r in self.metadata.get_many("files", self.partitions()).items()}

    def file_slices(self, as_of: str | None = None) -> dict[tuple[str, str], FileSlice]:
        """The latest file slice of every file group, as of the latest (or the given) completed instant."""
        completed = {i.time for i in self._timeline.completed(DATA_ACTIONS)}
        if as_of is not None and as_of not in completed:
            raise InvalidInputError(f"cannot read as of {as_of}: not a completed instant of {self.path}")

        def visible(t: str) -> bool:
            return t in completed and (as_of is None or t <= as_of)

        out = {}
        for partition, names in self._live_files().items():
            bases, logs = parse_names(names, PARQUET)
            logs = [lf for lf in logs if visible(lf.instant)]
            for file_id in sorted({b.file_id for b in bases} | {lf.file_id for lf in logs}):
                fs = latest_slice(partition, file_id, bases, logs, visible)
                if fs.base or fs.logs:
                    out[(partition, file_id)] = fs
        return out

    def _log_base_instants(self) -> dict[tuple[str, str], str]:
        """File groups of pending compactions -> the base instant new logs must name."""
        out = {}
        for instant in self._timeline.pending([Action.COMPACTION]):
            for group in self._timeline.plan(instant).get("file_groups", {}):
                partition, _, file_id = group.rpartition("/")
                out[(partition, file_id)] = max(out.get((partition, file_id), ""), instant.time)
        return out

    # -- reads --------------------------------------------------------------------------------------
    def scan_plan(self, as_of: str | None = None, filter: Sequence[Conjunct] | None = None) -> list[FileSlice]:
        """The file slices a read needs: all of them, less those whose column stats rule the filter out.
        How many were skipped is logged and kept in `last_scan`."""
        filters = validate(filter, self.config.schema)
        slices = list(self.file_slices(as_of).values())
        kept = slices
        if filters and "column_stats" in self.config.metadata_indexes:
            wanted = [column_stats_key(c, fs.partition, fs.base.file_name)
                      for fs in slices if fs.base and not fs.logs for c, _, _ in filters]
            stats = self.metadata.get_many("column_stats", wanted)

            def possible(fs: FileSlice) -> bool:
                if not fs.base or fs.logs:
                    return True
                for column, op, value in filters:
                    s = stats.get(column_stats_key(column, fs.partition, fs.base.file_name))
                    if s is not None and not may_match(op, value, s["min_value"], s["max_value"]):
                        return False
                return True
            kept = [fs for fs in slices if possible(fs)]
        self.last_scan = {"file_slices": len(slices), "skipped": len(slices) - len(kept)}
        if filters:
            log.info("read: %d of %d file slices skipped by column stats", len(slices) - len(kept), len(slices))
        return kept

    def to_arrow(self, as_of: str | None = None, read_optimized: bool = False,
                 filter: Sequence[Conjunct] | None = None) -> pa.Table:
        """The snapshot as a pyarrow Table, without Spark. `filter`: [(column, op, value), ...], all must hold."""
        names = self.config.schema.names
        filters = validate(filter, self.config.schema)
        tables = []
        for fs in self.scan_plan(as_of, filters):
            rows = read_slice(self.storage, self.path, self.config, fs, read_optimized).select(names)
            tables.append(rows.filter(row_mask(rows, filters)) if filters else rows)
        return pa.concat_tables(tables) if tables else self.config.schema.empty_table()

    def read(self, as_of: str | None = None, read_optimized: bool = False, spark: Any = None,
             filter: Sequence[Conjunct] | None = None) -> Any:
        """The snapshot as a Spark DataFrame (base files merged with their logs, unless `read_optimized`)."""
        from pyspark.sql import SparkSession

        from .spark_pipeline import spark_session

        spark = spark or SparkSession.getActiveSession() or spark_session()
        filters = validate(filter, self.config.schema)
        df = read_dataframe(spark, self.path, self.config, self.scan_plan(as_of, filters), read_optimized)
        return df.where(spark_condition(filters)) if filters else df

    def lookup(self, keys: Any, explain: bool = False, using: str = "index") -> Any:
        """Where each key lives: a pyarrow Table (key, partition, file_id; nulls when absent). `keys` has the
        record key columns, and optionally the partition columns (without them every partition is searched).
        `using="metadata"` takes the three-level path (column_stats ranges, bloom filters, file check)
        whatever the write index. With `explain`, returns (result, per-level counts)."""
        from .table_lookup import keys_table, locate

        if using not in ("index", "metadata"):
            raise InvalidInputError(f"lookup using must be 'index' or 'metadata', got {using!r}")
        result, report = locate(self, keys_table(keys), by_metadata=using == "metadata")
        return (result, report.as_dict()) if explain else result

    # -- table services (metatable/table_services.py) -------------------------------------------------
    def compact(self) -> str | None:
        """Merge-on-read: rewrite every file group that has logs as a new base file. Returns the instant."""
        return table_services.compact(self)

    def clean(self) -> str | None:
        """Delete file slices that none of the last `clean.retain_commits` completed instants can read."""
        return table_services.clean(self)

    def stats(self) -> list[dict[str, Any]]:
        """Per file group: rows, bytes and pending logs of its latest slice."""
        return table_services.stats(self)


__all__ = ["Table", "WriteResult", "IndexConfig", "MetatableError"]
