"""Reading through time: `as_of` any moment and `changes()` against a plain model of every snapshot, on both
table types and every index, with compactions, clusterings, resizes and cleans between the writes."""
from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metatable as mt
from metatable.errors import InvalidInputError, SnapshotExpiredError
from metatable.file_group.before_images import CHANGES_KEY, IMAGES_KEY, instants_with_images
from metatable.read import changes as changes_module
from metatable.services import archival
from metatable.timeline.instant import datetime_from_time, moment_time

from .change_stream_child import copy_changes
from .table_model import SCHEMA as MODEL_SCHEMA, sort_rows
from .test_table_concurrency import rows as concurrency_rows, start
from .test_write_concurrency import held_at, wait_held

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.string())])
KEYS = st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["a", "b"])), min_size=1, max_size=6, unique=True)
OPERATIONS = st.lists(st.one_of(st.tuples(st.just("upsert"), KEYS), st.tuples(st.just("delete"), KEYS),
                                st.tuples(st.sampled_from(["compact", "cluster", "resize", "schedule_resize", "clean"]),
                                          st.just([]))),
                      min_size=2, max_size=9)
INDEXES = {  # name -> (IndexConfig, partitioned, metadata indexes)
    "simple": (mt.IndexConfig(num_buckets=2), False, ("column_stats",)),
    "consistent_hashing": (mt.IndexConfig(engine="consistent_hashing", num_buckets=2), True, ("column_stats",)),
    "bloom": (mt.IndexConfig(type="bloom"), True, ("column_stats", "bloom_filter")),
    "record": (mt.IndexConfig(type="record"), True, ("column_stats",)),
}
GROW = {"write.target_file_size": 1024, "bucket.split_threshold": 1.0, "bucket.merge_threshold": 0.0}
CHANGE_COLUMNS = ["_change_type", "_commit_instant", "_commit_seq"]


class History:
    """The model: the rows after every write, and what each write changed."""

    def __init__(self, partitioned: bool) -> None:
        self.partitioned = partitioned
        self.rows: dict[tuple, tuple] = {}  # identity -> (p, v)
        self.snapshots: list[tuple[str, dict[tuple, tuple]]] = []  # (write instant, rows after it)
        self.changed: list[tuple[str, set[tuple]]] = []  # (write instant, identities whose state it changed)

    def identity(self, key: int, p: str) -> tuple:
        return (p, key) if self.partitioned else ("", key)

    def write(self, instant: str, operation: str, keys: list[tuple[int, str]], step: int) -> None:
        before = dict(self.rows)
        for key, p in keys:
            if operation == "upsert":
                self.rows[self.identity(key, p)] = (p, f"{step}-{key}")  # every write a new value
            else:
                self.rows.pop(self.identity(key, p), None)
        self.snapshots.append((instant, dict(self.rows)))
        self.changed.append((instant, {k for k in before.keys() | self.rows.keys()
                                       if before.get(k) != self.rows.get(k)}))

    def at(self, time: str) -> dict[tuple, tuple]:
        earlier = [rows for instant, rows in self.snapshots if instant <= time]
        return earlier[-1] if earlier else {}

    def changes(self, start: str, end: str) -> list[tuple]:
        """(id, p, v, change type, commit instant), sorted; and per instant, identities in `_commit_seq` order."""
        pre, post = self.at(start), self.at(end)
        out = []
        for k in pre.keys() | post.keys():
            touched = [instant for instant, changed in self.changed if start < instant <= end and k in changed]
            if not touched or pre.get(k) == post.get(k):
                continue
            key = k[1]
            gaps = [instant for instant, rows in self.snapshots if start < instant <= end and k not in rows]
            if k not in pre:
                out.append((key, *post[k], "insert", touched[-1]))
            elif k not in post:
                out.append((key, *pre[k], "delete", touched[-1]))
            elif gaps:  # deleted and inserted again: the first delete, then the insert
                out += [(key, *pre[k], "delete", gaps[0]), (key, *post[k], "insert", touched[-1])]
            else:
                out += [(key, *pre[k], "update_preimage", touched[-1]),
                        (key, *post[k], "update_postimage", touched[-1])]
        return sorted(out, key=str)

    def every_version(self, start: str, end: str) -> list[tuple]:
        """Each write's own changes, for the writes in `(start, end]`: its window alone."""
        writes = [instant for instant, _ in self.snapshots if start < instant <= end]
        return sorted((c for since, write in zip([start, *writes], writes) for c in self.changes(since, write)),
                      key=str)


def rows_of(table: pa.Table) -> list[tuple]:
    return sorted(((r["id"], r["p"], r["v"]) for r in table.to_pylist()), key=str)


def model_rows(rows: dict[tuple, tuple]) -> list[tuple]:
    return sorted(((key, p, v) for (_, key), (p, v) in rows.items()), key=str)


def change_tuples(table: pa.Table) -> list[tuple]:
    return sorted(((r["id"], r["p"], r["v"], r["_change_type"], r["_commit_instant"]) for r in table.to_pylist()),
                  key=str)


