"""Snapshot reads: the file slices a read needs (less those column stats rule out), as Arrow or Spark,
and per-file-group statistics."""
from __future__ import annotations

import collections
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from indexes.column_stats import stored_stat
from indexes.keys import column_stats_key

from metatable.arrow_memory import bulk_memory
from metatable.commit.context import TableContext
from metatable.commit.timeline_view import TimelineView
from metatable.config import THREADS
from metatable.errors import InvalidInputError
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import base_metadata, log_tables, read_slices, task_size
from metatable.file_group.slice_rows import slice_rows
from metatable.formats.data_log import log_row_count
from metatable.parallel import worker_pool
from metatable.read.changes import written_since
from metatable.read.key_lookup import KeysBySlice, candidate_slices, live_rows
from metatable.read.locator import MetadataIndex
from metatable.read.scan_filter import (
    NULLS, Filter, filter_columns, may_match_any, parse_filter, partition_ranges, row_mask, spark_condition)
from metatable.read.secondary_lookup import filter_slices, records_then
from metatable.spark.dataframes import read_dataframe
from metatable.spark.session import active_session
from metatable.table_config import DELETED_COLUMN, TableConfig
from metatable.timeline.instant import Moment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScanPlan:
    slices: list[FileSlice]
    filters: Filter
    total: int  # file slices listed: those of the partitions whose path values the filter may match
    config: TableConfig  # the snapshot's: its schema is the read's
    index: str | None = None  # the secondary index that chose the slices
    keys: KeysBySlice | None = None  # the records the index names in each slice: only their rows are read
    partitions: int = 0  # in the snapshot
    partitions_skipped: int = 0  # ruled out by their path values, their files not even listed
    snapshot: str | None = None  # the instant read (`TableContext.snapshot_kept`)

    @property
    def report(self) -> dict[str, Any]:
        """What the read skipped: whole partitions by their path values (`partitions_skipped`), then, of the
        file slices of the others (`file_slices`), those their column stats or a secondary index rule out
        (`skipped`)."""
        return {"partitions": self.partitions, "partitions_skipped": self.partitions_skipped,
                "file_slices": self.total, "skipped": self.total - len(self.slices),
                **({"secondary_index": self.index} if self.index else {})}

    def projected(self, columns: Sequence[str] | None) -> tuple[pa.Schema, TableConfig]:
        """The schema a read returns (every column, in table order, by default), and the config to read slices
        with: those columns, the filter's, and the key, partition and ordering columns (a config needs them,
        the merge the ordering), so files are read for no other column."""
        config = self.config
        schema = config.schema
        wanted = list(schema.names) if columns is None else list(columns)
        unknown = [c for c in wanted if c not in schema.names]
        if unknown or len(set(wanted)) != len(wanted):
            raise InvalidInputError(f"columns {wanted} must name distinct columns of the table ({schema.names})")
        return pa.schema([schema.field(c) for c in wanted]), config.reading([*wanted, *filter_columns(self.filters)])


def scan_plan(context: TableContext, index: MetadataIndex, as_of: Moment | None = None, filter: Any = None,
              read_optimized: bool = False) -> ScanPlan:
    """The file slices a read needs: all of them, less those that partition values, column stats or a secondary
    index rule out (`plan_of`). As of an earlier moment a secondary index answers through `keys_then`. A
    read-optimized read (base files only) asks no secondary index: its entries hold the values the logs give."""
    def plan(view: TimelineView) -> ScanPlan:
        filters = parse_filter(filter, view.config.schema)
        return plan_of(view, filters, context_logs(context, view.config),
                       partial(keys_then, context, index, view, filters), not read_optimized, read_optimized)
    return context.read_view(plan, as_of)


def keys_then(context: TableContext, index: MetadataIndex, view: TimelineView, filters: Filter,
              entries: pa.Table) -> KeysBySlice | None:
    """The file slices of `view`, a snapshot as of an earlier moment, that may hold rows matching `filters`, with
    the keys of those records: those a secondary index's entries of now name, and those writes since wrote whose
    rows then match (`secondary_lookup.records_then`); None where the writes since name more files than the
    snapshot has slices (`changes.written_since`)."""
    since = written_since(context, view)
    if since is None:
        return None

    def still_matching(keys: pa.Array, partitions: pa.Array | None) -> pa.Table:
        rows = live_rows(context, index, keys, partitions, view, filter_columns(filters))
        return rows.filter(row_mask(rows, filters))
    return candidate_slices(context, index, *records_then(view, entries, since, still_matching), view)


LogColumns = Callable[[FileSlice, Sequence[str]], Sequence[pa.Table]]  # a slice's log blocks: some columns


