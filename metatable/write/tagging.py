"""Tagging: each incoming row's record key, and the partition path and file group(s) the table's index
assigns it. Taggers see only the key and partition columns; they run on Spark executors (an Arrow UDF) or
in-process, and build their assigner once per worker process."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import decoded, encoded_partition_paths, record_keys
from indexes.assigner import Assigner, Assignment
from indexes.bloom_index import BloomAssigner, BloomPlan
from indexes.bucket import BucketAssigner
from indexes.consistent_hashing import ConsistentHashingAssigner

from metatable.metadata.table import MetadataTable
from metatable.read.locator import Explain, MetadataIndex, RecordIndex, SliceLocator
from metatable.table_config import TableConfig
from metatable.timeline.timeline import Timeline
from metatable.write.write_task import WriteTask

BASE_KEY_CACHE_FILES = 64  # sorted key arrays a bloom tagger keeps between batches


def tag_inputs(config: TableConfig) -> list[str]:
    """The columns that decide a row's record key, partition path and file group."""
    return list(dict.fromkeys([*config.record_key, *config.partition_by]))


def make_assigner(task: WriteTask, metadata: MetadataTable | None = None) -> Assigner:
    """`metadata`: the write's own metadata table, open at the snapshot the write began from, where the tagger
    runs in its process (else one is opened: on an object store a fresh one reads the properties, two timelines
    and the record index's logs, 14 requests at SF 0.1)."""
    config = task.config
    if config.index.consistent_hashing:
        return ConsistentHashingAssigner(task.index_plan)
    if config.index.type == "bucket":
        buckets = BucketAssigner(task.index_plan)
        return PresenceFromRecordIndex(buckets, RecordIndex(metadata or metadata_of(task), config)) \
            if task.asks_record_index else buckets
    plan: BloomPlan = task.index_plan
    storage = task.storage
    metadata = metadata or metadata_of(task)
    if config.index.type == "record":
        index = RecordIndex(metadata, config)  # partitions are given, or keys unique: one read per key
        return BloomAssigner(plan, index.locate)
    ranges = plan.ranges

    def pinned_ranges(files) -> dict:
        return {(p, n): ranges[p][n] for p, n in files if n in ranges.get(p, {})}

    filters = partial(MetadataIndex(metadata).filters, ready=config.metadata_indexes)
    locator = SliceLocator(storage, task.paths, config, task.slices, pinned_ranges, filters,
                           cache_base_keys=BASE_KEY_CACHE_FILES)
    return BloomAssigner(plan, lambda keys, partitions: locator.locate(keys, partitions, None, Explain("bloom")))


def metadata_of(task: WriteTask) -> MetadataTable:
    return MetadataTable(task.paths.metadata.root, storage=task.storage,
                         authority=Timeline(task.storage, task.paths.root))


class PresenceFromRecordIndex:
    """A bucket assigner whose assignments say which keys their file group holds, as the record index has
    them (`WriteTask.asks_record_index`)."""

    def __init__(self, buckets: Assigner, index: RecordIndex) -> None:
        self.buckets = buckets
        self.index = index

    def assign(self, keys: pa.Array, partitions: pa.Array) -> Assignment:
        assignment = self.buckets.assign(keys, partitions)
        where, file_ids = self.index.locate(keys, partitions)
        present = pc.and_kleene(pc.equal(where, decoded(assignment.partitions)),
                                pc.equal(file_ids, decoded(assignment.file_ids)))
        return replace(assignment, present=pc.fill_null(present, False))


class Tagger:
    """(record keys, assignment) of a batch of key and partition columns. Keeps its assigner (and the bloom
    filters and keys a bloom assigner fetched) for the life of the worker process; pickles as its task
    (`metadata`, the write's own metadata table in its process, stays there)."""

    def __init__(self, task: WriteTask, metadata: MetadataTable | None = None) -> None:
        self.task = task
        self.metadata = metadata
        self._assigner: Assigner | None = None

    def __getstate__(self) -> dict:
        return {"task": self.task}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["task"])

    def __call__(self, table: pa.Table) -> tuple[pa.Array, Assignment]:
        config = self.task.config
        keys = record_keys(table, config.record_key).combine_chunks()
        partitions = encoded_partition_paths(table, config.partition_by)
        if self._assigner is None:
            self._assigner = make_assigner(self.task, self.metadata)
        return keys, self._assigner.assign(keys, partitions)
