"""Choosing the surviving version of each record key, vectorized over Arrow tables.

Versions carry the record key, a deleted flag and a write sequence number (the
order of the writes that produced them). A key's survivor is, among its versions
written after its last delete, the one with the greatest ordering value (nulls
lowest), ties going to the later write; a key whose last version is a delete is
gone. A write that holds a delete and a row of one key (a change feed's record
deleted and inserted again, `Table.apply_changes(sequence_by=)`) deletes first:
its row replaces every earlier version, whatever their ordering values. Within
one incoming batch (one sequence number) ties are broken by the row's remaining
values, so the result never depends on input order.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metatable.schema_evolution import in_schema
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN

SEQ_COLUMN = "_mt_seq"


def _first_of_runs(sorted_keys: pa.ChunkedArray | pa.Array) -> np.ndarray:
    keys = sorted_keys.combine_chunks() if isinstance(sorted_keys, pa.ChunkedArray) else sorted_keys
    first = np.ones(len(keys), dtype=bool)
    if len(keys) > 1:
        first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
    return first


def survivors(versions: pa.Table, ordering: str | None, tiebreak: Sequence[str] = ()) -> pa.Table:
    """One row per live key; `versions` has KEY, DELETED and SEQ columns (dropped from the result)."""
    if versions.num_rows == 0:
        return versions.drop_columns([DELETED_COLUMN, SEQ_COLUMN])
    deleted = versions[DELETED_COLUMN]
    if pc.any(deleted).as_py():
        versions = versions.filter(after_last_delete(versions[KEY_COLUMN], deleted, versions[SEQ_COLUMN]))
    sort_keys = [(KEY_COLUMN, "ascending", "at_end")]
    if ordering:
        sort_keys.append((ordering, "descending", "at_end"))  # a null ordering value loses
    sort_keys.append((SEQ_COLUMN, "descending", "at_end"))
    sort_keys += [(c, "descending", "at_end") for c in tiebreak]
    order = pc.sort_indices(versions, sort_keys=sort_keys)
    first = _first_of_runs(versions[KEY_COLUMN].take(order))
    return versions.take(order.filter(pa.array(first))).drop_columns([DELETED_COLUMN, SEQ_COLUMN])


def after_last_delete(keys: pa.ChunkedArray, deleted: pa.ChunkedArray, seq: pa.ChunkedArray) -> pa.Array:
    """Which versions are live rows written at or after their key's last delete (a write's delete comes before
    its row): a sort by key and numpy over the runs, not Acero's hash aggregation and a lookup back (1,300
    versions, idle, 300 calls each: 0.27-0.30 ms against 0.52-0.55 ms)."""
    order = pc.sort_indices(pa.table({"k": keys}), sort_keys=[("k", "ascending")]).to_numpy()
    first = _first_of_runs(keys.take(order))
    flags = np.asarray(deleted.to_numpy(zero_copy_only=False), dtype=bool)
    seqs = np.asarray(seq.to_numpy(), dtype=np.int64)
    last_delete = np.maximum.reduceat(np.where(flags, seqs, -1)[order], np.flatnonzero(first))
    run = np.cumsum(first) - 1  # each sorted row's key run
    keep = np.empty(len(order), dtype=bool)
    keep[order] = (seqs[order] >= last_delete[run]) & ~flags[order]
    return pa.array(keep)


def loses(ours: pa.ChunkedArray | pa.Array, theirs: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Which rows' ordering values lose to the stored ones under the merge rule: a smaller value, or a null
    against a value (nulls lowest). A tie does not lose: the later write wins it."""
    lost = pc.or_kleene(pc.less(ours, theirs), pc.and_kleene(pc.is_null(ours), pc.is_valid(theirs)))
    return np.asarray(pc.fill_null(lost, False).to_numpy(zero_copy_only=False), dtype=bool)


