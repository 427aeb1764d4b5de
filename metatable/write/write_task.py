"""Everything a write's executors need, pickled into the Spark job (or used in-process): the table, the
instant, the operation, the file slices it began from, and the index's plan."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import decoded
from indexes.bloom_index import BloomPlan

from metatable.file_group.file_slice import FileSlice
from metatable.file_group.written import ABSENT_GROUP
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import TableConfig

PARTITION_COLUMN = "_mt_partition"  # columns the tagger adds to each row
FILE_ID_COLUMN = "_mt_file_id"
MOVED_OUT_COLUMN = "_mt_moved_out"  # a copy of a row whose key moved partition, to delete it where it lived
PRESENT_COLUMN = "_mt_present"  # the key lives in the row's file group already (indexes that look keys up)


@dataclass(frozen=True)
class WriteTask:
    paths: TablePaths
    storage: Storage  # pickled to executors with its settings (an object store's endpoint and credentials)
    config: TableConfig
    instant: str
    operation: str
    slices: Mapping[tuple[str, str], FileSlice] = field(default_factory=dict)
    log_base_instants: Mapping[tuple[str, str], str] = field(default_factory=dict)  # pending compactions
    index_plan: Any = None  # what the index pinned on the driver: BloomPlan, BucketLayout or RingPlan
    asks_record_index: bool = False  # see `record_index_may_answer`

    def placed(self, file_ids: pa.Array) -> pa.Array:
        """The file groups of tagged rows. A delete's keys that the index found nowhere go to `ABSENT_GROUP`,
        whose writer reports them: a write that completes while the delete runs may store one, and the
        commit probes for that (`conflicts.check`). Other rows assigned nowhere are dropped."""
        if self.operation == "delete" and file_ids.null_count:
            return pc.fill_null(decoded(file_ids), ABSENT_GROUP)
        return file_ids

    @property
    def moves_keys(self) -> bool:
        """Whether an upsert may move a key to another partition (global bloom or record index): its rows
        then carry MOVED_OUT_COLUMN."""
        return isinstance(self.index_plan, BloomPlan) and self.index_plan.moves

    @property
    def reads_slice_keys(self) -> bool:
        """Whether a file group's writer reads the keys its merge-on-read slice holds: to tell inserts from
        updates, or to skip or delete only keys that exist. Not where the index looked the keys up, nor for
        an upsert that does not count (`write.count_updates`)."""
        return (self.config.merge_on_read and not self.looks_up_keys
                and (self.operation != "upsert" or self.config.options["write.count_updates"]))

    @property
    def stored_columns(self) -> tuple[str, ...]:
        """The columns whose values a write keeps from its read of the slices' keys, for its commit's secondary
        index entries (`secondary_records.StoredRows`): those of the secondary indexes commits write, where the
        write reads the keys and each key's file group is its bucket in its partition (a simple bucket index
        scoped by partition), so that the slice read holds every version of the key."""
        config = self.config
        if not self.reads_slice_keys or config.index.type != "bucket" or config.index.consistent_hashing or \
                (config.partition_by and config.index.scope != "partition"):
            return ()
        return config.columns_indexed_by_commits

    @property
    def committed_columns(self) -> tuple[str, ...]:
        """The columns of its files that the write's commit reads: the secondary indexes' and the ordering
        field, which orders their entries (none without a secondary index)."""
        indexed = self.config.columns_indexed_by_commits
        ordering = self.config.ordering_field
        return tuple(dict.fromkeys([*indexed, ordering])) if indexed and ordering else indexed

    @property
    def looks_up_keys(self) -> bool:
        """Whether the index finds each key's file group by a lookup (bloom and record indexes), or a bucket
        index's tagger asks the record index (`asks_record_index`): its rows then carry PRESENT_COLUMN, and
        writers need not check their file groups again."""
        return isinstance(self.index_plan, BloomPlan) or self.asks_record_index


def record_index_may_answer(config: TableConfig, operation: str, storage: Storage) -> bool:
    """Whether the tagger of a bucket index's merge-on-read write (not a bulk insert) into a table on an object
    store may learn which keys exist from the ready record index, where the writers would read every touched
    slice's keys: one multi-get instead of each base's key pages (two ranged reads) and each slice's logs. On an
    object store a 1,000-row upsert at SF 0.1 read 12 ranges fewer (stop 55: 44 requests -> 32; since stop 56 a
process that holds the bases' key columns reads none either, `base_keys_present`). The write asks it
    (`WriteTask.asks_record_index`) only where that reads nothing new: in the process that holds the record index
    read already (in process, not Spark's executors). Cold, it would read the whole index: a 5% upsert at SF 0.1
    took 0.45 s against 0.14 s, decoding the load's 600k entries. On a file system the slices' keys cost no
    request and were read faster (SF 0.1: a 5% upsert 0.057-0.064 s against 0.073-0.095 s, 1,000 rows
    0.036-0.039 against 0.041-0.052 s). Consistent hashing keeps reading the slices: a resize moves keys
    between file groups."""
    return (not storage.local and config.index.type == "bucket" and not config.index.consistent_hashing
            and config.merge_on_read and "record_index" in config.metadata_indexes and operation != "bulk_insert"
            and (operation != "upsert" or config.options["write.count_updates"]))