def check_sequence(table: pa.Table, partitioned: bool) -> None:
    """`_commit_seq` numbers each instant's changes 0, 1, ... in the order of partition path and key; an
    update's two images share one, the pre-image first."""
    rows = table.to_pylist()
    assert [(r["_commit_instant"], r["_commit_seq"]) for r in rows] == sorted(
        (r["_commit_instant"], r["_commit_seq"]) for r in rows), "sorted by instant, then sequence"
    for instant in {r["_commit_instant"] for r in rows}:
        mine = [r for r in rows if r["_commit_instant"] == instant]
        events = list(dict.fromkeys(((f"p={r['p']}" if partitioned else ".") + "\x1f" + str(r["id"]), r["_commit_seq"])
                                    for r in mine))
        assert [seq for _, seq in events] == list(range(len(events)))
        assert [name for name, _ in events] == sorted(name for name, _ in events)
    for first, second in zip(rows, rows[1:]):
        if second["_change_type"] == "update_postimage":
            assert first["_change_type"] == "update_preimage" and first["id"] == second["id"]


def run_service(table: mt.Table, path: str, operation: str, index: str) -> None:
    """A compaction, clustering, resize (of a bucket index) or clean between writes; or a resize of consistent
    hashing planned, for the writes after it to dual-write (the next resize, or the end, runs it)."""
    if operation == "compact":
        table.compact()
    elif operation == "cluster":
        table.cluster()
    elif operation == "resize":
        if index == "simple":
            table.cluster(num_buckets=3 if table.config.index.num_buckets == 2 else 2)
        elif index == "consistent_hashing":
            mt.Table.open(path, options=GROW).cluster()
    elif operation == "schedule_resize":
        if index == "consistent_hashing":
            mt.Table.open(path, options=GROW).schedule_clustering()
    else:
        mt.Table.open(path, options={"clean.retain_commits": 3}).clean()


def between(instant: str) -> dt.datetime:
    """A moment after an instant and before the next (instant times are milliseconds)."""
    return datetime_from_time(instant) + dt.timedelta(microseconds=500)


@pytest.mark.parametrize("index", sorted(INDEXES))
@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS, windows=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=3,
                                               max_size=3),
       images=st.sampled_from(["off", "on", "midway"]))
def test_changes_and_time_travel_equal_the_model(tmp_path, table_type, index, operations, windows, images):
    """`images`: whether writes keep before-images (`changes.before_images`), from the start or from the middle
    of the writes on; kept from the start, `changes()` reads no row as of start from the table."""
    config, partitioned, metadata_indexes = INDEXES[index]
    path = str(tmp_path / uuid.uuid4().hex[:8])
    table = mt.Table.create(path, SCHEMA, "id", "p" if partitioned else None, table_type=table_type, index=config,
                            metadata_indexes=metadata_indexes,
                            options={"clean.retain_commits": 3, "clean.inline": False,
                                     "compaction.trigger.log_count": 0, "clustering.small_file_limit": 1 << 20,
                                     "changes.before_images": images == "on"})
    model = History(partitioned)
    moments = []  # every instant time of the table, and moments between them
    for step, (operation, keys) in enumerate(operations):
        if images == "midway" and step == len(operations) // 2:
            table.set_options({"changes.before_images": True})
            table = mt.Table.open(path)
        if not partitioned:  # a key names its record: once per batch
            keys = list({key: (key, p) for key, p in keys}.values())
        if operation in ("upsert", "delete"):
            data = pa.table({"id": [k for k, _ in keys], "p": [p for _, p in keys]})
            if operation == "upsert":
                data = data.append_column("v", pa.array([f"{step}-{k}" for k, _ in keys]))
                result = table.upsert(data.cast(SCHEMA))
            else:
                result = table.delete(data if partitioned else data.select(["id"]))
            model.write(result.instant, operation, keys, step)
        else:
            run_service(table, path, operation, index)
    table = mt.Table.open(path)
    table.run_clustering()  # a resize still planned: with its catch-up of the writes since
    for instant in table.timeline():
        moments += [instant.time, between(instant.time)]
    readable_from = table.context.view().readable_from
    first_write = model.snapshots[0][0] if model.snapshots else None

    # as of every moment: the model's rows then, or a clear refusal
    for moment in moments:
        time = moment_time(moment)
        if first_write is None or time < first_write or time < readable_from:
            with pytest.raises(SnapshotExpiredError):
                table.to_arrow(as_of=moment)
            continue
        expected = model_rows(model.at(time))
        assert rows_of(table.to_arrow(as_of=moment)) == expected, f"as of {moment}"
        keys = pa.table({"id": list(range(10)) * 2, "p": ["a"] * 10 + ["b"] * 10}).cast(
            pa.schema([SCHEMA.field("id"), SCHEMA.field("p")]))
        keys = keys if partitioned else keys.slice(0, 10).select(["id"])
        assert rows_of(table.get(keys, as_of=moment)) == expected, f"get as of {moment}"
        located = table.lookup(keys, as_of=moment)
        assert sum(located["file_id"].is_valid().to_pylist()) == len(expected)

    # changes in windows inside the retained range
    times = sorted({moment_time(m) for m in moments}) or ["20000101000000000"]
    with pytest.MonkeyPatch.context() as patch:
        if images == "on" and table.config.keeps_before_images:
            read_from_images_only(patch)
        check_windows(table, model, times, windows, readable_from, partitioned)
    kept = instants_with_images(table.context.storage, table.context.paths)
    assert all(t > readable_from for t in kept), "clean removes the images no readable window needs"
    if table_type == "merge_on_read":  # an in-process write whose images hold kept its change records too
        metas = [table.context.timeline.read_json(i) for i in table.timeline() if i.action.value == "deltacommit"]
        assert all(m.get(CHANGES_KEY) for m in metas if m.get(IMAGES_KEY) and m["files"]), "a write kept no file"


