"""What a commit records in a secondary index (`secondary_index_<name>`), and what an index build writes.

Where its write read the rows its keys had (`StoredRows`: a merge-on-read write on a simple bucket index that
counts updates) and no write changed them since, a commit compares its rows with those (`read_entries`).
Otherwise it reads the **reverse entries** of the keys its files write (one batched metadata multi-get: no
data file is read for the old values) and merges them with its files' rows by the table's merge rule
(`record_merge.survivors`: the greatest ordering value wins, a delete removes what came before it, versions in
the order their commits completed), so a row that loses to the stored one changes nothing. For each key whose
outcome differs from the stored one:

- a live outcome writes the forward entry of its values and its reverse entry (with its ordering value and
  when its commit completed); the forward entry of the old values, if they differ, is tombstoned;
- a deleted key tombstones its forward and reverse entries.

A base file's rows are what the file group holds (a copy-on-write rewrite, a clustering's or a resize's new
file group): each replaces its key's stored outcome, and a rewrite's keys it no longer holds are deleted; a
rewrite's rows that equal the previous base's change nothing and are skipped. Compactions move no row and
record nothing.

Entries merge in the order they were computed (`written_at`), each computation knowing every earlier one:
commits compute theirs under the table lock as they complete; while an index builds, commits leave it alone
and the indexer catches their instants up after its build (whose entries are oldest), one after another,
before the index becomes ready. So the index equals one built from the data at any time.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from avro_schemas import schema
from indexes import secondary_keys as sk
from indexes.arrow_keys import record_index_key_array, record_index_key_arrays

from metatable.commit.change import Change
from metatable.commit.stored_rows import GROUP, HELD, StoredRows
from metatable.file_group.base_file import PARQUET
from metatable.file_group.record_merge import SEQ_COLUMN, loses, survivors
from metatable.file_group.slice_reader import log_columns, read_base
from metatable.formats.avro_columns import decode_columns, encode_columns
from metatable.formats.log_file import Entries
from metatable.metadata.records import KINDS
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, TableConfig
from metatable.timeline.instant import Action

Current = Callable[[pa.Array], Entries]  # reverse entry keys -> the entries of those present

TOKEN, ORDERING_TEXT, PARTITION, FILE_ID = "_si_token", "_si_ordering", "_si_partition", "_si_file_id"
STAMP = "_si_stamp"  # when the commit of a version completed
SCHEMA = schema("secondary_index")


def secondary_records(storage: Storage, paths: TablePaths, config: TableConfig, change: Change, partition: str,
                      current: Current, written_at: int, after_stored: bool) -> Entries:
    """The entries `change` writes to one secondary index partition, computed at `written_at` (ns; entries
    merge in this order). `after_stored`: the change completed after every stored version (a commit under the
    table lock), so a key whose outcome differs from the stored one only in when its commit completed keeps
    its entries: every later computation is a later commit, whose versions follow the stored one whatever its
    stamp. This is most updates (their indexed values unchanged), and it kept a 5% upsert at SF 1 from
    rewriting 541,508 entries. A catch-up applies instants out of completion order and keeps stamps exact."""
    if change.action is Action.COMPACTION or not change.files:
        return Entries.empty()
    columns = config.secondary_columns(partition)
    if after_stored:
        read = read_entries(storage, paths, config, change, columns, written_at)
        if read is not None:
            return read
    parts = []
    for seq, f in enumerate(change.final_files, 1):
        path = paths.file(f.partition, f.file_name)
        if f.file_name.endswith("." + PARQUET):
            rows = read_base(storage, path, row_schema(config, columns, deleted=False), known=config.known_columns)
            previous = change.superseded.get((f.partition, f.file_id)) if change.action is Action.COMMIT else None
            if previous is not None:  # a copy-on-write rewrite: its unchanged rows, and the keys it dropped
                old = read_base(storage, paths.file(f.partition, previous), rows.schema, known=config.known_columns)
                rows, gone = rewritten(rows, old, columns, config.ordering_field)
                parts.append(versions(config, columns, gone, f.partition, f.file_id, seq, reset=True, deleted=True))
            parts.append(versions(config, columns, rows, f.partition, f.file_id, seq, reset=True))
        else:
            rows = log_columns(storage, path, row_schema(config, columns, deleted=True))
            parts.append(versions(config, columns, rows, f.partition, f.file_id, seq))
    written = pa.concat_tables(parts)
    if written.num_rows == 0:
        return Entries.empty()
    stored = reverse_versions(config, pc.unique(written[KEY_COLUMN].combine_chunks()), current)
    written = written.append_column(STAMP, pa.repeat(change.completed_at, written.num_rows).cast(pa.int64()))
    outcome = survivors(sequenced(pa.concat_tables([stored, written])), config.ordering_field)
    return entries_of(stored, outcome, written_at, compared=(TOKEN, PARTITION, FILE_ID, *(
        [ORDERING_TEXT] if config.ordering_field else []), *([] if after_stored else [STAMP])))


def read_entries(storage: Storage, paths: TablePaths, config: TableConfig, change: Change, columns: tuple[str, ...],
                 written_at: int) -> Entries | None:
    """The entries of a write where it read the rows its keys had (`Change.stored`; under the table lock): each
    row it wrote against its key's row there, by value, without the reverse entries and without the versions'
    merge (`survivors`). None where that does not hold: a file group the read does not cover, two files of one
    file group, a new base where the read found rows, a key written twice in one log (deleted and written
    again), keys that may move between partitions, a column the read lacks. SF 1's 5% upsert with one index:
    the commit's entries took 1.88 s from the reverse entries, 0.05-0.1 s so."""
    read = change.stored
    if read is None or any(c not in read.rows.column_names for c in columns) or \
            (config.partition_by and config.keys_unique_across_partitions):
        return None
    numbers = read.numbers
    groups = [(f.partition, f.file_id) for f in change.files]
    if len(set(groups)) < len(groups) or not all(g in numbers for g in groups):
        return None
    codes = np.array([numbers[g] for g in groups], np.int32)
    before = read.rows
    before_codes = before[GROUP].to_numpy()
    held = before[HELD].to_numpy(zero_copy_only=False)
    ordering = config.ordering_field
    logs, schema = [], row_schema(config, columns, deleted=True)
    for f, code in zip(change.files, codes):
        path = paths.file(f.partition, f.file_name)
        if f.file_name.endswith("." + PARQUET):  # a new file group: the read found none of its keys
            if (held & (before_codes == code)).any():
                return None
            rows = read_base(storage, path, row_schema(config, columns, deleted=False), known=config.known_columns)
            logs.append(rows.append_column(DELETED_COLUMN, pa.repeat(False, rows.num_rows)).cast(schema))
        else:
            logs.append(log_columns(storage, path, schema))
    if any(pc.any(log[DELETED_COLUMN]).as_py() and pc.count_distinct(log[KEY_COLUMN]).as_py() < log.num_rows
           for log in logs if log.num_rows):
        return None
    rows = pa.concat_tables(logs)
    if rows.num_rows == 0:
        return Entries.empty()
    owners = np.repeat(codes, [log.num_rows for log in logs])
    keys = rows[KEY_COLUMN].combine_chunks()
    at = _in_order(keys, read, codes, held)
    if at is None:
        mine = np.flatnonzero(held)
        found = _rows_of(owners, keys, before_codes[mine], before[KEY_COLUMN].take(pa.array(mine)).combine_chunks())
        at = pa.array(mine).take(found)
    present = at.is_valid().to_numpy(zero_copy_only=False)
    partitions, file_ids = read.partitions_and_file_ids(owners)
    old = before.select([*columns, *([ordering] if ordering and ordering not in columns else [])]).take(at)
    deleted = rows[DELETED_COLUMN].to_numpy()
    live = ~deleted & ~(present & loses(rows[ordering], old[ordering])) if ordering else ~deleted
    same_values = _same(rows, old, columns)
    changed = live & ~(present & same_values & (_same(rows, old, [ordering]) if ordering else True))
    moved = changed & present & ~same_values  # its old values' forward entry goes
    gone = deleted & present
    n = int(changed.sum())
    keep, dead = pa.array(changed), pa.array(moved | gone)

    def index_keys(mask: pa.Array) -> pa.Array:  # only the few that change: building all took 0.04 s
        return record_index_key_arrays(partitions.filter(mask), rows[KEY_COLUMN].filter(mask).combine_chunks(),
                                       config.keys_unique_across_partitions)
    new_keys, dead_keys = index_keys(keep), index_keys(dead)
    token = sk.tokens([rows[c].filter(keep) for c in columns])
    where = {"partition_path": partitions.filter(keep).cast(pa.string()),
             "file_id": file_ids.filter(keep).cast(pa.string()), "completed_at": change.completed_at,
             "written_at": written_at, "is_deleted": False, "value": None, "ordering": None}
    reverse = {**where, "value": token,
               "ordering": sk.texts(rows[ordering].filter(keep)).cast(pa.string()) if ordering else None}
    tombstoned = pa.concat_arrays([sk.forward_keys(sk.tokens([old[c].filter(dead) for c in columns]), dead_keys),
                                   sk.reverse_keys(dead_keys.filter(pa.array(gone[moved | gone])))])
    return Entries.concat([
        Entries(sk.forward_keys(token, new_keys), encode_columns(SCHEMA, where, n)),
        Entries(sk.reverse_keys(new_keys), encode_columns(SCHEMA, reverse, n)),
        Entries.repeated(tombstoned, KINDS["secondary_index"].encode(
            {**KINDS["secondary_index"].tombstone(), "written_at": written_at}))], may_repeat=False)


