"""Committing an action to a data table, the publishing half of its transaction.

Under the table lock: the conflict check (`conflicts.check`), the files that must move into the file
slice they land in (re-homed), then the metadata table's deltacommit at the same instant (the `files`,
`column_stats` and `bloom_filter` records of every new file, plus what the action itself records), and
finally the commit metadata that completes the instant, with the metadata deltacommit's completion in the
same fence of the lock (one request on an object store; a holder that dies after it has both rolled forward
by the next). A consistent-hashing write settles its dual-write
logs there (`dual_writes`) and records the initial ring of every partition it creates. A retried commit (a
resumed service) first undoes what an earlier attempt left in the metadata table.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.bloom import BloomFilter
from indexes.consistent_hashing import initial_ring
from indexes.keys import ALL_PARTITIONS_KEY, bloom_filter_key, hashing_meta_key

from metatable.commit.change import Change
from metatable.commit.conflicts import Committer, Concurrent, Resolution, check, concurrent_with
from metatable.commit.context import TableContext
from metatable.commit.dual_writes import DUAL, dual_rows, merge_into_bases, resize_instant
from metatable.commit.index_records import change_records
from metatable.commit.schema_history import record_schema
from metatable.commit.stored_rows import StoredRows
from metatable.commit.timeline_view import FileGroup, TimelineView, group_name, parse_group_name
from metatable.errors import ConflictError, MetadataReplacedError, after_the_commit_point
from metatable.faults import crash_point
from metatable.file_group.base_file import PARQUET, BaseFile, new_write_token
from metatable.file_group.base_file_writer import new_file
from metatable.file_group.before_images import IMAGES_KEY
from metatable.file_group.markers import clear, mark, own_markers, written_files
from metatable.file_group.slice_reader import base_keys_present, key_column, members, read_base, read_slice
from metatable.file_group.written import WrittenFile
from metatable.formats.data_log import read_data_log, write_data_log, write_parquet_log
from metatable.formats.log_file import LogFile
from metatable.metadata.table import metadata_location
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN
from metatable.timeline.held_reads import read_held
from metatable.timeline.instant import BOOTSTRAP_TIME, WRITE_ACTIONS, Action, Instant
from metatable.timeline.timeline import Timeline
from metatable.timeline.transaction import Content, Publication

log = logging.getLogger(__name__)

Records = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Commit:
    """What an action hands to its commit."""

    instant: Instant
    committer: Committer
    files: Sequence[WrittenFile]
    seen: frozenset[str]  # the completed instants it began from
    metadata: Content = field(default_factory=dict)  # commit metadata beyond the files (operation, counts)
    records: Records = field(default_factory=dict)  # metadata records beyond the new files' own
    file_groups: Sequence[str] | None = None  # the file groups it changes (default: those of its files)
    catch_up: Callable[[list[WrittenFile]], list[WrittenFile]] | None = None  # a resize's, under the lock
    schema: pa.Schema | None = None  # the schema its files have, when it changes the table's (`schema_history`)
    absent_deletes: Mapping[str, pa.ChunkedArray] = field(default_factory=dict)  # partition -> keys it deleted
    # without finding them (`written.ABSENT`)
    marked_here: bool = False  # this process wrote every marker of the instant (a write in process)
    stored: StoredRows | None = None  # what the write read of its keys' rows (its secondary index entries')


def commit(context: TableContext, c: Commit) -> Instant:
    markers = own_markers(context.storage, context.paths, c.instant.time) if c.marked_here else None
    done = context.transactions.commit(c.instant, lambda: publish(context, c), with_heartbeat=markers or ())
    with after_the_commit_point(f"clearing the markers of {c.instant.time}"):
        clear(context.storage, context.paths, c.instant.time, deleted=markers is not None)
    return done


def publish(context: TableContext, c: Commit) -> Publication:
    """Under the lock: check, record a schema change, roll back clusterings this write wins over, re-home,
    write the metadata deltacommit; returns the commit metadata, and the metadata deltacommit's completion,
    which the commit makes with the instant's in one fence."""
    time_ = c.instant.time
    location = read_held(context.timeline.lock, context.paths.metadata_roots,  # a rebuild swaps under the lock
                         lambda: metadata_location(context.storage, context.paths))
    if location.metadata_dir != context.paths.metadata_dir:
        raise MetadataReplacedError(f"{c.committer.action.value} {time_} on {context.root}: the metadata table was "
                                    "rebuilt since this process opened the table; open it again and retry")
    duals = [f for f in c.files if f.kind == DUAL]
    files = [f for f in c.files if f.kind != DUAL]
    touched = sorted(c.file_groups if c.file_groups is not None else {f.group for f in files})
    marked = partial(marked_file_groups, context) if c.committer.action is Action.REPLACECOMMIT else None
    concurrent = concurrent_with(context.timeline, c.instant, c.seen, marked)
    probe = partial(shared_keys, context, files) if context.config.index.type != "bucket" else None
    deleted = partial(keys_stored_by, context, c.absent_deletes) if c.absent_deletes else None
    resolution = check(c.committer, c.instant, touched, concurrent, probe, deleted)
    if c.schema is not None:  # before anything below reads or rewrites files under the widest schema (`config_now`)
        record_schema(context.storage, context.paths, context.config, context.timeline, c.instant, c.schema)
        crash_point("table.commit.schema")
    for clustering in resolution.abort:
        log.warning("write %s wins over pending clustering %s (clustering.updates = abort_clustering): rolling "
                    "it back", time_, clustering.time)
        context.transactions.rollback(clustering)
    kept: list[str] = []
    if c.committer.dual_writes and c.committer.action is not Action.REPLACECOMMIT:
        files, kept = settle_duals(context, time_, files, duals)
    files = rehome_files(context, time_, files, resolution.rehome) if resolution.rehome else files
    if c.catch_up is not None:
        files = c.catch_up(files)
    metadata = context.metadata
    metadata.reload_partitions()
    now = context.config_now()  # the index states and columns of now, whatever this writer opened with
    maintained = now.written_by_commits
    completed = time.time_ns()
    replaced = c.metadata.get("replaced", {})
    supersedes = maintained and (replaced or any(f.kind == "base" for f in files))  # else no view to read
    change = Change(c.committer.action, files, superseded_bases(context.view(), files, replaced) if supersedes else {},
                    completed, still_stored(c.stored, concurrent, resolution))
    if any(now.secondary_columns(p) for p in maintained):
        metadata.refresh()  # a secondary index reads what every commit completed before this one wrote
    records: dict[str, dict[str, Any]] = {"files": files_records(files),
                                          **change_records(context.storage, context.paths, now, time_,
                                                           change, maintained, metadata.lookup)}
    rings = new_rings(context, time_, files) if c.committer.dual_writes else {}
    if rings:
        records["hashing_meta"] = rings
    for partition, recs in c.records.items():
        records.setdefault(partition, {}).update(recs)
    kept_partitions = {"files", "hashing_meta", *maintained}
    if metadata.timeline.get(time_) is not None:  # what an interrupted earlier attempt left behind
        metadata.rollback(time_)
    metadata.begin(time_)
    metadata.write(time_, {p: r for p, r in records.items() if p in metadata.partitions and p in kept_partitions})
    crash_point("table.commit.metadata")
    touched = sorted({*touched, *(f.group for f in files)})  # re-homing may have moved rows into other groups
    running = earlier_writes_running(context.timeline, time_) if c.committer.action in WRITE_ACTIONS else []
    # images taken before a write this one re-homed behind, or beside dual writes, are not its rows as of start;
    # nor where a write with an earlier instant may complete after this one
    images = {IMAGES_KEY: not (duals or resolution.behind_writes or running)} if c.metadata.get(IMAGES_KEY) else {}
    return Publication({**c.metadata, **images, **({RUNNING_BEFORE: running} if running else {}),
                        "file_groups": touched, "files": [f.relative for f in files],
                        **({"dual_files": kept} if kept else {}), "indexes": sorted(maintained),
                        "completed_at": completed},
                       along=[metadata.completion(time_)])


