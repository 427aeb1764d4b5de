"""A conditional merge's decisions: which source rows update, delete or insert, given the table's current row
of each source key.

Each clause is a condition over one row of the source joined with the table's row of its key: the source's
columns by their names (columns the table lacks too, such as a change feed's operation column), the table's
as `target.<column>` (null where the key is new). A condition is `True` (every row), a filter as `to_arrow`
takes one (values converted to the column's type), or a `pyarrow.compute.Expression` over the same names,
which may compare columns with each other. Of the matched rows, those `matched_delete` takes are deleted
first; `matched_update` takes from the rest.

An update whose ordering value is below the stored row's would lose on read (the table's merge rule), so it
is not written: it is counted `stale`. Rows no clause takes are counted `skipped`. The decisions come from the
snapshot the write begins from; a write that commits in between is merged with this one by the usual rules
(the greatest ordering value wins), as two upserts would be.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import partition_paths, record_keys

from metatable.errors import InvalidInputError
from metatable.file_group.record_merge import loses
from metatable.read.scan_filter import parse_filter, row_mask
from metatable.table_config import DELETED_COLUMN, TableConfig

TARGET = "target."  # how a condition names the table's current row's columns
_ROW = "_mt_merge_row"


@dataclass(frozen=True)
class MergeClauses:
    """A conditional merge's clauses, each a condition (see above); None or False: no such clause."""

    matched_update: Any = None
    matched_delete: Any = None
    not_matched_insert: Any = None

    def named(self) -> dict[str, Any]:
        """The clauses given (a condition that is not None or False)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None and getattr(self, f.name) is not False}

    @property
    def writes_rows(self) -> bool:
        """Whether a clause writes the source's rows (updates or inserts), which then need every column."""
        return bool({"matched_update", "not_matched_insert"} & set(self.named()))

    def check(self, source: pa.Schema, config: TableConfig) -> None:
        """Refuse, before anything is written, a merge without clauses and a condition that does not parse."""
        named = self.named()
        if not named:
            raise InvalidInputError("merge takes at least one of matched_update, matched_delete and "
                                    "not_matched_insert (True, a filter, or a pyarrow.compute.Expression)")
        schema = joined_schema(source, config.schema)
        for name, condition in named.items():
            if condition is True:
                continue
            try:
                if isinstance(condition, pc.Expression):
                    holds(condition, schema.empty_table())  # names a column it lacks: an error now
                else:
                    parse_filter(condition, schema)
            except InvalidInputError as e:
                raise InvalidInputError(f"merge clause {name}: {e}; a condition names the source's columns as "
                                        f"they are and the table's as {TARGET}<column>") from None


def joined_schema(source: pa.Schema, table: pa.Schema) -> pa.Schema:
    """The columns a condition sees: the source's (in the table's types where the table has them), then the
    table's row's as `target.<column>`."""
    own = [table.field(f.name) if f.name in table.names else f for f in source]
    return pa.schema(own + [pa.field(TARGET + f.name, f.type) for f in table])


def holds(condition: Any, rows: pa.Table) -> np.ndarray:
    """Which rows meet the condition (a null counts as not)."""
    if condition is None or condition is False:
        return np.zeros(rows.num_rows, dtype=bool)
    if condition is True:
        return np.ones(rows.num_rows, dtype=bool)
    if isinstance(condition, pc.Expression):
        numbered = rows.append_column(_ROW, pa.array(np.arange(rows.num_rows)))
        try:
            taken = numbered.filter(condition)[_ROW].to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise InvalidInputError(f"merge condition {condition} cannot be evaluated: {e}") from None
        mask = np.zeros(rows.num_rows, dtype=bool)
        mask[taken] = True
        return mask
    mask = row_mask(rows, parse_filter(condition, rows.schema))
    if mask is None:  # an empty filter, as to_arrow's: every row
        return np.ones(rows.num_rows, dtype=bool)
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


@dataclass(frozen=True)
class MergeRows:
    rows: pa.Table  # in the table's columns, with DELETED_COLUMN: the rows to write
    skipped: int  # source rows no clause took
    stale: int  # updates that would lose to the stored row's ordering value


def match_keys(table: pa.Table, config: TableConfig) -> pa.ChunkedArray:
    """What names a record: its key, with its partition where a key is unique only within a partition."""
    keys = record_keys(table, config.record_key)
    if config.keys_unique_across_partitions:
        return keys
    return pc.binary_join_element_wise(keys, partition_paths(table, config.partition_by), "\x00")


def decide(source: pa.Table, extra: pa.Table, target: pa.Table, config: TableConfig,
           clauses: MergeClauses) -> MergeRows:
    """The rows a merge writes. `source`: conformed to the table (its keys unique; only the key and partition
    columns for a merge that only deletes); `extra`: the source's other columns, row for row, which only the
    conditions see; `target`: the table's current rows of the source's keys (each at most once)."""
    n = source.num_rows
    at = pc.index_in(match_keys(source, config), value_set=match_keys(target, config).combine_chunks())
    matched = np.asarray(pc.is_valid(at).to_numpy(zero_copy_only=False), dtype=bool)
    current = target.take(at)
    joined = pa.Table.from_arrays(
        [*source.columns, *extra.columns, *current.columns],
        names=[*source.column_names, *extra.column_names, *(TARGET + c for c in target.column_names)])
    delete = matched & holds(clauses.matched_delete, joined)
    update = matched & ~delete & holds(clauses.matched_update, joined)
    insert = ~matched & holds(clauses.not_matched_insert, joined)
    stale = np.zeros(n, dtype=bool)
    ordering = config.ordering_field
    if ordering and update.any():
        stale = update & loses(source[ordering], current[ordering])
        update &= ~stale
    written = source.filter(pa.array(update | insert))
    deleted = current.filter(pa.array(delete))  # the stored row's partition: where the key lives
    rows = pa.concat_tables([
        written.append_column(DELETED_COLUMN, pa.repeat(False, written.num_rows)),
        deleted.select(source.column_names).cast(source.schema).append_column(
            DELETED_COLUMN, pa.repeat(True, deleted.num_rows))])
    return MergeRows(rows, int(n - (delete | update | insert | stale).sum()), int(stale.sum()))


def unique_keys(source: pa.Table, config: TableConfig) -> None:
    """Refuse a source that names a record more than once: which of its rows should decide is ambiguous (Delta
    Lake refuses it too)."""
    keys = match_keys(source, config)
    if pc.count_distinct(keys).as_py() != len(keys):
        counted = pa.table({"k": keys}).group_by("k").aggregate([([], "count_all")])
        twice = counted.filter(pc.greater(counted["count_all"], 1))
        raise InvalidInputError(f"the merge source has {twice.num_rows} record keys more than once (such as "
                                f"{twice['k'][0].as_py()!r}); keep one row per key (the newest) and merge again")
