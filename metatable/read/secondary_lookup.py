"""Reads through a secondary index: `Table.get_by`, and the file slices an `==` / `in` filter needs.

A lookup of values is a prefix scan of the index's forward entries (one per file group of its partition),
which name each record's key and file group. Only a ready index answers. Its entries hold the values and
places of now; `get_by` as of an earlier moment reads that snapshot's rows of the keys the index names now
and of every record written since (`changes.written_since`): a record no write touched since has the same
value now as then. A filter as of an earlier moment reads by partition values and column stats. Every row a
read returns is checked against the values asked for: an entry that disagreed with the data (which `fsck`
reports) would cost a read, never a wrong row.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from indexes import secondary_keys as sk
from indexes.keys import record_index_key

from metatable.commit.timeline_view import TimelineView
from metatable.config import secondary_partition
from metatable.errors import InvalidInputError
from metatable.read.scan_filter import Filter, coerced
from metatable.table_config import TableConfig

log = logging.getLogger(__name__)

MAX_COMBINATIONS = 10_000  # value tuples a filter may ask an index for; more: the filter reads by stats


def usable(view: TimelineView, name: str) -> tuple[str, ...]:
    """The columns of a ready secondary index this view can read through, or an error that says why not."""
    config = view.config
    columns = config.secondary_indexes.get(name)
    if columns is None:
        raise InvalidInputError(f"no secondary index {name!r}; this table has "
                                f"{sorted(config.secondary_indexes) or 'none'} (create one with "
                                "Table.create(secondary_indexes=...) or schedule_indexing)")
    if secondary_partition(name) not in config.metadata_indexes:
        raise InvalidInputError(f"secondary index {name!r} is still building; run the indexing "
                                "(`Table.run_indexing`, `metatable index run`) and read again")
    return columns


def query_tokens(config: TableConfig, columns: Sequence[str], values: Sequence[Any]) -> list[tuple[int, str]]:
    """(how many columns, token string) of each value: a scalar for a one-column index, else a tuple of the
    first values of the index's columns (None for null)."""
    out = []
    for value in values:
        row = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        if not row or len(row) > len(columns):
            raise InvalidInputError(f"a lookup of the index on {list(columns)} takes 1 to {len(columns)} values, "
                                    f"got {value!r}")
        types = [config.schema.field(c).type for c in columns[:len(row)]]
        row = tuple(None if v is None else coerced(c, t, v) for c, t, v in zip(columns, types, row))
        out.append((len(row), sk.value_tokens(row, types)[0]))
    return out


def located(view: TimelineView, partition: str, tokens: Sequence[tuple[int, str]],
            whole_width: int) -> pa.Table:
    """(key, partition, file_id) of every forward entry of the given values: the record keys, not the
    record-index keys."""
    keys, partitions, file_ids = [], [], []
    unique = view.config.keys_unique_across_partitions
    for width, token in dict.fromkeys(tokens):
        for key, record in view.metadata.scan(partition, sk.scan_prefix(token, width == whole_width)):
            index_key = sk.index_key_of(key)
            prefix = "" if unique else record_index_key(record["partition_path"], "", False)
            keys.append(index_key[len(prefix):])
            partitions.append(record["partition_path"])
            file_ids.append(record["file_id"])
    return pa.table({"key": pa.array(keys, pa.string()), "partition": pa.array(partitions, pa.string()),
                     "file_id": pa.array(file_ids, pa.string())})


def matching(rows: pa.Table, columns: Sequence[str], tokens: Sequence[tuple[int, str]]) -> pa.Table:
    """The rows whose values are among the tokens asked for (each at its width)."""
    keep = None
    for width in sorted({w for w, _ in tokens}):
        have = sk.tokens([rows[c] for c in columns[:width]])
        hit = pc.is_in(have, value_set=pa.array([t for w, t in tokens if w == width], pa.string()))
        keep = hit if keep is None else pc.or_(keep, hit)
    return rows.filter(keep) if keep is not None else rows.slice(0, 0)