RUNNING_BEFORE = "running_before"  # commit metadata: the writes with earlier instants still running at its commit


def earlier_writes_running(timeline: Timeline, time_: str) -> list[str]:
    """The writes with an earlier instant that are still running. One that completes after this write merges
    its versions after this one's (a snapshot takes instants by time, and merges their versions in the order
    they completed), in every snapshot as of its instant or later. So a window of changes that starts at or
    after it and holds this write reads rows this write's images lack (they are not its rows as of start),
    and must merge that write's versions after this one's for the rows as of its end (`read.changes`). The
    chaos run's reader found both through change files (a pre-image older than the snapshot's row, a delete
    of a row the snapshot held); a net window that starts between the two instants met them too
    (`test_a_write_with_an_earlier_instant_that_completes_later_...`)."""
    return [i.time for i in timeline.pending(WRITE_ACTIONS) if i.time < time_]


def still_stored(stored: StoredRows | None, concurrent: Sequence[Concurrent],
                 resolution: Resolution) -> StoredRows | None:
    """What a write read of its keys' rows (`StoredRows`), if it still holds as the write commits: not once a
    write completed since in a file group it read (its rows may have changed; such a write is re-homed behind
    it too), nor once a clustering completed (it moves rows), nor where this commit moves its files. A
    compaction changes no row."""
    if stored is None or resolution.rehome or resolution.behind_writes:
        return None
    read = {group_name(p, f) for p, f in stored.groups}
    for other in concurrent:
        if other.pending or other.instant.action is Action.COMPACTION:
            continue
        if other.instant.action is Action.REPLACECOMMIT or other.file_groups & read:
            return None
    return stored


