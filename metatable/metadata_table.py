"""The metadata table: a merge-on-read key-value store with its own timeline.

Standalone, it validates log blocks against its own completed deltacommits. As
the metadata table of a data table (`authority=` the data timeline, sharing its
lock), a block is visible only once its instant completed on the data timeline.

Writes: `begin(time)` -> `write(time, records)` -> `complete(time)`, or
`commit(records)` for all three. Each write puts one Avro log file into every
file group it touches, named before it is written (and listed in the inflight
state) so rollback knows exactly what to remove. Compaction and clean run after
commits when `metadata.auto_compact` is on.
"""
from __future__ import annotations

import heapq
import json
import logging
import os
import time as _time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import fastavro

from indexes.keys import group_by_bucket, hash32

from . import config
from .base_file import BaseFile
from .errors import (InvalidInputError, RollbackError, TableExistsError, TableNotFoundError, TimelineError,
                     UnknownPartitionError)
from .faults import crash_point
from .instant import BOOTSTRAP_TIME, Action, Instant, State
from .lock import TableLock
from .log_file import BlockKind, LogBlock, LogFile, write_log
from .file_slice import FileSlice
from .metadata_file_group import SST_EXTENSION, MetadataFileGroup, Snapshot, resolve_slice
from .metadata_records import KINDS, Record, RecordKind
from .sst_file import SstCache, write_sst
from .storage import LocalStorage, Storage
from .timeline import META_DIR, Timeline

log = logging.getLogger(__name__)

DEFAULT_FILE_GROUPS = {"files": 1, "bloom_filter": 4, "column_stats": 4, "hashing_meta": 1}
PROPERTIES = "properties.json"
COMPACTION_TOKEN = "compacted"


def file_group_id(partition: str, index: int) -> str:
    return f"{partition.replace('_', '-')}-{index:04d}"


@dataclass(frozen=True)
class CompactionReport:
    instant: str | None
    file_groups: tuple[str, ...] = ()
    records: int = 0
    seconds: float = 0.0
    blocked: tuple[str, ...] = ()  # why file groups that were due could not be compacted


@dataclass(frozen=True)
class CleanReport:
    instant: str | None
    deleted: tuple[str, ...] = field(default_factory=tuple)