def with_version(table: pa.Table, seq: int, deleted: bool = False) -> pa.Table:
    """`table` as versions of write `seq`, keeping a DELETED column if it has one."""
    n = table.num_rows
    if DELETED_COLUMN not in table.column_names:
        table = table.append_column(DELETED_COLUMN, pa.array(np.full(n, deleted), pa.bool_()))
    return table.append_column(SEQ_COLUMN, pa.array(np.full(n, seq, dtype=np.int64)))


def dedupe_batch(batch: pa.Table, ordering: str | None, deleted: bool = False) -> pa.Table:
    """The rows of one incoming batch, one per key (greatest ordering wins, then greatest row values). A batch
    whose keys are unique (the usual) is returned as it is, in its order: sorting a workload-benchmark file
    group's ~67 rows by every column to find nothing to drop cost 0.45 ms, 480 times a batch."""
    if DELETED_COLUMN not in batch.column_names and _unique(batch[KEY_COLUMN].combine_chunks()):
        return batch.append_column(DELETED_COLUMN, pa.array(np.ones(batch.num_rows, dtype=bool))) if deleted \
            else batch
    tiebreak = [c for c in batch.column_names if c not in (KEY_COLUMN, ordering, DELETED_COLUMN)
                and _sortable(batch.schema.field(c).type)]
    result = survivors(with_version(batch, 0, False), ordering, tiebreak)
    if deleted:
        result = result.append_column(DELETED_COLUMN, pa.array(np.ones(result.num_rows, dtype=bool)))
    return result


def newest_of_each_key(batch: pa.Table, ordering: str | None) -> pa.Table:
    """A batch of upserts and deletes (DELETED_COLUMN per row, as a change feed's) reduced to the newest row of
    each key by the ordering value, a delete being a row like any other: a key inserted, updated and deleted
    in one batch is deleted; deleted, then inserted again, is kept. Among rows of one ordering value, the one
    with the greatest other values wins, as in `dedupe_batch`, so the result never depends on input order."""
    flag = "_mt_deleted_row"
    newest = dedupe_batch(batch.rename_columns([flag if c == DELETED_COLUMN else c for c in batch.column_names]),
                          ordering if ordering in batch.column_names else None)  # deletes only: keys alone
    return newest.rename_columns([DELETED_COLUMN if c == flag else c for c in newest.column_names])


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))


def merge_versions(tables: Sequence[pa.Table], ordering: str | None, schema: pa.Schema) -> pa.Table:
    """Merge the versions of a file slice (base first, then logs in write order) into `schema`'s columns, in
    no particular order. Only the keys the logs hold are merged: the base's other rows are the survivors as
    they are, unsorted (a workload-benchmark slice of 3,447 rows with four ~60-row logs: 1.4-1.65 ms a merge
    sorting every row, 1.13-1.2 ms so)."""
    if ordering is None and (newest := newest_versions([t for t in tables if t.num_rows], schema)) is not None:
        return newest
    if not _has_plain_base(tables):
        return _merged(tables, ordering, schema)
    return _over_bases([tables], ordering, schema)[0]


def merge_each(slices: Sequence[Sequence[pa.Table]], ordering: str | None, schema: pa.Schema) -> list[pa.Table]:
    """`merge_versions` of several file slices at once (each a base, then its logs in write order): each
    slice's rows, in no particular order. The slices with a plain base are ranked in one pass, their keys kept
    apart by slice, so a read or a compaction of many small slices pays each Arrow and numpy call once, not
    once a slice: the workload benchmark's 480 slices with one log each, 0.31-0.32 s merged one at a time,
    0.14-0.16 s 32 at a time."""
    plain = [tables for tables in slices if _has_plain_base(tables)]
    ranked = iter(_over_bases(plain, ordering, schema) if plain else [])
    return [next(ranked) if _has_plain_base(tables) else merge_versions(tables, ordering, schema) for tables in slices]


def _has_plain_base(tables: Sequence[pa.Table]) -> bool:
    """Whether a slice's versions start with a base of rows and no delete flag (each key once, as written)."""
    return bool(tables) and tables[0].num_rows > 0 and DELETED_COLUMN not in tables[0].column_names


