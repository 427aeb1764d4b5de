"""The simple bucket index: bucket = hash32(record key) % num_buckets, one file group per bucket and partition.

A bucket's file group is the live one whose id starts with its number; a bucket with none yet gets
`<bucket:08d>-<generation>`, where the generation is "0" until a clustering changes the bucket count (the
rehash's instant afterwards) or replaces that bucket's file group without a successor (that clustering's
instant): ids are deterministic, so two writers creating one bucket touch the same file group, and never
reuse the id of a replaced file group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_keys import bucket_ids
from .assigner import Assignment

INITIAL_GENERATION = "0"


def bucket_file_id(bucket: int, generation: str = INITIAL_GENERATION) -> str:
    """File ids start with the 8-digit bucket number (contract)."""
    return f"{bucket:08d}-{generation}"


def bucket_of(file_id: str) -> int | None:
    """The bucket a file id names, None for ids that do not start with one."""
    head = file_id[:8]
    return int(head) if len(file_id) > 9 and head.isdigit() and file_id[8] == "-" else None


@dataclass(frozen=True)
class BucketLayout:
    """What a snapshot says about the buckets: their count, the generation, the live file group of each
    bucket per partition, and per partition and bucket the latest clustering that replaced its file group
    (a bucket it left empty gets a file group named after it, never the replaced one's id)."""

    num_buckets: int
    generation: str = INITIAL_GENERATION
    live: Mapping[str, Mapping[int, str]] = field(default_factory=dict)  # partition -> bucket -> file id
    retired: Mapping[str, Mapping[int, str]] = field(default_factory=dict)  # partition -> bucket -> instant

    @classmethod
    def of(cls, num_buckets: int, generation: str, file_groups: Iterable[tuple[str, str]],
           replaced: Iterable[tuple[str, str, str]] = ()) -> BucketLayout:
        """`replaced`: (partition, file id, replacing instant) of every replaced file group."""
        live: dict[str, dict[int, str]] = {}
        for partition, file_id in file_groups:
            bucket = bucket_of(file_id)
            if bucket is not None and bucket < num_buckets:
                live.setdefault(partition, {})[bucket] = file_id
        retired: dict[str, dict[int, str]] = {}
        for partition, file_id, instant in replaced:
            bucket = bucket_of(file_id)
            if bucket is not None:
                mine = retired.setdefault(partition, {})
                mine[bucket] = max(mine.get(bucket, instant), instant)
        return cls(num_buckets, generation, live, retired)

    def ids(self, partition: str) -> list[str]:
        """The file id of every bucket in the partition."""
        mine, retired = self.live.get(partition, {}), self.retired.get(partition, {})
        return [mine.get(b) or bucket_file_id(b, max(self.generation, retired.get(b, self.generation)))
                for b in range(self.num_buckets)]


@dataclass(frozen=True)
class BucketAssigner:
    layout: BucketLayout

    def file_ids(self, keys: pa.Array, partitions: pa.Array) -> pa.Array:
        """Each key's bucket file group in its partition (plain strings)."""
        return self.encoded_file_ids(keys, partitions).dictionary_decode()

    def encoded_file_ids(self, keys: pa.Array, partitions: pa.Array) -> pa.DictionaryArray:
        """Each key's bucket file group in its partition, indexing every partition's bucket ids."""
        n = self.layout.num_buckets
        buckets = np.asarray(bucket_ids(keys, n), dtype=np.int64)
        encoded = pc.dictionary_encode(pa.chunked_array([partitions]) if isinstance(partitions, pa.Array)
                                       else partitions).combine_chunks()
        ids = pa.array([fid for p in encoded.dictionary.to_pylist() for fid in self.layout.ids(p)], pa.string())
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        return pa.DictionaryArray.from_arrays(pa.array((codes * n + buckets).astype(np.int32)), ids)

    def assign(self, keys: pa.Array, partitions: pa.Array) -> Assignment:
        return Assignment(partitions, self.encoded_file_ids(keys, partitions))
