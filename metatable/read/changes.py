"""Incremental reads (`Table.changes`): what the writes of a window of instants `(start, end]` changed, as
change records.

Net changes: every record (its key, and its partition path unless keys are unique across partitions) that a
write in the window wrote and whose row differs between the snapshot as of `start` and the one as of `end`
gives
- `insert`: absent as of start, present as of end: its row as of end;
- `delete`: present as of start, absent as of end: its row as of start;
- `update_preimage` then `update_postimage`: present in both with different values: the row as of start,
  then the row as of end.
A record updated several times in the window gives one pre-image (from before the window) and one
post-image (at its end); one inserted and deleted in the window, or changed and changed back, gives nothing.
One present at both ends that a write of the window deleted gives a `delete` (its row as of start, at the
first such write) and an `insert` (as of end): its row's ordering value may be smaller than before, so a
copy that applies the feed (`apply_changes(sequence_by=)`) must delete first.
`_commit_instant` is the latest write in the window that wrote the record; `_commit_seq` numbers the
changes of one instant (an update's two images share one), in the order of partition path and key.

How the records are found, without a scan of the table (docs/design-notes.md, "Reading through time"):
1. the window's writes: the commits and deltacommits that completed in it, archived ones too, and from each
   one's commit metadata the files it wrote. Compactions, clusterings and resizes are not writes: they move
   rows without changing them, and give no change records.
2. the records each write wrote: a log's keys (its key column: deletes are rows of it too); a base file's rows
   compared with the previous base of its file group (a copy-on-write write rewrites the group: the
   difference is what it changed; a new file group's keys are all new).
3. those records' rows as of start: where the record's first write in the window kept before-images
   (`changes.before_images`), the image it kept; otherwise from the file slices that hold them
   (`key_lookup.live_rows`), and of a large base file only the pages that do;
4. their rows as of end: the rows as of start merged with every version the window's writes wrote, in the
   order the writes completed, under the merge rule a read applies (`record_merge`): a read of the end's file
   slices would read the table's pages again for rows the window's files already hold. A write at or before
   start that completed after one of the window's writes merges after it in the snapshot as of end: its
   versions merge again, in their place (`late_writes`). Their comparison with the rows as of start is the
   change.

A window that reaches back past what clean kept is a SnapshotExpiredError that names the earliest start.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import partition_paths

from metatable.commit.context import TableContext
from metatable.commit.data_commit import RUNNING_BEFORE
from metatable.commit.timeline_view import TimelineView
from metatable.config import THREADS
from metatable.errors import InvalidInputError, SnapshotExpiredError
from metatable.faults import crash_point
from metatable.file_group.base_file import PARQUET, BaseFile
from metatable.file_group.before_images import CHANGES_KEY, IMAGES_KEY, read_change_files, read_images
from metatable.file_group.file_slice import parse_names
from metatable.file_group.record_merge import loses, merge_versions
from metatable.file_group.slice_reader import read_base
from metatable.formats.data_log import read_data_log
from metatable.formats.log_file import LogFile
from metatable.read.key_lookup import live_rows
from metatable.read.locator import MetadataIndex
from metatable.read.scan_filter import Filter, may_match_any, parse_filter, partition_ranges, row_mask
from metatable.schema_evolution import in_schema
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, TableConfig
from metatable.timeline.instant import BOOTSTRAP_TIME, WRITE_ACTIONS, Moment, moment_time
from metatable.timeline.transaction import Content

log = logging.getLogger(__name__)

CHANGE_TYPE = "_change_type"
COMMIT_INSTANT = "_commit_instant"
COMMIT_SEQ = "_commit_seq"
CHANGE_COLUMNS = pa.schema([(CHANGE_TYPE, pa.string()), (COMMIT_INSTANT, pa.string()), (COMMIT_SEQ, pa.int64())])
INSERT, DELETE, PREIMAGE, POSTIMAGE = "insert", "delete", "update_preimage", "update_postimage"


@dataclass(frozen=True)
class Window:
    """The writes of `(start, end]`: instant times (`start` may fall between instants)."""

    start: str
    end: str
    writes: tuple[tuple[str, Content], ...]  # (instant time, commit metadata), oldest first


def settled_end(view: TimelineView) -> str | None:
    """The latest completed data instant before every write the view does not see completed: a window that
    ends there reads the same whenever it is read again (a write that began earlier and completes later would
    fall inside a window ending after it; a new write's instant is later than every instant on the timeline).
    A write the listing shows completed but the view's metadata snapshot does not hold yet counts as running.
    What `changes` reads to by default, and how far a stream's offset moves."""
    running = min((i.time for i in view.instants if i.action in WRITE_ACTIONS and i.time not in view.completed_times),
                  default=None)
    return max((i.time for i in view.completed if running is None or i.time < running), default=None)


def window(view: TimelineView, start: Moment, end: Moment | None) -> Window:
    """The window `(start, end]` of a view (`end`: its settled end by default), checked readable."""
    start_time = moment_time(start)
    end_time = moment_time(end) if end is not None else (settled_end(view) or BOOTSTRAP_TIME)
    if start_time < view.readable_from:
        raise SnapshotExpiredError(
            f"cannot read the changes of {view.timeline.root} since {start}: a clean removed files of that "
            f"snapshot; the earliest start is {view.readable_from} (the latest commit is {view.latest}). "
            "clean.retain_commits and clean.retain_hours set how long changes stay readable")
    if end_time <= start_time:
        return Window(start_time, end_time, ())
    return Window(start_time, end_time, writes_of(view, lambda t: start_time < t <= end_time, start_time, end_time))


def writes_of(view: TimelineView, wanted: Callable[[str], bool], first: str, last: str
              ) -> tuple[tuple[str, Content], ...]:
    """The completed writes whose instant times are `wanted` (all in [`first`, `last`]), archived ones too
    (`until`, the newest archived time, is itself archived), each with its commit metadata, oldest first."""
    writes = {i.time: i for i in view.completed if i.action in WRITE_ACTIONS and wanted(i.time)}
    found = [(t, view.timeline.read_json(i)) for t, i in sorted(writes.items())]
    if first <= view.archived.until:
        found += [(i.time, content) for i, content in view.timeline.archive.read(first, last)
                  if i.action in WRITE_ACTIONS and wanted(i.time) and i.time not in writes]
    return tuple(sorted(found, key=lambda w: w[0]))


def late_writes(view: TimelineView, w: Window) -> Window:
    """The writes at or before the window's start that completed after one of its writes (whose commit names
    them: `RUNNING_BEFORE`). The snapshot as of end merges their versions after that write's, so the rows as
    of end merge them again in their place, over rows as of start that hold them already: a version merged
    twice gives what it gave once, and the later place is the one that counts."""
    times = {t for _, meta in w.writes for t in meta.get(RUNNING_BEFORE, ()) if t <= w.start}
    return Window(w.start, w.start, writes_of(view, times.__contains__, min(times), max(times)) if times else ())


def read_changes(context: TableContext, index: MetadataIndex, start: Moment, end: Moment | None = None,
                 columns: Sequence[str] | None = None, filter: Any = None,
                 partitions: Collection[str] | None = None, every_version: bool = False) -> pa.Table:
    """The change records of `(start, end]` (see the module's docstring), in the columns of the snapshot as of
    end (or `columns` of them) and the three change columns; `filter` as `to_arrow` takes, applied to each
    change record's row (an update whose pre-image matches and post-image does not gives the pre-image).
    `partitions`: only the records of these partition paths (a Spark task's share: `change_units`).
    `every_version`: each write's own changes, in the order of their instants (`each_write`), not the net."""
    read = each_write if every_version else changes_in
    return context.read_view(lambda view: read(context, index, view, window(view, start, end), columns, filter,
                                               partitions))


def change_units(view: TimelineView, w: Window) -> list[frozenset[str] | None]:
    """The window's records in shares that can be read apart: one per partition path its writes wrote (a
    record stays in its partition), or one for all where keys are unique across partitions (a record may
    move between them)."""
    if view.config.keys_unique_across_partitions:
        return [None] if w.writes else []
    return [frozenset([p]) for p in sorted({relative.rpartition("/")[0] for _, meta in w.writes
                                            for relative in meta.get("files", [])})]


def end_config(context: TableContext, view: TimelineView, w: Window) -> tuple[TimelineView, TableConfig]:
    """The view as of the window's end, and its config (whose schema the change records take)."""
    end_view = view if not w.writes or w.end >= (view.latest or BOOTSTRAP_TIME) else context.view(as_of=w.end)
    return end_view, end_view.config


def output(config: TableConfig, columns: Sequence[str] | None, filter: Any) -> tuple[pa.Schema, Filter]:
    """The change records' schema (`columns` of the table's, or all, then the change columns) and the filter."""
    schema = config.schema
    wanted = list(schema.names) if columns is None else list(columns)
    if len(set(wanted)) != len(wanted) or not set(wanted) <= set(schema.names):
        raise InvalidInputError(f"columns {wanted} must name distinct columns of the table ({schema.names})")
    return pa.schema([schema.field(c) for c in wanted] + list(CHANGE_COLUMNS)), parse_filter(filter, schema)


def each_write(context: TableContext, index: MetadataIndex, view: TimelineView, w: Window,
               columns: Sequence[str] | None, filter: Any, partitions: Collection[str] | None) -> pa.Table:
    """Every version: the change records of each write of the window as if its window held that write alone,
    the writes in the order of their instants (a record three writes updated gives three updates, each with
    its pre-image), as Delta's change data feed gives them. A write that kept a change file whose images hold
    (`CHANGES_KEY`, `IMAGES_KEY`) is that file; another's are its window's net changes (`changes_in`)."""
    _, config = end_config(context, view, w)
    out_schema, filters = output(config, columns, filter)
    whole = pa.schema(list(config.schema) + list(CHANGE_COLUMNS))
    kept = [t for t, meta in w.writes if meta.get(IMAGES_KEY) and meta.get(CHANGES_KEY)]
    with context.snapshot_kept(w.start):  # a clean that overtook the read removes change files too
        crash_point("changes.read")
        found = dict(zip(kept, read_change_files(context.storage, context.paths, kept, whole)))
    parts = []
    for (time, meta), since in zip(w.writes, [w.start, *(t for t, _ in w.writes)]):
        own = found.get(time)
        if own is None:
            own = in_schema(changes_in(context, index, view, Window(since, time, ((time, meta),)), None, None,
                                       partitions), whole)
        elif partitions is not None:
            own = own.filter(pc.is_in(partition_paths(own, config.partition_by), pa.array(list(partitions))))
        parts.append(own.filter(row_mask(own, filters)) if filters else own)
    return pa.concat_tables(parts).select(out_schema.names) if parts else out_schema.empty_table()


def own_changes(context: TableContext, view: TimelineView, config: TableConfig, instant: str,
                files: Sequence[str]) -> pa.Table:
    """The change records of one write, made from the files it wrote (`files`, relative) and the before-images
    it kept, before it commits (`view`: its snapshot): what a window that holds only this write gives when
    those images hold, which its commit says. They become the write's change file, and `each_write` reads one
    file per write instead of its logs and every file group's images. In `config`'s schema."""
    whole = pa.schema(list(config.schema) + list(CHANGE_COLUMNS))
    w = Window(instant, instant, ((instant, {"files": list(files)}),))
    versions = written_versions(context, view, w, [], None, config.log_schema)
    written = records_of(config, versions)
    if written.num_rows == 0:
        return whole.empty_table()
    first = np.asarray(written["first"].to_numpy(), np.int64)
    before = imaged_rows(context, config, written, first, np.ones(len(first), bool), {int(instant): instant})
    return change_records(config, written, before, rows_at_end(config, before, versions)).select(whole.names)


def changes_in(context: TableContext, index: MetadataIndex, view: TimelineView, w: Window,
               columns: Sequence[str] | None, filter: Any, partitions: Collection[str] | None) -> pa.Table:
    end_view, config = end_config(context, view, w)
    out_schema, filters = output(config, columns, filter)
    if not w.writes:
        return out_schema.empty_table()
    with context.snapshot_kept(w.start):  # what start's snapshot and the window's writes left, while clean keeps it
        crash_point("changes.read")
        # a record whose key is unique across partitions may move between them: its versions in partitions
        # the filter rules out count for its row as of end
        unique = config.keys_unique_across_partitions
        versions = written_versions(context, end_view, w, [] if unique else filters, partitions, config.log_schema)
        reached = [v for v in versions if not unique or in_reach(config, filters, v.partition)]
        written = records_of(config, reached)
        log.info("changes of %s in (%s, %s]: %d writes wrote %d records", context.root, w.start, w.end,
                 len(w.writes), written.num_rows)
        if written.num_rows == 0:
            return out_schema.empty_table()
        first = np.asarray(written["first"].to_numpy(), np.int64) if len(reached) == len(versions) else \
            first_writes(config, written, versions)  # a record of a unique key may have moved from beyond reach
        before = rows_as_of_start(context, index, view, w, config, written, first)
        late = written_versions(context, end_view, late_writes(view, w), [] if unique else filters, partitions,
                                config.log_schema)
    after = rows_at_end(config, before, [*versions, *late])
    table = change_records(config, written, before, after)
    if filters:
        table = table.filter(row_mask(table, filters))
    return table.select(out_schema.names)


def rows_as_of_start(context: TableContext, index: MetadataIndex, view: TimelineView, w: Window,
                     config: TableConfig, written: pa.Table, first: np.ndarray) -> pa.Table:
    """The written records' rows as of the window's start, in `config`'s storage schema: for a record whose
    first write in the window (`first`, in the order the writes completed) kept before-images, the image it
    kept (none: the record was absent); for the others, read from the file slices as of start (`live_rows`)."""
    storage_schema = config.storage_schema
    as_of_start = view.instant_at(w.start)
    if as_of_start is None:
        return storage_schema.empty_table()
    imaged = {int(t): t for t, meta in w.writes if meta.get(IMAGES_KEY)}
    from_images = np.isin(first, list(imaged))
    parts = []
    if from_images.any():
        parts.append(imaged_rows(context, config, written, first, from_images, imaged))
        if (expired := context.expired_since(w.start, "the writes' before-images")) is not None:
            raise expired  # a clean removed some while they were listed: a missing image would read as an insert
    if not from_images.all():
        rest = pa.array(~from_images)
        keys = written["key"].filter(rest).combine_chunks()
        partitions = None if config.keys_unique_across_partitions else \
            written["partition"].filter(rest).combine_chunks()
        parts.append(in_schema(live_rows(context, index, keys, partitions, context.view(as_of=as_of_start)),
                               storage_schema))
    return pa.concat_tables(parts) if parts else storage_schema.empty_table()


def first_writes(config: TableConfig, written: pa.Table, versions: Sequence[Versions]) -> np.ndarray:
    """`records_of`'s `first` over every version, also those beyond a filter's reach: for records whose keys
    are unique across partitions (a key names its record), which may have moved from a partition the filter
    rules out."""
    every = records_of(config, versions)
    return np.asarray(every["first"].take(pc.index_in(written["key"], value_set=every["key"])).to_numpy(), np.int64)


def imaged_rows(context: TableContext, config: TableConfig, written: pa.Table, first: np.ndarray,
                from_images: np.ndarray, imaged: dict[int, str]) -> pa.Table:
    """The rows as of start of the records `from_images` marks: each one's image from its first write (`first`),
    which kept an image of every row it replaced or deleted. Only the images of the records' partitions are
    read (all, where keys are unique across partitions)."""
    storage_schema = config.storage_schema
    reach = None if config.keys_unique_across_partitions else \
        set(written["partition"].filter(pa.array(from_images)).unique().to_pylist())
    found = read_images(context.storage, context.paths, [imaged[t] for t in np.unique(first[from_images]).tolist()],
                        storage_schema, reach)
    if not found:
        return storage_schema.empty_table()
    rows = pa.concat_tables([rows for _, rows in found])
    instants = [np.full(rows.num_rows, int(t), np.int64) for t, rows in found]
    at = pc.index_in(identities(config, rows[KEY_COLUMN], None, rows),
                     value_set=identities(config, written["key"], written["partition"]))
    record = np.asarray(at.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    mine = np.flatnonzero(valid(at) & from_images[record] & (first[record] == np.concatenate(instants)))
    _, one = np.unique(record[mine], return_index=True)  # a write that wrote a group twice kept it twice
    return in_schema(rows.take(pa.array(mine[one])), storage_schema)


def as_inserts(rows: pa.Table, instant: str) -> pa.Table:
    """A snapshot's rows as change records: what a stream without a start reads first (the snapshot as of
    `instant`, every row an insert stamped with it; `_commit_seq` null: no commit's own change)."""
    n = rows.num_rows
    return (rows.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(INSERT), n))
            .append_column(COMMIT_INSTANT, pa.repeat(pa.scalar(instant), n))
            .append_column(COMMIT_SEQ, pa.nulls(n, pa.int64())))


NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Versions:
    """The rows one file of a window's write holds (a log's, or what a rewritten base changed): the versions
    of its records that write made."""

    instant: int
    order: tuple[int, int]  # (completed at, instant): the order the writes' versions merge in
    partition: str
    rows: pa.Table  # KEY_COLUMN and DELETED_COLUMN, and the row's columns when asked for


KEYS_ONLY = pa.schema([(KEY_COLUMN, pa.string()), (DELETED_COLUMN, pa.bool_())])


def in_reach(config: TableConfig, filters: Filter, partition: str) -> bool:
    """Whether a partition's values may match the filter."""
    return not filters or may_match_any(filters, partition_ranges(partition, config.schema, config.partition_by).get)


def written_versions(context: TableContext, view: TimelineView, w: Window, filters: Filter,
                     partitions: Collection[str] | None, schema: pa.Schema) -> list[Versions]:
    """The versions every file of the window's writes holds (in `partitions` and partitions `filters` may match,
    when given), in `schema`: `KEYS_ONLY`, or the view's log schema for whole rows."""
    config = view.config
    files = [(int(time), (meta.get("completed_at", 0), int(time)), *relative.rpartition("/")[::2])
             for time, meta in w.writes for relative in meta.get("files", [])]
    files = [f for f in files if (partitions is None or f[2] in partitions) and in_reach(config, filters, f[2])]
    names = view.file_sizes({p for _, _, p, n in files if not LogFile.is_log_name(n)})

    def versions(file: tuple[int, tuple[int, int], str, str]) -> Versions:
        time, order, partition, name = file
        if LogFile.is_log_name(name):
            rows = read_data_log(context.storage, context.paths.file(partition, name), schema)[1]
        else:
            rows = rewritten_rows(context, view, partition, name, names[partition], schema)
        return Versions(time, order, partition, in_schema(rows, schema))

    with ThreadPoolExecutor(THREADS, thread_name_prefix="metatable-changes") as pool:  # decoding releases the GIL
        return list(pool.map(versions, files))