def read_from_images_only(patch: pytest.MonkeyPatch) -> None:
    """Makes `changes()` fail where it reads rows as of start from the table though every write of its window
    kept before-images that hold (a write beside a resize's dual writes records that its images do not:
    `IMAGES_KEY`)."""
    windows, window, live_rows = [], changes_module.window, changes_module.live_rows

    def recorded(*args, **kwargs):
        windows.append(window(*args, **kwargs))
        return windows[-1]

    def not_read_from_the_table(*args, **kwargs):
        if all(meta.get(IMAGES_KEY) for _, meta in windows[-1].writes):
            raise AssertionError("changes() read rows as of start from the table, though every write kept "
                                 "before-images")
        return live_rows(*args, **kwargs)

    patch.setattr(changes_module, "window", recorded)
    patch.setattr(changes_module, "live_rows", not_read_from_the_table)


def check_windows(table: mt.Table, model: History, times: list[str], windows: list[tuple[int, int]],
                  readable_from: str, partitioned: bool) -> None:
    for i, j in windows:
        start, end = times[min(i, len(times) - 1)], times[min(j, len(times) - 1)]
        if start < readable_from and readable_from != "00000000000000000":
            with pytest.raises(SnapshotExpiredError, match=f"the earliest start is {readable_from}"):
                table.changes(start, end)
            continue
        got = table.changes(start, end)
        assert got.column_names == SCHEMA.names + CHANGE_COLUMNS
        assert change_tuples(got) == (model.changes(start, end) if start < end else []), f"({start}, {end}]"
        check_sequence(got, partitioned)
        each = table.changes(start, end, every_version=True)
        assert each.column_names == SCHEMA.names + CHANGE_COLUMNS
        assert change_tuples(each) == model.every_version(start, end), f"every version of ({start}, {end}]"
        check_sequence(each, partitioned)
    if readable_from == "00000000000000000":  # nothing cleaned: everything since before the first commit
        everything = table.changes("2000-01-01")
        assert change_tuples(everything) == model.changes("0", "99999999999999999")


@pytest.mark.parametrize("index", [mt.IndexConfig(num_buckets=1), mt.IndexConfig(type="record")], ids=str)
@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_record_deleted_and_inserted_again_with_a_smaller_ordering_value_copies_through_its_changes(
        tmp_path, table_type, index):
    """The failure a change-stream copy met: the source deleted a record and inserted it again with a smaller
    ordering value. Its changes say so (a delete, then an insert, not an update), and `apply_changes` in the
    feed's order replaces the copy's row, whose ordering value is larger, in one commit; the copy's own
    changes show the reset the same way."""
    source, target = (mt.Table.create(str(tmp_path / name), MODEL_SCHEMA, "id", "p", "ts", table_type=table_type,
                                      index=index) for name in ("source", "target"))

    def rows(*items: tuple[int, str, int]) -> pa.Table:
        return pa.Table.from_pylist([{"id": i, "p": "a", "v": v, "ts": ts} for i, v, ts in items], schema=MODEL_SCHEMA)

    source.upsert(rows((1, "old", 57), (2, "kept", 10)))
    target.upsert(source.to_arrow())
    mark = source.timeline()[-1].time
    source.delete(rows((1, "", 0)).select(["id", "p"]))
    source.upsert(rows((1, "new", 55), (2, "changed", 11)))
    feed = source.changes(mark)
    assert [(r["id"], r["v"], r["_change_type"]) for r in feed.to_pylist()] == [
        (1, "old", "delete"), (1, "new", "insert"), (2, "kept", "update_preimage"), (2, "changed", "update_postimage")]
    before = target.timeline()[-1].time
    result = target.apply_changes(feed.filter(pc.field("_change_type") != "update_preimage"), "_change_type",
                                  ["delete"], sequence_by=["_commit_instant", "_commit_seq"])
    assert (result.inserted, result.updated, result.deleted) == (0, 2, 0)
    assert sort_rows(target.to_arrow().to_pylist()) == sort_rows(source.to_arrow().to_pylist())
    assert target.get(pa.table({"id": [1], "p": ["a"]})).to_pylist()[0]["v"] == "new"
    assert [(r["id"], r["_change_type"]) for r in target.changes(before).to_pylist()] == [
        (1, "delete"), (1, "insert"), (2, "update_preimage"), (2, "update_postimage")]
    assert target.fsck().healthy
    target.rebuild_metadata()  # the indexes built again from the files: the reset record lives
    assert target.get(pa.table({"id": [1], "p": ["a"]})).to_pylist()[0]["v"] == "new"
    if table_type == "merge_on_read":
        target.compact()
    assert sort_rows(target.to_arrow().to_pylist()) == sort_rows(source.to_arrow().to_pylist())