def plan_of(view: TimelineView, filters: Filter, logs: LogColumns,
            then: Callable[[pa.Table], KeysBySlice | None] | None = None, secondary: bool = True,
            base_only: bool = False) -> ScanPlan:
    """The view's slices the filter may match: judged by their partition's values, read off its path, before
    any of its files is listed (a one-day read of the workload benchmark's 120 days listed and parsed the
    names of all 480 file groups' ~4,800 files first: 72 of its 110 ms); then by each slice's base file's
    column stats (when the table has column stats) and, for a slice with logs that its base's stats rule out,
    by the ranges of its logs' live rows (`logs`: their columns; a row the slice holds is in its base or in a
    log, so it may match only where one of them may); or a secondary index (where `secondary`; as of an
    earlier moment, through `then`: see `secondary_lookup.filter_slices`), whose plan reads only the rows of the
    records the index names (`ScanPlan.keys`). `base_only`: a read of base files only, whose logs do not count."""
    config = view.config
    partitions = view.partitions
    ranges = {p: partition_ranges(p, config.schema, config.partition_by) for p in partitions} if filters else {}
    listed = [p for p in partitions if may_match_any(filters, ranges[p].get)] if filters else partitions
    found = view.file_slices if len(listed) == len(partitions) else view.slices_in(view.file_sizes(listed))
    slices = list(found.values())
    pruned = {"partitions": len(partitions), "partitions_skipped": len(partitions) - len(listed),
              "snapshot": view.as_of or view.latest}
    if not filters:
        return ScanPlan(slices, filters, len(slices), config, **pruned)
    columns = sorted(filter_columns(filters) - set(config.partition_by))
    by_stats = [fs for fs in slices if fs.base] if "column_stats" in config.metadata_indexes else []
    stats = view.metadata.get_many("column_stats", [column_stats_key(c, fs.partition, fs.base.file_name)
                                                    for fs in by_stats for c in columns])
    with_stats = {id(fs) for fs in by_stats}

    def possible(fs: FileSlice) -> bool:
        def ranges_of(column: str) -> Any:
            if column in ranges[fs.partition]:
                return ranges[fs.partition][column]
            s = stats.get(column_stats_key(column, fs.partition, fs.base.file_name)) if id(fs) in with_stats else None
            return None if s is None else (s["min_value"], s["max_value"])
        if not fs.logs or base_only:
            return may_match_any(filters, ranges_of)
        if id(fs) not in with_stats or may_match_any(filters, ranges_of):
            return True
        in_logs = log_ranges(logs(fs, columns), columns)  # the base's rows cannot match: can the logs' rows?
        return may_match_any(filters, lambda column: ranges[fs.partition].get(column, in_logs.get(column)))
    kept = [fs for fs in slices if possible(fs)]
    by_index = filter_slices(view, filters, then) if secondary else None
    if by_index is not None:
        index, keys = by_index
        kept = [fs for fs in kept if (fs.partition, fs.file_id) in keys]
        log.info("read: secondary index %s leaves %d of %d file slices", index, len(kept), len(slices))
        return ScanPlan(kept, filters, len(slices), config, index, keys, **pruned)
    log.info("read: %d of %d partitions skipped by their values, %d of %d file slices by partition values and "
             "column stats", pruned["partitions_skipped"], len(partitions), len(slices) - len(kept), len(slices))
    return ScanPlan(kept, filters, len(slices), config, **pruned)


def log_ranges(blocks: Sequence[pa.Table], columns: Sequence[str]) -> dict[str, Any]:
    """(min, max) of each column over the live rows of log blocks (their delete markers are no rows of the
    slice), as column stats store them; NULLS where those rows hold only nulls (or there are none)."""
    live = [b.filter(pc.invert(b[DELETED_COLUMN])) for b in blocks]
    out: dict[str, Any] = {}
    for column in columns:
        values = [b[column] for b in live if b.num_rows]
        both = pc.min_max(pa.chunked_array([c for v in values for c in v.chunks], values[0].type)) if values \
            else None
        out[column] = NULLS if both is None or not both["min"].is_valid else \
            (stored_stat(both["min"].as_py()), stored_stat(both["max"].as_py()))
    return out


def context_logs(context: TableContext, config: TableConfig) -> LogColumns:
    """A slice's log blocks, `columns` of them and the delete flag (kept in this process: `log_tables`)."""
    return lambda fs, columns: log_tables(context.storage, context.paths, config, fs, [*columns, DELETED_COLUMN])


def filtered(context: TableContext, view: TimelineView, filter: Any, columns: list[str] | None = None) -> pa.Table:
    """The rows (`columns` of them) of the view's snapshot that match `filter`, read as `Table.to_arrow` reads
    them (on THREADS threads, small slices merged together)."""
    plan = plan_of(view, parse_filter(filter, view.config.schema), context_logs(context, view.config))
    return to_arrow(context, plan, columns=columns)


