"""Damaged and missing files, a damaged metadata table and its rebuild, the timeline's refusals, fsck and its
sweep: every failure is named, every table recoverable, no committed row lost."""
from __future__ import annotations

import glob
import json
import os
import shutil
import re
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metatable as mt
from metatable.errors import CorruptFileError, MissingFileError, TimelineError
from metatable.formats.key_pages import key_page_count, key_pages, parquet_footer
from metatable.formats.log_file import LogFile
from metatable.formats.row_pages import file_pages

from .table_model import SCHEMA, check_metadata, data_files_on_disk, sort_rows

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2}


def batch(ids, v, ts, parts=("a", "b")):
    ids = list(ids)
    return pa.table({"id": ids, "p": [parts[i % len(parts)] for i in ids], "v": [v] * len(ids), "ts": [ts] * len(ids)},
                    schema=SCHEMA)


def two_commits(path, **kwargs) -> mt.Table:
    kwargs.setdefault("index", mt.IndexConfig(num_buckets=2))
    t = mt.Table.create(str(path), SCHEMA, "id", "p", "ts", **kwargs)
    t.insert(batch(range(300), "first", 1))
    t.upsert(batch(range(0, 300, 3), "second", 2))
    return t


def base_files(t: mt.Table) -> list[str]:
    return sorted(glob.glob(f"{t.path}/p=*/*.parquet"))


def damage(path: str, start: int = 16, length: int = 64) -> None:
    """Garble bytes of the first column's first page (from `start`: after the magic and into its header)."""
    data = bytearray(open(path, "rb").read())
    data[start:start + length] = bytes(b ^ 0x5A for b in data[start:start + length])
    open(path, "wb").write(data)
    forget_footers()


def forget_footers() -> None:
    """Base files never change in place, so their footers and page layouts are cached by path; not here."""
    for cached in (parquet_footer, key_pages, key_page_count, file_pages):
        cached.cache_clear()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metatable.cli", *args], cwd=ROOT_DIR, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT_DIR})


# -- data files ------------------------------------------------------------------------------------------
def test_a_corrupt_base_file_is_named_and_a_failed_compaction_leaves_nothing_pending(tmp_path):
    t = two_commits(tmp_path / "t")
    victim = base_files(t)[0]
    damage(victim)
    written_by = os.path.basename(victim).rsplit("_", 1)[1].split(".")[0]
    with pytest.raises(CorruptFileError) as e:
        t.to_arrow()
    assert e.value.path == victim and e.value.instant == written_by
    assert "fsck" in str(e.value) and "--as-of" in str(e.value)
    with pytest.raises(CorruptFileError):
        t.compact()
    assert not t.context.timeline.pending(), "the compaction rolled itself back"
    out = run_cli("read", t.path)
    assert out.returncode == 2 and f"corrupt file {victim}" in out.stderr and "Traceback" not in out.stderr
    report = t.fsck()
    assert [(p.kind, p.path) for p in report.problems] == [("corrupt", victim)]


def test_a_missing_base_file_is_named(tmp_path):
    t = two_commits(tmp_path / "t")
    victim = base_files(t)[-1]
    os.rename(victim, victim + ".away")
    with pytest.raises(MissingFileError, match="missing file .*fsck"):
        t.to_arrow()
    assert [(p.kind, p.path) for p in t.fsck().problems] == [("missing", victim)]
    os.rename(victim + ".away", victim)
    assert t.fsck().healthy