def test_as_of_takes_instants_iso_strings_datetimes_and_dates(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id")
    first = table.upsert(pa.table({"id": [1], "p": ["a"], "v": ["x"]}).cast(SCHEMA)).instant
    second = table.upsert(pa.table({"id": [1], "p": ["a"], "v": ["y"]}).cast(SCHEMA)).instant
    compaction = table.compact()
    at_first = datetime_from_time(first)
    for moment in (first, at_first, at_first.replace(tzinfo=None), at_first.isoformat(),
                   at_first.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                   at_first.astimezone(dt.timezone(dt.timedelta(hours=5))).isoformat()):
        assert table.to_arrow(as_of=moment)["v"].to_pylist() == ["x"], moment
    assert table.to_arrow(as_of=compaction)["v"].to_pylist() == ["y"]  # a compaction is a snapshot too
    assert table.to_arrow(as_of=table.timeline()[-1].time)["v"].to_pylist() == ["y"]
    assert table.to_arrow(as_of=dt.date(2999, 1, 1))["v"].to_pylist() == ["y"]
    assert table.get(pa.table({"id": [1]}), as_of=first)["v"].to_pylist() == ["x"]
    assert second > first
    with pytest.raises(SnapshotExpiredError, match="first commit; snapshots as of its first commit or later"):
        table.to_arrow(as_of=dt.date(2001, 1, 1))
    with pytest.raises(InvalidInputError, match="is not a moment"):
        table.to_arrow(as_of="yesterday")


def test_changes_before_what_clean_kept_name_the_earliest_start(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", table_type="copy_on_write",
                            options={"clean.retain_commits": 2})
    instants = [table.upsert(pa.table({"id": [1], "p": ["a"], "v": [str(i)]}).cast(SCHEMA)).instant
                for i in range(5)]
    readable_from = table.context.view().readable_from
    assert readable_from > instants[0]
    with pytest.raises(SnapshotExpiredError, match=f"the earliest start is {readable_from}"):
        table.changes(instants[0])
    got = table.changes(readable_from)
    assert got.to_pylist()[-1]["v"] == "4"


def test_changes_overtaken_by_a_clean_in_another_process_say_so(tmp_path, monkeypatch):
    """A read of changes held after it resolved its window, while another process writes and cleans what the
    window's start needed (but not what its end needs): a SnapshotExpiredError that says a clean removed the
    files it read, not a report of a damaged table."""
    root = str(tmp_path / "t")
    table = mt.Table.create(root, SCHEMA, "id", table_type="copy_on_write",
                            options={"clean.retain_commits": 2, "clean.inline": False})
    start = table.upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["0", "0"]}).cast(SCHEMA)).instant
    for v in "12":
        end = table.upsert(pa.table({"id": [1], "p": ["a"], "v": [v]}).cast(SCHEMA)).instant
    held = tmp_path / "held"
    cleaner = subprocess.Popen([sys.executable, "-c", f"""
import os, time, pyarrow as pa, metatable as mt
while not os.path.exists({str(held)!r} + ".reached"):
    time.sleep(0.05)
t = mt.Table.open({root!r})
t.upsert(pa.table({{"id": [1, 2], "p": ["a", "b"], "v": ["3", "3"]}}).cast(t.schema))
assert t.clean() is not None
open({str(held)!r}, "w").close()
"""], cwd=ROOT_DIR, env={**os.environ, "PYTHONPATH": ROOT_DIR})
    monkeypatch.setenv("METATABLE_PAUSE_AT", f"changes.read:{held}")
    with pytest.raises(SnapshotExpiredError, match=r"a clean removed files of .* while they were read"):
        table.changes(start)
    assert cleaner.wait(60) == 0
    monkeypatch.delenv("METATABLE_PAUSE_AT")
    assert start < table.context.view().readable_from <= end  # the end's snapshot is still readable
    with pytest.raises(SnapshotExpiredError, match="the earliest start is"):
        table.changes(start)


def test_changes_overtaken_by_a_clean_still_deleting_say_so(tmp_path, monkeypatch):
    """As above, but the clean has deleted the files and not completed yet (held at `clean.deleting`): its plan
    says which snapshots stay readable, so the read is still told it was overtaken. The chaos run found the
    read reported as a damaged table before."""
    root = str(tmp_path / "t")
    table = mt.Table.create(root, SCHEMA, "id", table_type="copy_on_write",
                            options={"clean.retain_commits": 2, "clean.inline": False})
    start = table.upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["0", "0"]}).cast(SCHEMA)).instant
    for v in "12":
        table.upsert(pa.table({"id": [1], "p": ["a"], "v": [v]}).cast(SCHEMA))
    held, deleting = tmp_path / "held", tmp_path / "deleting"
    cleaner = subprocess.Popen([sys.executable, "-c", f"""
import os, time, pyarrow as pa, metatable as mt
while not os.path.exists({str(held)!r} + ".reached"):
    time.sleep(0.05)
t = mt.Table.open({root!r})
t.upsert(pa.table({{"id": [1, 2], "p": ["a", "b"], "v": ["3", "3"]}}).cast(t.schema))
os.environ["METATABLE_PAUSE_AT"] = "clean.deleting:{deleting}"
assert t.clean() is not None
"""], cwd=ROOT_DIR, env={**os.environ, "PYTHONPATH": ROOT_DIR})
    releaser = subprocess.Popen([sys.executable, "-c", f"""
import os, time
while not os.path.exists({str(deleting)!r} + ".reached"):
    time.sleep(0.05)
open({str(held)!r}, "w").close()
"""])
    monkeypatch.setenv("METATABLE_PAUSE_AT", f"changes.read:{held}")
    try:
        with pytest.raises(SnapshotExpiredError, match=r"a clean removed files of .* while they were read"):
            table.changes(start)
        assert not any(i.action.value == "clean" and i.is_completed for i in table.timeline())
    finally:
        deleting.touch()
    assert releaser.wait(60) == 0 and cleaner.wait(60) == 0


