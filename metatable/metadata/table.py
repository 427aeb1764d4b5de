"""The metadata table: a merge-on-read key-value store with its own timeline.

Standalone, it validates log blocks against its own completed deltacommits. As
the metadata table of a data table (`authority=` the data timeline, sharing its
lock), a block is visible only once its instant completed on the data timeline.

Writes: `begin(time)` -> `write(time, records)` -> `complete(time)`, or
`commit(records)` for all three. Each write puts one Avro log file into every
file group it touches, named before it is written (and listed in the inflight
state) so rollback knows exactly what to remove. Instants go through the shared
transaction (`transaction.Transactions`); compaction and clean are services with
the shared lifecycle (`metadata.services`), run after commits when
`metadata.auto_compact` is on.
"""
from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import time as _time
from typing import Any, Callable, Iterable, Iterator, Mapping

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import hash32_array
from indexes.keys import group_by_bucket

from metatable import config
from metatable.errors import (CorruptFileError, InvalidInputError, MissingFileError, TableExistsError, TableNotFoundError,
                              TimelineError)
from metatable.faults import crash_point
from metatable.formats.log_file import BlockKind, Entries, LogBlock, LogFile, write_log
from metatable.metadata.file_group import SST_EXTENSION, MetadataFileGroup, Snapshot
from metatable.metadata.layout import MetadataLayout, check_key, kind_of
from metatable.metadata.records import KINDS, Record, RecordKind, kind_named
from metatable.metadata.services import (
    CleanReport, CompactionReport, MetadataUndo, clean_service, compaction_service, execute_clean,
    pending_compaction_plans)
from metatable.parallel import thread_map
from metatable.storage.base import Storage, read_json
from metatable.storage.location import storage_for
from metatable.storage.paths import TablePaths
from metatable.timeline.held_reads import forget
from metatable.timeline.instant import Action, Instant, State
from metatable.timeline.lifecycle import run_due
from metatable.timeline.lock import table_lock
from metatable.timeline.timeline import Completion, Timeline
from metatable.timeline.transaction import Publication, Transactions

log = logging.getLogger(__name__)

__all__ = ["MetadataTable", "CompactionReport", "CleanReport"]


class Scan(Iterator[tuple[str, Record]]):
    """A scan's records, streamed (a partition may hold millions); its repr shows the first few."""

    SHOWN = 5

    def __init__(self, partition: str, prefix: str, records: Callable[[], Iterator[tuple[str, Record]]]) -> None:
        self.partition = partition
        self.prefix = prefix
        self._records = records
        self._stream: Iterator[tuple[str, Record]] | None = None

    def __next__(self) -> tuple[str, Record]:
        if self._stream is None:
            self._stream = self._records()
        return next(self._stream)

    def __repr__(self) -> str:
        first = list(itertools.islice(self._records(), self.SHOWN + 1))
        lines = [f"  {key!r}: {record!r}" for key, record in first[:self.SHOWN]]
        more = "\n  ... (iterate, or list(), for all)" if len(first) > self.SHOWN else ""
        return f"scan of {self.partition!r} (prefix {self.prefix!r}):\n" + "\n".join(lines or ["  (no records)"]) + more


def properties_partitions(storage: Storage, paths: TablePaths) -> dict[str, int] | None:
    """The partitions a metadata table's properties list (None when they are missing or unreadable)."""
    try:
        return dict(read_json(storage, paths.properties)["partitions"])
    except (OSError, CorruptFileError, KeyError, TypeError):
        return None


def metadata_location(storage: Storage, paths: TablePaths) -> TablePaths:
    """A data table's paths with the metadata table it has now: the one the last generation under
    `metadata_roots` names (a rebuild creates one), `metadata/` while there is none. One listing."""
    generations = sorted(n for n in storage.list(paths.metadata_roots) if n.isdigit())
    if not generations:
        return paths
    return paths.with_metadata(storage.read(os.path.join(paths.metadata_roots, generations[-1])).decode())


def metadata_roots(storage: Storage, paths: TablePaths) -> list[str]:
    """Every metadata directory a generation under `metadata_roots` names, oldest first."""
    return [storage.read(os.path.join(paths.metadata_roots, n)).decode()
            for n in sorted(n for n in storage.list(paths.metadata_roots) if n.isdigit())]


