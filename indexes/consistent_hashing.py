"""The consistent-hashing bucket index (RFC-42): per partition a ring of nodes over [0, 0x7FFFFFFF]; a key goes
to the first node whose value is >= hash32(key) (past the last node it wraps to the first), and the node's
file group is `<file_id_prefix>-0`.

A ring changes only through a resize (a clustering): an oversized bucket splits, a run of adjacent small
buckets merges. This module is the pure logic: the initial ring, lookups (numpy `searchsorted`), the two
split rules, merges, the resize planner and the assigner a write tags rows with. Where rings are stored
(`hashing_meta`) and how a resize runs is the engine's business.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_keys import hash32_array
from .assigner import Assignment

MAX_HASH = 0x7FFFFFFF
SPAN = MAX_HASH + 1
NORMAL, REPLACE, DELETE = "NORMAL", "REPLACE", "DELETE"
_PREFIX_NAMESPACE = uuid.UUID("6f1c1f5e-3d55-4f0c-9a51-6d6574617462")


def file_id_of(prefix: str) -> str:
    """A node's file group (contract: `<file_id_prefix>-0`)."""
    return f"{prefix}-0"


def node_prefix(partition: str, low: int, high: int, seq_no: int = 0) -> str:
    """Depends only on (partition path, node range) and the ring's seq_no: two writers creating one partition
    agree on its initial ring (seq_no 0), a replanned resize names its nodes as the first plan did, and a
    node never reuses the file group of one that an earlier ring had (each resize advances seq_no)."""
    return str(uuid.uuid5(_PREFIX_NAMESPACE, f"{partition}\x00{low}\x00{high}\x00{seq_no}"))


@dataclass(frozen=True)
class Node:
    value: int  # upper end of the node's hash range, inclusive
    file_id_prefix: str
    tag: str = NORMAL

    @property
    def file_id(self) -> str:
        return file_id_of(self.file_id_prefix)


