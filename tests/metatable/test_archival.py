"""Timeline archival (issue 37): completed instants move into the archive; reads, time travel, services,
idempotent writes and crashes behave as if they had stayed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metatable as mt
from metatable.errors import MissingFileError, SnapshotExpiredError
from metatable.services import archival
from metatable.storage.local import LocalStorage
from metatable.timeline.archive import FAN_IN, Archive, ArchiveFile
from metatable.timeline.instant import Action, Instant
from metatable.timeline.timeline import Timeline
from metatable.write.write_client import Txn

from .archive_child import commit_rows
from .table_model import SCHEMA, TableModel, sort_rows

SMALL = {"archive.max_instants": 8, "archive.min_instants": 4, "clean.retain_commits": 3,
         "metadata.archive.max_instants": 8, "metadata.archive.min_instants": 4}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def new_table(tmp_path, name="t", **options) -> mt.Table:
    return mt.Table.create(str(tmp_path / name), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                           options={**SMALL, **options})


def upsert(t: mt.Table, model: TableModel, rows: list[dict], **kwargs) -> str:
    done = t.upsert(pa.Table.from_pylist(rows, schema=SCHEMA), **kwargs)
    model.apply("upsert", rows)
    return done.instant


def archived(t: mt.Table) -> list[Instant]:
    active = set(t.timeline())
    return [i for i in t.timeline(archived=True) if i not in active]


# -- the archive's files -------------------------------------------------------------------------------------
def test_archive_file_names_round_trip_and_bad_ones_are_refused():
    f = ArchiveFile("20260101000000000", "20260102000000000", 2)
    assert f.file_name == "20260101000000000_20260102000000000_2.archive"
    assert ArchiveFile.parse(f.file_name) == f
    with pytest.raises(mt.MetatableError, match="bad archive file name"):
        ArchiveFile.parse("20260101000000000_2.archive")


def test_archive_runs_are_read_back_in_order_and_levels_merge_once_fan_in_files_share_one(tmp_path):
    archive = Archive(LocalStorage(), str(tmp_path / "archive"))
    times = [f"20260101{n:06d}000" for n in range(FAN_IN * 2 + 1)]
    for n, time in enumerate(times):
        archive.append([(Instant(time, Action.DELTACOMMIT), {"n": n})], lambda carried, run: {
            "count": carried.get("count", 0) + len(run)})
        archive.merge_levels()
    assert [(i.time, c) for i, c in archive.read()] == [(t, {"n": n}) for n, t in enumerate(times)]
    assert archive.summary().until == times[-1] and archive.summary().carried == {"count": len(times)}
    levels = sorted(f.level for f in archive.all_files())
    assert levels == [0, 1, 1], "two full levels of 0 merged into level 1; the last file waits"
    assert archive.find(times[5]) == Instant(times[5], Action.DELTACOMMIT)
    assert archive.find("20250101000000000") is None


def test_a_read_of_the_archive_that_a_merge_of_levels_overtook_reads_each_instant_once(tmp_path):
    """Found by benchmarks/chaos.py: a reader listed the level-0 files, then an archival merged them into one
    of level 1 and deleted them before the reader reached them."""
    archive = Archive(LocalStorage(), str(tmp_path / "archive"))
    times = [f"20260101{n:06d}000" for n in range(FAN_IN)]
    for n, time in enumerate(times):
        archive.append([(Instant(time, Action.DELTACOMMIT), {"n": n})], lambda carried, run: carried)
    reading = archive.read()
    first = next(reading)  # the listing is done and the first file read
    archive.merge_levels()
    assert [f.level for f in archive.all_files()] == [1], "the files the reader listed are gone"
    assert [(i.time, c) for i, c in [first, *reading]] == [(t, {"n": n}) for n, t in enumerate(times)]
    later = "20260102000000000"
    archive.append([(Instant(later, Action.DELTACOMMIT), {"n": FAN_IN})], lambda carried, run: carried)
    reading = archive.read()
    next(reading)
    gone = ArchiveFile(later, later).file_name
    os.remove(os.path.join(archive.dir, gone))  # listed, then gone with nothing that holds its instants: named
    with pytest.raises(MissingFileError, match=gone):
        list(reading)


# -- tables -----------------------------------------------------------------------------------------------------
def test_a_long_lived_table_keeps_its_active_timeline_bounded_and_reads_every_retained_instant(tmp_path):
    t, model = new_table(tmp_path, **{"clean.retain_commits": 12}), TableModel(True)
    states = {}
    for i in range(40):
        time = upsert(t, model, commit_rows(i))
        states[time] = model.expected()
    assert len(t.timeline()) <= 2 * 12, "the active timeline keeps the 12 retained commits and little else"
    moved = archived(t)
    assert moved and all(i.is_completed for i in moved)
    mdt = t.context.metadata.timeline
    assert len(mdt.instants()) <= SMALL["metadata.archive.max_instants"] + 1 and mdt.archived.until > "0"
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()
    readable_from = t.context.view().readable_from
    retained = [time for time in states if time >= readable_from]
    assert any(mt_time <= t.context.timeline.archived.until for mt_time in retained), \
        "some readable instants are archived: time travel reads them from the archive"
    for time in retained:
        assert sort_rows(t.to_arrow(as_of=time).to_pylist()) == states[time], time
    assert t.fsck().healthy
    keys = pa.Table.from_pylist([{"id": r["id"], "p": r["p"]} for r in model.expected()[:5]])
    assert t.get(keys).num_rows == 5


def test_time_travel_to_an_archived_instant_that_clean_removed_is_refused_clearly(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    first = upsert(t, model, commit_rows(0))
    for i in range(1, 30):
        upsert(t, model, commit_rows(i))
    assert first <= t.context.timeline.archived.until
    with pytest.raises(SnapshotExpiredError, match="clean removed files"):
        t.to_arrow(as_of=first)
    with pytest.raises(SnapshotExpiredError, match="before the table's first commit"):
        t.to_arrow(as_of="20000101000000000")


def test_an_idempotent_writer_whose_last_commit_was_archived_is_still_skipped(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    first = upsert(t, model, commit_rows(0), txn=Txn("stream-1", 5))
    for i in range(1, 30):
        upsert(t, model, commit_rows(i))
    assert first <= t.context.timeline.archived.until
    again = t.upsert(pa.Table.from_pylist(commit_rows(99), schema=SCHEMA), txn=Txn("stream-1", 5))
    assert again.instant == first and again.inserted == again.updated == 0
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()


def test_a_rehash_that_was_archived_keeps_its_bucket_count(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    for i in range(5):
        upsert(t, model, commit_rows(i))
    rehash = t.cluster(num_buckets=4)
    for i in range(5, 40):
        upsert(t, model, commit_rows(i))
    assert rehash <= t.context.timeline.archived.until
    ids = {fid for (_, fid) in t.file_slices()}
    assert len(ids) == 8, ids  # 4 buckets in each of 2 partitions, none of the old count back
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()


def test_timeline_all_lists_the_archived_instants_too(tmp_path, capsys):
    from metatable.cli import main
    t, model = new_table(tmp_path), TableModel(True)
    for i in range(20):
        upsert(t, model, commit_rows(i))
    main(["timeline", t.path])
    short = capsys.readouterr().out
    assert "(archived)" not in short and "are archived: --all lists them" in short
    main(["timeline", "--all", t.path])
    full = capsys.readouterr().out
    assert full.count("(archived)") == len(archived(t)) > 0
    assert full.count("deltacommit") == 20


# -- the model, with services and time travel -------------------------------------------------------------------
ops = st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.integers(0, 200)),
    st.tuples(st.just("delete"), st.integers(0, 200)),
    st.tuples(st.sampled_from(["compact", "cluster", "clean"]), st.just(0))), min_size=15, max_size=35)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_archival_interleaved_with_writes_and_services_matches_the_model(tmp_path_factory, ops):
    t = new_table(tmp_path_factory.mktemp("archive"), **{"clean.retain_commits": 6})
    model, states = TableModel(True), {}
    for n, (op, seed) in enumerate(ops):
        if op == "upsert":
            time = upsert(t, model, commit_rows(seed + n))
            states[time] = model.expected()
        elif op == "delete":
            rows = commit_rows(seed)
            result = t.delete(pa.Table.from_pylist(rows, schema=SCHEMA).select(["id", "p"]))
            model.apply("delete", rows)
            states[result.instant] = model.expected()
        elif op == "compact":
            t.compact()
        elif op == "cluster":
            t.cluster()
        else:
            t.clean()
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()
    assert t.context.timeline.archived.until > "0" or len(t.timeline()) <= SMALL["archive.max_instants"]
    readable_from = t.context.view().readable_from
    for time, expected in states.items():
        if time >= readable_from:
            assert sort_rows(t.to_arrow(as_of=time).to_pylist()) == expected, time
    assert t.fsck().healthy


# -- crashes ---------------------------------------------------------------------------------------------------
def run_child(root: str, first: int, count: int, crash_at: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": ROOT}
    if crash_at:
        env["METATABLE_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "tests.metatable.archive_child", root, str(first), str(count),
                           json.dumps(SMALL)], cwd=ROOT, env=env, capture_output=True, timeout=300).returncode


@pytest.mark.parametrize("point", ["timeline.archive.file", "timeline.archive.file:2", "timeline.archive.summary",
                                   "timeline.archive.summary:2", "timeline.archive.remove:3", "timeline.archive.merge"])
def test_a_process_killed_while_archiving_loses_nothing_and_the_next_archival_finishes(tmp_path, point):
    """Killed at each step of an archival (the data table's and its metadata table's share the steps; the
    n-th time a point is reached is the one or the other), the next process finishes it."""
    t = new_table(tmp_path)
    crashes = 0
    first = 0
    while first < 120 and crashes < 2:
        code = run_child(t.path, first, 120 - first, point)
        crashes += code == -signal.SIGKILL
        assert code in (0, -signal.SIGKILL)
        first = len([i for i in mt.Table.open(t.path).timeline(archived=True)
                     if i.action is Action.DELTACOMMIT and i.is_completed])
    assert crashes, f"{point} was reached"
    assert run_child(t.path, first, 10, None) == 0
    table = mt.Table.open(t.path)
    commits = [i for i in table.timeline(archived=True) if i.action is Action.DELTACOMMIT]
    model = TableModel(True)
    states = {}
    for n, instant in enumerate(commits):
        model.apply("upsert", commit_rows(n))
        states[instant.time] = model.expected()
    assert len(commits) == first + 10
    assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    readable_from = table.context.view().readable_from
    for time, expected in states.items():
        if time >= readable_from:
            assert sort_rows(table.to_arrow(as_of=time).to_pylist()) == expected, time
    assert len(table.timeline()) <= SMALL["archive.max_instants"] + 1
    report = table.fsck()
    assert report.healthy, report.problems


def test_a_damaged_archive_file_is_named_and_the_active_timeline_still_reads(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    for i in range(20):
        upsert(t, model, commit_rows(i))
    archive = t.context.timeline.archive
    damaged = os.path.join(archive.dir, archive.all_files()[0].file_name)
    with open(damaged, "r+b") as f:
        f.write(b"not avro at all")
    with pytest.raises(mt.MetatableError, match=os.path.basename(damaged)):
        t.timeline(archived=True)
    assert sort_rows(mt.Table.open(t.path).to_arrow().to_pylist()) == model.expected()


# -- readers that meet an archival or a clean in another process (found by benchmarks/chaos.py) -------------
def test_an_instant_archived_after_a_reader_listed_it_is_read_from_the_archive(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    first = upsert(t, model, commit_rows(0))
    reader = Timeline(LocalStorage(), t.path)
    listed = reader.get(first)  # a view listed it; its commit metadata is read later (replacements, txns)
    for i in range(1, 30):
        upsert(t, model, commit_rows(i))
    assert not os.path.exists(os.path.join(reader.dir, listed.file_name)), "archived since it was listed"
    assert reader.read_json(listed)["operation"] == "upsert"
    assert reader.get(first) == listed


def test_a_read_that_meets_a_cleaned_metadata_file_runs_again_on_a_fresh_view(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    upsert(t, model, commit_rows(0))
    views = []

    def read(view):
        views.append(view)
        if len(views) == 1:
            raise MissingFileError("/m/record-index-0000_compacted_20260101000000000.sst", "gone", metadata=True)
        return len(view.file_slices)

    assert t.context.read_view(read) == len(t.file_slices()) and len(views) == 2 and views[0] is not views[1]

    def read_data(view):
        raise MissingFileError("/t/p=a/f_20260101000000000.parquet", "gone")

    with pytest.raises(MissingFileError):  # a data file is not a clean's: the read fails and names it
        t.context.read_view(read_data)


def test_a_table_opened_before_its_first_commit_sees_what_another_process_committed_and_archived(tmp_path):
    """A process that listed an empty timeline, then lists again after another process committed and archived
    instants: the archive's summary must be read again. It had been kept because the new listing held every
    name of the old one (none: nothing to lose), so the archived instants were neither listed nor archived for
    it: a consistent-hashing compaction then found no ring and wrote the initial one over the resized ring
    (the chaos run's `hashing_meta ... seq_no 0 does not advance past 1`)."""
    t, model = new_table(tmp_path), TableModel(True)
    assert t.to_arrow().num_rows == 0
    for i in range(30):
        model.apply("upsert", commit_rows(i))
    subprocess.run([sys.executable, "-m", "tests.metatable.archive_child", t.path, "0", "30", json.dumps(SMALL)],
                   cwd=ROOT, check=True)
    assert archived(mt.Table.open(t.path)), "the other process archived"
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()
    assert t.context.timeline.archived.until == mt.Table.open(t.path).context.timeline.archived.until


def clustered_after_a_clean_planned_while_it_was_pending(tmp_path) -> tuple[mt.Table, TableModel, str]:
    """A clustering of p=a that completes after a clean whose plan was made while it was pending: that clean
    records a `readable_from` past the clustering's time, and deletes none of the groups it replaces (they were
    not replaced yet); then enough writes for archival to look at the clustering."""
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", table_type="copy_on_write",
                        index=mt.IndexConfig(type="bloom"), metadata_indexes=["bloom_filter", "column_stats"],
                        options={**SMALL, "clean.inline": False, "write.target_file_size": 1024,
                                 "clustering.small_file_limit": 1 << 20})  # each write a file group of its own
    model = TableModel(True)
    for first in (0, 10):
        upsert(t, model, [{"id": i, "p": "a", "v": "first", "ts": 0} for i in range(first, first + 10)])
    clustering = t.schedule_clustering(partitions=["p=a"])
    assert clustering is not None
    for i in range(1, 8):
        upsert(t, model, [{"id": j, "p": "b", "v": f"c{i}", "ts": i} for j in range(5)])
    assert t.clean() is not None  # it deletes old slices of p=b
    assert t.run_clustering(clustering) == [clustering]
    for i in range(8, 20):
        upsert(t, model, [{"id": j, "p": "b", "v": f"c{i}", "ts": i} for j in range(5)])
    return t, model, clustering


