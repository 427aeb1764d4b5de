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
    """column_stats key -> record for one file's columns (`table` its rows, `metadata` its footer if known)."""
    sizes: dict[str, int] = {}
    footer: dict[str, list[tuple[Any, Any]] | None] = {}
    if metadata is not None:
        for rg in range(metadata.num_row_groups):
            group = metadata.row_group(rg)
            for c in range(group.num_columns):
                chunk = group.column(c)
                name = chunk.path_in_schema
                sizes[name] = sizes.get(name, 0) + chunk.total_compressed_size
                stats = chunk.statistics
                if stats is None or not stats.has_min_max:
                    footer[name] = None
                elif footer.setdefault(name, []) is not None:
                    footer[name].append((stats.min, stats.max))
    out = {}
    for name in columns:
        column = table[name]
        if table.num_rows and column.null_count < table.num_rows:
            lo, hi = _min_max(column, footer.get(name))
        else:
            lo = hi = None
        out[column_stats_key(name, partition, file_name)] = {
            "file_name": file_name, "column_name": name, "min_value": lo, "max_value": hi,
            "null_count": column.null_count, "value_count": table.num_rows, "total_size": sizes.get(name, 0),
            "is_deleted": False, "resets": False}
    return out


def _min_max(column: pa.ChunkedArray, footer: list[tuple[Any, Any]] | None) -> tuple[Any, Any]:
    """A column's stored min and max. Strings and bytes come from the Parquet footer when each row group has
    them: the writer compared them already, byte-wise as Arrow does (SF 1 file group of 115k rows, 18
    columns: 11 -> 2 ms, mostly the key and four short strings)."""
    t = column.type
    textual = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
        or pa.types.is_large_binary(t)
    if textual and footer:
        return min(lo for lo, _ in footer), max(hi for _, hi in footer)
    mm = pc.min_max(column)
    return stored_stat(mm["min"].as_py()), stored_stat(mm["max"].as_py())


def tombstones(columns: Sequence[str], partition: str, file_name: str) -> dict[str, None]:
    """Removal of a deleted file's stats."""
    return {column_stats_key(name, partition, file_name): None for name in columns}
