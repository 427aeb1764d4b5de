"""Tagging: each incoming row's record key, and the partition path and file group(s) the table's index
assigns it. Taggers see only the key and partition columns; they run on Spark executors (an Arrow UDF) or
in-process, and build their assigner once per worker process."""
from __future__ import annotations

from functools import partial

import pyarrow as pa

from indexes.arrow_keys import encoded_partition_paths, record_keys
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


def make_assigner(task: WriteTask) -> Assigner:
    config = task.config
    if config.index.consistent_hashing:
        return ConsistentHashingAssigner(task.index_plan)
    if config.index.type == "bucket":
        return BucketAssigner(task.index_plan)
    plan: BloomPlan = task.index_plan
    storage = task.storage
    metadata = MetadataTable(task.paths.metadata.root, storage=storage,
                             authority=Timeline(storage, task.paths.root))
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


class Tagger:
    """(record keys, assignment) of a batch of key and partition columns. Keeps its assigner (and the bloom
    filters and keys a bloom assigner fetched) for the life of the worker process; pickles as its task."""

    def __init__(self, task: WriteTask) -> None:
        self.task = task
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
            self._assigner = make_assigner(self.task)
        return keys, self._assigner.assign(keys, partitions)