def _in_order(keys: pa.Array, read: StoredRows, numbers: np.ndarray, held: np.ndarray) -> pa.Array | None:
    """Each written row's row in `read` (null: not held) where the files hold their groups' rows as the write
    tagged them, in its order (a writer keeps that order where no key repeats, and writes every row, as an
    upsert or a delete of held keys does); None otherwise. Compared, not joined: the join was 0.08 s of SF 1's
    5% upsert."""
    rows = read.of_groups(numbers)
    if len(rows) != len(keys) or not pc.all(pc.equal(keys, read.rows[KEY_COLUMN].take(pa.array(rows)))).as_py():
        return None
    return pa.array(rows, mask=~held[rows])


def _rows_of(groups: np.ndarray, keys: pa.Array, read_groups: np.ndarray, read_keys: pa.Array) -> pa.Array:
    """For each (file group number, record key), its row among the read ones (null: none). Joined by the
    record key, then checked by the group: a key the read found in two groups (two partitions' records) is
    joined again by both. Not by the record-index keys (partition hash and key): building both sides took 0.04
    s of SF 1's 5% upsert, and the join of the longer strings 0.03 s more."""
    if not len(read_keys):
        return pa.nulls(len(keys), pa.int32())
    at = pc.index_in(keys, value_set=read_keys)
    found = pc.fill_null(at, 0).to_numpy()
    other = at.is_valid().to_numpy(zero_copy_only=False) & (read_groups[found] != groups)
    if not other.any():
        return at
    again = np.flatnonzero(other)  # each such key against the read rows of the same key, by group
    candidates = np.flatnonzero(pc.is_in(read_keys, value_set=keys.take(pa.array(again))).to_numpy(
        zero_copy_only=False))
    pairs = pc.binary_join_element_wise(pa.array(read_groups[candidates]).cast(pa.string()),
                                        read_keys.take(pa.array(candidates)), "/")
    wanted = pc.binary_join_element_wise(pa.array(groups[again]).cast(pa.string()), keys.take(pa.array(again)), "/")
    match = pc.index_in(wanted, value_set=pairs)
    rows = np.where(at.is_valid().to_numpy(zero_copy_only=False), found, -1)
    rows[again] = np.where(match.is_valid().to_numpy(zero_copy_only=False),
                           candidates[pc.fill_null(match, 0).to_numpy()], -1)
    return pa.array(rows, mask=rows < 0)


