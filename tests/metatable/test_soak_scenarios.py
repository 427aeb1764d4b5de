"""The soak's findings (issue 41), each a deterministic scenario: everything at once must never block, lose or
answer wrongly. Each test failed on the code the soak ran against."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import metatable as mt
from metatable.errors import SnapshotExpiredError
from metatable.read import reads
from metatable.read.key_lookup import get_rows
from metatable.timeline.instant import Action

from .table_model import SCHEMA
from .test_clustering import loaded, snapshot
from .test_write_concurrency import ROOT_DIR, act, finished
from .test_write_concurrency import rows as row_dicts

KEYS = 400


def rows(ids, v: str = "x", ts: int = 1) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "p": "ab"[i % 2], "v": v, "ts": ts} for i in ids], schema=SCHEMA)


def keys(ids) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "p": ["ab"[i % 2] for i in ids]})


def indexed_table(path, index: mt.IndexConfig | None = None, **options) -> mt.Table:
    t = mt.Table.create(str(path), SCHEMA, ["id"], ["p"], "ts", index=index or mt.IndexConfig(num_buckets=2),
                        metadata_indexes=["column_stats", "bloom_filter", "record_index"], options=options)
    t.upsert(rows(range(KEYS)))
    return t


# -- 2. a dropped index ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dropped", ["record_index", "bloom_filter"])
def test_a_long_lived_handle_stops_using_an_index_another_process_dropped(tmp_path, dropped):
    path = tmp_path / "t"
    indexed_table(path)
    reader = mt.Table.open(str(path))  # opened while every index is ready
    assert reader.get(keys(range(0, KEYS, 4))).num_rows == KEYS // 4
    mt.Table.open(str(path)).drop_index(dropped)
    assert reader.get(keys(range(0, KEYS, 4))).num_rows == KEYS // 4
    for using in ("index", "metadata"):
        found, report = reader.lookup(keys(range(KEYS)), explain=True, using=using)
        assert found["file_id"].null_count == 0, using
        assert report["index"] != dropped
    assert dropped not in reader.indexes()


def test_a_read_that_an_index_drop_overtakes_reads_again_without_it(tmp_path):
    path = tmp_path / "t"
    indexed_table(path)
    reader, dropper = mt.Table.open(str(path)), mt.Table.open(str(path))
    wanted = keys(range(0, KEYS, 3))
    seen = []

    def read(view):
        seen.append(view)
        if len(seen) == 1:  # the drop lands while this read runs: states first, then the files go
            dropper.drop_index("record_index")
        return get_rows(reader.context, reader.metadata_index, wanted, view)

    got = reader.context.read_view(read)
    assert got.num_rows == wanted.num_rows
    assert sorted(got["id"].to_pylist()) == sorted(wanted["id"].to_pylist())
    assert [("record_index" in v.config.metadata_indexes) for v in seen] == [True, False]


# -- 1. an index built from a cleaned snapshot ----------------------------------------------------------------
def test_an_indexing_left_pending_keeps_its_snapshot_from_clean_and_builds_every_key(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                        options={"clean.retain_commits": 1, "clean.inline": False})
    t.upsert(rows(range(KEYS)))
    t.upsert(rows(range(0, KEYS, 2), "y", 2))
    indexing = t.schedule_indexing(["record_index"])  # builds from the snapshot as of the last upsert
    t.upsert(rows(range(1, KEYS, 2), "z", 3))
    assert t.compact()
    t.upsert(rows(range(0, KEYS, 5), "w", 4))
    t.clean()  # the compaction superseded the snapshot the indexing builds from: clean keeps it all the same
    assert t.run_indexing() == [indexing]
    assert t.indexes()["record_index"] == "ready"
    found = t.lookup(keys(range(KEYS)))
    assert found["file_id"].null_count == 0
    assert t.get(keys(range(KEYS))).num_rows == KEYS
    assert t.clean()  # once the indexing completed, clean catches up


def test_an_indexing_whose_snapshot_is_gone_aborts_instead_of_marking_an_incomplete_index_ready(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                        options={"clean.retain_commits": 1, "clean.inline": False})
    t.upsert(rows(range(KEYS)))
    old = t.upsert(rows(range(KEYS), "y", 2)).instant
    t.compact()
    t.upsert(rows(range(0, KEYS, 2), "z", 3))
    assert t.clean()
    with pytest.raises(mt.MetatableError):  # a hand-made plan as of a cleaned snapshot (no schedule picks one)
        from metatable.services.index_build import build
        build(t.context, "20990101000000000", {"record_index": 2}, old)
    with pytest.raises(SnapshotExpiredError, match="readable"):
        t.to_arrow(as_of=old)


# -- 6. a compaction that completes late ----------------------------------------------------------------------
def test_a_late_compaction_keeps_the_slices_it_supersedes_for_retain_commits_completions(tmp_path):
    retain = 2
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                        options={"clean.retain_commits": retain, "clean.inline": False, "compaction.mode": "off"})
    t.upsert(rows(range(KEYS)))
    t.upsert(rows(range(0, KEYS, 2), "y", 2))
    compaction = t.schedule_compaction()  # requested now, completed only after more than `retain` commits
    for ts in range(3, 3 + retain + 2):
        t.upsert(rows(range(ts, KEYS, 7), f"v{ts}", ts))
    expected = sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])
    reader = mt.Table.open(t.path)
    # a read that began before the compaction completed
    plan = reads.scan_plan(reader.context, reader.metadata_index)
    assert t.run_compaction() == [compaction]
    t.clean()
    got = reads.to_arrow(reader.context, plan)
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == expected
    for ts in range(10, 10 + retain):  # `retain` completions after the compaction: now its old slices may go
        t.upsert(rows([ts], f"v{ts}", ts))
    assert t.clean()
    assert mt.Table.open(t.path).fsck().healthy


# -- 7. time travel past what clean kept ----------------------------------------------------------------------
def test_time_travel_past_the_clean_horizon_is_a_named_error_that_says_what_is_readable(tmp_path, capsys):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                        options={"clean.retain_commits": 1, "clean.inline": False})
    first = t.upsert(rows(range(KEYS))).instant
    t.upsert(rows(range(KEYS), "y", 2))
    t.compact()
    last = t.upsert(rows(range(0, KEYS, 2), "z", 3)).instant
    assert t.clean()
    with pytest.raises(SnapshotExpiredError) as e:
        t.to_arrow(as_of=first)
    assert first in str(e.value) and "or later are readable" in str(e.value) and last in str(e.value)
    assert t.to_arrow(as_of=last).num_rows == KEYS
    from metatable import cli
    assert cli.main(["read", t.path, "--as-of", first]) != 0
    err = capsys.readouterr().err
    assert "or later are readable" in err and "Traceback" not in err


# -- 3. a killed clustering ----------------------------------------------------------------------------------
def killed_clustering(table: mt.Table, options: dict) -> str:
    """A clustering of `table` scheduled here and killed by SIGKILL mid-run in another process; its
    heartbeat has expired when this returns."""
    instant = mt.Table.open(table.path, options=options).schedule_clustering()
    assert instant is not None
    code, out, err = finished(act(table.path, "run_clustering", [], options, METATABLE_CRASH_AT="table.clustering.files"))
    assert code == -signal.SIGKILL, out + err
    time.sleep(0.6)
    return instant


@pytest.mark.parametrize("recover_by", ["write", "rollback", "cluster"])
def test_a_killed_clustering_never_blocks_writers(tmp_path, recover_by, capsys):
    table, model = loaded(str(tmp_path / "t"))
    options = {"write.target_file_size": 1 << 20}
    dead = killed_clustering(table, options)
    fresh = mt.Table.open(table.path, options=options)
    if recover_by == "write":  # a write to the dead clustering's file groups wins over it
        batch = row_dicts(range(0, 300, 7), "a", "late", 9)
        fresh.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        model.apply("upsert", batch)
    elif recover_by == "rollback":
        from metatable import cli
        assert cli.main(["rollback", table.path]) == 0
        assert dead in capsys.readouterr().out
    else:
        assert fresh.cluster() is not None
    assert not [i for i in fresh.context.timeline.instants() if i.time == dead and not i.is_completed]
    assert snapshot(fresh) == model.expected()
    assert fresh.cluster() is not None or recover_by == "cluster"  # the next clustering runs
    batch = row_dicts(range(0, 300, 5), "a", "after", 10)
    fresh.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    model.apply("upsert", batch)
    assert snapshot(fresh) == model.expected()


def test_cluster_runs_a_pending_resize_before_planning_anew(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts",
                        index=mt.IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=2),
                        options={"write.target_file_size": 2048, "heartbeat.interval_s": 0.1,
                                 "heartbeat.tolerable_misses": 3})
    t.upsert(rows(range(2000)))
    resize = t.schedule_clustering()
    assert resize is not None
    assert t.cluster() == resize or resize in [i.time for i in t.context.timeline.completed()]
    assert not t.context.timeline.pending([Action.REPLACECOMMIT])
    assert t.to_arrow().num_rows == 2000


# -- 4. a partition value too long for a path -----------------------------------------------------------------
def test_a_partition_value_too_long_for_a_path_is_refused_before_anything_is_written(tmp_path):
    t = indexed_table(tmp_path / "t")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "t").rglob("*") if ".metatable" not in p.parts)
    bad = pa.Table.from_pylist([{"id": 1, "p": "x" * 300, "v": "v", "ts": 1}], schema=SCHEMA)
    for write in (t.upsert, t.insert, t.bulk_insert):
        with pytest.raises(mt.MetatableError, match="too long for a path"):
            write(bad)
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "t").rglob("*") if ".metatable" not in p.parts)
    assert after == before
    assert not t.context.timeline.pending()
    t.upsert(rows(range(10), "after", 2))  # the table goes on: writes, services, recovery
    assert t.compact() and t.rollback() == {} and t.fsck().healthy
    assert t.get(keys(range(10)))["v"].to_pylist() == ["after"] * 10


# -- 9. a null partition value ---------------------------------------------------------------------------------
def test_a_null_partition_value_and_the_string_that_names_nulls_are_two_partitions(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2))
    t.upsert(pa.Table.from_pylist([{"id": 1, "p": None, "v": "null", "ts": 1},
                                   {"id": 1, "p": "__null__", "v": "text", "ts": 1}], schema=SCHEMA))
    got = sorted(t.to_arrow().to_pylist(), key=lambda r: r["v"])
    assert [(r["p"], r["v"]) for r in got] == [(None, "null"), ("__null__", "text")]
    assert len(t.partitions()) == 2
    t.delete(pa.table({"id": [1], "p": pa.array([None], pa.string())}))
    assert [(r["p"], r["v"]) for r in t.to_arrow().to_pylist()] == [("__null__", "text")]


# -- 5. a delete across file groups after a concurrent write -------------------------------------------------
@pytest.mark.parametrize("index", ["bloom", "record"])
def test_a_delete_in_several_file_groups_commits_after_a_concurrent_write(tmp_path, index):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(type=index),
                        metadata_indexes=["column_stats", "bloom_filter", *(["record_index"] if index == "record" else [])],
                        options={"write.target_file_size": 1024, "heartbeat.interval_s": 0.1})
    for start in range(0, 200, 50):  # small files: each insert opens new file groups
        t.upsert(rows(range(start, start + 50)))
    groups = {fid for (p, fid) in t.file_slices() if p == "p=a"}
    assert len(groups) >= 2
    deleted = [i for i in range(0, 200, 2) if i % 4 == 0]  # partition a, in every file group
    delete = act(t.path, "delete", [{"id": i, "p": "a", "v": None, "ts": 0} for i in deleted],
                 {"heartbeat.interval_s": 0.1}, METATABLE_PAUSE_AT="table.write.files:1.5")
    time.sleep(0.8)  # the delete has written its logs and waits to commit
    t.upsert(rows(range(1000, 1010), "new", 5))  # a concurrent write completes first
    code, out, err = finished(delete)
    assert code == 0, out + err
    ids = set(mt.Table.open(t.path).to_arrow()["id"].to_pylist())
    assert ids == (set(range(200)) - set(deleted)) | set(range(1000, 1010))


# -- 8. raw errors where named ones belong ---------------------------------------------------------------------
@pytest.mark.parametrize("index", [mt.IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=2),
                                   mt.IndexConfig(type="bloom"), mt.IndexConfig(), mt.IndexConfig(type="record")])
def test_an_empty_write_commits_nothing_on_every_index(tmp_path, index):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=index,
                        metadata_indexes=["column_stats", "bloom_filter"])
    for _ in ("empty", "with rows"):
        for write in (t.upsert, t.insert, t.bulk_insert):
            assert write(SCHEMA.empty_table()).files_written == 0
        assert t.delete(keys([])).deleted == 0
        t.upsert(rows(range(10)))
    assert t.to_arrow().num_rows == 10


def storage_fault(tmp_path, kind: str) -> dict[str, dict]:
    """The steps of `storage_child` KIND on a small tmpfs of its own mount namespace, by name."""
    root = tmp_path / "mnt"
    root.mkdir()
    script = (f"mount -t tmpfs -o size=6m tmpfs {root} && exec {sys.executable} -m tests.metatable.storage_child "
              f"{root} {kind}")
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], cwd=ROOT_DIR, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {s["step"]: s for s in steps}


def test_a_full_disk_fails_a_write_by_name_and_loses_nothing(tmp_path):
    steps = storage_fault(tmp_path, "full")
    failed = [s for s in steps.values() if s["step"].startswith("upsert ") and "error" in s]
    assert len(failed) == 1, steps
    assert failed[0]["error"] == "StorageError" and "disk is full" in failed[0]["message"], failed
    assert int(failed[0]["step"].split()[1]) >= 2, "some writes fit before the disk filled"
    for step in ("acknowledged writes only", "rollback after freeing space", "upsert after freeing space", "after",
                 "fsck"):
        assert steps[step].get("ok") is True, steps[step]


def test_a_read_only_table_reads_and_refuses_every_write_by_name(tmp_path):
    steps = storage_fault(tmp_path, "readonly")
    for name in ("upsert", "delete", "compact", "clean", "cluster", "rollback", "schedule_indexing", "drop_index",
                 "rebuild_metadata", "fsck --repair"):
        assert steps[name].get("error") == "StorageError" and "read-only" in steps[name]["message"], steps[name]
    for name in ("get", "lookup", "fsck", "reads"):
        assert steps[name].get("ok") is True, steps[name]
    assert steps["cli upsert"]["code"] == 2


def test_a_write_whose_after_commit_services_fail_returns_and_is_visible(tmp_path, monkeypatch, caplog):
    """The services after a commit run once it is durable: their failure is logged, not the write's."""
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                        options={"compaction.inline_every": 1})
    t.upsert(rows(range(10)))

    def failing(context):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("metatable.services.compaction.compact", failing)
    result = t.upsert(rows(range(5), "after", 2))
    assert result.updated == 5
    assert sorted(r["v"] for r in mt.Table.open(t.path).to_arrow().to_pylist()).count("after") == 5
    assert "runs again later" in caplog.text