def _over_bases(slices: Sequence[Sequence[pa.Table]], ordering: str | None, schema: pa.Schema) -> list[pa.Table]:
    """`merge_each` of slices whose base is plain (`_has_plain_base`): the versions of the keys the logs
    touch ranked with numpy over their positions (the ordering values as their dense ranks), then one filter
    of each base and one take of the logs. A key is its slice's number and its place among the logs' keys, so
    one slice's key never meets another's. The merge rule as `survivors` applies it: a key's versions written
    at or after its last delete (a log's delete ends the base's version), the greatest ordering value winning
    (nulls lowest), a tie going to the later write. Fewer Arrow calls than the sort of `_merged`, whatever the
    number of logs: the workload benchmark's 480 slices, 1.12-1.34 -> 0.65-0.88 ms a slice with one log (a
    read between compactions), 1.81-2.27 -> 0.92-1.03 ms with four (a compaction's). Logs come as they are read
    (`TableConfig.log_schema`, the delete flag not null), so they are not rebuilt to another schema."""
    full = schema.append(pa.field(DELETED_COLUMN, pa.bool_(), nullable=False))
    bases = [in_schema(tables[0], schema) for tables in slices]
    parts = [(n, in_schema(log, full)) for n, tables in enumerate(slices) for log in tables[1:] if log.num_rows]
    if not parts:
        return bases
    base = pa.concat_tables(bases) if len(bases) > 1 else bases[0]
    versions = pa.concat_tables([log for _, log in parts]) if len(parts) > 1 else parts[0][1]
    counts = [log.num_rows for _, log in parts]
    owners = np.repeat([n for n, _ in parts], counts)  # each version's slice
    seq = np.repeat(np.arange(1, len(parts) + 1), counts)  # write numbers: in order within each slice
    encoded = pc.dictionary_encode(versions[KEY_COLUMN].combine_chunks())
    distinct = encoded.dictionary
    keys, ids = np.unique(owners * len(distinct) + encoded.indices.to_numpy(), return_inverse=True)
    flags = versions[DELETED_COLUMN]
    deleted = (pc.fill_null(flags, False) if flags.null_count else flags).to_numpy().astype(bool)
    last_delete = np.zeros(len(keys), dtype=np.int64)  # 0: none (the logs are writes 1, 2, ...)
    np.maximum.at(last_delete, ids[deleted], seq[deleted])
    live = np.flatnonzero(~deleted & (seq >= last_delete[ids]))
    in_logs = pc.index_in(base[KEY_COLUMN], value_set=distinct)  # each base row's key among the logs', or null
    rows = np.flatnonzero(in_logs.is_valid().to_numpy(zero_copy_only=False))
    bounds = np.cumsum([0, *(b.num_rows for b in bases)])  # each slice's rows of `base`
    base_keys = (np.searchsorted(bounds, rows, side="right") - 1) * len(distinct) + pc.drop_null(in_logs).to_numpy()
    row_ids = np.minimum(np.searchsorted(keys, base_keys), len(keys) - 1)
    mine = keys[row_ids] == base_keys  # the key is in its own slice's logs
    rows, row_ids = rows[mine], row_ids[mine]
    touched = np.zeros(base.num_rows, dtype=bool)
    touched[rows] = True
    alive = last_delete[row_ids] == 0
    rows, row_ids = rows[alive], row_ids[alive]
    candidates = pa.chunked_array([*base[ordering].take(pa.array(rows)).chunks,
                                   *versions[ordering].take(pa.array(live)).chunks]) if ordering else None
    valid, value = _ranks(candidates, len(rows) + len(live))  # the bases' candidates first, then the logs'
    key = np.concatenate([row_ids, ids[live]])
    writes = np.concatenate([np.zeros(len(rows), np.int64), seq[live]])  # a base is write 0
    order = np.lexsort((writes, value, valid, key))
    last = np.ones(len(order), dtype=bool)  # the last of each key's run ranks highest
    last[:-1] = key[order][1:] != key[order][:-1]
    winners = order[last]
    keep = ~touched
    keep[rows[winners[winners < len(rows)]]] = True
    chosen = np.sort(live[winners[winners >= len(rows)] - len(rows)])  # distinct rows of the logs, by slice
    newer = (versions if len(chosen) == versions.num_rows else versions.take(pa.array(chosen))) \
        .drop_columns(DELETED_COLUMN)
    ends = np.searchsorted(chosen, np.searchsorted(owners, np.arange(len(bases) + 1)))  # each slice's of `newer`
    return [pa.concat_tables([_filtered(b, keep[bounds[n]:bounds[n + 1]]), newer.slice(ends[n], ends[n + 1] - ends[n])])
            for n, b in enumerate(bases)]


