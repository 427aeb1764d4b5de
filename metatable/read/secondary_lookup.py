"""Reads through a secondary index: `Table.get_by`, and the file slices an `==` / `in` filter needs.

A lookup of values is a prefix scan of the index's forward entries (one per file group of its partition),
which name each record's key and file group. Only a ready index answers. Its entries hold the values and
places of now; as of an earlier moment a read takes the keys the index names now and those of every record
written since (`changes.written_since`, `records_then`): a record no write touched since has the same value
now as then. `get_by` and a filter alike read only those records' rows, in the snapshot's slices that hold
them. Every row a read returns is checked against the values asked for: an entry that disagreed with the
data (which `fsck` reports) would cost a read, never a wrong row.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from indexes import secondary_keys as sk
from indexes.arrow_keys import partition_paths
from indexes.keys import record_index_key

from metatable.commit.timeline_view import TimelineView
from metatable.config import secondary_partition
from metatable.errors import InvalidInputError
from metatable.read.key_lookup import KeysBySlice, keys_by_slice
from metatable.read.scan_filter import Filter, coerced
from metatable.table_config import KEY_COLUMN, TableConfig

log = logging.getLogger(__name__)

RECORDS = pa.schema([("key", pa.string()), ("partition", pa.string())])  # records, as `located` names them
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
def filter_slices(view: TimelineView, filters: Filter,
                  then: Callable[[pa.Table], KeysBySlice | None] | None = None) -> tuple[str, KeysBySlice] | None:
    """(index name, the record keys of each file group that may hold matching rows) when a ready secondary index
    answers every conjunction of the filter (each has `==` or `in` on the index's leading columns); None
    otherwise. As of an earlier moment they are `then(entries found)`'s: the snapshot's slices of those records
    and of the records written since (None, and so no index, where those cost more to find than the slices to
    read)."""
    config = view.config
    if not filters or not (view.is_current or then):
        return None
    ready = [(name, cols) for name, cols in config.secondary_indexes.items()
             if secondary_partition(name) in config.metadata_indexes]
    if not ready:
        return None
    used = None
    found = []
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
        found.append(located(view, secondary_partition(name), tokens, len(cols)))
        used = name if used in (None, name) else f"{used}, {name}"
    entries = pa.concat_tables(found)
    if not view.is_current:
        groups = then(entries)
        return None if groups is None else (used, groups)
    if not set(zip(entries["partition"].to_pylist(), entries["file_id"].to_pylist())) <= set(view.file_slices):
        log.warning("secondary index names file groups the snapshot does not have; reading by stats instead")
        return None
    return used, keys_by_slice(entries, view)


def records_then(view: TimelineView, found: pa.Table, since: pa.Table,
                 still_matching: Callable[[pa.Array, pa.Array | None], pa.Table]) -> tuple[pa.Array, pa.Array | None]:
    """The records to read as of an earlier moment (`view`'s), each once: those the index's entries of now
    (`found`, from `located`) name that no write since touched, and those written since (`since`, from
    `changes.written_since`) whose rows then match (`still_matching(keys, partitions)`: those rows, of only the
    columns that decide: 1,000 records written since into an SF 0.1 table cost each query ~0.15 s so, for they
    touch nearly every page of those columns). As record keys and partition paths, without the paths where keys
    are unique across partitions."""
    config = view.config
    records = found.select(["key", "partition"]).cast(RECORDS)
    if since.num_rows:
        written = since.select(["key", "partition"]).cast(RECORDS)
        rows = still_matching(*distinct(config, written))
        untouched = pc.invert(pc.is_in(identities(config, records), value_set=identities(config, written)))
        records = pa.concat_tables([records.filter(untouched), pa.table(
            [rows[KEY_COLUMN], partition_paths(rows, config.partition_by)], schema=RECORDS)])
    return distinct(config, records)


def identities(config: TableConfig, records: pa.Table) -> pa.Array:
    """What tells (key, partition) records apart: the key alone where keys are unique across partitions, else
    `<length of the partition path>:<partition path>:<key>` (the length makes it unambiguous)."""
    if config.keys_unique_across_partitions:
        return records["key"].combine_chunks()
    partition = records["partition"]
    return pc.binary_join_element_wise(pc.cast(pc.utf8_length(partition), pa.string()), partition, records["key"],
                                       ":").combine_chunks()


def distinct(config: TableConfig, keys: pa.Table) -> tuple[pa.Array, pa.Array | None]:
    """(key, partition) rows as distinct record keys and their partition paths; distinct keys alone, without
    paths, where keys are unique across partitions."""
    if config.keys_unique_across_partitions:
        return pc.unique(keys["key"].combine_chunks()), None
    keys = keys.group_by(["key", "partition"]).aggregate([])
    return keys["key"].combine_chunks(), keys["partition"].combine_chunks()


def leading(columns: Sequence[str], equal: dict[str, list[Any]]) -> int:
    """How many of an index's leading columns the filter fixes."""
    return next((i for i, c in enumerate(columns) if c not in equal), len(columns))


def get_by(view: TimelineView, name: str, values: Sequence[Any],
           rows_of: Callable[..., pa.Table], scan: Callable[[Filter], pa.Table],
           written_since: Callable[[], pa.Table | None]) -> tuple[pa.Table, dict[str, Any]]:
    """The rows whose indexed values are among `values` (see `query_tokens`), and how they were found: the
    index's entries, then the rows of those keys (`rows_of(keys, partitions, columns=None)`, in the view's
    snapshot; of `columns` and those every read needs, where given); as of an earlier moment, with the records
    written since whose rows then match (`written_since()`, `records_then`), or, where those cost more to find
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
        rows = rows_of(*records_then(view, found, since, lambda keys, partitions: matching(
            rows_of(keys, partitions, columns), columns, tokens)))
        report = {"index": secondary_partition(name), "entries": found.num_rows, "written_since": since.num_rows,
                  "file_slices": None}
    else:  # a null matches no filter: no filter then
        firsts = [v[0] if isinstance(v, (tuple, list)) else v for v in values]
        rows = scan([] if None in firsts else [(columns[0], "in", firsts)])
        report = {"index": None, "entries": 0, "file_slices": None}
    rows = matching(rows, columns, tokens).select(view.config.schema.names)
    return rows, {**report, "rows": rows.num_rows}