@dataclass(frozen=True)
class Ring:
    """One partition's ring as `hashing_meta` stores it; a pending ring (in a resize plan) also holds the
    merged-away nodes, tagged DELETE, and its new nodes tagged REPLACE."""

    partition: str
    nodes: tuple[Node, ...]
    seq_no: int = 0
    instant: str = ""
    values: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        live = [n for n in self.nodes if n.tag != DELETE]
        values = np.array([n.value for n in live], dtype=np.int64)
        if len(values) == 0 or np.any(np.diff(values) <= 0):
            raise ValueError(f"ring of {self.partition!r}: node values must be unique and ascending, got "
                             f"{[n.value for n in self.nodes]}")
        object.__setattr__(self, "values", values)

    @property
    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.tag != DELETE]

    @property
    def num_buckets(self) -> int:
        return len(self.values)

    @property
    def file_ids(self) -> list[str]:
        return [n.file_id for n in self.live]

    def locate(self, hashes: np.ndarray) -> np.ndarray:
        """The index (among live nodes) of each hash's node: the first value >= hash, wrapping past the last."""
        at = np.searchsorted(self.values, hashes, side="left")
        at[at == len(self.values)] = 0
        return at

    def ranges(self) -> list[tuple[Node, int, int]]:
        """Each live node with the (exclusive) value of its predecessor and its own: it covers (low, high]."""
        live = self.live
        return [(n, live[i - 1].value, n.value) for i, n in enumerate(live)]

    def resolved(self, instant: str) -> Ring:
        """The ring a pending ring becomes when its resize commits: DELETE nodes gone, all NORMAL, seq_no + 1."""
        return Ring(self.partition, tuple(replace(n, tag=NORMAL) for n in self.live), self.seq_no + 1, instant)

    def to_record(self) -> dict[str, Any]:
        return {"version": 1, "partition_path": self.partition, "instant": self.instant, "seq_no": self.seq_no,
                "num_buckets": self.num_buckets, "is_deleted": False,
                "nodes": [{"value": n.value, "file_id_prefix": n.file_id_prefix, "tag": n.tag} for n in self.nodes]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Ring:
        return cls(record["partition_path"], tuple(Node(n["value"], n["file_id_prefix"], n.get("tag", NORMAL))
                                                   for n in record["nodes"]), record["seq_no"], record["instant"])


def initial_ring(partition: str, n: int) -> Ring:
    """n nodes at step * i (i = 1..n), step = ceil(0x7FFFFFFF / n), the last at 0x7FFFFFFF; seq_no 0 (contract)."""
    step = (MAX_HASH + n - 1) // n
    values = [min(step * i, MAX_HASH) for i in range(1, n + 1)]
    lows = [0] + values[:-1]
    return Ring(partition, tuple(Node(v, node_prefix(partition, lo, v)) for lo, v in zip(lows, values)))


# -- splits and merges ----------------------------------------------------------------------------------------
def middle(former: int, value: int) -> int | None:
    """RFC-42's split point of the node at `value` whose predecessor is at `former`; None when the range is too
    small to split (the middle equals one of its ends)."""
    mid = ((former + value + (0 if former < value else 0x80000000)) >> 1) & MAX_HASH
    return None if mid in (former, value) else mid


def quantile_points(former: int, value: int, hashes: np.ndarray, k: int) -> list[int]:
    """Values of up to k children of the node (former, value] so that each holds about as many of the bucket's
    actual key hashes: cut at the hashes' quantiles, in ring order (the range may wrap past 0x7FFFFFFF). The
    last child keeps `value`; equal hashes never straddle a cut, so a bucket of one repeated hash stays whole."""
    last = (value - former - 1) % SPAN
    offsets = np.sort((np.asarray(hashes, dtype=np.int64) - former - 1) % SPAN)
    offsets = offsets[offsets <= last]  # hashes outside the node's range (none, for its own keys) are ignored
    m = len(offsets)
    if m == 0 or k < 2:
        return [value]
    cuts = sorted({int(offsets[math.ceil(i * m / k) - 1]) for i in range(1, k)} - {last})
    return [(former + 1 + c) % SPAN for c in cuts] + [value]


def split(ring: Ring, index: int, points: Sequence[int]) -> list[Node]:
    """The REPLACE nodes that take over live node `index` at the given values (its own value last)."""
    live = ring.live
    node = live[index]
    if list(points)[-1] != node.value:
        raise ValueError(f"a split of the node at {node.value} must keep its value last, got {list(points)}")
    lows = [live[index - 1].value, *points[:-1]]
    return [Node(p, node_prefix(ring.partition, low, p, ring.seq_no + 1), REPLACE) for low, p in zip(lows, points)]


def merge(ring: Ring, indexes: Sequence[int]) -> list[Node]:
    """Adjacent live nodes (in ring order, wrapping) merged into one: DELETE for all but the last, whose value a
    new REPLACE node keeps."""
    live = ring.live
    n = len(live)
    consecutive = all((b - a) % n == 1 for a, b in zip(indexes, indexes[1:]))
    if len(indexes) < 2 or not consecutive or len(set(indexes)) != len(indexes):
        raise ValueError(f"only adjacent nodes merge; {list(indexes)} are not consecutive on a ring of {n}")
    low, last = live[indexes[0] - 1].value, live[indexes[-1]]
    merged = Node(last.value, node_prefix(ring.partition, low, last.value, ring.seq_no + 1), REPLACE)
    return [replace(live[i], tag=DELETE) for i in indexes[:-1]] + [merged]


def pending_ring(ring: Ring, changes: Sequence[Node]) -> Ring:
    """`ring` with the nodes of a resize: a REPLACE node takes the place of the node at its value (or joins),
    a DELETE node marks one that goes."""
    by_value = {n.value: n for n in ring.live}
    for c in changes:
        by_value[c.value] = c
    return Ring(ring.partition, tuple(by_value[v] for v in sorted(by_value)), ring.seq_no, ring.instant)


def under_resize(committed: Ring, pending: Ring) -> dict[str, list[str]]:
    """file id of each committed node that a pending ring replaces -> the file ids of the nodes taking its keys."""
    target = pending.resolved(pending.instant)
    kept = {n.file_id_prefix for n in target.nodes}
    out: dict[str, list[str]] = {}
    for node, low, high in committed.ranges():
        if node.file_id_prefix in kept:
            continue
        children = []
        for child, c_low, c_high in target.ranges():
            if overlaps(low, high, c_low, c_high):
                children.append(child.file_id)
        out[node.file_id] = children
    return out


def overlaps(low_a: int, high_a: int, low_b: int, high_b: int) -> bool:
    """Whether ring ranges (low_a, high_a] and (low_b, high_b] share a hash (either may wrap)."""
    def pieces(low: int, high: int) -> list[tuple[int, int]]:
        if low < high:
            return [(low + 1, high)]
        return [(low + 1, MAX_HASH), (0, high)] if low != MAX_HASH or high < MAX_HASH else [(0, MAX_HASH)]
    return any(a0 <= b1 and b0 <= a1 for a0, a1 in pieces(low_a, high_a) for b0, b1 in pieces(low_b, high_b))


# -- resize planning ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResizeLimits:
    target: int  # write.target_file_size
    split_threshold: float
    merge_threshold: float
    min_buckets: int
    max_buckets: int
    split_point: str  # "quantile" | "middle"

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> ResizeLimits:
        return cls(options["write.target_file_size"], options["bucket.split_threshold"],
                   options["bucket.merge_threshold"], options["bucket.min_buckets"], options["bucket.max_buckets"],
                   options["bucket.split_point"])


def plan_resize(ring: Ring, sizes: Sequence[int], limits: ResizeLimits,
                key_hashes: Callable[[int], np.ndarray]) -> Ring | None:
    """The pending ring of one partition's resize, None when no bucket needs one. `sizes`: bytes of each live
    node's file group; `key_hashes(i)`: hash32 of the keys in node i (read only for quantile splits).

    Splits come first, largest bucket first, while the count stays <= max_buckets: quantile splits into
    ceil(size / target) children at the quantiles of the bucket's key hashes (one round fixes a skewed
    bucket), middle splits in two at the range middle. Then runs of adjacent buckets (wrapping around), each
    under merge_threshold * target and together strictly under target, merge while the count stays >=
    min_buckets."""
    live = ring.live
    n = len(live)
    count = n
    changes: list[Node] = []
    splitting: set[int] = set()
    for i in sorted(range(n), key=lambda i: (-sizes[i], i)):
        if sizes[i] <= limits.split_threshold * limits.target or count >= limits.max_buckets:
            break
        former, value = live[i - 1].value, live[i].value
        if limits.split_point == "middle":
            mid = middle(former, value)
            points = [value] if mid is None else [mid, value]
        else:
            k = min(math.ceil(sizes[i] / limits.target), limits.max_buckets - count + 1)
            points = quantile_points(former, value, key_hashes(i), k)
        if len(points) < 2:
            continue
        count += len(points) - 1
        splitting.add(i)
        changes += split(ring, i, points)
    small = [sizes[i] < limits.merge_threshold * limits.target and i not in splitting for i in range(n)]
    start = next((i for i in range(n) if not small[i]), 0)
    run: list[int] = []
    total = 0

    def close() -> None:
        nonlocal count
        allowed = min(len(run), count - limits.min_buckets + 1)
        if allowed >= 2:
            changes.extend(merge(ring, run[:allowed]))
            count -= allowed - 1

    for step in range(n):
        i = (start + step) % n
        if small[i] and total + sizes[i] < limits.target and not (run and i == start):
            run.append(i)
            total += sizes[i]
            continue
        close()
        run, total = ([i], sizes[i]) if small[i] else ([], 0)
    close()
    return pending_ring(ring, changes) if changes else None


# -- tagging ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RingPlan:
    """What a write pins on the driver: the committed ring of every partition (a partition without one gets the
    initial ring), and the pending ring of every partition under a resize, with that resize's instant."""

    num_buckets: int  # of an initial ring
    committed: Mapping[str, Ring] = field(default_factory=dict)
    pending: Mapping[str, tuple[str, Ring]] = field(default_factory=dict)  # partition -> (resize instant, ring)

    def ring(self, partition: str) -> Ring:
        return self.committed.get(partition) or initial_ring(partition, self.num_buckets)

    def resize_of(self, partition: str, file_id: str) -> tuple[str, Ring] | None:
        """(resize instant, the ring it makes) when a pending resize replaces this file group, else None."""
        if partition not in self.pending:
            return None
        instant, ring = self.pending[partition]
        target = ring.resolved(instant)
        return None if file_id in set(target.file_ids) else (instant, target)


@dataclass(frozen=True)
class ConsistentHashingAssigner:
    plan: RingPlan

    def file_ids(self, keys: pa.Array, partitions: pa.Array) -> pa.Array:
        """Each key's node in its partition's ring (plain strings)."""
        return self.encoded_file_ids(keys, partitions).dictionary_decode()

    def encoded_file_ids(self, keys: pa.Array, partitions: pa.Array) -> pa.DictionaryArray:
        """Each key's node in its partition's ring: one searchsorted over every partition's node values, each
        partition's shifted into its own span of (partition code * 2^31 + value), wrapping within its ring."""
        hashes = hash32_array(keys)
        encoded = pc.dictionary_encode(pa.chunked_array([partitions]) if isinstance(partitions, pa.Array)
                                       else partitions).combine_chunks()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        rings = [self.plan.ring(p) for p in encoded.dictionary.to_pylist()]
        if not rings:  # no keys
            return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
        values = np.concatenate([code * SPAN + ring.values for code, ring in enumerate(rings)])
        ends = np.cumsum([ring.num_buckets for ring in rings])
        starts = ends - [ring.num_buckets for ring in rings]
        slot = np.searchsorted(values, codes * SPAN + hashes, side="left")
        wrapped = slot >= ends[codes]  # past the partition's last node: its first
        slot[wrapped] = starts[codes[wrapped]]
        ids = pa.array([fid for ring in rings for fid in ring.file_ids], pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(slot.astype(np.int32)), ids)

    def assign(self, keys: pa.Array, partitions: pa.Array) -> Assignment:
        return Assignment(partitions, self.encoded_file_ids(keys, partitions))
