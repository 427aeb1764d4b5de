"""`Table`: the facade of a keyed data table. It opens the table's context and delegates.

Writes go through the write client (`write.write_client`), reads through `read.reads`, lookups through
`read.key_lookup`, services through `services/`, every instant through the shared transactions
(`timeline.transaction`). docs/architecture.md maps the layers.
"""
from __future__ import annotations

import functools
import logging
import random
import time
from typing import Any, Callable, Mapping, Sequence, TypeVar

import pyarrow as pa

from metatable.commit.context import TableContext
from metatable.commit.timeline_view import TimelineView
from metatable.errors import (
    ClusteringConflict, ConflictError, InvalidInputError, MetadataReplacedError, MetatableError, RollbackError,
    storage_errors)
from metatable.file_group.file_slice import FileSlice
from metatable.read import reads, secondary_lookup
from metatable.read.changes import read_changes, written_since
from metatable.read.key_lookup import get_rows, keys_table, live_rows, locate
from metatable.read.locator import MetadataIndex
from metatable.read.scan import Scan
from metatable.services import clean, clustering, compaction, fsck, indexer, maintenance, rebuild
from metatable.services.fsck import FsckReport
from metatable.services.rebuild import RebuildReport
from metatable.storage.base import Storage
from metatable.storage.location import storage_for
from metatable.table_config import (IndexConfig, TableConfig, as_tuple, check_secondary_indexes, normalize_schema,
                                   secondary_partitions)
from metatable.timeline.instant import Action, Instant, Moment
from metatable.write.change_feed import DELETE_VALUES, flagged
from metatable.write.conditional_merge import MergeClauses
from metatable.write.write_client import Txn, WriteClient, WriteResult

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def replayable(data: Any) -> bool:
    """Whether a write's input can be read again: everything but a RecordBatchReader (read once)."""
    return not isinstance(data, pa.RecordBatchReader)


def writes(method: F) -> F:
    """An operation that writes to the table: the OS refusing a write (read-only, no permission, disk full)
    is a StorageError that says what to do (`errors.storage_errors`)."""
    @functools.wraps(method)
    def wrapped(self: Table, *args: Any, **kwargs: Any) -> Any:
        with storage_errors(f"{method.__name__} on {self.path}"):
            return method(self, *args, **kwargs)
    return wrapped  # type: ignore[return-value]

__all__ = ["Table", "Txn", "WriteResult", "IndexConfig", "MetatableError"]