def _same(rows: pa.Table, old: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Whether each row's values equal `old`'s in `columns`, a null equal to a null."""
    same = np.ones(rows.num_rows, dtype=bool)
    for c in columns:
        new, was = rows[c], old[c]
        equal = pc.fill_null(pc.equal(new, was), False)
        if new.null_count or was.null_count:
            equal = pc.or_(equal, pc.and_(pc.is_null(new), pc.is_null(was)))
        same &= equal.to_numpy(zero_copy_only=False)
    return same


def sequenced(versions: pa.Table) -> pa.Table:
    """Versions in the order data merges them: by when their commit completed, then by file within a commit.
    Under the table lock every stored entry completed before the commit; the indexer's catch-up applies
    instants in timeline order, which is not always completion order, and a stored row whose commit completed
    later wins there, as it does in the data."""
    stamp = versions[STAMP].to_numpy()
    order = versions[SEQ_COLUMN].to_numpy()
    by = np.lexsort((order, stamp))  # dense ranks of (stamp, order): np.unique(axis=0) took 0.45 s for 600k
    starts = np.ones(len(by), dtype=bool)
    starts[1:] = (np.diff(stamp[by]) != 0) | (np.diff(order[by]) != 0)
    ranks = np.empty(len(by), np.int64)
    ranks[by] = np.cumsum(starts)
    return versions.set_column(versions.schema.get_field_index(SEQ_COLUMN), SEQ_COLUMN, pa.array(ranks))


def row_schema(config: TableConfig, columns: tuple[str, ...], deleted: bool) -> pa.Schema:
    """The columns a secondary index reads of a data file: the key, the indexed ones, the ordering field."""
    names = [KEY_COLUMN, *columns, *([config.ordering_field] if config.ordering_field not in (None, *columns) else [])]
    schema = config.log_schema if deleted else config.storage_schema
    return pa.schema([schema.field(n) for n in names + ([DELETED_COLUMN] if deleted else [])])


def rewritten(rows: pa.Table, old: pa.Table, columns: tuple[str, ...],
              ordering: str | None) -> tuple[pa.Table, pa.Table]:
    """Of a copy-on-write rewrite: its rows that differ from the previous base's (in key, indexed values or
    ordering value), and the previous base's rows whose keys it no longer holds."""
    def signature(t: pa.Table) -> pa.Array:
        text = [t[KEY_COLUMN].combine_chunks(), sk.tokens([t[c] for c in columns])]
        if ordering:
            text.append(pc.fill_null(sk.texts(t[ordering]), "\x00"))
        return pc.binary_join_element_wise(*text, sk.KEY_SEP)

    changed = pc.invert(pc.is_in(signature(rows), value_set=signature(old)))
    gone = pc.invert(pc.is_in(old[KEY_COLUMN], value_set=rows[KEY_COLUMN]))
    return rows.filter(changed), old.filter(gone)