def superseded_bases(view: TimelineView, files: Sequence[WrittenFile],
                     replaced: Mapping[str, Sequence[str]]) -> dict[FileGroup, str]:
    """The base files that stop being the latest of their file group: where a new base is written, and in
    every file group a clustering replaces."""
    groups = [(f.partition, f.file_id) for f in files if f.kind == "base"]
    groups += [(p, file_id) for p, ids in replaced.items() for file_id in ids]
    written = {f.file_name for f in files if f.kind == "base"}
    out = {}
    for group in groups:
        fs = view.file_slices.get(group)
        if fs is not None and fs.base is not None and fs.base.file_name not in written:
            out[group] = fs.base.file_name
    return out


_COMPLETED_AT: dict[tuple[str, str], int] = {}  # completed commit metadata never changes


def completed_at(context: TableContext, instant: Instant) -> int:
    """When a completed instant's commit completed (ns; 0 for commits that predate the record)."""
    key = (context.root, instant.time)
    if key not in _COMPLETED_AT:
        if len(_COMPLETED_AT) > 100_000:
            _COMPLETED_AT.clear()
        _COMPLETED_AT[key] = context.timeline.read_json(instant).get("completed_at", 0)
    return _COMPLETED_AT[key]


def new_rings(context: TableContext, instant: str, files: Sequence[WrittenFile]) -> dict[str, Any]:
    """The initial ring of every partition these files create (two writers creating one agree on it)."""
    partitions = sorted({f.partition for f in files})
    known = context.metadata.get_many("hashing_meta", [hashing_meta_key(p) for p in partitions])
    n = context.config.index.num_buckets
    return {hashing_meta_key(p): {**initial_ring(p, n).to_record(), "instant": instant} for p in partitions
            if hashing_meta_key(p) not in known}


