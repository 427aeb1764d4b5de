"""Tagging: each incoming row's record key, and the partition path and file group it is written to.

Bucket index: the file group is the key's bucket. Bloom index: the three-level
lookup finds the file group that holds the key (in the row's partition, or in
any partition for the global scope); a new key goes to one of its partition's
insert file groups (small existing ones first, then new ones), chosen by hash so
every executor decides alike. Taggers see only key and partition columns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pyarrow as pa

from indexes.arrow_keys import bucket_ids, hash32_array, partition_paths, record_keys
from indexes.bucket import bucket_file_id

from .errors import InvalidInputError
from .storage import LocalStorage
from .table_config import TableConfig


@dataclass(frozen=True)
class BloomPlan:
    """What the driver pins for a bloom-index write."""

    ranges: Mapping[str, Mapping[str, tuple]] = field(default_factory=dict)  # partition -> base file -> key range
    insert_slots: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # partition -> file ids for new keys


def tag_inputs(config: TableConfig) -> list[str]:
    """The columns that decide a row's record key, partition path and file group."""
    return list(dict.fromkeys([*config.record_key, *config.partition_by]))


BASE_KEY_CACHE_FILES = 64  # sorted key arrays a tagging worker keeps between batches


class Tagger:
    """(record keys, partition paths, file ids) of a batch; a null file id drops the row (a delete of an
    absent key)."""

    def __init__(self, task) -> None:  # task: write_path.WriteTask
        self.task = task
        self.config: TableConfig = task.config

    def __call__(self, table: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
        raise NotImplementedError


class BucketTagger(Tagger):
    def __call__(self, table: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
        keys = record_keys(table, self.config.record_key).combine_chunks()
        partitions = partition_paths(table, self.config.partition_by).combine_chunks()
        n = self.config.index.num_buckets
        ids = pa.array([bucket_file_id(b) for b in range(n)]).take(pa.array(bucket_ids(keys, n)))
        return keys, partitions, ids


class BloomTagger(Tagger):
    """Keeps its locator (and the bloom filters it fetched) for the life of the worker process."""

    def __getstate__(self) -> dict:
        return {"task": self.task, "config": self.config}

    def _locator(self):
        if getattr(self, "_cached", None) is None:
            from .metadata_table import MetadataTable
            from .table_lookup import MetadataIndex, SliceLocator
            from .timeline import META_DIR, Timeline

            storage = LocalStorage()
            root = self.task.root
            metadata = MetadataTable(f"{root}/{META_DIR}/metadata", storage=storage,
                                     authority=Timeline(storage, root))
            index = MetadataIndex(metadata, self.config)
            ranges = self.task.bloom.ranges

            def pinned_ranges(files) -> dict:
                return {(p, n): ranges[p][n] for p, n in files if n in ranges.get(p, {})}
            self._cached = SliceLocator(storage, root, self.config, self.task.slices, pinned_ranges, index.filters,
                                        cache_base_keys=BASE_KEY_CACHE_FILES)
        return self._cached

    def __call__(self, table: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
        from .table_lookup import Explain

        keys = record_keys(table, self.config.record_key).combine_chunks()
        incoming = partition_paths(table, self.config.partition_by).combine_chunks()
        key_list, incoming_list = keys.to_pylist(), incoming.to_pylist()
        scope = None if self.config.index.scope == "global" else incoming_list
        found_partition, found_file = self._locator().locate(key_list, scope, False, Explain("bloom"))
        partitions = np.array(found_partition, dtype=object)
        files = np.array(found_file, dtype=object)
        new = np.equal(files, None)
        if new.any():
            arriving = np.array(incoming_list, dtype=object)
            partitions[new] = arriving[new]
            if self.task.operation != "delete":  # a delete of an absent key keeps a null file id: dropped
                hashes = hash32_array(keys)
                for partition in set(arriving[new]):
                    slots = self.task.bloom.insert_slots.get(partition)
                    if not slots:
                        raise InvalidInputError(f"no insert file group planned for partition {partition!r}")
                    mine = new & (arriving == partition)
                    files[mine] = np.array(slots, dtype=object)[hashes[mine] % len(slots)]
        return keys, pa.array(partitions.tolist(), pa.string()), pa.array(files.tolist(), pa.string())


def tagger_for(task) -> Tagger:
    return BloomTagger(task) if task.config.index.type == "bloom" else BucketTagger(task)


def insert_slots(partition_rows: Mapping[str, int], sizes: Mapping[str, Mapping[str, int]], bytes_per_row: float,
                 target: int, instant: str) -> dict[str, tuple[str, ...]]:
    """Per partition, the file groups new keys may go to: those below `target` bytes (smallest first), then
    enough new ones (`<instant>-<n>`) for the batch's rows at `bytes_per_row`, had they all been new."""
    out = {}
    for partition, rows in partition_rows.items():
        small = sorted((size, fid) for fid, size in sizes.get(partition, {}).items() if size < target)
        room = sum(target - size for size, _ in small)
        needed = rows * bytes_per_row - room
        fresh = int(np.ceil(needed / target)) if needed > 0 else 0
        slots = [fid for _, fid in small] + [f"{instant}-{n:04d}" for n in range(fresh)]
        out[partition] = tuple(slots or [f"{instant}-0000"])
    return out
