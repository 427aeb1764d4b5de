"""Snapshot reads: the file slices a read needs (less those column stats rule out), as Arrow or Spark,
and per-file-group statistics."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from indexes.keys import column_stats_key

from metatable.commit.context import TableContext
from metatable.commit.timeline_view import TimelineView
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import base_metadata, read_slice
from metatable.formats.data_log import log_row_count
from metatable.read.scan_filter import Conjunct, may_match, row_mask, spark_condition, validate
from metatable.spark.dataframes import read_dataframe
from metatable.spark.session import active_session
from metatable.table_config import TableConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScanPlan:
    slices: list[FileSlice]
    filters: list[Conjunct]
    total: int  # file slices in the snapshot
    config: TableConfig  # the snapshot's: its schema is the read's

    @property
    def report(self) -> dict[str, int]:
        return {"file_slices": self.total, "skipped": self.total - len(self.slices)}


def scan_plan(context: TableContext, as_of: str | None = None,
              filter: Sequence[Conjunct] | None = None) -> ScanPlan:
    """The file slices a read needs: all of them, less those whose column stats rule the filter out."""
    return context.read_view(lambda view: plan_of(view, validate(filter, view.config.schema)), as_of)


def plan_of(view: TimelineView, filters: list[Conjunct]) -> ScanPlan:
    slices = list(view.file_slices.values())
    kept = slices
    if filters and "column_stats" in view.config.metadata_indexes:
        wanted = [column_stats_key(c, fs.partition, fs.base.file_name)
                  for fs in slices if fs.base and not fs.logs for c, _, _ in filters]
        stats = view.metadata.get_many("column_stats", wanted)

        def possible(fs: FileSlice) -> bool:
            if not fs.base or fs.logs:
                return True
            for column, op, value in filters:
                s = stats.get(column_stats_key(column, fs.partition, fs.base.file_name))
                if s is not None and not may_match(op, value, s["min_value"], s["max_value"]):
                    return False
            return True
        kept = [fs for fs in slices if possible(fs)]
    if filters:
        log.info("read: %d of %d file slices skipped by column stats", len(slices) - len(kept), len(slices))
    return ScanPlan(kept, filters, len(slices), view.config)


def to_arrow(context: TableContext, plan: ScanPlan, read_optimized: bool = False) -> pa.Table:
    schema = plan.config.schema
    tables = []
    for fs in plan.slices:
        rows = read_slice(context.storage, context.paths, plan.config, fs, read_optimized).select(schema.names)
        tables.append(rows.filter(row_mask(rows, plan.filters)) if plan.filters else rows)
    return pa.concat_tables(tables) if tables else schema.empty_table()


def to_dataframe(context: TableContext, plan: ScanPlan, read_optimized: bool = False, spark: Any = None) -> Any:
    df = read_dataframe(active_session(spark), context.paths, plan.config, plan.slices, read_optimized)
    return df.where(spark_condition(plan.filters)) if plan.filters else df


def file_group_stats(context: TableContext, as_of: str | None = None) -> list[dict[str, Any]]:
    """Per file group: rows, bytes and pending logs of its latest slice (as of a completed instant)."""
    storage, paths = context.storage, context.paths
    out = []
    for (partition, file_id), fs in sorted(context.view(as_of).file_slices.items()):
        base_rows = base_bytes = 0
        if fs.base:
            path = paths.file(partition, fs.base.file_name)
            base_rows = base_metadata(path).num_rows
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