@pytest.mark.parametrize("point", ["changes.read", "changes.images", "changes.files"])
def test_changes_whose_before_images_a_clean_removes_meanwhile_say_so(tmp_path, monkeypatch, point):
    """A clean that completes while `changes()` runs removes the before-images of writes it no longer keeps
    readable; the read lists the images, so a removed one is only missing, and the update it held read as an
    insert (the chaos run found that). The read asks afterwards whether a clean overtook it. Held after the
    images are listed (`changes.images`), the read meets a listed file that is gone, and says the same; so
    does every version, held before it opens the change files (`changes.files`)."""
    root = str(tmp_path / "t")
    table = mt.Table.create(root, SCHEMA, "id", options={"clean.retain_commits": 1, "clean.inline": False,
                                                          "changes.before_images": True})
    start = table.upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["0", "0"]}).cast(SCHEMA)).instant
    update = table.upsert(pa.table({"id": [1], "p": ["a"], "v": ["1"]}).cast(SCHEMA)).instant
    assert [r["_change_type"] for r in table.changes(start).to_pylist()] == ["update_preimage", "update_postimage"]
    held = tmp_path / "held"
    cleaner = subprocess.Popen([sys.executable, "-c", f"""
import os, time, pyarrow as pa, metatable as mt
while not os.path.exists({str(held)!r} + ".reached"):
    time.sleep(0.05)
t = mt.Table.open({root!r})
t.upsert(pa.table({{"id": [2], "p": ["b"], "v": ["2"]}}).cast(t.schema))
assert t.clean() is not None
open({str(held)!r}, "w").close()
"""], cwd=ROOT_DIR, env={**os.environ, "PYTHONPATH": ROOT_DIR})
    monkeypatch.setenv("METATABLE_PAUSE_AT", f"{point}:{held}")
    try:
        with pytest.raises(SnapshotExpiredError, match=r"a clean removed files of .* while they were read"):
            table.changes(start, every_version=point == "changes.files")
    finally:
        held.touch()
    assert cleaner.wait(60) == 0
    assert update not in instants_with_images(table.context.storage, table.context.paths)  # the clean removed them


def test_retain_hours_keeps_every_commit_of_the_last_hours(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", table_type="copy_on_write",
                            options={"clean.retain_commits": 1, "clean.retain_hours": 1.0})
    instants = [table.upsert(pa.table({"id": [1], "p": ["a"], "v": [str(i)]}).cast(SCHEMA)).instant
                for i in range(4)]
    assert table.context.view().readable_from == "00000000000000000"
    assert [r["v"] for r in table.changes(instants[0]).to_pylist()] == ["0", "3"]
    assert table.to_arrow(as_of=instants[1])["v"].to_pylist() == ["1"]


def test_changes_columns_filter_and_the_cli(tmp_path, capsys):
    from metatable.cli import main
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p")
    start = table.upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["x", "y"]}).cast(SCHEMA)).instant
    table.upsert(pa.table({"id": [1, 2, 3], "p": ["a", "b", "b"], "v": ["x2", "y2", "z"]}).cast(SCHEMA))
    table.delete(pa.table({"id": [1], "p": ["a"]}))
    got = table.changes(start, columns=["id", "v"], filter=[("p", "==", "b")])
    assert got.column_names == ["id", "v"] + CHANGE_COLUMNS
    assert [(r["id"], r["v"], r["_change_type"]) for r in got.to_pylist()] == [
        (2, "y", "update_preimage"), (2, "y2", "update_postimage"), (3, "z", "insert")]
    assert [r["_change_type"] for r in table.changes(start, filter=[("p", "==", "a")]).to_pylist()] == ["delete"]
    main(["changes", str(tmp_path / "t"), "--since", start, "--output", "json"])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and '"_change_type": "delete"' in printed[-1]
    main(["changes", str(tmp_path / "t"), "--since", start, "--every-version", "--output", "json"])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 6 and '"_change_type": "delete"' in printed[-1]  # 1 updated, then deleted: 2 + 1
    main(["get", str(tmp_path / "t"), "1", "--as-of", start])
    assert " x " in capsys.readouterr().out.splitlines()[1] + " "