def settle_duals(context: TableContext, instant: str, files: list[WrittenFile],
                 duals: Sequence[WrittenFile]) -> tuple[list[WrittenFile], list[str]]:
    """A consistent-hashing write's dual-write logs (`dual_writes`): kept for a pending resize, adopted after a
    committed one (whose replaced file groups' files are then dropped: the adopted logs hold their rows),
    deleted after a rolled-back one. Returns the files to commit and the dual logs kept."""
    view = context.view()
    replaced_by = {(p, file_id): i.time for i, meta in view.replacements
                   for p, ids in meta.get("replaced", {}).items() for file_id in ids}
    out = []
    for f in files:
        by = replaced_by.get((f.partition, f.file_id))
        if by is not None and by < instant:  # this write began after that resize was planned: it dual-wrote
            context.storage.delete(context.paths.file(f.partition, f.file_name))
            continue
        out.append(f)
    kept, adopt = [], []
    for d in duals:
        resize = context.timeline.get(resize_instant(d.file_name), Action.REPLACECOMMIT)
        if resize is None:
            context.storage.delete(context.paths.file(d.partition, d.file_name))
        elif not resize.is_completed:
            kept.append(d.relative)
        else:
            adopt.append(d)
    slots = LogSlots(view)
    by_group: dict[FileGroup, list[WrittenFile]] = {}
    for d in adopt:
        group = (d.partition, d.file_id)
        log_file = WrittenFile(d.partition, d.file_id, d.file_name, "log", d.size, d.rows)
        if group in view.replaced:  # a later resize replaced it too
            out += split_into_successors(context, view, slots, instant, log_file)
        elif context.config.merge_on_read and group in view.file_slices:
            out.append(move_into(context, slots, instant, log_file, group))
        else:  # copy-on-write, or a new file group that the resize left empty: a new base
            by_group.setdefault(group, []).append(d)
    config = context.config_now()  # under the lock: the widest schema, so no column of a dual log is lost
    for (partition, file_id), logs in sorted(by_group.items()):
        rows = [dual_rows(context.storage, context.paths, config, partition, d.file_name) for d in logs]
        out += merge_into_bases(context.storage, context.paths, config, partition, file_id,
                                view.file_slices.get((partition, file_id)), [(instant, rows)])
        for d in logs:
            context.storage.delete(context.paths.file(partition, d.file_name))
    return out, kept


def marked_file_groups(context: TableContext, instant: Instant) -> frozenset[str]:
    """The file groups an inflight write has written files in so far (in the partitions it marked)."""
    out = set()
    for relative in written_files(context.storage, context.paths, instant.time):
        partition, _, name = relative.rpartition("/")
        if name.endswith("." + PARQUET):
            out.add(group_name(partition, BaseFile.parse(name).file_id))
        elif LogFile.is_log_name(name):
            out.add(group_name(partition, LogFile.parse(name).file_id))
    return frozenset(out)


def files_record(names: Mapping[str, int], deleted: bool = False) -> dict[str, Any]:
    """A `files` partition record listing (or tombstoning) file names with their sizes."""
    return {"files": {n: {"size": size, "is_deleted": deleted} for n, size in names.items()}, "is_deleted": False}


def files_records(files: Sequence[WrittenFile]) -> dict[str, Any]:
    """The `files` records of new files (and the partition list)."""
    by_partition: dict[str, dict[str, int]] = {}
    for f in files:
        by_partition.setdefault(f.partition, {})[f.file_name] = f.size
    records = {p: files_record(n) for p, n in by_partition.items()}
    if by_partition:
        records[ALL_PARTITIONS_KEY] = files_record({p: 0 for p in by_partition})
    return records