def written_records(context: TableContext, view: TimelineView, w: Window, filters: Filter) -> pa.Table:
    """`records_of` the versions the window's writes wrote."""
    return records_of(view.config, written_versions(context, view, w, filters, None, KEYS_ONLY))


def records_of(config: TableConfig, versions: Sequence[Versions]) -> pa.Table:
    """Every record the versions are of, once: key, partition (null where keys are unique across partitions:
    a key names its record), and as int64 instants `written`, the last write that wrote a row of it (-1: none
    did), `deleted`, the first delete after that (NEVER: none): the write that made its state as of end,
    whichever that state is, `dropped`, the first delete at or before `written` (NEVER: none): a record
    present at start and at end was deleted and inserted again, and `first`, the first write that wrote a
    version of it in the order the writes completed: the one whose before-image is its row as of start. In
    numpy over each record's number (its partition's and its key's codes): Acero's two hash aggregations took
    0.47 of the 5.9 s of `changes()` of 5 commits at SF 1 (150,000 records)."""
    unique = config.keys_unique_across_partitions
    keys = pa.chunked_array([v.rows[KEY_COLUMN] for v in versions], pa.string()).combine_chunks()
    encoded = pc.dictionary_encode(keys)
    distinct = encoded.dictionary
    counts = [v.rows.num_rows for v in versions]
    paths = sorted({v.partition for v in versions})
    number_of = {p: n for n, p in enumerate(paths)}
    path_of = np.repeat(np.array([number_of[v.partition] for v in versions], np.int64), counts)
    record = encoded.indices.to_numpy().astype(np.int64) + (0 if unique else path_of * len(distinct))
    numbers, of = np.unique(record, return_inverse=True)
    instant = np.repeat(np.array([v.instant for v in versions], np.int64), counts)
    deleted = np.concatenate([np.asarray(v.rows[DELETED_COLUMN].to_numpy(), dtype=bool) for v in versions]) \
        if versions else np.zeros(0, bool)
    written = np.full(len(numbers), -1, np.int64)
    np.maximum.at(written, of, np.where(deleted, -1, instant))
    after = deleted & (instant > written[of])
    gone, dropped = np.full(len(numbers), NEVER, np.int64), np.full(len(numbers), NEVER, np.int64)
    np.minimum.at(gone, of[after], instant[after])
    np.minimum.at(dropped, of[deleted & ~after], instant[deleted & ~after])
    orders = sorted({v.order for v in versions})
    rank_of = {order: i for i, order in enumerate(orders)}
    first = np.full(len(numbers), len(orders), np.int64)
    np.minimum.at(first, of, np.repeat(np.array([rank_of[v.order] for v in versions], np.int64), counts))
    partition = pa.nulls(len(numbers), pa.string()) if unique else \
        pa.array(paths, pa.string()).take(pa.array(numbers // max(len(distinct), 1)))
    return pa.table({"key": distinct.take(pa.array(numbers % max(len(distinct), 1))), "partition": partition,
                     "written": written, "deleted": gone, "dropped": dropped,
                     "first": np.array([order[1] for order in orders] + [-1], np.int64)[first]})


def written_since(context: TableContext, view: TimelineView) -> pa.Table | None:
    """The records (key, partition: as `written_records`) that writes completed after the moment of `view`, a
    view as of an earlier instant, wrote. With a secondary index of now they name every record that may have
    had a value then: one no write touched since has the same value now (compaction, clustering and resizes
    move rows, they do not change them). Read the index first: a write that completes in between is then in
    one or the other. None when finding them means reading more files than the snapshot has file slices: a
    filtered read of the snapshot costs less then."""
    current = context.view()
    w = window(current, view.as_of, current.latest)
    if sum(len(meta.get("files", [])) for _, meta in w.writes) > len(view.file_slices):
        return None
    return written_records(context, current, w, [])


def rewritten_rows(context: TableContext, view: TimelineView, partition: str, name: str, names: Collection[str],
                   schema: pa.Schema) -> pa.Table:
    """The versions a base file wrote, against the previous base of its file group (among `names`, the
    partition's files), in `schema` (`KEYS_ONLY`, or the log schema), with a delete flag as a log's: all of
    its rows in a new file group; in a rewritten one, those added or with other values, those removed
    (deleted), and those whose ordering value went down (deleted and written again: no write lowers it
    otherwise; the row and its delete are one write's, and a write's delete comes first)."""
    config = view.config
    bases, _ = parse_names(names, PARQUET)
    new = BaseFile.parse(name)
    earlier = [b for b in bases if b.file_id == new.file_id and b.instant < new.instant and view.visible(b.instant)]
    path = context.paths.file(partition, name)
    row_columns = [c for c in schema.names if c != DELETED_COLUMN]
    if not earlier:
        rows = read_base(context.storage, path, pa.schema([config.storage_schema.field(c) for c in row_columns]),
                         known=config.known_columns)
        return rows.append_column(DELETED_COLUMN, pa.repeat(pa.scalar(False), rows.num_rows))
    previous = max(earlier, key=lambda b: b.instant)
    storage_schema = config.storage_schema
    after = read_base(context.storage, path, storage_schema, known=config.known_columns)
    before = read_base(context.storage, context.paths.file(partition, previous.file_name), storage_schema,
                       known=config.known_columns)
    at = pc.index_in(after[KEY_COLUMN], value_set=before[KEY_COLUMN].combine_chunks())
    matched = np.asarray(pc.is_valid(at).to_numpy(zero_copy_only=False), dtype=bool)
    differs = ~matched
    kept, was = after.filter(pa.array(matched)), before.take(at.filter(pc.is_valid(at)))
    differs[matched] = rows_differ(kept, was)
    reset = np.zeros(len(differs), dtype=bool)
    if config.ordering_field:  # a smaller ordering value than before: the write deleted the record first
        reset[matched] = loses(kept[config.ordering_field], was[config.ordering_field])
    changed = after.filter(pa.array(differs)).select(row_columns)
    removed = pc.invert(pc.is_in(before[KEY_COLUMN], value_set=after[KEY_COLUMN].combine_chunks()))
    deletes = pa.chunked_array([*before[KEY_COLUMN].filter(removed).chunks,
                                *after[KEY_COLUMN].filter(pa.array(reset)).chunks], pa.string())
    return pa.concat_tables([
        changed.append_column(DELETED_COLUMN, pa.repeat(pa.scalar(False), changed.num_rows)),
        in_schema(pa.table({KEY_COLUMN: deletes, DELETED_COLUMN: pa.repeat(pa.scalar(True), len(deletes))}),
                  changed.schema.append(pa.field(DELETED_COLUMN, pa.bool_())))])


RECORD_KEY = "_mt_own_key"  # a record's own key while the merge below keys it by partition and key


def rows_at_end(config: TableConfig, before: pa.Table, versions: Sequence[Versions]) -> pa.Table:
    """The records' rows as of the window's end: their rows as of start (`before`, in the storage schema)
    merged with the versions the window's writes made, each write's as one write, in the order the writes
    completed (as a file slice orders its logs), under the merge rule a read applies (`merge_versions`).
    Compactions, clusterings and resizes in the window moved rows without changing them; a write's delete in
    one partition and its row in another (a record that moved) is one write's, and its row survives.
    Versions of records beyond a filter's reach come out too; `change_records` takes the written records'."""
    storage_schema = config.storage_schema
    by_write: dict[tuple[int, int], list[pa.Table]] = {}
    for v in versions:
        by_write.setdefault(v.order, []).append(v.rows if config.keys_unique_across_partitions else
                                                recorded(config, v.rows, pa.scalar(v.partition, pa.string())))
    writes = [pa.concat_tables(by_write[order]) for order in sorted(by_write)]
    if config.keys_unique_across_partitions:
        return merge_versions([before, *writes], config.ordering_field, storage_schema)
    merged = merge_versions([recorded(config, before, None), *writes], config.ordering_field,
                            storage_schema.append(pa.field(RECORD_KEY, pa.string())))
    return merged.set_column(merged.schema.get_field_index(KEY_COLUMN), storage_schema.field(KEY_COLUMN),
                             merged[RECORD_KEY]).drop_columns(RECORD_KEY)


def recorded(config: TableConfig, rows: pa.Table, partition: pa.Scalar | None) -> pa.Table:
    """`rows` keyed by record (partition path and key, as `identities`) for the merge, their own key kept in
    RECORD_KEY."""
    keys = rows[KEY_COLUMN].combine_chunks()
    paths = None if partition is None else pa.repeat(partition, len(keys))
    return rows.set_column(rows.schema.get_field_index(KEY_COLUMN), KEY_COLUMN,
                           identities(config, keys, paths, rows)).append_column(RECORD_KEY, keys)


def change_records(config: TableConfig, written: pa.Table, before: pa.Table, after: pa.Table) -> pa.Table:
    """The change records of the written records, from their rows as of start (`before`) and as of end
    (`after`), both in the storage schema: see the module's docstring. Sorted by instant, then sequence."""
    candidates = identities(config, written["key"], written["partition"])
    before_at = pc.index_in(candidates, value_set=identities(config, before[KEY_COLUMN], None, before))
    after_at = pc.index_in(candidates, value_set=identities(config, after[KEY_COLUMN], None, after))
    was, now = valid(before_at), valid(after_at)
    both = np.flatnonzero(was & now)
    b_at = np.asarray(before_at.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    a_at = np.asarray(after_at.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    differ = both[rows_differ(before.take(b_at[both]), after.take(a_at[both]))] if len(both) else both
    live = np.asarray(written["written"].to_numpy(), dtype=np.int64)
    gone = np.asarray(written["deleted"].to_numpy(), dtype=np.int64)
    dropped = np.asarray(written["dropped"].to_numpy(), dtype=np.int64)
    reborn = differ[dropped[differ] != NEVER]  # deleted and inserted again: a delete, then an insert
    updated = differ[dropped[differ] == NEVER]
    inserted, deleted = np.flatnonzero(~was & now), np.flatnonzero(was & ~now)
    deleted_at = np.where(gone[deleted] != NEVER, gone[deleted], live[deleted])  # by the write that deleted
    events = np.concatenate([inserted, reborn, deleted, reborn, updated])
    kinds = np.repeat(np.array([0, 0, 1, 1, 2], np.int8), [len(inserted), len(reborn), len(deleted), len(reborn),
                                                           len(updated)])
    instants = np.concatenate([live[inserted], live[reborn], deleted_at, dropped[reborn], live[updated]])
    # each event's sequence number within its instant, in the order of partition path and key (a record one
    # write deleted and wrote again, `apply_changes(sequence_by=)`: its delete, then its insert)
    order = pc.sort_indices(pa.table({"i": instants, "id": candidates.take(pa.array(events)), "ins": kinds == 0}),
                            sort_keys=[("i", "ascending"), ("id", "ascending"), ("ins", "ascending")]).to_numpy()
    events, kinds, instants = events[order], kinds[order], instants[order]
    seq = np.arange(len(events)) - np.searchsorted(instants, instants, side="left")
    # the output rows: an update gives its pre-image, then its post-image
    images = np.where(kinds == 2, 2, 1)
    rows = np.repeat(np.arange(len(events)), images)
    second = np.zeros(len(rows), dtype=bool)
    second[np.cumsum(images)[kinds == 2] - 1] = True
    from_before = (kinds[rows] == 1) | ((kinds[rows] == 2) & ~second)
    source = np.where(from_before, b_at[events[rows]], len(before) + a_at[events[rows]])
    kind_codes = np.where(kinds[rows] == 2, np.where(second, 3, 2), kinds[rows])  # names from a take, not Python
    both_tables = pa.concat_tables([before, after]).select(config.schema.names)
    out = both_tables.take(pa.array(source, pa.int64()))
    instant_text = pc.utf8_lpad(pc.cast(pa.array(instants[rows], pa.int64()), pa.string()), 17, "0")
    return (out.append_column(CHANGE_TYPE, pa.array([INSERT, DELETE, PREIMAGE, POSTIMAGE]).take(kind_codes))
            .append_column(COMMIT_INSTANT, instant_text)
            .append_column(COMMIT_SEQ, pa.array(seq[rows], pa.int64())))


def identities(config: TableConfig, keys: pa.ChunkedArray | pa.Array, partitions: pa.ChunkedArray | pa.Array | None,
               rows: pa.Table | None = None) -> pa.Array:
    """What names a record: its key, and its partition path (given, or read off `rows`) unless keys are unique
    across partitions."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if config.keys_unique_across_partitions:
        return keys
    if partitions is None:
        partitions = partition_paths(rows, config.partition_by)
    partitions = partitions.combine_chunks() if isinstance(partitions, pa.ChunkedArray) else partitions
    return pc.binary_join_element_wise(partitions, keys, "\x1f")


def valid(positions: pa.Array) -> np.ndarray:
    return np.asarray(pc.is_valid(positions).to_numpy(zero_copy_only=False), dtype=bool)


def rows_differ(a: pa.Table, b: pa.Table) -> np.ndarray:
    """Per row of two tables of one schema: whether any column differs (nulls equal nulls, NaN equals NaN)."""
    differ = np.zeros(a.num_rows, dtype=bool)
    for name in a.column_names:
        differ |= ~values_equal(a[name], b[name].cast(a.schema.field(name).type))
    return differ


def values_equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    type_ = a.type
    if pa.types.is_nested(type_) or pa.types.is_dictionary(type_):  # no kernel compares these: by value
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist())], dtype=bool)
    same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(type_):
        same = pc.or_kleene(same, pc.and_kleene(pc.is_nan(a), pc.is_nan(b)))
    return np.asarray(pc.fill_null(same, False).to_numpy(zero_copy_only=False), dtype=bool)