class MetadataTable:
    def __init__(self, root: str, *, storage: Storage | None = None, options: Mapping[str, Any] | None = None,
                 authority: Timeline | None = None) -> None:
        self.root = root
        self.storage = storage or LocalStorage()
        props_path = os.path.join(root, META_DIR, PROPERTIES)
        if not self.storage.exists(props_path):
            raise TableNotFoundError(f"no metadata table at {root} (missing {props_path}); create it first")
        props = json.loads(self.storage.read(props_path))
        self.partitions: dict[str, int] = dict(props["partitions"])
        self.options = config.resolve({**props.get("options", {}), **(options or {})})
        lock = authority.lock if authority else TableLock(os.path.join(root, META_DIR, "lock"),
                                                          self.options["lock.timeout_s"])
        self.timeline = Timeline(self.storage, root, lock, self.options["heartbeat.interval_s"],
                                 self.options["heartbeat.tolerable_misses"])
        self.authority = authority or self.timeline
        self.standalone = authority is None
        self.lock = lock
        self.sst_cache = SstCache(os.path.join(root, META_DIR, "sst_cache"))
        self.refresh()

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def create(cls, root: str, partitions: Mapping[str, int] | Iterable[str] | None = None, *,
               options: Mapping[str, Any] | None = None, storage: Storage | None = None,
               authority: Timeline | None = None) -> MetadataTable:
        """A new, empty metadata table. `partitions` maps name -> file groups (defaults per kind)."""
        storage = storage or LocalStorage()
        if partitions is None:
            partitions = DEFAULT_FILE_GROUPS
        if not isinstance(partitions, Mapping):
            partitions = {p: DEFAULT_FILE_GROUPS.get(p, 1) for p in partitions}
        for name, n in partitions.items():
            _kind(name, KINDS)
            if not isinstance(n, int) or n < 1:
                raise InvalidInputError(f"partition {name!r} needs a positive number of file groups, got {n!r}")
        config.resolve(options)  # reject unknown options before anything is written
        props = {"format_version": 1, "partitions": dict(partitions), "options": dict(options or {})}
        if not storage.create_exclusive(os.path.join(root, META_DIR, PROPERTIES),
                                        json.dumps(props, indent=2, sort_keys=True).encode()):
            raise TableExistsError(f"a metadata table already exists at {root}")
        return cls(root, storage=storage, authority=authority)

    @classmethod
    def open(cls, root: str, **kwargs: Any) -> MetadataTable:
        return cls(root, **kwargs)

    def refresh(self) -> None:
        """See everything completed up to now; a table object keeps its view until this is called. When
        nothing was completed since, the decoded log records are kept (what is readable is unchanged)."""
        snapshot = self._snapshot()
        if snapshot == getattr(self, "snapshot", None):
            return
        self.snapshot = snapshot
        self._groups: dict[tuple[str, int], MetadataFileGroup] = {}
        self._listings: dict[str, list[str]] = {}

    def _snapshot(self) -> Snapshot:
        own = self.timeline.instants()
        done = [i for i in own if i.is_completed]
        if self.standalone:
            valid = {i.time for i in done if i.action is Action.DELTACOMMIT}
        else:
            valid = {i.time for i in self.authority.completed()}
        return Snapshot(
            valid_instants=frozenset(valid),
            rollbacks=frozenset(i.time for i in done if i.action is Action.ROLLBACK),
            compactions=frozenset({BOOTSTRAP_TIME} | {i.time for i in done if i.action is Action.COMPACTION}),
        )

    # -- routing ----------------------------------------------------------------------------------
    def kind(self, partition: str) -> RecordKind:
        return _kind(partition, self.partitions)

    def file_group_index(self, partition: str, key: str) -> int:
        return hash32(key) % self.partitions[partition]

    def _dir(self, partition: str) -> str:
        return os.path.join(self.root, partition)

    def _listing(self, partition: str) -> list[str]:
        if partition not in self._listings:
            self._listings[partition] = self.storage.list(self._dir(partition))
        return self._listings[partition]

    def _slice(self, partition: str, index: int, snapshot: Snapshot) -> FileSlice:
        return resolve_slice(partition, file_group_id(partition, index), self._listing(partition), snapshot.compactions)

    def _group(self, partition: str, index: int) -> MetadataFileGroup:
        group = self._groups.get((partition, index))
        if group is None:
            group = MetadataFileGroup(self.storage, self._dir(partition), self._slice(partition, index, self.snapshot),
                                      self.kind(partition), self.snapshot, self.sst_cache)
            self._groups[(partition, index)] = group
        return group

    # -- reads --------------------------------------------------------------------------------------
    def get(self, partition: str, key: str) -> Record | None:
        return self.get_many(partition, [key]).get(key)

    def get_many(self, partition: str, keys: Iterable[str]) -> dict[str, Record]:
        """Merged records of the present keys (absent keys are left out)."""
        self.kind(partition)
        n = self.partitions[partition]
        keys = [_check_key(k) for k in keys] if not isinstance(keys, list) or not all(keys) else keys
        out: dict[str, Record] = {}
        for index, group_keys in group_by_bucket(keys, n):
            out.update(self._group(partition, index).get_visible(group_keys))
        return out

    def scan(self, partition: str, prefix: str = "") -> Iterator[tuple[str, Record]]:
        """(key, record) for every present key starting with `prefix`, in key order."""
        kind = self.kind(partition)
        streams = [self._group(partition, i).scan(prefix) for i in range(self.partitions[partition])]
        for key, record in heapq.merge(*streams, key=lambda kv: kv[0]):
            shown = kind.visible(record)
            if shown is not None:
                yield key, shown

    # -- writes -------------------------------------------------------------------------------------
    def begin(self, time: str | None = None) -> str:
        """Start a deltacommit; standalone tables make the instant time, attached ones take the data instant's."""
        if time is None and not self.standalone:
            raise InvalidInputError("the metadata table of a data table commits at the data instant's time")
        with self.lock.held():
            if self.standalone:
                self._recover()
            return self.timeline.request(Action.DELTACOMMIT, time).time

    def write(self, time: str, records: Mapping[str, Mapping[str, Record | None]]) -> list[str]:
        """Write the instant's records (None = tombstone) as one log file per touched file group."""
        encoded = {partition: self._encode(partition, recs) for partition, recs in records.items()}
        with self.lock.held():
            instant = self.timeline.get(time, Action.DELTACOMMIT)
            if instant is None or instant.state is not State.REQUESTED:
                raise TimelineError(f"metadata deltacommit {time} is {instant and instant.state.value or 'missing'}; "
                                    "call begin() first, and write() once")
            self._check_successors(records)
            planned: list[tuple[str, LogFile, list[tuple[str, bytes]]]] = []
            for partition, entries in encoded.items():
                by_group: dict[int, list[tuple[str, bytes]]] = {}
                for key, value in entries:
                    by_group.setdefault(self.file_group_index(partition, key), []).append((key, value))
                names = self._next_logs(partition, by_group, time)
                for index, group_entries in sorted(by_group.items()):
                    planned.append((partition, names[index], sorted(group_entries)))
            paths = [os.path.join(partition, lf.file_name) for partition, lf, _ in planned]
            self.timeline.transition(instant, State.INFLIGHT, {"logs": paths})
            for partition, lf, entries in planned:
                write_log(self.storage, os.path.join(self._dir(partition), lf.file_name),
                          LogBlock(time, BlockKind.RECORDS, entries))
                crash_point("metadata.write.log")
            return paths

    def complete(self, time: str) -> None:
        with self.lock.held():
            instant = self.timeline.get(time, Action.DELTACOMMIT)
            if instant is None or instant.is_completed:
                raise TimelineError(f"metadata deltacommit {time} is {instant and 'already completed' or 'missing'}")
            if instant.state is State.REQUESTED:
                instant = self.timeline.transition(instant, State.INFLIGHT, {"logs": []})
            content = self.timeline.read_json(instant)
            crash_point("metadata.complete")
            self.timeline.complete(instant, content)

    def commit(self, records: Mapping[str, Mapping[str, Record | None]], time: str | None = None) -> str:
        """begin + write + complete (standalone), then compaction and clean when due."""
        time = self.begin(time)
        self.write(time, records)
        self.complete(time)
        self.refresh()
        if self.options["metadata.auto_compact"]:
            self.maintain()
        return time

    def maintain(self) -> None:
        """Compact what is due, then clean; called after commits."""
        report = self.compact()
        if report.instant:
            self.clean()

    def _encode(self, partition: str, records: Mapping[str, Record | None]) -> list[tuple[str, bytes]]:
        kind = self.kind(partition)
        out = []
        for key, record in records.items():
            _check_key(key)
            try:
                out.append((key, kind.encode(kind.tombstone() if record is None else record)))
            except (ValueError, TypeError, KeyError, AttributeError, fastavro.validation.ValidationError) as e:
                raise InvalidInputError(f"record for key {key!r} does not fit the {partition} schema: {e}") from None
        return out

    def _check_successors(self, records: Mapping[str, Mapping[str, Record | None]]) -> None:
        for partition, recs in records.items():
            kind = self.kind(partition)
            live = {k: r for k, r in recs.items() if r is not None}
            if type(kind).check_successor is RecordKind.check_successor or not live:
                continue
            current = self._raw_current(partition, list(live))
            for key, record in live.items():
                kind.check_successor(current.get(key), record)

    def _raw_current(self, partition: str, keys: list[str]) -> dict[str, Record]:
        """The latest merged records as stored (tombstones included), from a fresh listing and snapshot."""
        snapshot = self._snapshot()
        names = self.storage.list(self._dir(partition))
        out = {}
        for index, group_keys in group_by_bucket(keys, self.partitions[partition]):
            fs = resolve_slice(partition, file_group_id(partition, index), names, snapshot.compactions)
            group = MetadataFileGroup(self.storage, self._dir(partition), fs, self.kind(partition), snapshot,
                                      self.sst_cache)
            for key in group_keys:
                record = group.get_raw(key)
                if record is not None:
                    out[key] = record
        return out

    def _pending_compaction_plans(self) -> list[tuple[Instant, dict[str, Any]]]:
        return [(i, self.timeline.plan(i)) for i in self.timeline.pending([Action.COMPACTION])]

    def _next_logs(self, partition: str, indexes: Iterable[int], time: str) -> dict[int, LogFile]:
        """The next log name per file group, in the slice new writes belong to (a pending compaction's)."""
        names = self.storage.list(self._dir(partition))
        compactions = self._snapshot().compactions
        pending = self._pending_compaction_plans()
        out = {}
        for index in indexes:
            file_id = file_group_id(partition, index)
            base_instant = resolve_slice(partition, file_id, names, compactions).base_instant
            for instant, plan in pending:
                if file_id in plan.get("file_groups", {}):
                    base_instant = max(base_instant, instant.time)
            prefix = f".{file_id}_{base_instant}.log."
            versions = [LogFile.parse(n).version for n in names if n.startswith(prefix) and LogFile.is_log_name(n)]
            out[index] = LogFile(file_id, base_instant, max(versions, default=0) + 1, f"{time}-{uuid.uuid4().hex[:8]}")
        return out

    # -- rollback -----------------------------------------------------------------------------------
    def rollback(self, time: str) -> None:
        """Undo a deltacommit. A pending one loses its files; a completed one is undone by rollback blocks
        (its files stay for readers that still see it, until clean). Compacted instants cannot be undone."""
        with self.lock.held():
            instant = self.timeline.get(time, Action.DELTACOMMIT)
            if instant is None:
                return  # nothing of it on the metadata table (never written, or already rolled back)
            logs = self.timeline.read_json(instant).get("logs", []) if instant.state is not State.REQUESTED else []
            self._refuse_if_compacted(time, logs)
            target_done = time in self._snapshot().valid_instants
            plan = {"target": time, "logs": logs, "completed": target_done}
            rb = self.timeline.request(Action.ROLLBACK, plan=plan, others=[self.authority])
            self._execute_rollback(rb, plan)
        self.refresh()

    def _refuse_if_compacted(self, time: str, logs: list[str]) -> None:
        names = {os.path.basename(p) for p in logs}
        for instant in self.timeline.instants():
            if instant.action is not Action.COMPACTION:
                continue
            plan = self.timeline.plan(instant)
            for entry in plan.get("file_groups", {}).values():
                if names & set(entry["logs"]):
                    state = "was compacted" if instant.is_completed else "is being compacted"
                    raise RollbackError(f"metadata instant {time} {state} into a base at {instant.time}; "
                                        "it can no longer be rolled back on its own")

    def _execute_rollback(self, rb: Instant, plan: dict[str, Any]) -> None:
        """Idempotent: safe to run again after a crash."""
        if rb.state is State.REQUESTED:
            rb = self.timeline.start(rb)
        target = plan["target"]
        if plan["completed"]:
            touched = sorted({(os.path.dirname(p), LogFile.parse(os.path.basename(p)).file_id) for p in plan["logs"]})
            for partition, file_id in touched:
                index = int(file_id.rsplit("-", 1)[1])
                lf = self._next_logs(partition, [index], rb.time)[index]
                existing = [n for n in self.storage.list(self._dir(partition))
                            if n.startswith(f".{file_id}_") and LogFile.is_log_name(n)
                            and LogFile.parse(n).instant == rb.time]
                if not existing:
                    write_log(self.storage, os.path.join(self._dir(partition), lf.file_name),
                              LogBlock(rb.time, BlockKind.ROLLBACK, [], target_instant=target))
        else:
            for path in plan["logs"]:
                self.storage.delete(os.path.join(self.root, path))
            pending = self.timeline.get(target, Action.DELTACOMMIT)
            if pending is not None and not pending.is_completed:
                self.timeline.remove(pending)
        crash_point("metadata.rollback")
        self.timeline.complete(rb, plan)

    def _recover(self) -> None:
        """Finish interrupted rollbacks and cleans; roll back dead writers' deltacommits (standalone)."""
        for instant in self.timeline.pending([Action.ROLLBACK]):
            self._execute_rollback(instant, self.timeline.plan(instant))
        for instant in self.timeline.pending([Action.CLEAN]):
            self._execute_clean(instant, self.timeline.plan(instant))
        if self.standalone:
            for instant in self.timeline.pending([Action.DELTACOMMIT]):
                if self.timeline.is_expired(instant):
                    log.warning("rolling back metadata deltacommit %s: its writer stopped", instant.time)
                    self.rollback(instant.time)

    # -- compaction ---------------------------------------------------------------------------------
    def compact(self, force: bool = False) -> CompactionReport:
        """Compact file groups with `metadata.compact.max_delta_commits` logs (any logs if `force`).

        Never compacts a log of an instant that is not completed; a file group whose slice has a log
        newer than some pending instant waits (and says so) until that instant completes or is rolled back.
        """
        started = _time.monotonic()
        with self.lock.held():
            self._recover()
            resumable = [(i, p) for i, p in self._pending_compaction_plans() if self.timeline.is_expired(i)]
            running = [i for i, _ in self._pending_compaction_plans() if not self.timeline.is_expired(i)]
            if running:
                why = f"compaction {running[0].time} is running in another process"
                log.info("metadata compaction waits: %s", why)
                return CompactionReport(None, blocked=(why,))
            if resumable:
                instant, plan = resumable[0]
                log.warning("resuming interrupted metadata compaction %s", instant.time)
            else:
                plan, blocked = self._compaction_plan(force)
                for why in blocked:
                    log.warning("metadata compaction blocked: %s; it runs as soon as that instant completes or "
                                "is rolled back", why)
                if not plan:
                    return CompactionReport(None, blocked=tuple(blocked))
                instant = self.timeline.request(Action.COMPACTION, plan={"file_groups": plan},
                                                others=[self.authority])
                plan = {"file_groups": plan}
        records = self._execute_compaction(instant, plan)
        self.refresh()
        seconds = _time.monotonic() - started
        log.info("compacted metadata file groups %s at %s (%d records, %.2fs)",
                 ", ".join(plan["file_groups"]), instant.time, records, seconds)
        return CompactionReport(instant.time, tuple(plan["file_groups"]), records, seconds)

    def _compaction_plan(self, force: bool) -> tuple[dict[str, Any], list[str]]:
        snapshot = self._snapshot()
        pending = sorted(i.time for i in self.authority.pending()
                         if not (self.standalone and i.action is not Action.DELTACOMMIT))
        threshold = 1 if force else self.options["metadata.compact.max_delta_commits"]
        plan: dict[str, Any] = {}
        blocked: list[str] = []
        for partition, n in self.partitions.items():
            names = self.storage.list(self._dir(partition))
            for index in range(n):
                file_id = file_group_id(partition, index)
                fs = resolve_slice(partition, file_id, names, snapshot.compactions)
                readable = [lf for lf in fs.logs if lf.instant in snapshot.valid_instants
                            or lf.instant in snapshot.rollbacks]
                if len(readable) < threshold:
                    continue
                newest = max(lf.instant for lf in readable)
                stuck = [p for p in pending if p <= newest or any(lf.instant == p for lf in fs.logs)]
                if stuck:
                    blocked.append(f"{file_id} waits for pending instant {stuck[0]}")
                    continue
                plan[file_id] = {"partition": partition, "index": index,
                                 "base": fs.base.file_name if fs.base else None,
                                 "logs": [lf.file_name for lf in readable]}
        return plan, blocked

    def _execute_compaction(self, instant: Instant, plan: dict[str, Any]) -> int:
        if instant.state is State.REQUESTED:
            instant = self.timeline.start(instant)
        snapshot = self._snapshot()
        records = 0
        written = {}
        with self.timeline.heartbeat(instant):
            for file_id, entry in plan["file_groups"].items():
                partition = entry["partition"]
                base = BaseFile.parse(entry["base"]) if entry["base"] else None
                logs = tuple(LogFile.parse(n) for n in entry["logs"])
                fs = FileSlice(partition, file_id, base.instant if base else BOOTSTRAP_TIME, base, logs)
                group = MetadataFileGroup(self.storage, self._dir(partition), fs, self.kind(partition), snapshot,
                                          self.sst_cache)
                output = BaseFile(file_id, COMPACTION_TOKEN, instant.time, SST_EXTENSION)
                count = write_sst(self.storage, os.path.join(self._dir(partition), output.file_name),
                                  group.compacted_items())
                records += count - 1
                written[file_id] = output.file_name
                crash_point("metadata.compaction.file_group")
        with self.lock.held():
            self.timeline.complete(instant, {"bases": written, "records": records})
        return records

    # -- clean --------------------------------------------------------------------------------------
    def clean(self) -> CleanReport:
        """Delete file slices beyond the newest `metadata.clean.retain_file_slices` per file group, bases of
        compactions that no longer exist, and logs of instants that no timeline knows any more."""
        with self.lock.held():
            snapshot = self._snapshot()
            known = {i.time for i in self.timeline.instants()} | {i.time for i in self.authority.instants()}
            pending_compactions = {i.time for i in self.timeline.pending([Action.COMPACTION])}
            keep = self.options["metadata.clean.retain_file_slices"]
            doomed: list[str] = []
            for partition, n in self.partitions.items():
                names = self.storage.list(self._dir(partition))
                for index in range(n):
                    doomed += [os.path.join(partition, name) for name in
                               _obsolete(file_group_id(partition, index), names, snapshot.compactions,
                                         pending_compactions, known, keep)]
            if not doomed:
                return CleanReport(None)
            instant = self.timeline.request(Action.CLEAN, plan={"delete": doomed}, others=[self.authority])
            self._execute_clean(instant, {"delete": doomed})
        return CleanReport(instant.time, tuple(doomed))

    def _execute_clean(self, instant: Instant, plan: dict[str, Any]) -> None:
        if instant.state is State.REQUESTED:
            instant = self.timeline.start(instant)
        for path in plan["delete"]:
            self.storage.delete(os.path.join(self.root, path))
            if path.endswith("." + SST_EXTENSION):
                self.sst_cache.forget(os.path.basename(path))
        self.timeline.complete(instant, plan)

    def close(self) -> None:
        self._groups = {}
        self.sst_cache.close()


