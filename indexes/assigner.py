"""The assigner interface: which file group each incoming key is written to.

An index assigns every row (record key, partition path) a partition path and a file group there: the
bucket index computes the key's bucket, the consistent-hashing index finds the key's node on its
partition's ring, the bloom index looks the key up and places new keys. A global index's upsert of a key that
arrives with another partition value moves it: written to the new partition, deleted from the old one.
Assigners are pure logic; whatever they need from storage (a lookup, a ring) the engine hands them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa


@dataclass(frozen=True)
class Assignment:
    # string arrays, plain or dictionary-encoded (the bucket indexes index a few ids rather than repeat them)
    partitions: pa.Array  # where each row is written (the row's own partition path, unless the index keeps it)
    file_ids: pa.Array  # its file group there; null: nowhere (a delete of an absent key)
    # a global index's key that arrives with another partition value: where it lived (deleted there); null
    # for every other row. None: no row moves.
    moved_from: tuple[pa.Array, pa.Array] | None = None  # (partition paths, file ids)
    # whether each row's key already lives in the file group it is written to, where the index looked the
    # key up (a lookup verifies against the same file slices the writer reads); None: the writer checks
    present: pa.Array | None = None


class Assigner(Protocol):
    def assign(self, keys: pa.Array, partitions: pa.Array) -> Assignment:
        """`keys`: record key strings; `partitions`: the rows' partition paths, maybe dictionary-encoded."""