def test_a_corrupt_log_is_named_and_reads_as_of_before_it_still_work(tmp_path):
    t = two_commits(tmp_path / "t")
    first = t.timeline()[0].time
    expected_then = sort_rows(t.to_arrow(as_of=first).to_pylist())
    log = sorted(glob.glob(f"{t.path}/p=a/.*.log.*"))[0]
    open(log, "r+b").truncate(os.path.getsize(log) // 2)
    with pytest.raises(CorruptFileError, match=f"corrupt file {log}.*written by instant .*--as-of"):
        t.to_arrow()
    assert sort_rows(t.to_arrow(as_of=first).to_pylist()) == expected_then


@pytest.fixture(scope="module")
def flip_table(tmp_path_factory):
    t = mt.Table.create(str(tmp_path_factory.mktemp("flip") / "t"), SCHEMA, "id", "p", "ts",
                        index=mt.IndexConfig(num_buckets=1))
    t.insert(pa.table({"id": list(range(3000)), "p": ["a"] * 3000, "v": [f"v{i % 37}" for i in range(3000)],
                       "ts": list(range(3000))}, schema=SCHEMA))
    path = base_files(t)[0]
    keys = pa.table({"id": [7, 1500, 2999], "p": ["a"] * 3})
    return t.path, path, open(path, "rb").read(), t.to_arrow().sort_by("id"), t.get(keys).sort_by("id"), keys


def rows_or_named_error(flip_table, position: int, bit: int) -> None:
    """A read of the base file with one bit flipped gives the rows written or a CorruptFileError naming it."""
    root, path, original, rows, got, keys = flip_table
    data = bytearray(original)
    data[position] ^= 1 << bit
    try:
        open(path, "wb").write(data)
        forget_footers()
        table = mt.Table.open(root)
        for read, expected in ((lambda: table.to_arrow().sort_by("id"), rows),
                               (lambda: table.get(keys).sort_by("id"), got)):
            try:
                assert read().equals(expected)
            except CorruptFileError as e:
                assert e.path == path
    finally:
        open(path, "wb").write(original)
        forget_footers()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_in_a_base_file_never_reads_wrong_rows(flip_table, position, bit):
    """Page checksums (written and verified), and the footer checked for what they cannot cover."""
    rows_or_named_error(flip_table, int(position * len(flip_table[2])), bit)


@pytest.mark.slow
def test_every_byte_of_the_footer_flipped_never_reads_wrong_rows(flip_table):
    """The footer has no checksum: column names and row counts are checked (before, 7 of its bytes flipped
    read a column of nulls and 1 dropped rows)."""
    original = flip_table[2]
    footer = int.from_bytes(original[-8:-4], "little") + 8
    for position in range(len(original) - footer, len(original) - 4):
        rows_or_named_error(flip_table, position, position % 8)


# -- the metadata table ------------------------------------------------------------------------------------
TABLES = {
    "bucket-mor": dict(index=mt.IndexConfig(num_buckets=2)),
    "bloom-global-cow": dict(table_type="copy_on_write", index=mt.IndexConfig(type="bloom", scope="global"),
                             metadata_indexes=["column_stats", "bloom_filter"]),
    "consistent-hashing": dict(index=mt.IndexConfig(engine="consistent_hashing", num_buckets=2),
                               options={"write.target_file_size": 4096, "bucket.split_threshold": 1.0}),
    "record-index": dict(index=mt.IndexConfig(type="record")),
}


def busy_history(t: mt.Table) -> None:
    """Commits, a compaction or clustering (a resize for consistent hashing), a clean, more commits."""
    t.upsert(batch(range(250, 400), "third", 3, ("a", "b", "c")))
    t.delete(batch(range(0, 30), "", 0).select(["id", "p"]))
    if t.config.index.consistent_hashing:
        assert t.cluster(), "a resize"
    elif t.config.merge_on_read:
        t.compact()
    t.upsert(batch(range(100, 130), "fourth", 4))
    t.clean()


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_a_corrupt_metadata_log_is_named_and_rebuild_restores_every_read(tmp_path, kind):
    t = two_commits(tmp_path / "t", **TABLES[kind])
    busy_history(t)
    rows = sort_rows(t.to_arrow().to_pylist())
    keys = pa.table({"id": [1, 50, 299, 333, 9999]})
    located = t.lookup(keys).sort_by("key").to_pylist()
    indexes = t.indexes()
    victim = sorted(glob.glob(f"{t.path}/.metatable/metadata/files/.*.log.*"))[-1]
    open(victim, "r+b").truncate(40)
    damaged = mt.Table.open(t.path)
    with pytest.raises(CorruptFileError, match=f"{victim}.*metatable metadata rebuild"):
        damaged.to_arrow()
    assert [p.path for p in damaged.fsck().problems] == [victim]

    report = damaged.rebuild_metadata()
    assert report.files == len(data_files_on_disk(damaged)) and not report.missing
    assert os.path.isdir(report.damaged)
    again = mt.Table.open(t.path)
    assert sort_rows(again.to_arrow().to_pylist()) == rows
    assert again.lookup(keys).sort_by("key").to_pylist() == located
    assert again.indexes() == indexes
    if kind == "consistent-hashing":
        assert [r["buckets"] for r in again.rings()] == [r["buckets"] for r in t.rings()]
    assert again.fsck().healthy
    check_metadata(again)
    again.upsert(batch([5, 1000], "after", 9))
    assert {r["id"]: r["v"] for r in again.to_arrow().to_pylist()}[1000] == "after"
    check_metadata(again)


@pytest.mark.parametrize("damaged", ["sst", "properties", "lost partition"])
def test_the_rebuild_command_restores_a_damaged_metadata_table(tmp_path, damaged):
    t = two_commits(tmp_path / "t")
    t.metadata.compact(force=True)
    rows = sort_rows(t.to_arrow().to_pylist())
    mdt = f"{t.path}/.metatable/metadata"
    if damaged == "sst":
        victim = glob.glob(f"{mdt}/files/*.sst")[0]
        data = bytearray(open(victim, "rb").read())
        data[len(data) // 3:len(data) // 3 + 40] = bytes(40)
        open(victim, "wb").write(data)
        with pytest.raises(CorruptFileError, match=f"{victim}.*metadata rebuild"):
            mt.Table.open(t.path).to_arrow()
        assert [p.path for p in mt.Table.open(t.path).fsck().problems] == [victim]
    elif damaged == "properties":
        open(f"{mdt}/.metatable/properties.json", "w").write("{not json")
        out = run_cli("read", t.path)
        assert out.returncode == 2 and "properties.json: not valid JSON" in out.stderr and "rebuild" in out.stderr
    else:
        shutil.rmtree(f"{mdt}/column_stats")
    out = run_cli("metadata", "rebuild", t.path)
    assert out.returncode == 0, out.stderr
    assert "rebuilt the metadata table" in out.stdout
    again = mt.Table.open(t.path)
    assert again.fsck().healthy and sort_rows(again.to_arrow().to_pylist()) == rows
    assert again.to_arrow(filter=[("ts", ">=", 2)]).num_rows == 100 and again.last_scan["skipped"] >= 0
    check_metadata(again)


def test_fsck_and_the_rebuild_command_on_both_storages(lake):
    """A lost data file is named by reads and fsck, and healthy again once restored; a damaged metadata log is
    a named error until `metatable metadata rebuild` (the CLI, on the table's URL) rebuilds the metadata table.
    The reads are another process's: one that has read the file keeps what it read of it on an object store
    (its name is never written again), and may answer from that."""
    t = two_commits(lake / "t")
    rows = sort_rows(t.to_arrow().to_pylist())
    storage, paths = t.storage, t.context.paths
    victim = next(paths.file(fs.partition, fs.base.file_name) for fs in t.file_slices().values() if fs.base)
    saved = storage.read(victim)
    storage.delete(victim)
    out = run_cli("read", t.path)
    assert out.returncode != 0 and re.search("missing file .*fsck", out.stderr), out.stderr
    assert [(p.kind, p.path) for p in mt.Table.open(t.path).fsck().problems] == [("missing", victim)]
    storage.write_atomic(victim, saved)  # restored from a backup
    assert mt.Table.open(t.path).fsck().healthy
    logs = f"{paths.metadata.root}/files"
    newest = max((n for n in storage.list(logs) if ".log." in n), key=lambda n: LogFile.parse(n).instant)
    storage.write_atomic(f"{logs}/{newest}", storage.read(f"{logs}/{newest}")[:40])  # a torn copy of it
    with pytest.raises(CorruptFileError, match="metadata rebuild"):
        mt.Table.open(t.path).to_arrow()
    out = run_cli("metadata", "rebuild", t.path)
    assert out.returncode == 0, out.stderr
    again = mt.Table.open(t.path)
    assert again.context.paths.metadata_dir.startswith("metadata-")
    assert again.fsck().healthy and sort_rows(again.to_arrow().to_pylist()) == rows
    check_metadata(again)
    again.upsert(batch([5, 1000], "after", 9))
    assert {r["id"]: r["v"] for r in mt.Table.open(t.path).to_arrow().to_pylist()}[1000] == "after"


def child(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.metatable.table_writer_child", *args], cwd=ROOT_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR, **env})


@pytest.mark.slow
def test_a_rebuild_killed_before_its_swap_leaves_the_old_metadata_in_use_and_is_swept(tmp_path):
    """The swap is one create-only pointer (no directory renames): killed before it, the rebuild's directory is
    named by nothing; the table keeps reading its old metadata table, and the sweep removes the half-built one."""
    t = two_commits(tmp_path / "t")
    rows = sort_rows(t.to_arrow().to_pylist())
    proc = child(t.path, "rebuild_metadata", "[]", METATABLE_CRASH_AT="rebuild.swap")
    assert proc.wait(120) == -signal.SIGKILL
    [built] = [n for n in os.listdir(f"{t.path}/.metatable") if n.startswith("metadata-")]
    again = mt.Table.open(t.path)
    assert again.context.paths.metadata_dir == "metadata"
    assert sort_rows(again.to_arrow().to_pylist()) == rows
    report = again.fsck(repair=True)
    assert f"{t.path}/.metatable/{built}/" in report.leftovers and report.healthy
    assert not os.path.exists(f"{t.path}/.metatable/{built}")
    again.rebuild_metadata()
    rebuilt = mt.Table.open(t.path)
    assert rebuilt.context.paths.metadata_dir.startswith("metadata-")
    assert os.path.exists(f"{t.path}/.metatable/metadata"), "the old one stays, for inspection"
    assert sort_rows(rebuilt.to_arrow().to_pylist()) == rows and rebuilt.fsck().healthy


@pytest.mark.slow
def test_a_writer_during_a_rebuild_waits_for_it_and_lands(tmp_path):
    t = two_commits(tmp_path / "t")
    rebuild = child(t.path, "rebuild_metadata", "[]", METATABLE_PAUSE_AT="rebuild.swap:3")
    time.sleep(1.5)
    writer = child(t.path, "upsert", json.dumps([{"id": 7, "p": "b", "v": "during", "ts": 5}]))
    for proc in (rebuild, writer):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    again = mt.Table.open(t.path)
    assert {(r["p"], r["id"]): r["v"] for r in again.to_arrow().to_pylist()}[("b", 7)] == "during"
    assert again.fsck().healthy
    check_metadata(again)


# -- the timeline -----------------------------------------------------------------------------------------
def test_the_timeline_refuses_forged_instants(tmp_path):
    t = two_commits(tmp_path / "t")
    timeline = f"{t.path}/.metatable/timeline"
    forged = f"{timeline}/20991231235959999.commit"
    open(forged, "w").write("{}")
    with pytest.raises(TimelineError, match=f"{forged} is dated 20991231235959999"):
        t.upsert(batch([1], "x", 9))
    os.remove(forged)
    half = f"{timeline}/20200101000000000.deltacommit"
    open(half, "w").write("{}")
    with pytest.raises(TimelineError, match=f"{half} has no requested state before it"):
        t.to_arrow()
    assert [p.kind for p in t.fsck().problems] == ["timeline"]
    os.remove(half)
    t.upsert(batch([1], "x", 9))
    commit = f"{timeline}/{t.timeline()[-1].time}.deltacommit"
    open(commit, "w").write("{torn")
    with pytest.raises(TimelineError, match=f"unreadable instant file {commit}.*restore it from a backup"):
        t.rebuild_metadata()  # replays every commit's metadata


# -- leftovers and services --------------------------------------------------------------------------------
@pytest.mark.slow
def test_fsck_repair_sweeps_what_dead_processes_left(tmp_path):
    t = two_commits(tmp_path / "t", options=FAST)
    rows = sort_rows(t.to_arrow().to_pylist())
    proc = child(t.path, "upsert", json.dumps([{"id": i, "p": "a", "v": "dead", "ts": 9} for i in range(40)]),
                 METATABLE_CRASH_AT="table.commit")
    assert proc.wait(120) == -signal.SIGKILL
    partition = f"{t.path}/p=a"
    staged = f"{partition}/.00000000-0_x_20200101000000000.parquet.tmp-abc"
    orphan = f"{partition}/00000009-0_feed_20200101000000000.parquet"
    for path in (staged, orphan):
        shutil.copyfile(base_files(t)[0], path)
    os.utime(staged, (time.time() - 7200, time.time() - 7200))
    time.sleep(0.3)
    report = mt.Table.open(t.path, options=FAST).fsck()
    assert {staged, orphan} <= set(report.leftovers) and report.healthy
    assert mt.Table.open(t.path, options=FAST).rollback()
    repaired = mt.Table.open(t.path, options=FAST).fsck(repair=True)
    assert repaired.repaired and not any(os.path.exists(p) for p in repaired.leftovers)
    assert not os.listdir(f"{t.path}/.metatable/markers")
    assert mt.Table.open(t.path).fsck().leftovers == ()
    assert sort_rows(mt.Table.open(t.path).to_arrow().to_pylist()) == rows


@pytest.mark.slow
def test_plain_rollback_recovers_a_killed_compaction_which_then_runs_again(tmp_path):
    t = two_commits(tmp_path / "t", options=FAST)
    rows = sort_rows(t.to_arrow().to_pylist())
    proc = child(t.path, "compact", "[]", json.dumps(FAST), METATABLE_CRASH_AT="table.compaction.files")
    assert proc.wait(120) == -signal.SIGKILL
    time.sleep(0.3)
    out = run_cli("rollback", t.path)
    assert out.returncode == 0 and "compaction: its process died; reset to requested, it runs again" in out.stdout
    again = mt.Table.open(t.path, options=FAST)
    assert [i.state.value for i in again.context.timeline.pending()] == ["requested"]
    assert again.compact() == again.context.timeline.completed()[-1].time
    assert not again.context.timeline.pending() and sort_rows(again.to_arrow().to_pylist()) == rows
    assert again.fsck().healthy


@pytest.mark.slow
@pytest.mark.parametrize("point", ["clean.deleting", "table.commit"])
def test_a_killed_clean_is_finished_and_leaks_nothing(tmp_path, point):
    t = two_commits(tmp_path / "t", options={**FAST, "clean.retain_commits": 1, "clean.inline": False})
    t.compact()
    t.upsert(batch(range(10), "third", 3))
    rows = sort_rows(t.to_arrow().to_pylist())
    proc = child(t.path, "clean", "[]", json.dumps(FAST), METATABLE_CRASH_AT=point)
    assert proc.wait(120) == -signal.SIGKILL
    time.sleep(0.3)
    again = mt.Table.open(t.path, options=FAST)
    assert [i.action.value for i in again.context.timeline.pending()] == ["clean"]
    again.upsert(batch([1], "after", 9))  # the next writer's recovery finishes it
    assert not again.context.timeline.pending()
    check_metadata(again)
    assert again.fsck().healthy and not again.fsck().leftovers
    assert sort_rows(again.to_arrow().to_pylist()) == sort_rows(
        [r for r in rows if (r["p"], r["id"]) != ("b", 1)] + [{"id": 1, "p": "b", "v": "after", "ts": 9}])
    assert not again.context.metadata.timeline.pending(), "metadata compaction is not held up"