def versions(config: TableConfig, columns: tuple[str, ...], rows: pa.Table, partition: str, file_id: str, seq: int,
             reset: bool = False, deleted: bool = False) -> pa.Table:
    """Rows of a file as versions for `survivors`, keyed by their `record_index` keys. `reset`: each replaces
    its key's earlier versions whatever their ordering values (a delete and the row, both at `seq`)."""
    n = rows.num_rows
    flags = rows[DELETED_COLUMN] if DELETED_COLUMN in rows.column_names else pa.repeat(deleted, n)
    keys = record_index_key_array(partition, rows[KEY_COLUMN], config.keys_unique_across_partitions)
    out = version_table(config, keys, flags, seq, sk.tokens([rows[c] for c in columns]), ordering_of(config, rows),
                        pa.repeat(pa.scalar(partition), n), pa.repeat(pa.scalar(file_id), n))
    if reset and not deleted:
        return pa.concat_tables([out.set_column(1, DELETED_COLUMN, pa.repeat(True, n)), out])
    return out


def ordering_of(config: TableConfig, rows: pa.Table) -> pa.Array | None:
    return rows[config.ordering_field].combine_chunks() if config.ordering_field else None


def version_table(config: TableConfig, keys: pa.Array, deleted: pa.Array | pa.ChunkedArray, seq: int, token: pa.Array,
                  ordering: pa.Array | None, partitions: pa.Array, file_ids: pa.Array) -> pa.Table:
    n = len(keys)
    columns = {KEY_COLUMN: keys.cast(pa.string()), DELETED_COLUMN: deleted,
               SEQ_COLUMN: pa.array(np.full(n, seq, np.int64)), TOKEN: token.cast(pa.string()),
               PARTITION: partitions.cast(pa.string()), FILE_ID: file_ids.cast(pa.string())}
    if config.ordering_field:
        columns[ORDERING_TEXT] = sk.texts(ordering).cast(pa.string())
        columns[config.ordering_field] = ordering.cast(config.schema.field(config.ordering_field).type)
    return pa.table(columns)


def reverse_versions(config: TableConfig, keys: pa.Array, current: Current) -> pa.Table:
    """The reverse entries of `keys` as versions (file order 0, stamped with when they completed)."""
    found = current(sk.reverse_keys(keys))
    records = decode_columns(SCHEMA, found.values)
    present = pc.utf8_slice_codeunits(found.keys.cast(pa.string()), len(sk.KEY_SEP))
    ordering = None
    if config.ordering_field:
        ordering = sk.from_texts(records["ordering"].combine_chunks(), config.schema.field(config.ordering_field).type)
    table = version_table(config, present, pa.repeat(False, len(present)), 0, records["value"].combine_chunks(),
                          ordering, records["partition_path"].combine_chunks(), records["file_id"].combine_chunks())
    return table.append_column(STAMP, records["completed_at"])


