"""The simple bucket index: bucket = hash32(record key) % num_buckets, one file group per bucket."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .arrow_keys import bucket_ids
from .assigner import Assignment


def bucket_file_id(bucket: int) -> str:
    """File ids start with the 8-digit bucket number (contract); deterministic, so that two writers creating
    the same bucket touch the same file group."""
    return f"{bucket:08d}-0"


@dataclass(frozen=True)
class BucketAssigner:
    num_buckets: int

    def file_ids(self, keys: pa.Array) -> pa.Array:
        """Each key's bucket file group (the same id in every partition)."""
        ids = pa.array([bucket_file_id(b) for b in range(self.num_buckets)])
        return ids.take(pa.array(bucket_ids(keys, self.num_buckets)))

    def assign(self, keys: pa.Array, partitions: pa.Array) -> Assignment:
        return Assignment(partitions, self.file_ids(keys))