class Table:
    def __init__(self, path: str, *, storage: Storage | None = None, options: Mapping[str, Any] | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self._open(path, storage or storage_for(path, storage_options))
        self.path = self.context.root
        self.storage = self.context.storage
        self.last_scan: dict[str, Any] = {}

    def _open(self, path: str, storage: Storage | None) -> None:
        """Open the table's context: its config, with the index states of now, and its metadata table."""
        self.context = TableContext.open(path, storage, self.options, roll_forward={Action.CLEAN: clean.finish})
        self.config = self.context.config
        self.metadata = self.context.metadata
        self.metadata_index = MetadataIndex(self.metadata)  # key ranges and bloom filters, cached

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, schema: pa.Schema, record_key: str | Sequence[str],
               partition_by: str | Sequence[str] | None = None, ordering_field: str | None = None,
               table_type: str = "merge_on_read", index: IndexConfig | None = None,
               metadata_indexes: Sequence[str] = ("column_stats",), options: Mapping[str, Any] | None = None,
               storage: Storage | None = None, storage_options: Mapping[str, Any] | None = None,
               secondary_indexes: Mapping[str, str | Sequence[str]] | None = None) -> Table:
        """A new table at `path`: a local directory, or an `s3://bucket/prefix` URL on an S3-compatible store
        (endpoint and credentials from `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
        `AWS_REGION`, or `storage_options` in the spellings delta-rs and pyiceberg take).
        `secondary_indexes`: name -> column(s), e.g. `{"by_part": ["l_partkey"]}`: indexes on non-key columns
        that `get_by` and `to_arrow`'s `==` and `in` filters use (see `schedule_indexing` for a live table)."""
        if not isinstance(schema, pa.Schema):
            raise InvalidInputError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        index = index or IndexConfig()
        indexes = tuple(metadata_indexes) + (("record_index",) if index.type == "record" and
                                             "record_index" not in metadata_indexes else ())
        secondary = check_secondary_indexes(secondary_indexes or {}, schema)
        config = TableConfig(normalize_schema(schema), as_tuple(record_key), as_tuple(partition_by), ordering_field,
                             table_type, index, indexes + secondary_partitions(secondary), dict(options or {}),
                             secondary_indexes=secondary)
        storage = storage or storage_for(path, storage_options)
        with storage_errors(f"create {path}"):
            return cls(TableContext.create(path, config, storage), storage=storage)

    @classmethod
    def open(cls, path: str, options: Mapping[str, Any] | None = None, storage: Storage | None = None,
             storage_options: Mapping[str, Any] | None = None) -> Table:
        """The table at `path` (a directory or an `s3://` URL, as for `create`)."""
        return cls(path, storage=storage, options=options, storage_options=storage_options)

    def timeline(self, archived: bool = False) -> list[Instant]:
        """The active timeline's instants, oldest first; with `archived`, the archived ones before them (all
        completed: archival moves only completed instants)."""
        timeline = self.context.timeline
        active = timeline.instants()
        return (timeline.archived_instants() if archived else []) + active

    # -- writes -------------------------------------------------------------------------------------
    @writes
    def upsert(self, data: Any, txn: Txn | None = None, schema_mode: str | None = None) -> WriteResult:
        """Insert new keys, update existing ones (the greatest ordering value wins). `data`: a Spark DataFrame,
        local data (a pyarrow Table, a pandas or Polars DataFrame: `arrow_input`), or a stream as for `bulk_insert`.
        `txn` (application, version), as every write takes: skipped when the application already committed that
        version or a later one (a replayed stream batch lands once; `spark_source.StreamSink`).
        `schema_mode="merge"`, as every write but delete takes: the data's new columns are added to the table
        (nullable), in the same commit; without it they are an error (widening a column is `add_columns`'). Columns
        added to the table since it was created may be left out of the data: they are written as nulls."""
        return self._write(data, "upsert", txn, schema_mode)

    @writes
    def insert(self, data: Any, txn: Txn | None = None, schema_mode: str | None = None) -> WriteResult:
        """Insert new keys; rows whose key already exists are skipped (counted in `skipped`)."""
        return self._write(data, "insert", txn, schema_mode)

    @writes
    def bulk_insert(self, data: Any, txn: Txn | None = None, schema_mode: str | None = None) -> WriteResult:
        """A load: insert, for data too big to hold. Give a stream (a Parquet path, a `pyarrow.dataset`, a
        `RecordBatchReader`, anything with `__arrow_c_stream__` such as a DuckDB relation) and it is read in chunks
        of `write.chunk_rows` and written one file group at a time, so memory follows the chunk and file-group
        sizes, not the input's. Keys that exist are skipped as by `insert` (Hudi's bulk_insert would duplicate
        them); where a partition has no files yet, no key is looked up."""
        return self._write(data, "bulk_insert", txn, schema_mode)

    @writes
    def delete(self, keys: Any = None, txn: Txn | None = None, where: Any = None) -> WriteResult:
        """Delete by key: the record key columns (and partition columns, for a partitioned table). Or by
        condition: `where` a filter as `to_arrow` takes; the rows that match it in the snapshot the delete
        begins from are deleted by key, in one commit (column stats skip the file slices that cannot match)."""
        if (keys is None) == (where is None):
            raise InvalidInputError("delete takes keys or where=..., one of them")
        return self._write(keys, "delete", txn, where=where)

    def _write(self, data: Any, operation: str, txn: Txn | None, schema_mode: str | None = None,
               where: Any = None, assignments: Mapping[str, Any] | None = None) -> WriteResult:
        retries = self.config.options["write.conflict_retries"] if replayable(data) else 0
        result, client = self._retried(lambda c: c.write(data, operation, txn, schema_mode, where, assignments),
                                       operation, retries)
        maintenance.after_commit(self.context, client.action, result.instant)
        return result

    def _retried(self, attempt: Callable[[WriteClient], R], operation: str, retries: int) -> tuple[R, WriteClient]:
        """`attempt(client)`, again from a new snapshot (up to `retries` times) when it lost to a concurrent
        write; with the table opened again when another process replaced its metadata table (a rebuild)."""
        for tried in range(retries + 1):
            client = WriteClient(self.context, self.metadata_index)
            try:
                return attempt(client), client
            except ClusteringConflict:  # the clustering must complete first: the caller retries after it
                raise
            except ConflictError as e:
                if tried == retries:
                    raise
                log.info("%s on %s lost to a concurrent write (%s); again from a new snapshot", operation,
                         self.path, e)
                if isinstance(e, MetadataReplacedError):
                    self._reopen()
                time.sleep(random.uniform(0.01, 0.05) * 2 ** tried)  # writers that collided do not again
        raise AssertionError("unreachable")

    @writes
    def apply_changes(self, data: Any, operation_column: str = "op", delete_values: Sequence[Any] = DELETE_VALUES,
                      txn: Txn | None = None, sequence_by: Sequence[str] = ()) -> WriteResult:
        """A change feed's batch in one commit: a row whose `operation_column` is one of `delete_values`
        deletes its key, any other row upserts it (the column itself is not stored). A key that comes more than
        once takes its newest row by the ordering field, a delete like any other (give delete rows their
        ordering value: a null one loses). `sequence_by`: the feed's columns that order its rows (not stored;
        metatable's own feed: `["_commit_instant", "_commit_seq"]`): a record takes its last row, and one
        deleted and inserted again in the batch replaces the stored row whatever its ordering value, as it did
        where the feed comes from. `data`: local data as `upsert` takes, or a Spark DataFrame."""
        config = self.config
        identity = [*config.record_key, *([] if config.keys_unique_across_partitions else config.partition_by)]
        return self._write(flagged(data, operation_column, delete_values, sequence_by, identity), "merge", txn)

    @writes
    def merge(self, source: Any, matched_update: Any = None, matched_delete: Any = None,
              not_matched_insert: Any = None, txn: Txn | None = None) -> WriteResult:
        """A conditional merge of `source` (local data as `upsert` takes, read whole; one row per record key) in one
        commit. The table's rows of the source's keys are found through the index; then, of the source rows whose
        key the table holds, those `matched_delete` takes delete it, those `matched_update` takes replace it; of the
        others, those `not_matched_insert` takes are inserted. Each clause is True, a filter as `to_arrow` takes (or
        a `pyarrow.compute.Expression`) over the source's columns, which may include some the table lacks (an
        operation column), and the table's row as `target.<column>`: `matched_update=[("target.status", "!=",
        "closed")]`. An update below the stored row's ordering value is not written (counted `stale`); rows no
        clause takes are counted `skipped`."""
        clauses = MergeClauses(matched_update, matched_delete, not_matched_insert)
        result, client = self._retried(lambda c: c.merge(source, clauses, txn), "merge",
                                       self.config.options["write.conflict_retries"])
        maintenance.after_commit(self.context, client.action, result.instant)
        return result

    @writes
    def update(self, where: Any, set: Mapping[str, Any], txn: Txn | None = None) -> WriteResult:
        """Set columns to values in the rows that match `where` (a filter as `to_arrow` takes), in one commit:
        the matching rows of the snapshot the update begins from are upserted with the values set (they keep
        their ordering value). Key and partition columns cannot be set. Counted as `updated`."""
        return self._write(None, "upsert", txn, where=where, assignments=set)

    @writes
    def add_columns(self, fields: Sequence[pa.Field]) -> str | None:
        """Add nullable columns, or widen existing ones (a wider integer, float to double, a decimal's precision
        up), in one commit: rows written before read the new columns as nulls, and reads as of earlier instants
        keep their own schema. Dropping, narrowing or retyping a column is refused before anything is written.
        Returns the instant, None when the table has every field already."""
        return self._retried(lambda c: c.add_columns(fields), "add_columns",
                             self.config.options["write.conflict_retries"])[0]

    @writes
    def set_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Store table options (as `Table.create` takes them) for every later `Table.open`, this object
        included; a process that has the table open keeps its own until it opens it again. Unknown options
        and bad values are refused, as are the metadata partitions' file-group counts. Returns the options the
        table now stores (those that differ from their defaults)."""
        stored = self.context.save_options(options)
        self._reopen()
        return stored

    @property
    def schema(self) -> pa.Schema:
        """The table's columns now (with every schema change that has completed)."""
        return self.context.current_config().schema

    @writes
    def rollback(self, instant: str | None = None, force: bool = False) -> dict[str, str]:
        """Recover from dead processes: roll back every pending write whose writer died, reset a service
        (compaction, a resize, indexing) whose process died so it runs again, roll back a dead clustering that
        writers would wait on, finish a dead clean; or roll back
        the given pending instant (`force`: even if its process still beats). Completed instants stay. Returns
        instant -> what was done."""
        transactions = self.context.transactions
        with transactions.lock.held():
            if instant is None:
                done = transactions.recover()
            else:
                found = self.context.timeline.get(instant)
                if found is None:
                    raise RollbackError(f"no instant {instant} on the timeline of {self.path}")
                if found.is_completed:
                    raise RollbackError(f"instant {instant} is completed; metatable rolls back only failed writes "
                                        "(restoring a completed commit is not supported)")
                if not force and not self.context.timeline.is_expired(found):
                    raise RollbackError(f"instant {instant} is still running (its writer beats); pass force to "
                                        "roll it back anyway")
                transactions.rollback(found)
                done = {instant: f"{found.action.value}: rolled back"}
        self.metadata.refresh()
        return done

    # -- the file system view -------------------------------------------------------------------------
    def partitions(self) -> list[str]:
        return self.context.view().partitions

    def file_slices(self, as_of: Moment | None = None) -> dict[tuple[str, str], FileSlice]:
        """The latest file slice of every file group, as of the latest (or the given) completed instant."""
        return self.context.view(as_of).file_slices

    # -- reads --------------------------------------------------------------------------------------
    def scan_plan(self, as_of: Moment | None = None, filter: Any = None) -> list[FileSlice]:
        """The file slices a read needs: all of them, less those whose partition values (read off the path,
        before their files are listed), column stats or secondary index rule the filter out. How many were
        skipped is logged and kept in `last_scan` (`ScanPlan.report`)."""
        return self._plan(as_of, filter).slices

    def to_arrow(self, as_of: Moment | None = None, read_optimized: bool = False, filter: Any = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
        """The snapshot as a pyarrow Table, without Spark. `filter`: [(column, op, value), ...], all must hold,
        or a list of such lists, one of which must (ops ==, !=, <, <=, >, >=, in; values are converted to the
        column's type, so a date may be "2024-01-31"). `columns`: only these, in this order. `as_of`: the snapshot
        of the latest completed write at or before a moment: an instant time, an ISO-8601 time ("2026-11-26",
        "2026-11-26T10:00:00+01:00"; without an offset: UTC) or a `datetime` (naive: UTC). A moment before the
        first commit, or whose files a clean removed, is a SnapshotExpiredError naming the readable times."""
        plan = self._plan(as_of, filter, read_optimized)
        with self.context.snapshot_kept(plan.snapshot):
            return reads.to_arrow(self.context, plan, read_optimized, columns)

    def to_pandas(self, as_of: Moment | None = None, read_optimized: bool = False, filter: Any = None,
                  columns: Sequence[str] | None = None) -> Any:
        """The snapshot as a pandas DataFrame (pandas must be installed): `to_arrow`'s rows, converted by
        pyarrow (timestamps keep their time zone, nulls in integer columns make them float)."""
        return self.to_arrow(as_of, read_optimized, filter, columns).to_pandas()

    def to_batches(self, columns: Sequence[str] | None = None, filter: Any = None, as_of: Moment | None = None,
                   read_optimized: bool = False) -> pa.RecordBatchReader:
        """The snapshot as a stream of record batches, read one file slice at a time as it is consumed (memory
        holds a slice, not the table). DuckDB scans it lazily (`duckdb.sql("select ... from reader")`); Polars
        takes it with `pl.from_arrow(reader)`. `columns`, `filter` as for `to_arrow`. The snapshot is fixed
        when this is called."""
        return self.scan(columns, filter, as_of, read_optimized).to_batches()

    def scan(self, columns: Sequence[str] | None = None, filter: Any = None, as_of: Moment | None = None,
             read_optimized: bool = False) -> Scan:
        """The snapshot read for another engine to run lazily (`read.scan`): DuckDB takes it as it is
        (`duckdb.sql("select ... from s")`), Polars as a LazyFrame whose projection and limit reach the read
        (`s.to_polars()`), pyarrow through `__arrow_c_stream__`. `columns`, `filter` as for `to_arrow`; the file
        slices are fixed when this is called."""
        return Scan(self.context, self._plan(as_of, filter, read_optimized), columns, read_optimized)

    def read(self, as_of: Moment | None = None, read_optimized: bool = False, spark: Any = None,
             filter: Any = None, columns: Sequence[str] | None = None) -> Any:
        """The snapshot as a Spark DataFrame (base files merged with their logs, unless `read_optimized`)."""
        return reads.to_dataframe(self.context, self._plan(as_of, filter, read_optimized), read_optimized, spark,
                                  columns)

    def changes(self, start: Moment, end: Moment | None = None, columns: Sequence[str] | None = None,
                filter: Any = None, every_version: bool = False) -> pa.Table:
        """What the writes committed in `(start, end]` changed, as change records (`read.changes`): one per
        record whose row differs between the snapshots as of `start` and `end`, `_change_type` insert, delete,
        or update_preimage then update_postimage, with `_commit_instant` (the last write in the window that
        wrote it) and `_commit_seq`. `start`, `end` as `as_of` takes (`end`: the latest commit that no running
        write precedes). Compactions, clusterings and resizes change nothing. `columns`, `filter` as for
        `to_arrow` (the filter is applied to each change record). `every_version`: each write's own change
        records instead, in the order of their instants (a record three writes updated gives three updates);
        fast where the writes kept change files (`changes.before_images`). A start older than what clean
        kept is a SnapshotExpiredError that names the earliest."""
        return read_changes(self.context, self.metadata_index, start, end, columns, filter,
                            every_version=every_version)

    def _plan(self, as_of: Moment | None, filter: Any, read_optimized: bool = False) -> reads.ScanPlan:
        plan = reads.scan_plan(self.context, self.metadata_index, as_of, filter, read_optimized)
        self.last_scan = plan.report
        return plan

    def lookup(self, keys: Any, explain: bool = False, using: str = "index", as_of: Moment | None = None) -> Any:
        """Where each key lives: a pyarrow Table (key, partition, file_id; nulls when absent). `keys` (local data as
        `upsert` takes, or a Spark DataFrame) has the record key columns, and optionally the partition columns
        (without them every partition is searched). `using="metadata"` takes the three-level path (column_stats
        ranges, bloom filters, file check) whatever the write index. `as_of` as for `to_arrow`: where the keys lived
        then. With `explain`, returns (result, per-level counts)."""
        if using not in ("index", "metadata"):
            raise InvalidInputError(f"lookup using must be 'index' or 'metadata', got {using!r}")
        data = keys_table(keys)
        result, report = self.context.read_view(
            lambda view: locate(self.context, self.metadata_index, data, using == "metadata", view), as_of)
        return (result, report.as_dict()) if explain else result

    def get(self, keys: Any, as_of: Moment | None = None) -> pa.Table:
        """The full rows of the keys that exist, found through the table's index: only the file slices that
        hold them are read. `keys` as for `lookup`; `as_of` as for `to_arrow`."""
        data = keys_table(keys)
        return self.context.read_view(lambda view: get_rows(self.context, self.metadata_index, data, view), as_of)

    def get_by(self, index: str, values: Sequence[Any], as_of: Moment | None = None, explain: bool = False) -> Any:
        """The full rows whose indexed values are among `values`, found through secondary index `index`: a scalar
        per value for a one-column index; for a composite one a tuple of values of its columns, or of its first
        columns (None matches null). Only the file slices that hold them are read. `as_of` as for `to_arrow`
        (as of an earlier snapshot, the index's keys and those of every record written since are read in it).
        With `explain`, returns (rows, report: the index used, its entries found, the file slices read, and as
        of an earlier snapshot the records written since)."""
        def read(view: TimelineView) -> tuple[pa.Table, dict[str, Any]]:
            return secondary_lookup.get_by(
                view, index, values,
                lambda keys, partitions, columns=None: live_rows(self.context, self.metadata_index, keys, partitions,
                                                                 view, columns),
                functools.partial(reads.filtered, self.context, view),
                functools.partial(written_since, self.context, view))
        rows, report = self.context.read_view(read, as_of)
        return (rows, report) if explain else rows

    # -- table services -----------------------------------------------------------------------------
    @writes
    def compact(self) -> str | None:
        """Merge-on-read: rewrite every file group that has logs as a new base file. Returns the instant."""
        done = compaction.compact(self.context)
        self.metadata.refresh()
        return done

    @writes
    def schedule_compaction(self) -> str | None:
        """Merge-on-read: plan a compaction (a requested instant) for `run_compaction` to execute later;
        writers keep appending logs meanwhile. Returns the instant, None when no file group has logs."""
        return compaction.schedule(self.context)

    @writes
    def run_compaction(self, instant: str | None = None) -> list[str]:
        """Execute the given pending compaction, or all of them; returns the instants completed."""
        done = compaction.run(self.context, instant)
        self.metadata.refresh()
        return done

    @writes
    def schedule_clustering(self, sort_columns: Sequence[str] | None = None,
                            partitions: Sequence[str] | int | None = None, num_buckets: int | None = None) -> str | None:
        """Plan a clustering (a requested replacecommit) of the small file slices of every partition, the given
        ones, or the N most recently written (`partitions=N`); `sort_columns` default to the option
        `clustering.sort_columns`. Returns the instant, None when nothing qualifies. Writers keep writing."""
        return clustering.schedule(self.context, sort_columns, partitions, num_buckets)

    @writes
    def run_clustering(self, instant: str | None = None, spark: Any = None) -> list[str]:
        """Execute the given pending clustering, or all of them (one Spark task per group when `spark` is
        given, in-process otherwise); returns the instants completed."""
        done = clustering.run(self.context, instant, spark)
        self.metadata.refresh()
        return done

    @writes
    def cluster(self, sort_columns: Sequence[str] | None = None, partitions: Sequence[str] | int | None = None,
                num_buckets: int | None = None, spark: Any = None) -> str | None:
        """Run the clusterings already pending, then schedule and run a new one. `num_buckets` on a
        simple-bucket table changes its bucket count: a multiple of the current count splits each bucket, any
        other count rewrites each partition."""
        done = clustering.cluster(self.context, sort_columns, partitions, num_buckets, spark)
        self.metadata.refresh()
        return done

    def clustering_plans(self) -> list[dict[str, Any]]:
        """Pending and completed clusterings with their groups and bytes, oldest first."""
        return clustering.plans(self.context)

    @writes
    def clean(self) -> str | None:
        """Delete file slices that none of the last `clean.retain_commits` completed instants can read."""
        done = clean.clean(self.context)
        self.metadata.refresh()
        return done

    # -- the async indexer ----------------------------------------------------------------------------
    @writes
    def schedule_indexing(self, partitions: Sequence[str] = (),
                          secondary: Mapping[str, str | Sequence[str]] | None = None) -> str:
        """Plan building metadata indexes (`bloom_filter`, `column_stats`, `record_index`, and secondary indexes:
        `secondary` maps a name to its column(s)) of this table while writers keep writing: from now on every
        commit maintains them (commits during a secondary index's build are caught up by the indexer). Returns
        the indexing instant."""
        done = indexer.schedule(self.context, as_tuple(partitions), secondary)
        self._reopen()
        return done

    @writes
    def run_indexing(self, instant: str | None = None, spark: Any = None) -> list[str]:
        """Build the given pending indexing, or all of them; the partitions become ready. Returns the instants
        completed. A write still running at `indexer.catchup_timeout_s` aborts it (IndexingAborted)."""
        try:
            return indexer.run(self.context, instant, spark)
        finally:
            self._reopen()

    @writes
    def drop_index(self, partition: str) -> list[str]:
        """Stop maintaining a metadata index and delete it (a pending indexing of it is cancelled, and
        returned). Writers are never blocked."""
        cancelled = indexer.drop(self.context, partition)
        self._reopen()
        return cancelled

    def indexes(self) -> dict[str, str]:
        """Metadata index -> "building" | "ready"."""
        return indexer.settle(self.context)

    def index_status(self) -> list[dict[str, Any]]:
        """Per metadata index: state, file groups, records, and the instant it is current to."""
        return indexer.status(self.context)

    @writes
    def rebuild_metadata(self) -> RebuildReport:
        """Rebuild the metadata table from the data files and the completed timeline, and swap it in (see
        `rebuild`): what a corrupt or lost metadata file's error asks for."""
        try:
            return rebuild.rebuild(self.context)
        finally:
            self._reopen()

    @writes
    def fsck(self, repair: bool = False) -> FsckReport:
        """Check every file the table references (present, readable, checksums) and the metadata table; with
        `repair`, remove what dead processes left (staging files, markers, spilled input, files of instants that
        are gone). See `fsck`."""
        return fsck.check(self.context, repair)

    def _reopen(self) -> None:
        """See the index states and stored options of now (this object reads, looks up and tags with the ready
        indexes)."""
        self._open(self.path, self.storage)

    def stats(self, as_of: Moment | None = None) -> list[dict[str, Any]]:
        """Per file group: rows, bytes and pending logs of its latest slice (as of a completed instant)."""
        return reads.file_group_stats(self.context, as_of)

    def rings(self) -> list[dict[str, Any]]:
        """Consistent hashing: per partition the ring's bucket count, seq_no, smallest and largest file group
        and the hash range each covers."""
        return reads.ring_stats(self.context)

    def __repr__(self) -> str:
        c = self.config
        index = f"bucket/{c.index.engine}" if c.index.type == "bucket" else f"{c.index.type}/{c.index.scope}"
        return (f"Table({self.path!r}, {c.table_type}, key={list(c.record_key)}, "
                f"partition_by={list(c.partition_by)}, index={index}, last instant {self.context.timeline.last_time()})")