def rehome_files(context: TableContext, instant: str, files: Sequence[WrittenFile],
                 groups: Iterable[str]) -> list[WrittenFile]:
    """Move this commit's files of `groups` into the file slice each lands in now: a log gets that slice's
    next version (so logs are ordered by completion), after a compaction the compaction's base; a base
    written for a file group that another write created meanwhile becomes a log of it; a log of a file group
    that a clustering replaced meanwhile is split among the file groups that now hold its keys."""
    groups = set(groups)
    view = context.view()
    slots = LogSlots(view)
    out = []
    for f in files:
        group = parse_group_name(f.group)
        if f.group not in groups:
            out.append(f)
        elif group in view.replaced:
            out += split_into_successors(context, view, slots, instant, f)
        elif group in view.file_slices:
            out.append(move_into(context, slots, instant, f, group))
        else:
            out.append(f)
    return out


class LogSlots:
    """The next log of each file group's current slice, counting the logs this commit adds."""

    def __init__(self, view: TimelineView) -> None:
        self.view = view
        self.bases = view.log_base_instants()
        self.taken: dict[FileGroup, int] = {}

    def next(self, group: FileGroup) -> tuple[str, int]:
        fs = self.view.file_slices.get(group)
        current = fs.base_instant if fs else BOOTSTRAP_TIME
        base = max(current, self.bases.get(group, current))
        logs = fs.logs if fs else ()
        version = self.taken.get(group) or max((lf.version for lf in logs if lf.base_instant == base), default=0)
        self.taken[group] = version + 1
        return base, version + 1


def move_into(context: TableContext, slots: LogSlots, instant: str, f: WrittenFile, group: FileGroup) -> WrittenFile:
    base, version = slots.next(group)
    source = context.paths.file(f.partition, f.file_name)
    if f.kind == "log":
        lf = LogFile.parse(f.file_name)
        if (lf.base_instant, lf.version) == (base, version):
            return f
        target = LogFile(f.file_id, base, version, lf.write_token)
        mark(context.storage, context.paths, instant, f.partition)
        context.storage.move(source, context.paths.file(f.partition, target.file_name))
        size = f.size
    else:
        target = LogFile(f.file_id, base, version, f"{instant}-{new_write_token()}")
        mark(context.storage, context.paths, instant, f.partition)
        size = write_parquet_log(context.storage, context.paths.file(f.partition, target.file_name), instant,
                                 context.storage.read(source), f.rows)
        context.storage.delete(source)
    log.info("instant %s: %s re-homed as %s", instant, f.file_name, target.file_name)
    return WrittenFile(f.partition, f.file_id, target.file_name, "log", size, f.rows)


def successors(view: TimelineView, group: FileGroup) -> list[FileGroup]:
    """The live file groups that took over a replaced one's rows (through every clustering since)."""
    direct: dict[str, list[str]] = {}
    for _, meta in view.replacements:
        direct.update(meta.get("successors", {}))
    out, todo = [], [group_name(*group)]
    while todo:
        name = todo.pop(0)
        for nxt in direct.get(name, []):
            parsed = parse_group_name(nxt)
            if parsed in view.file_slices:
                out.append(parsed)
            elif parsed in view.replaced:
                todo.append(nxt)
    return out