# -- filters ---------------------------------------------------------------------------------------------------
def filter_slices(view: TimelineView, filters: Filter) -> tuple[str, set[tuple[str, str]]] | None:
    """(index name, the file groups that may hold matching rows) when a ready secondary index answers every
    conjunction of the filter (each has `==` or `in` on the index's leading columns); None otherwise."""
    config = view.config
    if not view.is_current or not filters:
        return None
    ready = [(name, cols) for name, cols in config.secondary_indexes.items()
             if secondary_partition(name) in config.metadata_indexes]
    if not ready:
        return None
    used = None
    groups: set[tuple[str, str]] = set()
    for conjunction in filters:
        equal: dict[str, list[Any]] = {}
        for column, op, value in conjunction:
            if op in ("==", "in"):
                allowed = [value] if op == "==" else list(value)
                equal[column] = [v for v in equal[column] if v in allowed] if column in equal else allowed
        best = max(((name, cols, leading(cols, equal)) for name, cols in ready), key=lambda x: x[2], default=None)
        if best is None or best[2] == 0:
            return None
        name, cols, width = best
        combos = list(itertools.islice(itertools.product(*(equal[c] for c in cols[:width])), MAX_COMBINATIONS + 1))
        if len(combos) > MAX_COMBINATIONS:
            return None
        tokens = query_tokens(config, cols, combos)
        found = located(view, secondary_partition(name), tokens, len(cols))
        groups |= set(zip(found["partition"].to_pylist(), found["file_id"].to_pylist()))
        used = name if used in (None, name) else f"{used}, {name}"
    if not groups <= set(view.file_slices):
        log.warning("secondary index names file groups the snapshot does not have; reading by stats instead")
        return None
    return used, groups


def leading(columns: Sequence[str], equal: dict[str, list[Any]]) -> int:
    """How many of an index's leading columns the filter fixes."""
    return next((i for i, c in enumerate(columns) if c not in equal), len(columns))


def get_by(view: TimelineView, name: str, values: Sequence[Any],
           rows_of: Callable[[pa.Array, pa.Array | None], pa.Table], scan: Callable[[Filter], pa.Table],
           written_since: Callable[[], pa.Table | None]) -> tuple[pa.Table, dict[str, Any]]:
    """The rows whose indexed values are among `values` (see `query_tokens`), and how they were found: the
    index's entries, then the rows of those keys (`rows_of(keys, partitions)`, in the view's snapshot); as of
    an earlier moment, with the records written since (`written_since()`), or, where those cost more to find
    than the snapshot's slices to read (None), a read of the snapshot filtered on the index's first column
    (`scan`). Every row is checked against the values."""
    columns = usable(view, name)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidInputError(f"get_by takes a list of values, got {values!r}")
    values = list(values)
    tokens = query_tokens(view.config, columns, values)
    found = located(view, secondary_partition(name), tokens, len(columns))  # first: `changes.written_since`
    if view.is_current:
        rows = rows_of(found["key"].combine_chunks(), found["partition"].combine_chunks())
        report = {"index": secondary_partition(name), "entries": found.num_rows,
                  "file_slices": len(set(zip(found["partition"].to_pylist(), found["file_id"].to_pylist())))}
    elif (since := written_since()) is not None:
        keys = pa.concat_tables([found.select(["key", "partition"]), since.select(["key", "partition"])
                                 .cast(pa.schema([("key", pa.string()), ("partition", pa.string())]))])
        if view.config.keys_unique_across_partitions:
            rows = rows_of(pc.unique(keys["key"].combine_chunks()), None)
        else:
            keys = keys.group_by(["key", "partition"]).aggregate([])
            rows = rows_of(keys["key"].combine_chunks(), keys["partition"].combine_chunks())
        report = {"index": secondary_partition(name), "entries": found.num_rows, "written_since": since.num_rows,
                  "file_slices": None}
    else:  # a null matches no filter: no filter then
        firsts = [v[0] if isinstance(v, (tuple, list)) else v for v in values]
        rows = scan([] if None in firsts else [(columns[0], "in", firsts)])
        report = {"index": None, "entries": 0, "file_slices": None}
    rows = matching(rows, columns, tokens).select(view.config.schema.names)
    return rows, {**report, "rows": rows.num_rows}