@pytest.mark.slow
def test_a_change_stream_killed_twice_copies_a_table_that_three_writers_keep_writing(spark, tmp_path, request):
    """`readStream.format("metatable")` into a second table through `StreamSink` (pre-images dropped, deletes
    applied), while three writer processes upsert and delete; the query is SIGKILLed once mid-run and once
    after a batch committed to the target but before Spark's checkpoint recorded it. Restarted (the last time
    in the test run's session: a process of its own cost a JVM's start and warm-up), it ends with the target
    equal to the source."""
    source, target, checkpoint = (str(tmp_path / name) for name in ("source", "target", "checkpoint"))
    # the feed's retention: an hour; its writers keep before-images, which concurrent writes make stale at times
    for path, options in ((source, {"clean.retain_hours": 1.0, "changes.before_images": True}), (target, {})):
        mt.Table.create(path, MODEL_SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2), options=options)
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}

    logs = []
    children: list[subprocess.Popen] = []

    def child(*args: str, **extra: str) -> subprocess.Popen:
        logs.append(tmp_path / f"child-{len(logs)}.log")
        with open(logs[-1], "w") as out:  # a file, not a pipe: Spark's logging would fill a pipe and block
            children.append(subprocess.Popen([sys.executable, "-m", "tests.metatable.change_stream_child", *args],
                                             cwd=ROOT_DIR, env={**env, **extra}, stdout=out, stderr=out))
            return children[-1]

    request.addfinalizer(lambda: [c.kill() for c in children if c.poll() is None])  # a failure leaves none behind

    def log_of(process: subprocess.Popen) -> str:
        return logs[-1].read_text()[-3000:] if process.args else ""

    def wait_for(condition, process: subprocess.Popen) -> None:
        deadline = time.time() + 120
        while not condition():
            assert process.poll() is None and time.time() < deadline, log_of(process)
            time.sleep(0.2)

    def target_commits() -> int:
        return sum(1 for i in mt.Table.open(target).timeline() if i.is_completed)

    mt.Table.open(source).upsert(pa.Table.from_pylist([{"id": i, "p": "ab"[i % 2], "v": "first", "ts": 0}
                                                       for i in range(40)], schema=MODEL_SCHEMA))
    query = child("copy", source, target, checkpoint)
    wait_for(lambda: target_commits() >= 1, query)  # the first batch: the snapshot
    stop = tmp_path / "stop"
    writers = [child("write", source, str(seed), str(stop)) for seed in range(3)]
    wait_for(lambda: target_commits() >= 3, query)
    query.kill()  # SIGKILL, mid-run
    query.wait()
    before = target_commits()
    query = child("copy", source, target, checkpoint, METATABLE_CRASH_AT="stream.batch.written:2")
    assert query.wait(timeout=180) == -signal.SIGKILL, log_of(query)
    assert target_commits() > before
    assert all(writer.poll() is None for writer in writers), "the writers wrote throughout"
    stop.touch()
    for writer in writers:
        assert writer.wait(timeout=180) == 0, "a writer failed"
    copy_changes(spark, source, target, checkpoint, drain=True)
    expected = sort_rows(mt.Table.open(source).to_arrow().to_pylist())
    assert expected and sort_rows(mt.Table.open(target).to_arrow().to_pylist()) == expected


@pytest.mark.slow
@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS, window=st.tuples(st.integers(0, 20), st.integers(0, 20)))
def test_spark_reads_through_time_equal_the_table(spark, tmp_path, table_type, operations, window):
    """`format("metatable")` with `as_of`, and with `start` and `end`, reads what `to_arrow` and `changes`
    read (which the model test checks). Every other upsert is a Spark write, whose executors keep the
    before-images: the changes equal those of a twin table written in-process without them."""
    path, twin_path = (str(tmp_path / uuid.uuid4().hex[:8]) for _ in range(2))
    table, twin = (mt.Table.create(p, SCHEMA, "id", "p", table_type=table_type,
                                   options={"clean.inline": False, "changes.before_images": images})
                   for p, images in ((path, True), (twin_path, False)))
    starts = {}  # the table's instant -> the twin's
    for step, (operation, keys) in enumerate(operations):
        data = pa.table({"id": [k for k, _ in keys], "p": [p for _, p in keys]})
        for t in (table, twin):
            done = None
            if operation == "upsert":
                rows = data.append_column("v", pa.array([f"{step}-{k}" for k, _ in keys])).cast(SCHEMA)
                done = t.upsert(spark.createDataFrame(rows.to_pandas()) if t is table and step % 2 else rows)
            elif operation == "delete":
                done = t.delete(data)
            elif operation in ("compact", "cluster"):
                done = getattr(t, operation)()
            instant = done.instant if isinstance(done, mt.WriteResult) else None
            if t is table:
                mine = instant
            elif mine is not None:
                starts[mine] = instant
    times = [i.time for i in table.timeline()] or ["20000101000000000"]
    start, end = (times[min(i, len(times) - 1)] for i in window)
    changes = spark.read.format("metatable").option("start", start).option("end", end).load(path)
    assert change_tuples(changes.toArrow()) == change_tuples(table.changes(start, end))
    each = spark.read.format("metatable").option("start", start).option("end", end).option("every_version", "true")
    assert change_tuples(each.load(path).toArrow()) == change_tuples(table.changes(start, end, every_version=True))
    if start in starts and end in starts:
        assert [t[:4] for t in change_tuples(table.changes(start, end))] == \
            [t[:4] for t in change_tuples(twin.changes(starts[start], starts[end]))]
    if table.timeline():
        moment = between(end).isoformat()
        snapshot = spark.read.format("metatable").option("as_of", moment).load(path)
        assert rows_of(snapshot.toArrow()) == rows_of(table.to_arrow(as_of=moment))


