"""A table context: everything an action on a data table needs, opened once and handed to every action.

Storage, paths, the table's config, its timeline, its metadata table and the transactions over its
timeline. Actions and services take a context, never a `Table`, so they depend on nothing above them.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterator, Mapping, TypeVar

from metatable import config as config_options
from metatable.commit.data_undo import DataUndo
from metatable.commit.timeline_view import TimelineView, ViewMemo
from metatable.config import METADATA_PREFIXES
from metatable.errors import (ConfigError, CorruptFileError, MetatableError, MissingFileError, SnapshotExpiredError,
                              TableExistsError, TableNotFoundError)
from metatable.formats.clustering_plan import RESIZE
from metatable.metadata.table import MetadataTable, metadata_location
from metatable.storage.base import Storage, read_json
from metatable.storage.location import storage_for, table_root
from metatable.storage.paths import TablePaths
from metatable.table_config import READY, TableConfig, parse_index_states
from metatable.timeline.held_reads import forget, read_held, write_held
from metatable.timeline.instant import WRITE_ACTIONS, Action, Instant, Moment
from metatable.timeline.lock import table_lock
from metatable.timeline.timeline import Timeline
from metatable.timeline.transaction import Transactions

log = logging.getLogger(__name__)

R = TypeVar("R")


def rejects_writes(timeline: Timeline, instant: Instant) -> bool:
    """Whether writes to the file groups of this pending service fail until it completes: a clustering (a
    resize does not: writers dual-write through it)."""
    return instant.action is Action.REPLACECOMMIT and timeline.plan(instant).get("strategy") != RESIZE


@dataclass(frozen=True)
class TableContext:
    paths: TablePaths
    storage: Storage
    config: TableConfig  # as opened: its schema is the widest (`with_stored`); a snapshot's is its view's
    timeline: Timeline
    metadata: MetadataTable
    transactions: Transactions
    memo: ViewMemo = field(default_factory=ViewMemo, compare=False, repr=False)

    @property
    def root(self) -> str:
        return self.paths.root

    def view(self, as_of: Moment | None = None) -> TimelineView:
        """What a reader sees now (or as of a completed instant), with the index states of now."""
        return TimelineView(self.timeline, self.metadata, self.config_now(), as_of, self.memo)

    @contextmanager
    def snapshot_kept(self, instant: str | None) -> Iterator[None]:
        """A read of the snapshot as of `instant` that meets a missing data file: where a clean that completed
        since, or one still deleting, keeps that snapshot no longer, the read was overtaken (it took longer than
        the clean retains commits), a SnapshotExpiredError that says so and what to do; otherwise the loss is
        damage, reported as it was. The check is made only on the error, so reads pay nothing for it. A clean
        deletes before it completes: the chaos run's `changes()` of a window a few commits back met a clustering's
        file that way, and reported it as damage before the running cleans' plans were asked too."""
        try:
            yield
        except MissingFileError as e:
            if e.metadata or instant is None or (expired := self.expired_since(instant, e.path)) is None:
                raise
            raise expired from None

    def expired_since(self, instant: str, what: str) -> SnapshotExpiredError | None:
        """The error to raise if a clean that completed, or one still deleting, keeps the snapshot as of `instant`
        no longer: what a read of it found (`what`) may lack files that clean removed. Reads that list files
        rather than open named ones (a write's before-images: a removed file is only not listed) ask after
        listing; a clean records its plan before it deletes. The chaos run's `changes()` reported a write's
        updates as inserts so: a clean removed its images while they were listed."""
        readable = self.readable_once_cleaned()
        if instant >= readable:
            return None
        return SnapshotExpiredError(
            f"a clean removed files of {self.root} as of {instant} while they were read ({what}): snapshots as of "
            f"{readable} or later are readable. Read again, or keep snapshots readable for longer "
            "(clean.retain_commits, clean.retain_hours)")

    def readable_once_cleaned(self) -> str:
        """The earliest readable snapshot once the cleans that are running complete: the completed cleans' (the
        view's `readable_from`) and each running clean's plan."""
        planned = [self.timeline.plan_if_present(i).get("readable_from", "")
                   for i in self.timeline.pending([Action.CLEAN])]
        return max([self.view().readable_from, *planned])

    def read_view(self, read: Callable[[TimelineView], R], as_of: Moment | None = None) -> R:
        """`read(view)` on a new snapshot. Should a metadata index that the snapshot had ready be dropped while
        it read (a drop changes the states first, then deletes the files), what it read of the index may be
        gone or missing: the read runs once more on a snapshot without that index, instead of answering from
        half-deleted files or failing with an error about a damaged metadata table. The check costs a read
        of table.json after the read; a drop that changes the states after it deletes nothing this read saw.
        A metadata file that a metadata clean in another process removed while this read used it (the metadata
        table keeps `metadata.clean.retain_file_slices` slices, not every reader's) is read again the same way,
        from the newer slice that replaced it.
        On an object store the read is made at a quiet generation of the lock when there is one
        (`TableLock.quiet`): the timeline listings and table.json read at it are read again without a request,
        and the check is one HEAD (nobody took the lock since: nothing was dropped). A warm `lookup` was 3 LISTs
        and 2 GETs, and is 3 HEADs so."""
        with self.timeline.lock.quiet() as quiet:
            view = self.view(as_of)
            try:
                with self.snapshot_kept(view.as_of or view.latest):
                    result = read(view)
            except MissingFileError as e:
                if not e.metadata:
                    raise
                log.info("a metadata file was cleaned during a read of %s (%s): read again", self.root, e.path)
            except (MetatableError, FileNotFoundError):
                if not self.dropped_since(view, quiet):
                    raise
                log.info("a metadata index was dropped during a read of %s: read again without it", self.root)
            else:
                if not self.dropped_since(view, quiet):
                    return result
                log.info("a metadata index was dropped during a read of %s: read again without it", self.root)
        return read(self.view(as_of))  # outside the quiet generation: everything read again

    def dropped_since(self, view: TimelineView, quiet: int | None = None) -> set[str]:
        """The metadata indexes the view had ready that are not ready now (none when the lock is still at the
        quiet generation `quiet` the view was made at: a drop takes the lock)."""
        if quiet is not None and self.timeline.lock.unchanged(quiet):
            return set()
        now = parse_index_states(read_json(self.storage, self.paths.table_config)["metadata_indexes"])
        return {p for p in view.config.metadata_indexes if now.get(p) != READY}

    def index_states(self) -> dict[str, str]:
        """Metadata index -> "building" | "ready", as table.json holds them now (the indexer changes them while
        tables are open: a commit reads them under the lock, whatever this context was opened with)."""
        return parse_index_states(self.stored()["metadata_indexes"])

    def config_now(self) -> TableConfig:
        """The table's config with the index states and schema versions of now (`TableConfig.with_stored`); a
        view picks its schema among the versions. Made again only when table.json changed (`memo`): decoding
        its schemas was 0.12 ms of a 4 ms warm point read."""
        stored = self.stored()
        return self.memo.get("config_now", (self.config, stored), lambda: self.config.with_stored(stored))

    def stored(self) -> dict[str, Any]:
        """table.json as it is now: read once per epoch or quiet generation of the lock (`held_reads`), since
        only lock holders change it."""
        return read_held(self.timeline.lock, self.paths.table_config,
                         lambda: read_json(self.storage, self.paths.table_config))

    def current_config(self) -> TableConfig:
        """`config_now` with the schema of the latest completed instant: what a write conforms its input to
        before it begins. Lists the timeline only when the table's schema has ever changed."""
        config = self.config_now()
        if len(config.schema_versions) == 1:
            return config
        completed = {i.time for i in self.timeline.completed()}
        archived = self.timeline.archived
        return config.as_seen(lambda time: time in completed or archived.holds(time))

    def save_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Store options in table.json for every later open (validated; a default value is stored as none).
        The metadata partitions' file-group counts are fixed when a partition is made, and refused here.
        Returns the table's stored options after the change."""
        fixed = sorted(name for name in options if name.startswith("metadata.") and name.endswith(".file_groups"))
        if fixed:
            raise ConfigError(f"options {fixed} are fixed when their metadata partition is made; to change one, "
                              "drop the index and schedule it again with the option (or rebuild the metadata)")
        with self.timeline.lock.held():
            stored = read_json(self.storage, self.paths.table_config)
            resolved = config_options.resolve({**stored["options"], **options})
            stored["options"] = {k: v for k, v in resolved.items() if v != config_options.OPTIONS[k].default}
            write_held(self.storage, self.paths.table_config, stored)
        log.info("options of %s stored: %s", self.root, dict(options))
        return stored["options"]

    @classmethod
    def open(cls, path: str, storage: Storage | None = None, options: Mapping[str, Any] | None = None,
             roll_forward: Mapping[Action, Callable[[TableContext, Instant], None]] | None = None,
             storage_options: Mapping[str, Any] | None = None) -> TableContext:
        """The context of the table at `path` (a directory, or an `s3://` URL reached with `storage_options`
        and the environment's AWS settings). `roll_forward`: how to finish a service that cannot be undone
        (clean), should its process die; the services live above the context, so they hand it in."""
        storage = storage or storage_for(path, storage_options)
        paths = TablePaths(table_root(path))
        try:  # the store's capability is checked by the first write (`LeaseLock`): a read needs no create
            raw = storage.read(paths.table_config)
        except FileNotFoundError:
            raise TableNotFoundError(f"no metatable table at {path} (missing {paths.table_config}); use Table.create") \
                from None
        try:
            config = TableConfig.from_json(raw.decode(), options)
        except MetatableError:  # an unknown option among `options`
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptFileError(paths.table_config, f"not a table config ({type(e).__name__}: {e}); it holds the "
                                                       "schema, the key and the options") from None
        opts = config.options
        paths = metadata_location(storage, paths)
        lock = table_lock(storage, paths.lock, opts["lock.timeout_s"], opts["lock.lease_s"])
        timeline = Timeline(storage, paths.root, lock, opts["heartbeat.interval_s"], opts["heartbeat.tolerable_misses"])
        mdt_options = {k: v for k, v in opts.items() if k.startswith(METADATA_PREFIXES)}
        try:
            metadata = MetadataTable(paths.metadata.root, storage=storage, options=mdt_options, authority=timeline)
        except TableNotFoundError:  # a create that died between its two steps: finish it
            metadata = MetadataTable.create(paths.metadata.root, config.metadata_partitions(), options=mdt_options,
                                            storage=storage, authority=timeline)
        transactions = Transactions(timeline, DataUndo(storage, paths, metadata), name="table",
                                    writes=WRITE_ACTIONS,
                                    services=[Action.COMPACTION, Action.REPLACECOMMIT, Action.INDEXING],
                                    others=lambda: [metadata.timeline],
                                    blocks_writers=partial(rejects_writes, timeline))
        context = cls(paths, storage, config, timeline, metadata, transactions)
        for action, finish in (roll_forward or {}).items():
            transactions.roll_forward[action] = partial(finish, context)
        return context

    @staticmethod
    def create(path: str, config: TableConfig, storage: Storage | None = None) -> str:
        """Write a new table's config; its metadata table follows when it is first opened."""
        storage = storage or storage_for(path)
        paths = TablePaths(table_root(path))
        storage.check(paths.meta)
        if not storage.create_exclusive(paths.table_config, config.to_json().encode()):
            raise TableExistsError(f"a table already exists at {paths.root}")
        forget(paths.table_config)  # what this process kept of a table that was here before
        log.info("created %s table at %s", config.table_type, paths.root)
        return paths.root