def slice_tables(context: TableContext, plan: ScanPlan, columns: Sequence[str] | None = None,
                 read_optimized: bool = False, threads: int = 1, together: int = 1) -> Iterator[pa.Table]:
    """The plan's rows, `together` file slices at a time (merged at once: `read_slices`), in the plan's order:
    merged, filtered, projected. With `threads`, that many are read at a time, up to twice as many ahead of
    the caller (decoding, merging and filtering release the GIL); with one, when the caller gets to them (a
    stream of one slice at a time holds one slice, not the table)."""
    out, config = plan.projected(columns)

    def read(slices: list[FileSlice]) -> pa.Table:
        if plan.keys is not None:
            wanted = [(fs, plan.keys[fs.partition, fs.file_id]) for fs in slices]
            rows = pa.concat_tables(slice_rows(context.storage, context.paths, config, wanted, read_optimized))
        else:
            rows = read_slices(context.storage, context.paths, config, slices, read_optimized)
        return matched(plan, rows, out)

    tasks = [plan.slices[i:i + together] for i in range(0, len(plan.slices), together)]
    if threads < 2 or len(tasks) < 2:
        yield from map(read, tasks)
        return
    with worker_pool(threads, "metatable-read") as pool:
        ahead: collections.deque[Future[pa.Table]] = collections.deque()
        for task in tasks:
            ahead.append(pool.submit(read, task))
            if len(ahead) > 2 * threads:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def matched(plan: ScanPlan, rows: pa.Table, out: pa.Schema) -> pa.Table:
    """A slice's rows that match the plan's filter, in the read's columns."""
    return (rows.filter(row_mask(rows, plan.filters)) if plan.filters else rows).select(out.names)


def to_arrow(context: TableContext, plan: ScanPlan, read_optimized: bool = False,
             columns: Sequence[str] | None = None) -> pa.Table:
    """The plan's rows, its slices read THREADS at a time: a full read of the workload benchmark's 480 slices
    (1.69M rows, four logs each) took 1.88 s on one thread, 1.42 s on two (best of three; the per-slice
    Python work holds the GIL). Several small slices a task, merged at once (`task_size`; with one log
    each, 1.28-1.49 s before, 0.66-0.74 s so). A secondary index's plan reads its records' rows from all its
    slices at once, as `get` does (`slice_rows`). Allocated from the bulk pool (`arrow_memory`), as
    a write's are."""
    with bulk_memory():
        if plan.keys is not None:
            out, config = plan.projected(columns)
            wanted = [(fs, plan.keys[fs.partition, fs.file_id]) for fs in plan.slices]
            found = slice_rows(context.storage, context.paths, config, wanted, read_optimized)
            tables = [matched(plan, rows, out) for rows in found]
        else:
            tables = list(slice_tables(context, plan, columns, read_optimized, THREADS,
                                       task_size(len(plan.slices), THREADS)))
    return pa.concat_tables(tables) if tables else plan.projected(columns)[0].empty_table()


def to_dataframe(context: TableContext, plan: ScanPlan, read_optimized: bool = False, spark: Any = None,
                 columns: Sequence[str] | None = None) -> Any:
    out, _ = plan.projected(columns)
    df = read_dataframe(active_session(spark), context.storage, context.paths, plan.config, plan.slices, read_optimized)
    df = df.where(spark_condition(plan.filters)) if plan.filters else df
    return df.select(*out.names) if columns is not None else df


def file_group_stats(context: TableContext, as_of: Moment | None = None) -> list[dict[str, Any]]:
    """Per file group: rows, bytes and pending logs of its latest slice (as of a completed instant)."""
    storage, paths = context.storage, context.paths
    out = []
    for (partition, file_id), fs in sorted(context.view(as_of).file_slices.items()):
        base_rows = base_bytes = 0
        if fs.base:
            path = paths.file(partition, fs.base.file_name)
            base_rows = base_metadata(storage, path).num_rows
            base_bytes = storage.size(path)
        log_paths = [paths.file(partition, lf.file_name) for lf in fs.logs]
        out.append({"partition": partition, "file_id": file_id, "base_rows": base_rows, "base_bytes": base_bytes,
                    "logs": len(fs.logs), "log_rows": sum(log_row_count(storage, p) for p in log_paths),
                    "log_bytes": sum(storage.size(p) for p in log_paths)})
    return out


def ring_stats(context: TableContext) -> list[dict[str, Any]]:
    """A consistent-hashing table's ring per partition: bucket count, seq_no, and its smallest and largest file
    group with the hash range (low, high] each covers."""
    view = context.view()
    sizes = view.live_files
    out = []
    for partition, ring in sorted(view.rings.items()):
        buckets = []
        for node, low, high in ring.ranges():
            fs = view.file_slices.get((partition, node.file_id))
            size = sum(sizes[partition].get(n, 0) for n in fs.file_names) if fs else 0
            buckets.append((size, node.file_id, low, high))
        small, large = min(buckets), max(buckets)
        out.append({"partition": partition, "buckets": ring.num_buckets, "seq_no": ring.seq_no,
                    "instant": ring.instant, "smallest_file_group": small[1], "smallest_bytes": small[0],
                    "smallest_range": f"({small[2]}, {small[3]}]", "largest_file_group": large[1],
                    "largest_bytes": large[0], "largest_range": f"({large[2]}, {large[3]}]"})
    return out
