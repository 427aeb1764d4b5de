"""Checking a table, and sweeping what dead processes left behind (`metatable fsck [--repair]`).

The check reads everything a reader may need, and reports every problem instead of stopping at the first:

- the timeline: every file parses, none is dated in the future, every state has the states before it;
- the metadata table: every record of every partition, merged (each log and SST it reads);
- the data files: the ones the completed timeline lists (`timeline.replay.live_files`: what commits added
  and cleans did not delete) are present, and read whole, bases with their page checksums verified; and the
  `files` partition lists exactly those;
- every ready secondary index against the data: it holds exactly the forward and reverse entries of the
  latest snapshot's live rows;
- no record key is live in two file groups of the latest snapshot (each merges only its own rows, so reads
  would return the key twice). No index can say that: it names one file group per key.

With `repair` it also removes what dead processes left behind (`commit.leftovers`), as every clean does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from indexes.secondary_keys import KEY_SEP

from metatable.commit.context import TableContext
from metatable.commit.index_records import secondary_slice_entries
from metatable.commit.leftovers import find_leftovers, remove
from metatable.commit.timeline_view import group_name
from metatable.errors import CorruptFileError, MetatableError, MissingFileError
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import read_base, read_each
from metatable.formats.avro_columns import decode_columns
from metatable.formats.data_log import read_data_log
from metatable.formats.log_file import Entries, LogFile
from metatable.metadata.records import KINDS
from metatable.table_config import KEY_COLUMN
from metatable.timeline.replay import live_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    kind: str     # "missing", "corrupt", "metadata", "timeline" or "duplicate"
    path: str
    detail: str


@dataclass(frozen=True)
class FsckReport:
    files_checked: int
    problems: tuple[Problem, ...]
    leftovers: tuple[str, ...]   # what dead processes left (removed when `repaired`)
    repaired: bool

    @property
    def healthy(self) -> bool:
        return not self.problems


def check(context: TableContext, repair: bool = False) -> FsckReport:
    """Everything checked and reported. Exact on a table nobody writes; while writers commit and cleans delete,
    the file lists are taken together under the lock, and a file missing by the end is reported only if the
    timeline still lists it."""
    problems: list[Problem] = []
    try:
        context.timeline.instants()
    except MetatableError as e:  # nothing else can be judged without the timeline
        return FsckReport(0, (Problem("timeline", context.paths.timeline, str(e)),), (), False)
    problems += check_metadata(context)
    with context.transactions.lock.held(shared=True):
        expected, missing = live_files(context.timeline, context.paths, context.storage)
        problems += files_partition_mismatch(context, expected, set(missing))
        problems += secondary_index_mismatch(context)
        problems += keys_in_several_file_groups(context)
    checked = 0
    gone: list[Problem] = [Problem("missing", path, "a completed commit added it and no clean deleted it")
                           for path in missing]
    for partition, names in expected.items():
        for name in names:
            path = context.paths.file(partition, name)
            checked += 1
            try:
                if LogFile.is_log_name(name):
                    read_data_log(context.storage, path, context.config.log_schema)
                else:
                    read_base(context.storage, path)
            except MissingFileError as e:
                gone.append(Problem("missing", path, str(e)))
            except CorruptFileError as e:
                problems.append(Problem("corrupt", path, str(e)))
    if gone:  # a clean may have deleted them meanwhile
        present, absent = live_files(context.timeline, context.paths, context.storage)
        still = {context.paths.file(p, n) for p, names in present.items() for n in names} | set(absent)
        problems += [p for p in gone if p.path in still]
    with context.transactions.lock.held(shared=not repair):
        leftovers = sorted(find_leftovers(context, context.timeline.instants()))
        if repair:
            remove(context, leftovers)
    for p in problems:
        log.warning("fsck %s: %s %s", context.root, p.kind, p.detail)
    return FsckReport(checked, tuple(problems), tuple(leftovers), repair)


def check_metadata(context: TableContext) -> list[Problem]:
    metadata = context.metadata
    out = []
    for partition in metadata.partitions:
        try:
            for _ in metadata.scan(partition):
                pass
        except MetatableError as e:
            out.append(Problem("metadata", getattr(e, "path", metadata.root), str(e)))
    return out


def files_partition_mismatch(context: TableContext, expected: dict[str, dict[str, int]],
                             missing: set[str]) -> list[Problem]:
    """Files the `files` partition lists that the timeline does not, and the other way round (`missing`: files
    the timeline lists that are gone, reported already)."""
    try:
        listed = context.view().live_files
    except MetatableError:
        return []  # reported by check_metadata
    out = []
    for partition in sorted({*expected, *listed}):
        want, have = set(expected.get(partition, ())), set(listed.get(partition, ()))
        out += [Problem("metadata", context.paths.file(partition, n), "the files partition lists it, but no "
                        "completed commit added it (or a clean deleted it): `metatable metadata rebuild TABLE`")
                for n in sorted(have - want) if context.paths.file(partition, n) not in missing]
        out += [Problem("metadata", context.paths.file(partition, n), "a completed commit added it, but the files "
                        "partition does not list it: `metatable metadata rebuild TABLE`")
                for n in sorted(want - have)]
    return out


def secondary_index_mismatch(context: TableContext) -> list[Problem]:
    """Entries a ready secondary index lacks, has beyond the latest snapshot's rows, or whose reverse entry names
    other values (a commit would tombstone the wrong entry). Compared as columns: at SF 1 an index holds 12M
    entries."""
    try:
        view = context.view()
    except MetatableError:
        return []  # reported by check_metadata
    config, metadata = view.config, context.metadata
    out = []
    for partition in config.metadata_indexes:
        if config.secondary_columns(partition) is None:
            continue
        expected = Entries.concat([entries for fs in view.file_slices.values() for entries in
                                   secondary_slice_entries(context.storage, context.paths, config, fs, partition,
                                                           lambda _: 0)], may_repeat=False)
        try:
            stored = metadata.entries(partition)
        except MetatableError:
            continue  # reported by check_metadata
        wrong = entry_differences(expected, stored)
        if wrong:
            out.append(Problem("metadata", metadata.layout.dir(partition),
                               f"{len(wrong)} entries of {partition} disagree with the data (first: {wrong[0]}): "
                               "`metatable metadata rebuild TABLE`"))
    return out


def keys_in_several_file_groups(context: TableContext) -> list[Problem]:
    """Record keys live in more than one file group of the latest snapshot, one problem per partition (per
    table where keys are unique across partitions). The key columns are read a partition at a time, so what is
    held at once is a partition's keys (the table's with a global index). The chaos run's churn configuration
    found a table whose fsck was healthy while a clustering archived too early had made 133 keys live twice."""
    try:
        view = context.view()
        slices = view.file_slices
    except MetatableError:
        return []  # reported by check_metadata
    config = view.config.reading(())
    scopes: dict[str, list[FileSlice]] = {}
    for (partition, _), fs in slices.items():
        scopes.setdefault("" if config.keys_unique_across_partitions else partition, []).append(fs)
    out = []
    for scope, held_slices in sorted(scopes.items()):
        try:
            rows = [r for group in read_each(context.storage, context.paths, config, held_slices) for r in group]
        except MetatableError:
            continue  # a damaged or missing file, or metadata: reported by the other checks
        if not any(r.num_rows for r in rows):
            continue
        held = pa.table({"key": pa.concat_arrays([r[KEY_COLUMN].combine_chunks() for r in rows]),
                         "group": pa.concat_arrays([pa.repeat(pa.scalar(i, pa.int32()), r.num_rows)
                                                    for i, r in enumerate(rows)])})
        counts = held.group_by("key").aggregate([("group", "count")])
        twice = counts.filter(pc.greater(counts["group_count"], 1))["key"]
        if len(twice):
            first = twice[0].as_py()
            where = held.filter(pc.equal(held["key"], first))["group"].to_pylist()
            names = [group_name(held_slices[i].partition, held_slices[i].file_id) for i in where]
            out.append(Problem("duplicate", context.paths.partition_dir(scope) if scope else context.root,
                               f"{len(twice)} record keys are live in more than one file group, so reads return "
                               f"them more than once (first: {first!r} in {names}). This is a defect of metatable: "
                               "report it with `metatable timeline --all TABLE`"))
    return out


def entry_differences(expected: Entries, stored: Entries) -> list[str]:
    """What `stored` secondary index entries lack of `expected`, hold beyond it, or name differently (reverse
    entries' values), each said in a sentence."""
    expected_keys, stored_keys = expected.keys.cast(pa.large_string()), stored.keys.cast(pa.large_string())
    at = pc.index_in(expected_keys, value_set=stored_keys)
    missing = expected_keys.filter(pc.is_null(at))
    extra = stored_keys.filter(pc.invert(pc.is_in(stored_keys, value_set=expected_keys)))
    reverse = pc.and_(pc.starts_with(expected_keys, KEY_SEP), pc.is_valid(at))  # reverse entries' keys start so
    schema = KINDS["secondary_index"].schema
    want = decode_columns(schema, expected.values.filter(reverse))["value"]
    have = decode_columns(schema, stored.values.take(at.filter(reverse)))["value"]
    differs = pc.fill_null(pc.not_equal(want, have), pc.is_null(want) != pc.is_null(have))
    names = expected_keys.filter(reverse).filter(differs).to_pylist()
    return ([f"no entry {k!r}" for k in missing.to_pylist()] +
            [f"reverse entry {k!r} names {v!r}" for k, v in zip(names, have.filter(differs).to_pylist())] +
            [f"entry {k!r} of no row" for k in sorted(extra.to_pylist())])