def test_before_images_taken_before_a_concurrent_write_to_their_file_group_are_not_used(tmp_path):
    """A merge-on-read write that a concurrent write to the same file group completed before re-homes behind
    it: the images it took when it began lack that write's rows, so its commit says they are not complete,
    and `changes()` reads those records' rows as of start from the table. The concurrent write began first
    (its instant is earlier), so a window that starts at it holds the later one alone: its rows as of start
    are the concurrent write's, not the images'. Three processes."""
    table = mt.Table.create(str(tmp_path / "t"), MODEL_SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            options={"changes.before_images": True})
    table.upsert(pa.Table.from_pylist(concurrency_rows([1, 2], "a", "seed", 1), schema=MODEL_SCHEMA))
    early_go, late_go = tmp_path / "early", tmp_path / "late"
    early = start(table.path, "upsert", concurrency_rows([1], "a", "early", 3),
                  **held_at("table.write.files", early_go))
    wait_held(early, early_go)
    late = start(table.path, "upsert", concurrency_rows([1, 2], "a", "late", 5),
                 **held_at("table.write.files", late_go))
    wait_held(late, late_go)  # both have written their files and images
    early_go.touch()
    assert early.wait(60) == 0, early.stderr.read()
    late_go.touch()
    assert late.wait(60) == 0, late.stderr.read()
    reopened = mt.Table.open(table.path)
    writes = [i for i in reopened.timeline() if i.action.value == "deltacommit"]
    assert [reopened.context.timeline.read_json(i)["before_images"] for i in writes] == [True, True, False]
    got = sorted((r["id"], r["v"], r["_change_type"]) for r in reopened.changes(writes[1].time).to_pylist())
    late_changes = [(1, "early", "update_preimage"), (1, "late", "update_postimage"),
                    (2, "seed", "update_preimage"), (2, "late", "update_postimage")]
    assert got == sorted(late_changes)
    # its change file was made from those images too: every version reads its changes from the table instead
    each = reopened.changes(writes[0].time, every_version=True)
    assert [(r["id"], r["v"], r["_change_type"], r["_commit_instant"]) for r in each.to_pylist()] == [
        (1, "seed", "update_preimage", writes[1].time), (1, "early", "update_postimage", writes[1].time),
        *[(*change, writes[2].time) for change in late_changes]]


@pytest.mark.parametrize("early_ts", [3, 5])
def test_a_write_with_an_earlier_instant_that_completes_later(tmp_path, early_ts):
    """Snapshots take instants by time and merge versions in the order their writes completed. A write X whose
    instant is earlier than W's and that completes after W changes rows of W's file groups in the snapshot as
    of X, rows W's images (and so its change file) lack: a window that starts at X and whose first write is W
    must not take W's images as its rows as of start; W's commit says its images are not complete when a write
    with an earlier instant is still running. And in the snapshot as of W, X's versions merge after W's: with
    equal ordering values (`early_ts` 5) X's row wins, and W changed nothing of that record. Three processes;
    the chaos run's reader found both through the change files (a pre-image older than the snapshot's row, a
    delete of a row the snapshot held)."""
    table = mt.Table.create(str(tmp_path / "t"), MODEL_SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            options={"changes.before_images": True})
    seed = table.upsert(pa.Table.from_pylist(concurrency_rows([1, 2], "a", "seed", 1), schema=MODEL_SCHEMA)).instant
    early_go = tmp_path / "early"
    early = start(table.path, "upsert", concurrency_rows([1], "a", "early", early_ts),
                  **held_at("table.write.files", early_go))
    wait_held(early, early_go)
    late = start(table.path, "upsert", concurrency_rows([1, 2], "a", "late", 5))
    assert late.wait(60) == 0, late.stderr.read()
    early_go.touch()
    assert early.wait(60) == 0, early.stderr.read()
    reopened = mt.Table.open(table.path)
    writes = [i for i in reopened.timeline() if i.action.value == "deltacommit"]
    metas = [reopened.context.timeline.read_json(i) for i in writes]
    assert [(m[IMAGES_KEY], m[CHANGES_KEY]) for m in metas[1:]] == [(False, True), (False, True)]  # kept, unread
    x, w = writes[1].time, writes[2].time
    assert metas[2]["running_before"] == [x]
    final = "late" if early_ts < 5 else "early"  # a tie goes to the write that completed last
    assert {r["id"]: r["v"] for r in reopened.to_arrow().to_pylist()} == {1: final, 2: "late"}
    by_w = [(1, "early", "update_preimage", w), (1, "late", "update_postimage", w)] if final == "late" else []
    by_w += [(2, "seed", "update_preimage", w), (2, "late", "update_postimage", w)]
    net = reopened.changes(x)
    assert [(r["id"], r["v"], r["_change_type"], r["_commit_instant"]) for r in net.to_pylist()] == by_w
    each = reopened.changes(seed, every_version=True)
    assert [(r["id"], r["v"], r["_change_type"], r["_commit_instant"]) for r in each.to_pylist()] == [
        (1, "seed", "update_preimage", x), (1, "early", "update_postimage", x), *by_w]
    # X archived, the newest archived instant (the archive's `until`): the window still merges its versions
    archiving = mt.Table.open(table.path, options={"archive.max_instants": 2, "archive.min_instants": 1})
    assert archival.archive(archiving.context) == 2 and archiving.context.timeline.archive.summary().until == x
    net = archiving.changes(x)
    assert [(r["id"], r["v"], r["_change_type"], r["_commit_instant"]) for r in net.to_pylist()] == by_w