def entries_of(stored: pa.Table, outcome: pa.Table, written_at: int, compared: tuple[str, ...]) -> Entries:
    """Forward and reverse entries and tombstones of the keys whose outcome differs from what is stored in a
    `compared` column; each entry stamped with when the commit of its row completed."""
    described = [TOKEN, PARTITION, FILE_ID, STAMP, *([ORDERING_TEXT] if ORDERING_TEXT in stored.column_names else [])]
    joined = outcome.select([KEY_COLUMN, *described])
    at = pc.index_in(joined[KEY_COLUMN], value_set=stored[KEY_COLUMN])  # a left join on unique keys: 0.21 s
    for c in described:                                                 # for 300k keys as a join, 0.05 s so
        joined = joined.append_column(f"old{c}", stored[c].take(at))
    same = pa.repeat(True, joined.num_rows)
    for c in compared:  # null-aware: a null ordering value equals a null one
        equal = pc.fill_null(pc.equal(joined[c], joined[f"old{c}"]), False)
        both_null = pc.and_(pc.is_null(joined[c]), pc.is_null(joined[f"old{c}"]))
        same = pc.and_(same, pc.or_(equal, both_null))
    changed = joined.filter(pc.invert(same))  # the stored row survived where nothing differs
    keys = changed[KEY_COLUMN].combine_chunks()
    n = changed.num_rows
    where = {"partition_path": changed[PARTITION], "file_id": changed[FILE_ID], "completed_at": changed[STAMP],
             "written_at": written_at, "is_deleted": False, "value": None, "ordering": None}
    reverse = {**where, "value": changed[TOKEN],
               "ordering": changed[ORDERING_TEXT] if ORDERING_TEXT in described else None}
    moved = changed.filter(pc.and_(pc.is_valid(changed[f"old{TOKEN}"]),
                                   pc.fill_null(pc.not_equal(changed[TOKEN], changed[f"old{TOKEN}"]), True)))
    gone = stored.filter(pc.invert(pc.is_in(stored[KEY_COLUMN], value_set=outcome[KEY_COLUMN])))
    gone_keys = gone[KEY_COLUMN].combine_chunks()
    dead = pa.concat_arrays([sk.forward_keys(moved[f"old{TOKEN}"].combine_chunks(), moved[KEY_COLUMN].combine_chunks()),
                            sk.forward_keys(gone[TOKEN].combine_chunks(), gone_keys), sk.reverse_keys(gone_keys)]) \
        if len(moved) or len(gone) else pa.array([], pa.string())
    return Entries.concat([
        Entries(sk.forward_keys(changed[TOKEN].combine_chunks(), keys), encode_columns(SCHEMA, where, n)),
        Entries(sk.reverse_keys(keys), encode_columns(SCHEMA, reverse, n)),
        Entries.repeated(dead, KINDS["secondary_index"].encode(
            {**KINDS["secondary_index"].tombstone(), "written_at": written_at}))], may_repeat=False)


def rows_entries(config: TableConfig, columns: tuple[str, ...], rows: pa.Table, keys: pa.Array, partition: str,
                 file_id: str, stamps: np.ndarray) -> Entries:
    """The forward and reverse entries of live rows (`keys`: their record-index keys; `stamps`: when the commit
    that wrote each completed): what an index build writes, with `written_at` 0, so that whatever is computed
    after the build wins over it."""
    token = sk.tokens([rows[c] for c in columns]).cast(pa.string())
    keys = keys.cast(pa.string())
    n = len(keys)
    where = {"partition_path": partition, "file_id": file_id, "completed_at": pa.array(stamps, pa.int64()),
             "written_at": 0, "is_deleted": False, "value": None, "ordering": None}
    reverse = {**where, "value": token,
               "ordering": sk.texts(rows[config.ordering_field]).cast(pa.string()) if config.ordering_field else None}
    return Entries.concat([Entries(sk.forward_keys(token, keys), encode_columns(SCHEMA, where, n)),
                           Entries(sk.reverse_keys(keys), encode_columns(SCHEMA, reverse, n))], may_repeat=False)