def _filtered(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """`table.filter(mask)`, a record batch at a time: the table's filter dispatches per column and chunk, 195 us
    against 128 us for a workload slice of 3,447 rows and 8 columns. A mask that keeps every row copies none."""
    if mask.all():
        return table
    batches = table.to_batches()
    parts = np.split(mask, np.cumsum([b.num_rows for b in batches[:-1]]))
    return pa.Table.from_batches([b.filter(pa.array(m)) for b, m in zip(batches, parts)], schema=table.schema)


def _ranks(values: pa.ChunkedArray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Ordering values as numpy arrays: whether each is valid (a null ranks lowest) and its dense rank among
    them, in the order `survivors` sorts them (a NaN below every number). Without an ordering field every
    version ties, and the later write wins."""
    if values is None:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
    return (values.is_valid().to_numpy(zero_copy_only=False),
            pc.rank(values, tiebreaker="dense").to_numpy().astype(np.int64))


def _merged(tables: Sequence[pa.Table], ordering: str | None, schema: pa.Schema) -> pa.Table:
    """The general merge of `merge_versions`: every version, sorted by key."""
    parts = [with_version(t, seq) for seq, t in enumerate(tables) if t.num_rows]
    if not parts:
        return schema.empty_table()
    full = schema.append(pa.field(DELETED_COLUMN, pa.bool_())).append(pa.field(SEQ_COLUMN, pa.int64()))
    combined = pa.concat_tables([in_schema(p, full) for p in parts])
    return survivors(combined, ordering).select(schema.names)


def newest_versions(parts: Sequence[pa.Table], schema: pa.Schema) -> pa.Table | None:
    """The merge without an ordering field, where no part deletes and each holds a key at most once (a base
    file, a log block: what writers write): the newest version of each key is a part's row whose key no later
    part holds. No sort: a 94k-row SF 1 slice with two logs, 28.6 ms by sorting, 14.5 ms so. None where
    the parts do not qualify."""
    if not parts:
        return schema.empty_table()
    if any(DELETED_COLUMN in p.column_names and pc.any(p[DELETED_COLUMN]).as_py() for p in parts):
        return None
    keys = [p[KEY_COLUMN].combine_chunks() for p in parts]
    if not all(_unique(k) for k in keys):
        return None
    every = pa.concat_arrays(keys)  # the keys of the parts after part i are one slice of it, not a copy
    ends = np.cumsum([len(k) for k in keys])
    kept = [part.filter(pc.invert(pc.is_in(keys[i], value_set=every.slice(int(ends[i])))))
            for i, part in enumerate(parts[:-1])]
    return pa.concat_tables([in_schema(p, schema) for p in [*kept, parts[-1]]])


def _unique(keys: pa.Array) -> bool:
    """Whether no key repeats: strictly ascending keys (a base file's) are checked in one pass, others hashed."""
    if len(keys) < 2:
        return True
    if pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py():
        return True
    return len(pc.unique(keys)) == len(keys)  # `count_distinct` took 20 ms for 115k keys, `unique` 9 ms