def point_to(storage: Storage, paths: TablePaths, metadata_dir: str) -> None:
    """Make `metadata_dir` the data table's metadata table, atomically for every later open: the next
    generation under `metadata_roots`, created once (callers hold the lock)."""
    generations = sorted(int(n) for n in storage.list(paths.metadata_roots) if n.isdigit())
    generation = (generations[-1] if generations else 0) + 1
    if not storage.create_exclusive(os.path.join(paths.metadata_roots, f"{generation:08d}"), metadata_dir.encode()):
        raise TimelineError(f"metadata root generation {generation} of {paths.root} exists already: another "
                            "process replaced the metadata table at the same time")
    forget(paths.metadata_roots)


class MetadataTable:
    def __init__(self, root: str, *, storage: Storage | None = None, options: Mapping[str, Any] | None = None,
                 authority: Timeline | None = None) -> None:
        self.root = root
        self.storage = storage or storage_for(root)
        paths = TablePaths(root)
        if not self.storage.exists(paths.properties):
            raise TableNotFoundError(f"no metadata table at {root} (missing {paths.properties}); create it first")
        props = read_json(self.storage, paths.properties, metadata=True)
        self.options = config.resolve({**props.get("options", {}), **(options or {})})
        lock = authority.lock if authority else table_lock(self.storage, paths.lock, self.options["lock.timeout_s"],
                                                           self.options["lock.lease_s"])
        self.standalone = authority is None
        self.timeline = Timeline(self.storage, root, lock, self.options["heartbeat.interval_s"],
                                 self.options["heartbeat.tolerable_misses"])
        self.authority = authority or self.timeline
        self.lock = lock
        self.layout = MetadataLayout(self.storage, paths, dict(props["partitions"]),
                                     self.options["metadata.sst_cache_bytes"], lock)
        self.transactions = Transactions(
            self.timeline, MetadataUndo(self.layout, self.timeline, authority), name="metadata",
            writes=[Action.DELTACOMMIT] if self.standalone else [], services=[Action.COMPACTION],
            roll_forward={Action.CLEAN: self._finish_clean},
            others=lambda: [] if self.standalone else [self.authority])
        self.refresh()

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def create(cls, root: str, partitions: Mapping[str, int] | Iterable[str] | None = None, *,
               options: Mapping[str, Any] | None = None, storage: Storage | None = None,
               authority: Timeline | None = None) -> MetadataTable:
        """A new, empty metadata table. `partitions` maps name -> file groups (by default every kind, with
        `metadata.<partition>.file_groups` file groups)."""
        storage = storage or storage_for(root)
        config.resolve(options)  # reject unknown options before anything is written
        if partitions is None:
            partitions = [k for k in KINDS if k != "secondary_index"]  # a secondary index is named
        if not isinstance(partitions, Mapping):
            partitions = {p: config.file_groups(p, options) if kind_named(p) else 1 for p in partitions}
        for name, n in partitions.items():
            kind_of(name, (name,))
            if not isinstance(n, int) or n < 1:
                raise InvalidInputError(f"partition {name!r} needs a positive number of file groups, got {n!r}")
        props = {"format_version": 1, "partitions": dict(partitions), "options": dict(options or {})}
        if not storage.create_exclusive(TablePaths(root).properties,
                                        json.dumps(props, indent=2, sort_keys=True).encode()):
            raise TableExistsError(f"a metadata table already exists at {root}")
        return cls(root, storage=storage, authority=authority)

    @classmethod
    def open(cls, root: str, **kwargs: Any) -> MetadataTable:
        return cls(root, **kwargs)

    def refresh(self) -> None:
        """See everything completed up to now; a table object keeps its view until this is called. When
        nothing was completed since, the decoded log records are kept (what is readable is unchanged)."""
        snapshot = Snapshot.of(self.timeline, None if self.standalone else self.authority)
        if snapshot == getattr(self, "snapshot", None):
            return
        self.snapshot = snapshot
        self._groups: dict[tuple[str, int], MetadataFileGroup] = {}
        self._listings: dict[str, list[str]] = {}

    # -- partitions ---------------------------------------------------------------------------------
    @property
    def partitions(self) -> dict[str, int]:
        return self.layout.partitions

    def reload_partitions(self) -> None:
        """Pick up partitions added or removed since this object opened (the data table's indexer does that)."""
        if self.layout.reload():
            self.reread()

    def add_partitions(self, partitions: Mapping[str, int]) -> None:
        """Create empty partitions (name -> file groups); a leftover directory of an earlier one is emptied."""
        for name in partitions:
            kind_of(name, (name,))
            self._delete_files(name)
        with self.lock.held():
            self.layout.reload()
            self.layout.save({**self.layout.partitions, **partitions})
        self.reread()

    def remove_partition(self, partition: str, wait_s: float = 60.0) -> None:
        """Forget a partition, then delete its files once no metadata compaction that planned it is still
        running (up to `wait_s`; readers that still hold the partition fail on a missing file)."""
        with self.lock.held():
            self.layout.reload()
            self.layout.save({p: n for p, n in self.layout.partitions.items() if p != partition})
        self.reread()
        deadline = _time.monotonic() + wait_s
        while _time.monotonic() < deadline:
            with self.lock.held():
                self.transactions.recover()
                busy = [i for i in self.timeline.pending([Action.COMPACTION]) if i.state is State.INFLIGHT
                        and any(e["partition"] == partition for e in self.timeline.plan(i)["file_groups"].values())]
            if not busy:
                break
            _time.sleep(0.05)
        self._delete_files(partition)

    def _delete_files(self, partition: str) -> None:
        directory = self.layout.dir(partition)
        for name in self.storage.list(directory):
            self.storage.delete(os.path.join(directory, name))
            if name.endswith("." + SST_EXTENSION):
                self.layout.sst_cache.forget(name)
        self.layout.forget_listings([partition])

    # -- reads --------------------------------------------------------------------------------------
    def kind(self, partition: str) -> RecordKind:
        return self.layout.kind(partition)

    def _group(self, partition: str, index: int) -> MetadataFileGroup:
        group = self._groups.get((partition, index))
        if group is None:
            if partition not in self._listings:
                self._listings[partition] = self.layout.listing(partition)
            fs = self.layout.slice(partition, index, self._listings[partition], self.snapshot.compacted)
            group = self._groups[(partition, index)] = self.layout.group(fs, self.snapshot)
        return group

    def is_read(self, partition: str) -> bool:
        """Whether a read of the partition would read no file this process has not read already (its logs are
        decoded, its bases at hand): what a lookup then costs is the lookup alone. False for a partition this
        table object does not have (yet)."""
        return partition in self.partitions and all(self._group(partition, i).is_read()
                                                    for i in range(self.partitions[partition]))

    def get(self, partition: str, key: str) -> Record | None:
        return self.get_many(partition, [key]).get(key)

    def get_many(self, partition: str, keys: Iterable[str]) -> dict[str, Record]:
        """Merged records of the present keys (absent keys are left out)."""
        self.kind(partition)
        keys = [check_key(k) for k in keys] if not isinstance(keys, list) or not all(keys) else keys
        try:
            return self._get_many(partition, keys)
        except MissingFileError:  # a compaction and clean elsewhere moved the table on, or removed a read
            self.reread()          # cache: once more on what is there now (still missing: damage, raised)
            self.refresh()
            return self._get_many(partition, keys)

    def _get_many(self, partition: str, keys: list[str]) -> dict[str, Record]:
        out: dict[str, Record] = {}
        for index, group_keys in group_by_bucket(keys, self.partitions[partition]):
            out.update(self._group(partition, index).get_visible(group_keys))
        return out

    def get_entries(self, partition: str, keys: pa.Array) -> Entries:
        """`get_many` as columns, nothing decoded, for a partition whose kind merges columns (the record index,
        secondary indexes): the merged entries of the present keys."""
        try:
            return self._get_entries(partition, keys, self._group)
        except MissingFileError:  # as in `get_many`
            self.reread()
            self.refresh()
            return self._get_entries(partition, keys, self._group)

    def _get_entries(self, partition: str, keys: pa.Array, group: Callable[[str, int], MetadataFileGroup]) -> Entries:
        if not self.kind(partition).merges_columns:
            raise InvalidInputError(f"the records of {partition} do not merge as columns: read them with get_many")
        buckets = hash32_array(keys) % self.partitions[partition]
        groups = [(group(partition, b), keys.filter(pa.array(buckets == b))) for b in np.unique(buckets).tolist()]
        # RocksDB's multi-get and Arrow's sorts release the GIL: 300,239 reverse entries of 4 file groups (a
        # 5% upsert at SF 1) in 0.62 s in one thread, 0.36 s in two
        return Entries.concat(thread_map(lambda gk: gk[0].get_entries(gk[1]), groups), may_repeat=False)

    def entries(self, partition: str) -> Entries:
        """Every visible merged entry of a partition whose kind merges columns, as columns, file group by file
        group (what fsck compares with the data)."""
        if not self.kind(partition).merges_columns:
            raise InvalidInputError(f"the records of {partition} do not merge as columns: scan them")
        return Entries.concat([self._group(partition, i).merged_entries() for i in range(self.partitions[partition])],
                              may_repeat=False)

    def lookup(self, partition: str, base_of: str | None = None) -> Callable[[pa.Array], Entries]:
        """`get_entries` of one partition, as a function of the keys. `base_of`: a pending indexing whose bases
        are read too (its catch-up reads the index it built), from a listing of now."""
        if base_of is None:
            return lambda keys: self.get_entries(partition, keys)
        self.refresh()
        snapshot = self.snapshot.with_base_of(base_of)
        names = self.layout.listing(partition, fresh=True)

        def group(partition: str, index: int) -> MetadataFileGroup:
            return self.layout.group(self.layout.slice(partition, index, names, snapshot.compacted), snapshot)
        return lambda keys: self._get_entries(partition, keys, group)

    def reread(self) -> None:
        """Read the files again on the next read, and list them again: blocks were appended to instants this
        snapshot already had, or files were written that instants completing now make visible."""
        self._groups, self._listings = {}, {}
        self.layout.forget_listings()

    def scan(self, partition: str, prefix: str = "") -> Scan:
        """(key, record) for every present key starting with `prefix`, in key order, streamed."""
        self.kind(partition)
        return Scan(partition, prefix, lambda: self._scan(partition, prefix))

    def _scan(self, partition: str, prefix: str) -> Iterator[tuple[str, Record]]:
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
        return self.transactions.begin(Action.DELTACOMMIT, time=time, start=False, beat=self.standalone).time

    def write(self, time: str, records: Mapping[str, Mapping[str, Record | None] | Entries]) -> list[str]:
        """Write the instant's records (None = tombstone) as one log file per touched file group."""
        encoded = {partition: self._encode(partition, recs) for partition, recs in records.items()}
        with self.lock.held():
            instant = self.timeline.get(time, Action.DELTACOMMIT)
            if instant is None or instant.state is not State.REQUESTED:
                raise TimelineError(f"metadata deltacommit {time} is {instant and instant.state.value or 'missing'}; "
                                    "call begin() first, and write() once")
            self._check_successors(records)
            planned = self._plan_logs(time, encoded)
            paths = [os.path.join(partition, lf.file_name) for partition, lf, _ in planned]
            self.timeline.transition(instant, State.INFLIGHT, {"logs": paths})
            self._write_logs(time, planned)
            return paths

    def append(self, time: str, records: Mapping[str, Mapping[str, Record | None] | Entries], token: str) -> list[str]:
        """Write records as log blocks of instant `time`, which already completed on the data timeline, with
        the write token `token` (no instant of its own: the data table's indexer catches instants up so,
        and undoes them by their token)."""
        if self.standalone:
            raise InvalidInputError("only the metadata table of a data table appends blocks of completed instants")
        encoded = {partition: self._encode(partition, recs) for partition, recs in records.items() if recs}
        with self.lock.held():
            planned = self._plan_logs(time, encoded, token)
            self._write_logs(time, planned)
        return [os.path.join(partition, lf.file_name) for partition, lf, _ in planned]

    def _plan_logs(self, time: str, encoded: Mapping[str, Entries],
                   token: str | None = None) -> list[tuple[str, LogFile, Entries]]:
        """(partition, log name, entries) of each file group the entries go to."""
        compacted = Snapshot.of(self.timeline, None if self.standalone else self.authority).compacted
        pending = pending_compaction_plans(self.timeline, None if self.standalone else self.authority)
        planned = []
        for partition, entries in encoded.items():
            groups = hash32_array(entries.keys) % self.partitions[partition]
            order = np.argsort(groups, kind="stable")
            bounds = np.flatnonzero(np.diff(groups[order])) + 1
            runs = {int(groups[run[0]]): run for run in np.split(order, bounds) if len(run)}
            names = self.layout.next_logs(partition, runs, time, compacted, pending, token)
            for index, run in sorted(runs.items()):
                planned.append((partition, names[index], entries.take(run)))
        return planned

    def _write_logs(self, time: str, planned: list[tuple[str, LogFile, Entries]]) -> None:
        for partition, lf, entries in planned:
            path = os.path.join(self.layout.dir(partition), lf.file_name)
            block = LogBlock(time, BlockKind.RECORDS, entries)
            self.layout.wrote(partition, lf.file_name, write_log(self.storage, path, block))
            self.layout.log_cache.keep(path, block)
            crash_point("metadata.write.log")

    def complete(self, time: str) -> None:
        """Complete the deltacommit (a standalone table's; an attached one's completes with the data instant,
        `completion`)."""
        with self.lock.held():
            self._begun_empty(time)

            def publish() -> Publication:
                return Publication(self._commit_metadata(time))

            self.transactions.commit(Instant(time, Action.DELTACOMMIT, State.INFLIGHT), publish)

    def completion(self, time: str) -> Completion:
        """The deltacommit's completion, for the data instant at `time` to make with its own in one fence: what
        a write records here is readable exactly when the write is."""
        with self.lock.held():
            self._begun_empty(time)
            return self.transactions.completion(Instant(time, Action.DELTACOMMIT, State.INFLIGHT),
                                                lambda: self._commit_metadata(time))

    def _begun_empty(self, time: str) -> None:
        instant = self.timeline.get(time, Action.DELTACOMMIT)
        if instant is not None and instant.state is State.REQUESTED:  # begun, nothing written
            self.timeline.transition(instant, State.INFLIGHT, {"logs": []})

    def _commit_metadata(self, time: str) -> dict[str, Any]:
        content = self.timeline.read_json(self.timeline.get(time, Action.DELTACOMMIT))
        crash_point("metadata.complete")
        return {"logs": content.get("logs", [])}

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
        """Compact what is due, then clean and archive; called after commits (each looks before it locks)."""
        report = self.compact(look_first=True)
        if report.instant:
            self.clean(look_first=True)
        self.archive()

    def archive(self) -> int:
        """Move the oldest completed instants into the archive once the timeline holds more than
        `metadata.archive.max_instants`, down to `metadata.archive.min_instants`; returns how many moved. The
        run stops at the first pending instant of either timeline: a data write rolled back after its metadata
        deltacommit completed undoes it through the instant (`MetadataUndo`), which must still be active."""
        if len(self.timeline.instants()) <= self.options["metadata.archive.max_instants"]:  # no lock taken
            return 0
        with self.lock.held():
            active = self.timeline.instants()
            if len(active) <= self.options["metadata.archive.max_instants"]:
                return 0
            pending = [i.time for i in (*active, *self.authority.instants()) if not i.is_completed]
            stop = min(pending, default=None)
            run = []
            for instant in active[:len(active) - self.options["metadata.archive.min_instants"]]:
                if not instant.is_completed or (stop is not None and instant.time >= stop):
                    break
                run.append(instant)
            if run:
                self.timeline.archive_run(run, lambda carried, archived: carried)
        if run:
            log.info("archived %d metadata instants (%s to %s)", len(run), run[0].time, run[-1].time)
        return len(run)

    def _encode(self, partition: str, records: Mapping[str, Record | None] | Entries) -> Entries:
        """The records as encoded entries (None: a tombstone); entries pass through."""
        if isinstance(records, Entries):
            keys = records.keys
            if keys.null_count or pc.any(pc.equal(pc.binary_length(keys), 0)).as_py():
                raise InvalidInputError(f"metadata keys are non-empty strings; {partition} entries have an empty one")
            return records
        kind = self.kind(partition)
        tombstone = kind.tombstone()
        out = []
        for key, record in records.items():
            check_key(key)
            try:
                out.append((key, kind.encode(tombstone if record is None else record)))
            except (ValueError, TypeError, KeyError, AttributeError, fastavro.validation.ValidationError) as e:
                raise InvalidInputError(f"record for key {key!r} does not fit the {partition} schema: {e}") from None
        return Entries.of(out)

    def _check_successors(self, records: Mapping[str, Mapping[str, Record | None] | Entries]) -> None:
        for partition, recs in records.items():
            kind = self.kind(partition)
            if type(kind).check_successor is RecordKind.check_successor or isinstance(recs, Entries):
                continue
            live = {k: r for k, r in recs.items() if r is not None}
            if not live:
                continue
            current = self._raw_current(partition, list(live))
            for key, record in live.items():
                kind.check_successor(current.get(key), record)

    def _raw_current(self, partition: str, keys: list[str]) -> dict[str, Record]:
        """The latest merged records as stored (tombstones included), from a fresh listing and snapshot."""
        snapshot = Snapshot.of(self.timeline, None if self.standalone else self.authority)
        names = self.layout.listing(partition)
        out = {}
        for index, group_keys in group_by_bucket(keys, self.partitions[partition]):
            group = self.layout.group(self.layout.slice(partition, index, names, snapshot.compacted), snapshot)
            for key in group_keys:
                record = group.get_raw(key)
                if record is not None:
                    out[key] = record
        return out

    # -- rollback -----------------------------------------------------------------------------------
    def rollback(self, time: str) -> None:
        """Undo a deltacommit. A pending one loses its files; a completed one is undone by rollback blocks
        (its files stay for readers that still see it, until clean). Compacted instants cannot be undone."""
        with self.lock.held():
            instant = self.timeline.get(time, Action.DELTACOMMIT)
            if instant is not None:  # else: never written here, or already rolled back
                self.transactions.rollback(instant)
        self.refresh()

    # -- services -----------------------------------------------------------------------------------
    def compact(self, force: bool = False, look_first: bool = False) -> CompactionReport:
        """Compact file groups with `metadata.compact.max_delta_commits` logs or `metadata.compact.max_log_bytes`
        bytes of them (any logs if `force`).

        Never compacts a log of an instant that is not completed; a file group whose slice has a log
        newer than some pending instant waits (and says so) until that instant completes or is rolled back.
        """
        started = _time.monotonic()
        blocked: list[str] = []
        done: dict[str, Any] = {}
        threshold = 1 if force else self.options["metadata.compact.max_delta_commits"]
        max_bytes = 1 if force else self.options["metadata.compact.max_log_bytes"]
        service = compaction_service(self.layout, self.transactions, None if self.standalone else self.authority,
                                     threshold, max_bytes, blocked, done)
        run = run_due(self.transactions, service, look_first)
        if run.running_elsewhere is not None:
            why = f"compaction {run.running_elsewhere.time} is running in another process"
            log.info("metadata compaction waits: %s", why)
            return CompactionReport(None, blocked=(why,))
        blocked = list(dict.fromkeys(blocked))  # a look before the lock planned once more
        for why in blocked:
            log.warning("metadata compaction blocked: %s; it runs as soon as that instant completes or is "
                        "rolled back", why)
        if run.instant is None:
            return CompactionReport(None, blocked=tuple(blocked))
        self.refresh()
        seconds = _time.monotonic() - started
        log.info("compacted metadata file groups %s at %s (%d records, %.2fs)",
                 ", ".join(done["file_groups"]), run.instant.time, done["records"], seconds)
        return CompactionReport(run.instant.time, done["file_groups"], done["records"], seconds)

    def clean(self, look_first: bool = False) -> CleanReport:
        """Delete file slices beyond the newest `metadata.clean.retain_file_slices` per file group, bases of
        compactions that no longer exist, and logs of instants that no timeline knows any more."""
        service = clean_service(self.layout, self.transactions, None if self.standalone else self.authority,
                                self.options["metadata.clean.retain_file_slices"])
        run = run_due(self.transactions, service, look_first)
        return CleanReport(run.instant.time, run.result) if run.instant else CleanReport(None)

    def _finish_clean(self, instant: Instant) -> None:
        execute_clean(self.layout, self.transactions, self.transactions.take(instant), self.timeline.plan(instant))

    def close(self) -> None:
        self._groups = {}
        self.layout.sst_cache.close()