def test_a_clustering_stays_active_until_a_clean_removed_the_file_groups_it_replaced(tmp_path):
    """Archival took a clean's `readable_from` past a clustering as the sign that the groups it replaced were
    gone, moved the clustering into the archive, and views, which hide replaced groups only while their
    clustering is active, showed them again: every row they held was stored twice (the chaos run's churn
    configuration found it, 133 keys of a group a resize had split)."""
    t, model, clustering = clustered_after_a_clean_planned_while_it_was_pending(tmp_path)
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()
    assert clustering > t.context.timeline.archived.until

    assert t.clean() is not None  # now the replaced groups go, and the clustering may follow
    for i in range(20, 30):
        upsert(t, model, [{"id": j, "p": "b", "v": f"c{i}", "ts": i} for j in range(5)])
    assert clustering <= t.context.timeline.archived.until
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()
    assert t.fsck().healthy


def test_fsck_names_keys_live_in_two_file_groups(tmp_path, monkeypatch):
    """The table the early archival left (made again by switching its check off): fsck said healthy."""
    monkeypatch.setattr(archival, "replaced_files_remain", lambda *_: False)
    t, model, clustering = clustered_after_a_clean_planned_while_it_was_pending(tmp_path)
    assert clustering <= t.context.timeline.archived.until
    assert t.to_arrow().num_rows == len(model.expected()) + 20
    report = t.fsck()
    assert not report.healthy
    [problem] = report.problems
    assert problem.kind == "duplicate" and problem.path == t.context.paths.partition_dir("p=a")
    assert problem.detail.startswith("20 record keys are live in more than one file group"), problem.detail


def test_logs_written_while_a_rolled_back_compaction_was_pending_stay_visible_once_archived(tmp_path):
    """Writers put their logs in a pending compaction's slice (named after its instant). A compaction that fails
    is rolled back, and once archival passes its instant, that instant reads as completed: the logs were taken
    for logs of a base that was never written, and their rows vanished (the metadata table lost committed
    rows so in an RGW soak). The logs belong to the slice before it."""
    t, model = new_table(tmp_path, **{"compaction.mode": "off", "compaction.trigger.log_count": 0}), TableModel(True)
    for i in range(3):
        upsert(t, model, commit_rows(i))
    pending = t.schedule_compaction()
    for i in range(3, 6):
        upsert(t, model, commit_rows(i))  # in the pending compaction's slice
    t.rollback(pending, force=True)
    for i in range(6, 30):  # keys of their own: the rows of commits 3-5 stay the latest of theirs
        upsert(t, model, [{"id": 1000 + i, "p": "a", "v": f"c{i}", "ts": i}])
    assert t.context.timeline.archived.until > pending, "archival passed the rolled-back compaction"
    for table in (t, mt.Table.open(t.path)):
        assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    assert t.fsck().healthy
