"""Hash and key definitions (contract: see DESIGN.md, "Hash and key definitions").

All strings are UTF-8 encoded before hashing. Metadata keys encode each
component on its own so that every key of one partition path (or one column)
shares a fixed-length prefix and can be range-scanned.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

import mmh3
import numpy as np
import pybase64

from metatable.errors import InvalidInputError

ALL_PARTITIONS_KEY = "__all_partitions__"
NON_PARTITIONED = "."


def _utf8(s: str | bytes) -> bytes:
    return s if isinstance(s, bytes) else s.encode("utf-8")


def hash32(s: str | bytes) -> int:
    """Bucket hash in [0, 2^31-1]."""
    return mmh3.hash(_utf8(s), seed=0, signed=False) & 0x7FFFFFFF


def bucket_indexes(keys: Sequence[str], n: int) -> np.ndarray:
    """`hash32(key) % n` for many keys (the low 31 bits of murmur3 do not depend on its sign)."""
    return (np.fromiter(map(mmh3.hash, keys), dtype=np.int64, count=len(keys)) & 0x7FFFFFFF) % n


def group_by_bucket(keys: Sequence[str], n: int) -> list[tuple[int, list[str]]]:
    """(bucket, keys) for each bucket that has keys, bucket = hash32(key) % n."""
    if n == 1:
        return [(0, list(keys))] if len(keys) else []
    buckets = bucket_indexes(keys, n)
    order = np.argsort(buckets, kind="stable")
    ordered = np.array(keys, dtype=object)[order]
    counts = np.bincount(buckets, minlength=n)
    out, start = [], 0
    for bucket, count in enumerate(counts.tolist()):
        if count:
            out.append((bucket, ordered[start:start + count].tolist()))
            start += count
    return out


def hash64(s: str | bytes) -> bytes:
    """First 64 bits of murmur3 x64 128, as 8 big-endian bytes."""
    return mmh3.hash64(_utf8(s), seed=0, x64arch=True, signed=False)[0].to_bytes(8, "big")


def hash128(s: str | bytes) -> bytes:
    return mmh3.hash_bytes(_utf8(s), seed=0, x64arch=True)


def b64(x: bytes) -> str:
    return pybase64.b64encode(x).decode("ascii")


def key_value_text(name: str, value: Any) -> str:
    """One key field's value as text; null or empty is an error."""
    if value is None:
        raise InvalidInputError(f"record key field {name!r} is null; every record needs a key")
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (dt.date, dt.datetime)):
        text = value.isoformat()
    elif isinstance(value, bytes):
        text = value.decode("utf-8")
    else:
        text = str(value)
    if text == "":
        raise InvalidInputError(f"record key field {name!r} is empty; every record needs a key")
    return text


def record_key(fields: Sequence[str], values: Sequence[Any]) -> str:
    """One field -> its value as text; several -> `name1:value1,name2:value2` in declared order."""
    if len(fields) != len(values):
        raise InvalidInputError(f"record key has fields {list(fields)} but {len(values)} values")
    if len(fields) == 1:
        return key_value_text(fields[0], values[0])
    return ",".join(f"{name}:{key_value_text(name, value)}" for name, value in zip(fields, values))


def files_key(partition_path: str) -> str:
    """`files` partition key: the partition path, `.` for a non-partitioned table."""
    return partition_path or NON_PARTITIONED


def bloom_filter_key(partition_path: str, file_name: str) -> str:
    """The engine passes `.` as the partition path of a non-partitioned table."""
    return b64(hash64(partition_path)) + b64(hash128(file_name))


def column_stats_key(column_name: str, partition_path: str, file_name: str) -> str:
    return b64(hash64(column_name)) + b64(hash64(partition_path)) + b64(hash128(file_name))


def column_stats_prefix(column_name: str, partition_path: str | None = None) -> str:
    """Key prefix of all stats of a column (optionally within one partition path)."""
    prefix = b64(hash64(column_name))
    return prefix if partition_path is None else prefix + b64(hash64(partition_path))


def bloom_filter_prefix(partition_path: str) -> str:
    return b64(hash64(partition_path))


def hashing_meta_key(partition_path: str) -> str:
    return files_key(partition_path)


def record_index_key(partition_path: str, key: str, global_scope: bool) -> str:
    """`record_index` key: the record key where keys are unique across partitions (`global_scope`: a
    non-partitioned table or a global index), else `b64(hash64(partition_path)) + record key`."""
    return key if global_scope else b64(hash64(partition_path)) + key

