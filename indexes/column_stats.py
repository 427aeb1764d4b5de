"""Column statistics of data files, as `column_stats` metadata records, and their typed min/max values."""
from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .keys import column_stats_key


def wrap_stat_value(v: Any) -> Any:
    """A plain Python value as the min/max union branch that keeps its type."""
    if isinstance(v, dt.datetime):
        return {"micros": v}
    if isinstance(v, dt.date):
        return {"days": v}
    return v


def stat_value(v: Any) -> Any:
    """A stored min/max union value as a plain Python value."""
    if isinstance(v, dict):
        return v.get("days", v.get("micros"))
    return v


def stored_stat(value: Any) -> Any:
    """A min/max as stored: decimals as doubles (range pruning only needs order), dates and timestamps typed."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    return wrap_stat_value(value)


def file_column_stats(table: pa.Table, columns: Sequence[str], partition: str, file_name: str,
                      metadata: pq.FileMetaData | None = None) -> dict[str, dict[str, Any]]:
    """column_stats key -> record for one file's columns."""
    sizes: dict[str, int] = {}
    if metadata is not None:
        for rg in range(metadata.num_row_groups):
            group = metadata.row_group(rg)
            for c in range(group.num_columns):
                chunk = group.column(c)
                sizes[chunk.path_in_schema] = sizes.get(chunk.path_in_schema, 0) + chunk.total_compressed_size
    out = {}
    for name in columns:
        column = table[name]
        if table.num_rows and column.null_count < table.num_rows:
            mm = pc.min_max(column)
            lo, hi = stored_stat(mm["min"].as_py()), stored_stat(mm["max"].as_py())
        else:
            lo = hi = None
        out[column_stats_key(name, partition, file_name)] = {
            "file_name": file_name, "column_name": name, "min_value": lo, "max_value": hi,
            "null_count": column.null_count, "value_count": table.num_rows, "total_size": sizes.get(name, 0),
            "is_deleted": False, "resets": False}
    return out


def tombstones(columns: Sequence[str], partition: str, file_name: str) -> dict[str, None]:
    """Removal of a deleted file's stats."""
    return {column_stats_key(name, partition, file_name): None for name in columns}