def split_into_successors(context: TableContext, view: TimelineView, slots: LogSlots, instant: str,
                          f: WrittenFile) -> list[WrittenFile]:
    """A log written for a file group that a clustering replaced meanwhile: each row goes to the file group
    that holds its key now (a new key to the first of them, or its bucket's), as a log of that group."""
    config = context.config_now()  # under the lock: the widest schema, so no column of the log is lost
    targets = successors(view, parse_group_name(f.group))
    if not targets:
        raise ConflictError(f"write {instant}: file group {f.group} was replaced and nothing took over its rows")
    source = context.paths.file(f.partition, f.file_name)
    rows = read_data_log(context.storage, source, config.log_schema)[1] if f.kind == "log" else \
        read_base(context.storage, source, config.storage_schema)
    keys = rows[KEY_COLUMN]
    if config.index.type == "bucket":
        ids = view.bucket_assigner(config.index).file_ids(keys, pa.repeat(pa.scalar(f.partition, pa.string()),
                                                                                  len(keys)))
        destination = np.array(ids.to_pylist(), dtype=object)
    else:
        destination = np.full(len(keys), targets[0][1], dtype=object)
        unplaced = np.ones(len(keys), dtype=bool)
        for partition, file_id in targets:
            fs = view.file_slices[(partition, file_id)]
            held = members(keys, read_slice(context.storage, context.paths, config, fs)[KEY_COLUMN])
            destination[unplaced & held] = file_id
            unplaced &= ~held
    out = []
    for file_id in sorted(set(destination.tolist())):
        part = rows.filter(pa.array(destination == file_id))
        base, version = slots.next((f.partition, file_id))
        target = LogFile(file_id, base, version, f"{instant}-{new_write_token()}")
        path = new_file(context.storage, context.paths, instant, f.partition, target.file_name)
        size = write_data_log(context.storage, path, instant, part if f.kind == "log" else
                              part.append_column(DELETED_COLUMN, pa.array(np.zeros(len(part), bool))),
                              *config.log_encoding)
        out.append(WrittenFile(f.partition, file_id, target.file_name, "log", size, part.num_rows))
    context.storage.delete(source)
    log.info("instant %s: %s (of replaced file group %s) split into %d logs", instant, f.file_name, f.group, len(out))
    return out


def shared_keys(context: TableContext, ours: Sequence[WrittenFile], writes: Sequence[Concurrent]) -> list[str]:
    """Keys stored in this commit's files that files added by the concurrent `writes` store too."""
    mine: dict[str, pa.ChunkedArray] = {}
    for f in ours:
        keys = stored_keys(context, f.partition, f.file_name)
        held = mine[f.partition].chunks if f.partition in mine else []
        mine[f.partition] = pa.chunked_array([*held, *keys.chunks], pa.string())  # a delete's logs store none
    return keys_stored_by(context, mine, writes)


def keys_stored_by(context: TableContext, mine: Mapping[str, pa.ChunkedArray],
                   writes: Sequence[Concurrent]) -> list[str]:
    """Which of the keys (by partition) the files added by the concurrent `writes` store (in the same
    partition, or anywhere for a global index): their bloom filters first, then the files."""
    if not mine:
        return []
    everywhere = pa.chunked_array([c for keys in mine.values() for c in keys.chunks], pa.string())
    global_scope = context.config.index.scope == "global"
    theirs = [parse_group_name(relative) for c in writes for relative in c.files]
    filters = context.metadata.get_many("bloom_filter", [bloom_filter_key(p, n) for p, n in theirs
                                                         if n.endswith("." + PARQUET)]) \
        if "bloom_filter" in context.metadata.partitions else {}
    found: list[str] = []
    for partition, name in theirs:
        candidates = everywhere if global_scope else mine.get(partition)
        if candidates is None or not len(candidates):
            continue
        path = context.paths.file(partition, name)
        if name.endswith("." + PARQUET):
            record = filters.get(bloom_filter_key(partition, name))
            if record is not None:
                maybe = BloomFilter.from_bytes(record["bloom_filter"], name).might_contain(candidates.to_pylist())
                candidates = candidates.filter(pa.array(maybe))
            present, _ = base_keys_present(context.storage, path, candidates)
        else:
            present = members(candidates, stored_keys(context, partition, name))
        found += candidates.filter(pa.array(present)).to_pylist()
    return found


def stored_keys(context: TableContext, partition: str, name: str) -> pa.ChunkedArray:
    """The keys a data file stores live: a base file's key column, a log block's keys not deleted by it."""
    path = context.paths.file(partition, name)
    if name.endswith("." + PARQUET):
        return key_column(context.storage, path)[0]
    rows = read_data_log(context.storage, path, context.config.log_schema)[1].select([KEY_COLUMN, DELETED_COLUMN])
    return rows.filter(pc.invert(rows[DELETED_COLUMN]))[KEY_COLUMN]
