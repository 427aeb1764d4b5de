"""Writing one file group's share of a batch at one instant (on an executor or in-process).

Merge-on-read appends the rows as a log block to the file group's latest slice (or writes a first base
for a new file group); copy-on-write merges them with the slice and rewrites the base. A mixed write
(operation `merge`) flags each row as an upsert or a delete: one block holds both. Counts say what
happened to the rows: inserted, updated, deleted, or skipped (an insert of a key that exists); or upserted,
when an upsert does not tell inserts from updates (`write.count_updates` false).

Consistent hashing: when a pending resize replaces the file group, the rows it took (deletes as delete
markers) are also written, in the same task, as "dual" logs of the new file groups the pending ring maps
them to, based on the resize's instant. The commit keeps them for the resize to adopt, or adopts them itself
once the resize has committed (`data_commit`). Only the groups under resize pay, and no row is shuffled
twice.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import hash32_array
from indexes.consistent_hashing import RingPlan

from metatable.commit.dual_writes import DUAL
from metatable.file_group.base_file import new_write_token
from metatable.file_group.base_file_writer import new_file, write_base_file
from metatable.file_group.before_images import write_images
from metatable.file_group.record_merge import dedupe_batch, loses, merge_versions, newest_of_each_key
from metatable.file_group.slice_reader import (keep_log_columns, live_mask, log_keys, log_tables, members, read_slice,
                                               stored_values)
from metatable.file_group.slice_rows import slice_rows
from metatable.file_group.written import ABSENT_GROUP, NO_COUNTS, absent_row, stats_row
from metatable.formats.data_log import write_data_log
from metatable.formats.log_file import LogFile
from metatable.schema_evolution import in_schema
from metatable.storage.base import Storage
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, RESET_COLUMN
from metatable.write.key_prefetch import KeyPrefetch, SliceKeys
from metatable.write.write_task import FILE_ID_COLUMN, MOVED_OUT_COLUMN, PARTITION_COLUMN, PRESENT_COLUMN, WriteTask


class FileGroupWriter:
    def __init__(self, task: WriteTask, partition: str, file_id: str, storage: Storage | None = None,
                 prefetched: SliceKeys | None = None) -> None:
        self.task = task
        self.prefetched = prefetched
        self.config = task.config
        self.partition = partition
        self.file_id = file_id
        self.storage = storage or task.storage
        self.slice = task.slices.get((partition, file_id))

    def write(self, rows: pa.Table) -> list[dict]:
        if self.file_id == ABSENT_GROUP:  # a delete's keys the index found nowhere
            return [absent_row(self.partition, self.file_id, rows[KEY_COLUMN])]
        if MOVED_OUT_COLUMN in rows.column_names:  # keys moving to another partition are deleted here
            moved_out = rows.filter(rows[MOVED_OUT_COLUMN])[KEY_COLUMN]
            rows = rows.filter(pc.invert(rows[MOVED_OUT_COLUMN])).drop_columns([MOVED_OUT_COLUMN])
            if len(moved_out):
                return self._move_out(rows.drop_columns([PRESENT_COLUMN]), moved_out)  # moves come from lookups
        config, op, paths = self.config, self.task.operation, self.task.paths
        deleting = op == "delete"
        rows = rows.drop_columns([PARTITION_COLUMN, FILE_ID_COLUMN])
        if config.merge_on_read and (self.slice is None or self.slice.base is None) and rows.num_rows > 1:
            # a new base is written in key order: sorted now, the batch's keys are told unique in one pass
            # (`dedupe_batch`) and the base is not sorted again; hashing them took 20 ms of a load's group of 115k
            rows = rows.take(pc.sort_indices(rows[KEY_COLUMN]))
        incoming = newest_of_each_key(rows, config.ordering_field) if op == "merge" else \
            dedupe_batch(rows, None if deleting else config.ordering_field, deleted=deleting)
        known = incoming.column(PRESENT_COLUMN).to_numpy(zero_copy_only=False).astype(bool) \
            if PRESENT_COLUMN in incoming.column_names else None
        if known is not None:
            incoming = incoming.drop_columns([PRESENT_COLUMN])
        if config.merge_on_read:
            cow_current = None
            is_present = known if known is not None else self._live_in_slice(incoming[KEY_COLUMN])
        else:
            cow_current = read_slice(self.storage, paths, config, self.slice)
            is_present = members(incoming[KEY_COLUMN], cow_current[KEY_COLUMN])
        counts = dict(NO_COUNTS)
        absent: np.ndarray | None = None  # deletes of keys the group does not hold
        n_present = 0 if is_present is None else int(is_present.sum())
        if is_present is None:
            counts.update(upserted=incoming.num_rows)
        elif op == "upsert":
            stale = self._stale(incoming, is_present, cow_current)
            counts.update(inserted=incoming.num_rows - n_present, updated=n_present - stale, stale=stale)
        elif op == "merge":  # upserts and deletes
            deletes = incoming[DELETED_COLUMN].to_numpy(zero_copy_only=False).astype(bool)
            counts.update(inserted=int((~deletes & ~is_present).sum()), updated=int((~deletes & is_present).sum()),
                          deleted=int((deletes & is_present).sum()))
            absent = deletes & ~is_present
        elif op in ("insert", "bulk_insert"):
            # a filter copies every row, even when it keeps them all: SF 1 in-process load, 9 runs each
            # alternated, median 7.2 -> 6.5 s
            if n_present:
                incoming = incoming.filter(pa.array(~is_present))
            counts.update(inserted=incoming.num_rows, skipped=n_present)
        else:
            counts.update(deleted=n_present)
            absent = ~is_present
        dropped = absent is not None and bool(absent.any()) and not self._orders_deletes_of_absent_keys()
        reported = [self._absent(incoming, absent)] if dropped else []
        if dropped:
            incoming = incoming.filter(pa.array(~absent))
            is_present = is_present[~absent]
        if incoming.num_rows == 0:
            counted = [stats_row(self.partition, self.file_id, None, None, 0, 0, counts)] if any(counts.values()) \
                else []
            return counted + reported
        if op not in ("insert", "bulk_insert"):  # an insert replaces no row
            written_keys = incoming[KEY_COLUMN]
            self._keep_before_images(written_keys if is_present is None else written_keys.filter(pa.array(is_present)),
                                     cow_current)
        incoming = with_reset_markers(incoming, is_present)
        duals = self._write_duals(incoming)
        if cow_current is not None:
            merged = merge_versions([cow_current, incoming], config.ordering_field, config.storage_schema)
            return [self._write_base(merged, counts), *duals, *reported]
        if self.slice is None or self.slice.base is None:
            return [self._write_base(incoming.select(config.storage_schema.names).cast(config.storage_schema),
                                     counts), *duals, *reported]
        key = (self.partition, self.file_id)
        base_instant = self.task.log_base_instants.get(key, self.slice.base_instant)
        version = 1 + max((lf.version for lf in self.slice.logs if lf.base_instant == base_instant), default=0)
        return [self._write_log(incoming, counts, self.file_id, base_instant, version), *duals]

    def _orders_deletes_of_absent_keys(self) -> bool:
        """Whether this write's deletes of keys the group does not hold are written all the same, as delete
        markers. A concurrent write may store such a key before this one commits; a merge-on-read slice orders
        its logs by completion (`data_commit.rehome_files`), so the delete, completing later, still wins, as it
        does in Hudi's bucket index. Where nothing would order them (copy-on-write, a group with no base yet)
        they are dropped and reported with their keys (`ABSENT`): the commit fails if a concurrent write stored
        one of them (`conflicts.check`). A chaos run found the delete of a key lost so: dropped as absent, the
        key stored by a write that completed first."""
        return self.config.merge_on_read and self.slice is not None and self.slice.base is not None

    def _absent(self, incoming: pa.Table, absent: np.ndarray) -> dict:
        return absent_row(self.partition, self.file_id, incoming[KEY_COLUMN].filter(pa.array(absent)))

    def _stale(self, incoming: pa.Table, is_present: np.ndarray, current: pa.Table | None) -> int:
        """How many rows update a key the group holds with an ordering value that loses to the stored row's.
        They are written all the same (a delete committed meanwhile would make them the newest version); the
        count tells the caller they changed nothing. Copy-on-write has the stored rows at hand; merge-on-read
        reads the ordering column of the keys' rows (`stored_values`)."""
        ordering = self.config.ordering_field
        if ordering is None or not is_present.any():
            return 0
        present = incoming.filter(pa.array(is_present))
        keys, ours = present[KEY_COLUMN].combine_chunks(), present[ordering]
        if current is not None:
            stored = current[ordering].take(pc.index_in(keys, value_set=current[KEY_COLUMN].combine_chunks()))
        else:
            stored = stored_values(self.storage, self.task.paths, self.config, self.slice, keys, ordering,
                                   above=physical_min(ours), logs=self._logs())
        return int(loses(ours, stored).sum())

    def _live_in_slice(self, keys: pa.ChunkedArray) -> np.ndarray | None:
        """Which keys the merge-on-read slice holds, read from its key column and logs; None for an upsert that
        does not count updates (`write.count_updates`), which needs nothing else from them. Where the index
        looked the keys up (bloom, record index), the caller has the answer already: reading the keys again
        cost the Spark bloom upsert's write stage ~0.5 s at SF 1."""
        if self.slice is not None and not self.task.reads_slice_keys:
            return None
        ahead = self.prefetched
        in_logs = ahead.in_logs(keys) if ahead else None
        if in_logs is None and self.slice is not None and self.slice.logs:
            touched, alive = log_keys(self.storage, self.task.paths, self.config, self.slice)
            in_logs = members(keys, touched), members(keys, alive)
        return live_mask(self.storage, self.task.paths, self.config, self.slice, keys,
                         ahead.in_base(keys) if ahead else None, in_logs)

    def _logs(self) -> list[pa.Table]:
        """The slice's log blocks (key, delete flag, ordering value): the stored values an update may lose to
        (`log_keys` says which keys live)."""
        if self.slice is None or not self.slice.logs:
            return []
        ordering = self.config.ordering_field
        columns = [KEY_COLUMN, DELETED_COLUMN, *([ordering] if ordering else [])]
        return log_tables(self.storage, self.task.paths, self.config, self.slice, columns)

    def _move_out(self, rows: pa.Table, moved_out: pa.ChunkedArray) -> list[dict]:
        """An upsert's rows of this file group, and the keys that move from it to another partition: one new
        log (delete markers for those) or base (without them). A move counts as a delete here and an insert
        where the key arrives."""
        config = self.config
        rows = rows.drop_columns([PARTITION_COLUMN, FILE_ID_COLUMN])
        if DELETED_COLUMN not in rows.column_names:  # an upsert's rows; a merge's may delete too
            rows = rows.append_column(DELETED_COLUMN, pa.repeat(False, rows.num_rows))
        incoming = newest_of_each_key(rows, config.ordering_field)
        deletes = incoming[DELETED_COLUMN].to_numpy(zero_copy_only=False).astype(bool)
        markers = pa.table({KEY_COLUMN: moved_out, DELETED_COLUMN: pa.repeat(True, len(moved_out))})
        whole = None if config.merge_on_read else read_slice(self.storage, self.task.paths, config, self.slice)
        if whole is None:
            present = live_mask(self.storage, self.task.paths, config, self.slice, incoming[KEY_COLUMN])
        else:
            current = whole.filter(pa.array(~members(whole[KEY_COLUMN], moved_out)))
            present = members(incoming[KEY_COLUMN], current[KEY_COLUMN])
        self._keep_before_images(pa.chunked_array([*moved_out.chunks, *incoming[KEY_COLUMN].filter(pa.array(present))
                                                   .chunks], pa.string()), whole)
        counts = {**NO_COUNTS, "inserted": int((~deletes & ~present).sum()), "updated": int((~deletes & present).sum()),
                  "deleted": len(moved_out) + int((deletes & present).sum())}
        absent = deletes & ~present
        dropped = bool(absent.any()) and not self._orders_deletes_of_absent_keys()
        reported = [self._absent(incoming, absent)] if dropped else []
        if dropped:
            incoming, present = incoming.filter(pa.array(~absent)), present[~absent]
        incoming = with_reset_markers(incoming, present)
        if config.merge_on_read:
            key = (self.partition, self.file_id)
            base_instant = self.task.log_base_instants.get(key, self.slice.base_instant)
            version = 1 + max((lf.version for lf in self.slice.logs if lf.base_instant == base_instant), default=0)
            block = pa.concat_tables([markers, incoming], promote_options="default")
            return [self._write_log(block, counts, self.file_id, base_instant, version), *reported]
        return [self._write_base(merge_versions([current, incoming], config.ordering_field, config.storage_schema),
                                 counts), *reported]

    def _keep_before_images(self, keys: pa.ChunkedArray, current: pa.Table | None) -> None:
        """With `changes.before_images`, the rows of `keys` (those this write replaces or deletes) as the slice it
        began from holds them, kept for `changes()`; `current`: the slice's rows, where the writer read them
        whole (copy-on-write). A merge-on-read writer reads them as `get` does, by page where few."""
        if not self.config.keeps_before_images or self.slice is None or not len(keys):
            return
        if current is not None:
            rows = current.filter(pc.is_in(current[KEY_COLUMN], value_set=keys.combine_chunks()))
        else:
            rows = slice_rows(self.storage, self.task.paths, self.config, [(self.slice, keys.combine_chunks())])[0]
        if rows.num_rows:
            write_images(self.storage, self.task.paths, self.config, self.task.instant, self.partition, self.file_id,
                         rows)

    def _write_base(self, rows: pa.Table, counts: dict[str, int]) -> dict:
        written = write_base_file(self.storage, self.task.paths, self.config, self.task.instant, self.partition,
                                  self.file_id, rows)
        return {**written, **counts}

    def _write_duals(self, rows: pa.Table) -> list[dict]:
        plan = self.task.index_plan
        resize = plan.resize_of(self.partition, self.file_id) if isinstance(plan, RingPlan) else None
        if resize is None:
            return []
        instant, ring = resize
        targets = ring.locate(hash32_array(rows[KEY_COLUMN]))
        return [self._write_log(rows.filter(pa.array(targets == i)), NO_COUNTS, ring.live[i].file_id, instant, 1,
                                DUAL) for i in np.unique(targets).tolist()]

    def _write_log(self, rows: pa.Table, counts: dict[str, int], file_id: str, base_instant: str, version: int,
                   kind: str = "log") -> dict:
        lf = LogFile(file_id, base_instant, version, f"{self.task.instant}-{new_write_token()}")
        path = new_file(self.storage, self.task.paths, self.task.instant, self.partition, lf.file_name)
        schema = self.config.log_schema
        if DELETED_COLUMN not in rows.column_names:
            rows = rows.append_column(DELETED_COLUMN, pa.array(np.zeros(rows.num_rows, dtype=bool)))
        block = in_schema(rows, schema)
        size = write_data_log(self.storage, path, self.task.instant, block, *self.config.log_encoding)
        keep_log_columns(self.storage, path, block, self.task.committed_columns)
        return stats_row(self.partition, file_id, lf.file_name, kind, size, rows.num_rows, counts)


