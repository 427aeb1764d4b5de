"""The simple bucket index: bucket = hash32(record key) % num_buckets, one file group per bucket."""
from __future__ import annotations


def bucket_file_id(bucket: int) -> str:
    """File ids start with the 8-digit bucket number (contract); deterministic, so that two writers creating
    the same bucket touch the same file group."""
    return f"{bucket:08d}-0"
