"""What a snapshot of a data table sees: its completed instants, its live files and its file slices.

The view is taken at the latest completed instant, or `as_of` an older one (time travel). Files come
from the metadata table's `files` partition, never from listing directories; a file is visible when the
instant that wrote it is. Each file group's latest slice is its newest visible base plus the visible logs
written after it (`file_slice.latest_slice`). File groups that a completed replacecommit (clustering)
replaced are hidden from views at or after it. Reads, writes, lookups and services all take their
slices from a view.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Callable, Collection, Iterable, TypeVar

from indexes.bucket import INITIAL_GENERATION, BucketAssigner, BucketLayout
from indexes.consistent_hashing import ConsistentHashingAssigner, Ring, RingPlan
from indexes.keys import ALL_PARTITIONS_KEY

from metatable.errors import SnapshotExpiredError
from metatable.file_group.base_file import PARQUET
from metatable.file_group.file_slice import FileSlice, by_completion, latest_slice, parse_names
from metatable.formats.clustering_plan import ClusteringPlan, busy_file_groups
from metatable.metadata.table import MetadataTable
from metatable.table_config import IndexConfig, TableConfig
from metatable.timeline.instant import BOOTSTRAP_TIME, DATA_ACTIONS, Action, Instant, Moment, moment_time
from metatable.timeline.timeline import Timeline


FileGroup = tuple[str, str]  # (partition path, file id)
T = TypeVar("T")


class ViewMemo:
    """What the last view computed of what depends only on what it sees (its config, partitions, live files,
    file slices and bucket layout), for the next view that sees the same: one per table context, each value
    under the key that names what it was computed from. A warm point read made them again for every view:
    0.4 ms of a 4 ms `get_by` of one (l_suppkey, l_shipdate) pair at SF 1. The values are shared by the
    views: nobody changes them."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[tuple[Any, ...], Any]] = {}

    def get(self, name: str, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        kept = self._kept.get(name)
        if kept is not None and kept[0] == key:
            return kept[1]
        value = compute()
        self._kept[name] = (key, value)
        return value


def group_name(partition: str, file_id: str) -> str:
    """How commit metadata and plans name a file group."""
    return f"{partition}/{file_id}"


def parse_group_name(name: str) -> FileGroup:
    partition, _, file_id = name.rpartition("/")
    return partition, file_id


class TimelineView:
    """What one snapshot sees. `config` is the table's config with the metadata index states read when the
    snapshot was made, and the schema of the snapshot: every read and write through this view uses those,
    so an index dropped (or made ready), or a column added, by another process afterwards changes only later
    snapshots."""

    def __init__(self, timeline: Timeline, metadata: MetadataTable, config: TableConfig,
                 as_of: Moment | None = None, memo: ViewMemo | None = None) -> None:
        if not set(config.maintained) <= set(metadata.partitions):  # an index built since this table opened
            metadata.reload_partitions()
        metadata.refresh()
        self.timeline = timeline
        self.metadata = metadata
        self.instants = timeline.instants()
        self.archived = timeline.archived  # read after the listing: an instant is in one or the other
        # the metadata snapshot was fixed first: an instant that completed after it is not seen (a resize
        # would otherwise hide its parents while the snapshot lacks its children's files)
        snapshot = None if metadata.standalone else metadata.snapshot
        self.completed = [i for i in self.instants if i.is_completed and i.action in DATA_ACTIONS
                          and (snapshot is None or snapshot.valid(i.time))]
        self.completed_times = frozenset(i.time for i in self.completed)
        if as_of is not None:
            as_of = self.resolve(as_of)
        self.as_of = as_of
        self.config = config.as_seen(self.visible)  # the schema of this snapshot (`schema_history`)
        self.memo = memo or ViewMemo()

    def is_completed(self, time: str) -> bool:
        """Whether a data instant completed at `time`: on the active timeline, or in the archive."""
        if time in self.completed_times:
            return True
        if not self.archived.holds(time):
            return False
        found = self.timeline.archive.find(time)
        return found is not None and found.action in DATA_ACTIONS

    def resolve(self, moment: Moment) -> str:
        """The latest completed data instant at or before a moment (an instant time, an ISO-8601 time or a
        `datetime`: `instant.moment_time`): what a read as of that moment reads. A time before the table's first
        commit, or one whose files a clean removed, is a SnapshotExpiredError naming the readable times."""
        found = self.instant_at(moment_time(moment))
        if found is None or found < self.readable_from:
            why = "before the table's first commit" if found is None else "a clean removed files of that snapshot"
            since = "its first commit" if self.readable_from == BOOTSTRAP_TIME else self.readable_from
            raise SnapshotExpiredError(
                f"cannot read {self.timeline.root} as of {moment}: {why}; snapshots as of {since} or later are readable (the "
                f"latest commit is {self.latest}). clean.retain_commits and clean.retain_hours set how long commits "
                "stay readable")
        return found

    def instant_at(self, time: str) -> str | None:
        """The latest completed data instant at or before an instant time (archived ones too), None before the
        first."""
        found = max((i.time for i in self.completed if i.time <= time), default=None)
        if found is None and self.archived.until != BOOTSTRAP_TIME:
            found = max((i.time for i, _ in self.timeline.archive.read(last=time) if i.action in DATA_ACTIONS),
                        default=None)
        return found

    @property
    def is_current(self) -> bool:
        """Whether this is the table's latest snapshot. Indexes that hold only the present (the record index,
        consistent-hashing rings) answer for it; a view as of an older instant finds keys through what is
        versioned by file (bloom filters and key ranges, kept per base file) and its slices' own files."""
        return self.as_of is None or self.as_of == self.latest

    @property
    def latest(self) -> str | None:
        """The latest completed data instant this view could see."""
        return self.completed[-1].time if self.completed else None

    @cached_property
    def readable_from(self) -> str:
        """The oldest instant time whose snapshot every completed clean kept (each records its own; the
        archive carries the newest of the archived ones)."""
        cleans = [i for i in self.instants if i.is_completed and i.action is Action.CLEAN]
        return max([self.timeline.read_json(i).get("readable_from", BOOTSTRAP_TIME) for i in cleans],
                   default=self.archived.carried.get("readable_from", BOOTSTRAP_TIME))

    def visible(self, time: str) -> bool:
        """Whether files an instant at `time` wrote are in this snapshot: it completed (an archived one did)
        and, in time travel, not after the snapshot."""
        return (time in self.completed_times or self.archived.holds(time)) and \
            (self.as_of is None or time <= self.as_of)

    def pending(self, actions: Iterable[Action]) -> list[Instant]:
        wanted = set(actions)
        return [i for i in self.instants if not i.is_completed and i.action in wanted]

    # -- files ----------------------------------------------------------------------------------------
    @cached_property
    def partitions(self) -> list[str]:
        def read() -> list[str]:
            record = self.metadata.get("files", ALL_PARTITIONS_KEY)
            return sorted(record["files"]) if record else []
        return self.memo.get("partitions", self._metadata_key, read)

    @cached_property
    def live_files(self) -> dict[str, dict[str, int]]:
        """partition -> every file name in `files` -> its size (visible or not: callers filter)."""
        return self.memo.get("live_files", self._metadata_key, lambda: {
            p: {name: e["size"] for name, e in sorted(r["files"].items())}
            for p, r in self.metadata.get_many("files", self.partitions).items()})

    @property
    def _metadata_key(self) -> tuple[Any, ...]:
        """What names what the metadata table shows now: which one (a rebuild stages another) and its snapshot."""
        return (self.metadata, self.metadata.snapshot)

    @property
    def _slices_key(self) -> tuple[Any, ...]:
        """What names the file slices this view sees: the metadata's files, and which instants are visible."""
        return (*self._metadata_key, self.completed_times, self.archived, self.as_of)

    @cached_property
    def replacements(self) -> list[tuple[Instant, dict[str, Any]]]:
        """Completed replacecommits this view sees, with their commit metadata, oldest first."""
        return [(i, self.timeline.read_json(i)) for i in self.completed
                if i.action is Action.REPLACECOMMIT and self.visible(i.time)]

    @cached_property
    def replaced(self) -> frozenset[FileGroup]:
        """File groups replaced by completed replacecommits this view sees."""
        return frozenset((partition, file_id) for _, meta in self.replacements
                         for partition, ids in meta.get("replaced", {}).items() for file_id in ids)

    def bucket_layout(self, configured: int) -> BucketLayout:
        """A simple-bucket table's buckets as this view sees them: a completed rehash (a replacecommit that
        records `num_buckets`) changes the count atomically with the file groups it rewrote."""
        return self.memo.get("bucket_layout", (*self._slices_key, configured), lambda: self._layout(configured))

    def _layout(self, configured: int) -> BucketLayout:
        count, generation = self.archived.carried.get("num_buckets") or (configured, INITIAL_GENERATION)
        for instant, meta in self.replacements:
            if meta.get("num_buckets"):
                count, generation = meta["num_buckets"], instant.time
        replaced = [(partition, file_id, instant.time) for instant, meta in self.replacements
                    for partition, ids in meta.get("replaced", {}).items() for file_id in ids]
        return BucketLayout.of(count, generation, self.file_slices, replaced)

    @cached_property
    def rings(self) -> dict[str, Ring]:
        """A consistent-hashing table's committed ring of every partition (`hashing_meta`)."""
        if "hashing_meta" not in self.metadata.partitions:
            return {}
        return {r["partition_path"]: Ring.from_record(r) for _, r in self.metadata.scan("hashing_meta")}

    def pending_rings(self) -> dict[str, tuple[str, Ring]]:
        """partition -> (instant, pending ring) of every pending resize."""
        out = {}
        for instant in self.pending([Action.REPLACECOMMIT]):
            plan = self.plan(instant)
            for ring in ClusteringPlan.from_record(plan).rings if plan else ():
                out[ring.partition] = (instant.time, ring)
        return out

    def index_plan(self, index: IndexConfig) -> BucketLayout | RingPlan:
        """What a bucket index computes file groups from: the simple index's layout, or the rings."""
        if index.consistent_hashing:
            return RingPlan(index.num_buckets, self.rings, self.pending_rings())
        return self.bucket_layout(index.num_buckets)

    def bucket_assigner(self, index: IndexConfig) -> BucketAssigner | ConsistentHashingAssigner:
        plan = self.index_plan(index)
        return ConsistentHashingAssigner(plan) if isinstance(plan, RingPlan) else BucketAssigner(plan)

    @cached_property
    def file_slices(self) -> dict[FileGroup, FileSlice]:
        """The latest file slice of every live file group."""
        return self.memo.get("file_slices", self._slices_key, lambda: self.slices_in(self.live_files))

    def slices_in(self, files: dict[str, Collection[str]]) -> dict[FileGroup, FileSlice]:
        """The latest file slices of the given partitions' files (`file_sizes` of a few partitions: what a
        commit touched, without reading the rest of the table)."""
        out = {}
        for partition, names in files.items():
            bases, logs = parse_names(names, PARQUET)
            logs = [lf for lf in logs if self.visible(lf.instant)]
            for file_id in sorted({b.file_id for b in bases} | {lf.file_id for lf in logs}):
                if (partition, file_id) in self.replaced:
                    continue
                fs = latest_slice(partition, file_id, bases, logs, self.visible, by_completion)
                if fs.base or fs.logs:
                    out[(partition, file_id)] = fs
        return out

    def file_sizes(self, partitions: Collection[str]) -> dict[str, dict[str, int]]:
        """partition -> file name -> bytes, for the given partitions only (one metadata read of them)."""
        if "live_files" in self.__dict__:  # already read for every partition
            return {p: self.live_files.get(p, {}) for p in partitions}
        records = self.metadata.get_many("files", sorted(partitions))
        return {p: {name: e["size"] for name, e in records[p]["files"].items()} if p in records else {}
                for p in partitions}

    def sizes(self) -> dict[str, dict[str, int]]:
        """partition -> file id -> bytes of its latest base file, as committed."""
        out: dict[str, dict[str, int]] = {}
        for (partition, file_id), fs in self.file_slices.items():
            if fs.base:
                out.setdefault(partition, {})[file_id] = self.live_files[partition][fs.base.file_name]
        return out

    # -- pending services -------------------------------------------------------------------------------
    def plan(self, instant: Instant) -> dict[str, Any]:
        """A pending instant's plan; {} when it was rolled back since this view listed it."""
        return self.timeline.plan_if_present(instant)

    def busy(self) -> set[str]:
        """`partition/file_id` of the file groups that pending compactions and clusterings will rewrite."""
        return busy_file_groups(self.plan(i) for i in self.pending([Action.COMPACTION, Action.REPLACECOMMIT]))

    def log_base_instants(self) -> dict[FileGroup, str]:
        """File groups of pending compactions -> the base instant that new logs must name."""
        out: dict[FileGroup, str] = {}
        for instant in self.pending([Action.COMPACTION]):
            for name in self.plan(instant).get("file_groups", {}):
                group = parse_group_name(name)
                out[group] = max(out.get(group, ""), instant.time)
        return out
