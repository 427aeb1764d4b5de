"""Resizing a consistent-hashing table: the clustering strategy of such a table (RFC-42), planned and caught up
here; `clustering` runs it like any plan (one task per group, rows routed by the pending ring).

- Plan (under the lock): per partition without a pending resize or compaction, `plan_resize` over the ring from
  `hashing_meta` and the size of each node's file group; one plan group per split (one old file group, its
  children) or merge (the old file groups, one child). Bounded by `clustering.resize.max_bytes` and
  `clustering.resize.max_partitions`. The plan keeps each pending ring and the seq_no it was planned against.
- Before reading, the resize waits for the writes that began before its plan (they do not know it, so they
  cannot dual-write); then it reads the old file groups as they are, so those writes are in, but not what
  writes after its plan wrote: their dual logs bring those rows, named by each write's own instant, so that a
  snapshot as of the resize holds no row of a later write (`as_of_now`).
- Commit (under the lock): if a partition's ring changed since planning, the resize fails (rolled back; plan
  it again). Otherwise the catch-up adopts the dual-write logs of every write that committed meanwhile
  (`dual_writes`), in completion order: merge-on-read copies them as the children's first logs (a child the
  resize wrote no base for gets an empty one first), copy-on-write writes one base of the child per write, in
  the order of their instants (each the one before with the write's rows applied; writes into one old group
  complete in that order, or conflict). Each is named by its write's instant: as-of reads and change records
  see each write where it happened, not at the resize. Files named by a write's instant are marked by path
  under the resize's, so that its rollback deletes them.
  The new ring (seq_no + 1, instant = the replacecommit) goes into the metadata deltacommit of the same instant
  as the new files.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pyarrow as pa

from indexes.arrow_keys import hash32_array
from indexes.consistent_hashing import ResizeLimits, Ring, plan_resize, under_resize
from indexes.keys import hashing_meta_key

from metatable.commit.context import TableContext
from metatable.commit.dual_writes import dual_rows, merge_into_bases, resize_instant
from metatable.commit.timeline_view import TimelineView
from metatable.errors import ConflictError
from metatable.file_group.base_file_writer import new_file
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import key_column, read_base, read_slice
from metatable.file_group.written import WrittenFile
from metatable.formats.clustering_plan import RESIZE, ClusteringPlan, Group, SliceRef
from metatable.formats.log_file import LogFile
from metatable.table_config import KEY_COLUMN
from metatable.timeline.instant import WRITE_ACTIONS, Instant

log = logging.getLogger(__name__)


def resize_plan(context: TableContext, view: TimelineView, partitions: Sequence[str] | None) -> ClusteringPlan | None:
    """The resize of every partition (of `partitions`, or all) whose buckets need one; None when none does."""
    options = context.config.options
    limits = ResizeLimits.of(options)
    busy = set(view.pending_rings()) | {name.rpartition("/")[0] for name in view.busy()}  # incl. compactions
    chosen = [p for p in sorted(view.rings) if p not in busy and (partitions is None or p in partitions)]
    groups: list[Group] = []
    rings: list[Ring] = []
    planned_bytes = 0
    by_partition = slices_by_partition(view)
    for partition in chosen:
        ring = view.rings[partition]
        slices = by_partition.get(partition, {})
        refs = {file_id: slice_ref(view, fs) for file_id, fs in slices.items()}
        sizes = [refs[fid].bytes if fid in refs else 0 for fid in ring.file_ids]

        def key_hashes(i: int, ring: Ring = ring, slices: dict[str, FileSlice] = slices) -> np.ndarray:
            fs = slices.get(ring.file_ids[i])
            return hash32_array(slice_keys(context, fs)) if fs else np.zeros(0, np.int64)

        pending = plan_resize(ring, sizes, limits, key_hashes)
        if pending is None:
            continue
        mine = resize_groups(partition, ring, pending, refs)
        size = sum(g.bytes for g in mine)
        if rings and planned_bytes + size > options["clustering.resize.max_bytes"]:
            break
        planned_bytes += size
        groups += mine
        rings.append(pending)
        if len(rings) >= options["clustering.resize.max_partitions"]:
            break
    return ClusteringPlan(RESIZE, tuple(groups), rings=tuple(rings)) if rings else None


def slices_by_partition(view: TimelineView) -> dict[str, dict[str, FileSlice]]:
    out: dict[str, dict[str, FileSlice]] = {}
    for (partition, file_id), fs in view.file_slices.items():
        out.setdefault(partition, {})[file_id] = fs
    return out


def slice_ref(view: TimelineView, fs: FileSlice) -> SliceRef:
    sizes = view.live_files[fs.partition]
    return SliceRef(fs.file_id, tuple(fs.file_names), sum(sizes.get(n, 0) for n in fs.file_names))


def slice_keys(context: TableContext, fs: FileSlice) -> pa.ChunkedArray:
    """The record keys of a file slice (its base's key column alone when it has no logs)."""
    if fs.base and not fs.logs:
        return key_column(context.storage, context.paths.file(fs.partition, fs.base.file_name))[0]
    return read_slice(context.storage, context.paths, context.config, fs)[KEY_COLUMN]


def resize_groups(partition: str, committed: Ring, pending: Ring, refs: dict[str, SliceRef]) -> list[Group]:
    """One group per split or merge: the old file groups whose keys go to the same children."""
    by_children: dict[tuple[str, ...], list[str]] = {}
    for old, children in under_resize(committed, pending).items():
        by_children.setdefault(tuple(children), []).append(old)
    return [Group(partition, tuple(refs[o] for o in olds if o in refs), len(children))
            for children, olds in sorted(by_children.items()) if any(o in refs for o in olds)]


def as_of_now(context: TableContext, plan: ClusteringPlan, view: TimelineView, instant: str) -> ClusteringPlan:
    """The plan over the old file groups as they are now (the writes before it added to them, or created
    some), so that the resize reads every row those writes committed, but none of a write after its plan (it
    dual-wrote them: `CatchUp` adopts them under their own instants). On a merge-on-read table, the slices
    without the files of those writes (`before_plan`); on a copy-on-write table, whose writes rewrite bases
    whole, the slices as of the plan (clean keeps them while the resize is pending: `clean.kept_snapshots`)."""
    groups: list[Group] = []
    source = view if view.config.merge_on_read else context.view(as_of=instant)
    by_partition = slices_by_partition(source)
    if view.config.merge_on_read:
        by_partition = {p: {fid: before_plan(fs, instant) for fid, fs in slices.items()}
                        for p, slices in by_partition.items()}
    for pending in plan.rings:
        committed = view.rings.get(pending.partition)
        if committed is None or committed.seq_no != pending.seq_no:
            raise ConflictError(f"resize: the ring of partition {pending.partition!r} changed since it was planned; "
                                "it is rolled back, schedule it again")
        refs = {fid: slice_ref(source, fs) for fid, fs in by_partition.get(pending.partition, {}).items()}
        groups += resize_groups(pending.partition, committed, pending, refs)
    return ClusteringPlan(plan.strategy, tuple(groups), plan.sort_columns, plan.num_buckets, plan.rings)


def before_plan(fs: FileSlice, instant: str) -> FileSlice:
    """A merge-on-read slice without the files of writes that began after the resize's plan (`instant`): they
    dual-wrote their rows, whose logs the resize adopts under their own instants (`CatchUp`), so its base files,
    which carry its instant, hold none of a later write's rows and a snapshot as of it sees none. The chaos
    run's change records found a later write's rows in the snapshot as of the resize, and in no window of
    changes."""
    if fs.base is not None and fs.base.instant > instant:
        return replace(fs, base=None, logs=())
    return replace(fs, logs=tuple(lf for lf in fs.logs if lf.instant < instant))


def replacements(plan: ClusteringPlan, view: TimelineView) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(partition -> replaced file ids, `partition/old` -> `partition/child` ids): every old node's file group,
    with or without files (a write may still create one; it dual-writes its rows)."""
    replaced: dict[str, list[str]] = {}
    successors: dict[str, list[str]] = {}
    for pending in plan.rings:
        p = pending.partition
        for old, children in under_resize(view.rings[p], pending).items():
            replaced.setdefault(p, []).append(old)
            successors[f"{p}/{old}"] = [f"{p}/{c}" for c in children]
    return replaced, successors


def wait_for_earlier_writes(context: TableContext, instant: Instant) -> None:
    """Block until no write that began before the plan is inflight; their processes, if dead, are rolled back
    once their heartbeats expire. Gives up (ConflictError) after `clustering.resize.writer_wait_s`."""
    limit = context.config.options["clustering.resize.writer_wait_s"]
    started = time.monotonic()
    while True:
        earlier = [i for i in context.timeline.pending(WRITE_ACTIONS) if i.time < instant.time]
        if not earlier:
            if time.monotonic() - started > 1:
                log.info("resize %s waited %.1fs for earlier writes", instant.time, time.monotonic() - started)
            return
        if time.monotonic() - started > limit:
            raise ConflictError(f"resize {instant.time} waited {limit:.0f}s for writes {[i.time for i in earlier]} "
                                "that began before it was planned; it is rolled back, schedule it again "
                                "(clustering.resize.writer_wait_s)")
        if any(context.timeline.is_expired(i) for i in earlier):
            context.transactions.recover()
        time.sleep(0.1)


@dataclass
class CatchUp:
    """The resize's commit-time work, under the lock (`data_commit.Commit.catch_up`)."""

    context: TableContext
    plan: ClusteringPlan
    instant: str
    write_token: str  # of the resize's base files
    adopted: list[tuple[str, str]] = field(default_factory=list)  # (partition, file name) of dual logs taken

    def records(self) -> dict[str, dict]:
        return {hashing_meta_key(r.partition): r.resolved(self.instant).to_record() for r in self.plan.rings}

    def __call__(self, files: list[WrittenFile]) -> list[WrittenFile]:
        self.check_rings()
        context = self.context
        config = context.config_now()  # under the lock: the widest schema, so no column of a dual log is lost
        by_group: dict[tuple[str, str], list[str]] = {}
        for relative in self.dual_logs():
            partition, _, name = relative.rpartition("/")
            by_group.setdefault((partition, LogFile.parse(name).file_id), []).append(name)
        out = list(files)
        for (partition, file_id), names in sorted(by_group.items()):
            base = next((f for f in out if (f.partition, f.file_id, f.kind) == (partition, file_id, "base")), None)
            if config.merge_on_read and base is None:  # a child the resize read no row for: an empty base of the
                # resize's instant, so that the adopted rows stay logs of their own writes' instants (merged into
                # a base, a snapshot as of the resize showed them)
                (base,) = merge_into_bases(context.storage, context.paths, config, partition, file_id,
                                           config.storage_schema.empty_table(), [(self.instant, [])], self.write_token)
                out.append(base)
            if config.merge_on_read:  # the child's first logs, in completion order
                for version, name in enumerate(names, start=1):
                    # named by the write's instant, not the resize's: a snapshot as of the resize (or of any
                    # moment before the write) must not see the write's rows; the chaos run's change records
                    # found them in the snapshot as of the resize and in no window
                    written_at = LogFile.parse(name).instant
                    target = LogFile(file_id, self.instant, version, f"{written_at}-catchup{version}")
                    path = new_file(context.storage, context.paths, self.instant, partition, target.file_name)
                    data = context.storage.read(context.paths.file(partition, name))
                    context.storage.write_atomic(path, data)
                    out.append(WrittenFile(partition, file_id, target.file_name, "log", len(data), 0))
            else:  # one new base of the child per caught-up write, named by the write's instant: a snapshot as
                # of the resize, or of any moment before a write, holds none of its rows, and the write's change
                # records see them change (merged into one base of the resize's instant, they had none)
                by_write: dict[str, list[pa.Table]] = {}  # a write into several replaced groups left a log of each
                for name in names:
                    by_write.setdefault(LogFile.parse(name).instant, []).append(
                        dual_rows(context.storage, context.paths, config, partition, name))
                current = read_base(context.storage, context.paths.file(partition, base.file_name),
                                    config.storage_schema) if base is not None else config.storage_schema.empty_table()
                out += merge_into_bases(context.storage, context.paths, config, partition, file_id, current,
                                        sorted(by_write.items()),  # as-of reads go by instant
                                        marked_by=self.instant)
            self.adopted += [(partition, n) for n in names]
        if self.adopted:
            log.info("resize %s caught up %d dual-write logs of writes committed meanwhile", self.instant,
                     len(self.adopted))
        return out

    def check_rings(self) -> None:
        keys = [hashing_meta_key(r.partition) for r in self.plan.rings]
        stored = self.context.metadata.get_many("hashing_meta", keys)
        for ring in self.plan.rings:
            now = stored.get(hashing_meta_key(ring.partition))
            if now is None or now["seq_no"] != ring.seq_no:
                raise ConflictError(f"resize {self.instant}: the ring of partition {ring.partition!r} changed since it "
                                    f"was planned (seq_no {ring.seq_no} -> {now and now['seq_no']}); it is rolled "
                                    "back, schedule it again")

    def dual_logs(self) -> list[str]:
        """`partition/name` of the dual logs for this resize of every write committed since it was planned, in
        completion order."""
        timeline = self.context.timeline
        writes = [(timeline.read_json(i), i) for i in timeline.completed(WRITE_ACTIONS) if i.time > self.instant]
        writes.sort(key=lambda m: (m[0].get("completed_at", 0), m[1].time))
        return [relative for meta, _ in writes for relative in meta.get("dual_files", [])
                if resize_instant(relative.rpartition("/")[2]) == self.instant]

    def remove_adopted(self) -> None:
        """After the commit: the dual logs now copied into (or merged with) the children."""
        for partition, name in self.adopted:
            self.context.storage.delete(self.context.paths.file(partition, name))