def test_a_writer_killed_after_its_change_file_leaves_none_behind(tmp_path):
    """A write SIGKILLed after it kept its change file and before it committed: the next writer rolls it back,
    its images and change file go with it, and every version of a window over both writes is the survivor's."""
    table = mt.Table.create(str(tmp_path / "t"), MODEL_SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            options={"changes.before_images": True, "lock.lease_s": 2.0})
    seed = table.upsert(pa.Table.from_pylist(concurrency_rows([1, 2], "a", "seed", 1), schema=MODEL_SCHEMA)).instant
    victim = start(table.path, "upsert", concurrency_rows([1], "a", "dead", 3),
                   METATABLE_CRASH_AT="table.write.change_file")
    assert victim.wait(60) == -signal.SIGKILL
    kept = instants_with_images(table.context.storage, table.context.paths)
    assert len(kept) == 2 and kept[0] == seed, "the seed's change file, the victim's images and change file"
    time.sleep(0.3)
    survivor = mt.Table.open(table.path, options={"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2})
    after = survivor.upsert(pa.Table.from_pylist(concurrency_rows([2], "a", "after", 3), schema=MODEL_SCHEMA)).instant
    assert instants_with_images(survivor.context.storage, survivor.context.paths) == [seed, after]
    assert survivor.context.timeline.read_json(survivor.context.timeline.get(after))[CHANGES_KEY] is True
    each = survivor.changes(seed, every_version=True)
    assert [(r["id"], r["v"], r["_change_type"], r["_commit_instant"]) for r in each.to_pylist()] == [
        (2, "seed", "update_preimage", after), (2, "after", "update_postimage", after)]


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_before_images_give_the_changes_the_table_gives_and_go_with_clean(lake, table_type):
    """On both storages: the changes read from before-images equal those read from the table's slices (a twin
    written the same way without them), through a key moved out of its partition (a global record index) and a
    compaction; clean then removes the images no readable window needs."""
    tables = [mt.Table.create(lake / name, SCHEMA, "id", "p", table_type=table_type,
                              index=mt.IndexConfig(type="record", scope="global"),
                              options={"changes.before_images": images, "clean.retain_commits": 2,
                                       "clean.inline": False, "compaction.trigger.log_count": 0})
              for name, images in (("images", True), ("twin", False))]
    batches = [("upsert", [(1, "a", "x"), (2, "a", "y"), (3, "b", "z")]), ("upsert", [(1, "b", "x2"), (4, "b", "w")]),
               ("delete", [(2, "a", None)]), ("compact", []), ("upsert", [(3, "b", "z2"), (1, "b", "x3")])]
    instants: list[list[str]] = [[], []]
    for operation, rows in batches:
        for t, mine in zip(tables, instants):
            data = pa.table({"id": [r[0] for r in rows], "p": [r[1] for r in rows], "v": [r[2] for r in rows]})
            if operation == "upsert":
                mine.append(t.upsert(data.cast(SCHEMA)).instant)
            elif operation == "delete":
                mine.append(t.delete(data.select(["id", "p"])).instant)
            else:
                t.compact()
    images, twin = tables
    meta = images.context.timeline.read_json(images.context.timeline.get(instants[0][1]))
    assert meta["before_images"] is True
    for first in range(len(instants[0]) - 1):
        got, expected = (change_tuples(t.changes(mine[first])) for t, mine in zip(tables, instants))
        assert [g[:4] for g in got] == [e[:4] for e in expected]
        got, expected = (change_tuples(t.changes(mine[first], every_version=True))
                         for t, mine in zip(tables, instants))
        assert [g[:4] for g in got] == [e[:4] for e in expected], "every version: change files and the table"
    # the first replaced nothing: merge-on-read kept its change file alone, copy-on-write nothing
    assert instants_with_images(images.context.storage, images.context.paths) == \
        instants[0][0 if table_type == "merge_on_read" else 1:]
    images.clean()  # the last two commits stay readable: earlier images go
    readable_from = images.context.view().readable_from
    kept = instants_with_images(images.context.storage, images.context.paths)
    assert kept and all(t > readable_from for t in kept) and len(kept) < len(instants[0])