def _obsolete(file_id: str, names: list[str], compactions: frozenset[str], pending_compactions: set[str],
              known: set[str], keep: int) -> list[str]:
    bases = []
    for name in names:
        if name.startswith(file_id + "_") and name.endswith("." + SST_EXTENSION):
            bf = BaseFile.parse(name)
            if bf.file_id == file_id:
                bases.append(bf)
    live_bases = sorted({BOOTSTRAP_TIME} | {b.instant for b in bases if b.instant in compactions})
    oldest_kept = live_bases[-keep] if len(live_bases) >= keep else live_bases[0]
    out = [b.file_name for b in bases
           if b.instant < oldest_kept or (b.instant not in compactions and b.instant not in pending_compactions)]
    for name in names:
        if name.startswith(f".{file_id}_") and LogFile.is_log_name(name):
            lf = LogFile.parse(name)
            if lf.file_id == file_id and (lf.base_instant < oldest_kept or lf.instant not in known):
                out.append(name)
    return out


def _kind(partition: str, valid: Mapping[str, Any]) -> RecordKind:
    if partition not in valid or partition not in KINDS:
        raise UnknownPartitionError(f"unknown metadata partition {partition!r}; this table has: "
                                    f"{', '.join(sorted(valid))}")
    return KINDS[partition]


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"metadata keys are non-empty strings, got {key!r}")
    return key
