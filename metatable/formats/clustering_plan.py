"""A clustering plan, and how it is made: which file slices are rewritten together, into how many files.

Pure logic over slice sizes (and key ranges), so the rules can be checked against fixed vectors:

- a slice is eligible when its base file is smaller than `clustering.small_file_limit` (merge-on-read slices
  with logs included: they are merged on read when the plan runs);
- per partition, slices are taken largest first; a group closes when adding the next slice would pass
  `clustering.max_bytes_per_group`, and writes `ceil(group bytes / write.target_file_size)` files;
- a slice left alone at the end of its partition (nothing to merge it with) is rewritten only when rows are
  sorted, since rewriting it unsorted changes nothing;
- planning stops after `clustering.max_groups` groups.

`key_range` groups only slices whose record-key ranges overlap (so that after clustering, level 1 of the
bloom index prunes by key range); `recent` is `size` over the most recently written partitions.

The plan is kept as Avro (`avro_schemas/clustering_plan.avsc`) in `<instant>.replacecommit.requested`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from indexes.consistent_hashing import Node, Ring

REHASH = "rehash"
RESIZE = "resize"


@dataclass(frozen=True)
class SliceRef:
    file_id: str
    file_names: tuple[str, ...]  # base first, then logs in merge order
    bytes: int


@dataclass(frozen=True)
class Group:
    partition: str
    slices: tuple[SliceRef, ...]
    num_output_groups: int

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.slices)


@dataclass(frozen=True)
class ClusteringPlan:
    strategy: str
    groups: tuple[Group, ...]
    sort_columns: tuple[str, ...] = ()
    num_buckets: int | None = None  # a rehash of a simple-bucket table into this many buckets
    rings: tuple[Ring, ...] = ()  # a consistent-hashing resize: the pending ring of each partition it changes

    def ring(self, partition: str) -> Ring | None:
        """The ring partition's rows are routed by once this resize commits."""
        return next((r for r in self.rings if r.partition == partition), None)

    @property
    def file_groups(self) -> list[str]:
        """The file groups it replaces, as `partition/file_id`."""
        return sorted(f"{g.partition}/{s.file_id}" for g in self.groups for s in g.slices)

    def to_record(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "sort_columns": list(self.sort_columns), "num_buckets": self.num_buckets,
                "groups": [{"partition": g.partition, "num_output_groups": g.num_output_groups,
                            "slices": [{"file_id": s.file_id, "file_names": list(s.file_names), "bytes": s.bytes}
                                       for s in g.slices]} for g in self.groups],
                "rings": [{"partition": r.partition, "seq_no": r.seq_no, "instant": r.instant,
                           "nodes": [{"value": n.value, "file_id_prefix": n.file_id_prefix, "tag": n.tag}
                                     for n in r.nodes]} for r in self.rings]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ClusteringPlan:
        groups = tuple(Group(g["partition"], tuple(SliceRef(s["file_id"], tuple(s["file_names"]), s["bytes"])
                                                   for s in g["slices"]), g["num_output_groups"])
                       for g in record["groups"])
        rings = tuple(Ring(r["partition"], tuple(Node(n["value"], n["file_id_prefix"], n["tag"]) for n in r["nodes"]),
                           r["seq_no"], r["instant"]) for r in record.get("rings", ()))
        return cls(record["strategy"], groups, tuple(record["sort_columns"]), record.get("num_buckets"), rings)


@dataclass(frozen=True)
class Limits:
    small_file_limit: int
    max_bytes_per_group: int
    max_groups: int
    target_file_size: int

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Limits:
        return cls(options["clustering.small_file_limit"], options["clustering.max_bytes_per_group"],
                   options["clustering.max_groups"], options["write.target_file_size"])


@dataclass(frozen=True)
class Candidate:
    """A file slice that might be clustered."""

    slice: SliceRef
    base_bytes: int
    key_range: tuple[str, str] | None = None
    latest_instant: str = ""


def size_groups(slices: Sequence[SliceRef], max_bytes: int, sort: bool) -> list[list[SliceRef]]:
    """One partition's slices in groups, largest first; a trailing lone slice only when sorting."""
    ordered = sorted(slices, key=lambda s: (-s.bytes, s.file_id))
    groups: list[list[SliceRef]] = []
    current: list[SliceRef] = []
    for s in ordered:
        if current and sum(c.bytes for c in current) + s.bytes > max_bytes:
            groups.append(current)
            current = []
        current.append(s)
    if current and (len(current) > 1 or sort):
        groups.append(current)
    return groups


def overlapping(candidates: Sequence[Candidate]) -> list[list[Candidate]]:
    """Runs of slices whose key ranges overlap (a sweep in min-key order); slices without a range stay out."""
    ranged = sorted((c for c in candidates if c.key_range), key=lambda c: (c.key_range, c.slice.file_id))
    runs: list[list[Candidate]] = []
    high = None
    for c in ranged:
        low, top = c.key_range
        if runs and high is not None and low <= high:
            runs[-1].append(c)
            high = max(high, top)
        else:
            runs.append([c])
            high = top
    return runs


def plan_groups(candidates: Mapping[str, Sequence[Candidate]], limits: Limits, strategy: str = "size",
                sort_columns: Sequence[str] = (), recent_partitions: int | None = None) -> list[Group]:
    """The groups of a plan over each partition's candidate slices (those not busy in another plan)."""
    sort = bool(sort_columns)
    partitions = sorted(candidates)
    if strategy == "recent":
        latest = {p: max((c.latest_instant for c in candidates[p]), default="") for p in partitions}
        partitions = sorted(sorted(partitions, key=lambda p: latest[p], reverse=True)[:recent_partitions or 1])
    out: list[Group] = []
    for partition in partitions:
        small = [c for c in candidates[partition] if c.base_bytes < limits.small_file_limit]
        if strategy == "key_range":
            pools = [[c.slice for c in run] for run in overlapping(small)]
            pools = [pool for pool in pools if len(pool) > 1 or sort]
        else:
            pools = [[c.slice for c in small]]
        for pool in pools:
            for members in size_groups(pool, limits.max_bytes_per_group, sort):
                total = sum(s.bytes for s in members)
                out.append(Group(partition, tuple(members), max(1, math.ceil(total / limits.target_file_size))))
                if len(out) >= limits.max_groups:
                    return out
    return out


def busy_file_groups(plans: Iterable[Mapping[str, Any]]) -> set[str]:
    """`partition/file_id` of every file group in the given pending plans (compaction or clustering)."""
    out: set[str] = set()
    for plan in plans:
        if "groups" in plan:
            out |= set(ClusteringPlan.from_record(plan).file_groups)
        out |= set(plan.get("file_groups", {}))
    return out