def with_reset_markers(rows: pa.Table, is_present: np.ndarray | None) -> pa.Table:
    """A change feed's rows that reset their record (`RESET_COLUMN`) written after a delete of it in the same
    write, which the merge rule (`record_merge`) applies first: the row then replaces every stored version
    of its key, whatever their ordering values. Only for keys the file group holds (all, where unknown)."""
    if RESET_COLUMN not in rows.column_names:
        return rows
    resets = rows[RESET_COLUMN].to_numpy(zero_copy_only=False).astype(bool)
    rows = rows.drop_columns([RESET_COLUMN])
    if is_present is not None:
        resets &= is_present
    if not resets.any():
        return rows
    keys = rows[KEY_COLUMN].filter(pa.array(resets))
    markers = pa.table({KEY_COLUMN: keys, DELETED_COLUMN: pa.repeat(True, len(keys))})
    if DELETED_COLUMN not in rows.column_names:
        rows = rows.append_column(DELETED_COLUMN, pa.repeat(False, rows.num_rows))
    return pa.concat_tables([markers, rows], promote_options="default")


def physical_min(values: pa.ChunkedArray) -> int | None:
    """The least of integer, date or timestamp values as Parquet stores them (days, a timestamp's units);
    None for other types and where a value is null (a null loses to every stored value)."""
    t = values.type
    if values.null_count or not len(values) or t == pa.uint64() or not (
            pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t)):
        return None
    return pc.min(pc.cast(values, pa.int32() if pa.types.is_date32(t) else pa.int64())).as_py()


def write_file_group(task: WriteTask, rows: pa.Table, prefetch: KeyPrefetch | None = None) -> list[dict]:
    """Every incoming row of one file group (tagged) -> statistics rows of the files written (`stats_table`
    makes them a table, once for all the file groups a caller writes); `prefetch` may have read the slice's
    keys ahead."""
    if rows.num_rows == 0:
        return []
    partition = rows[PARTITION_COLUMN][0].as_py()
    file_id = rows[FILE_ID_COLUMN][0].as_py()
    prefetched = prefetch.take((partition, file_id)) if prefetch is not None else None
    return FileGroupWriter(task, partition, file_id, prefetched=prefetched).write(rows)
