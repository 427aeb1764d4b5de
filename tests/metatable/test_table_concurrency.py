"""Real processes writing one table: conflicts, disjoint writers, and a SIGKILLed writer."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import metatable as mt
from metatable.file_group.before_images import instants_with_images

from .table_model import SCHEMA, TableModel, check_metadata, data_files_on_disk, sort_rows
from .test_storage import stopped, wait_until_stopped
from .test_write_concurrency import held_at, wait_held

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2, "lock.lease_s": 2.0}


def rows(ids, p, v, ts=1):
    return [{"id": i, "p": p, "v": v, "ts": ts} for i in ids]


def start(root, operation, data, options=None, **env):
    return subprocess.Popen([sys.executable, "-m", "tests.metatable.table_writer_child", root, operation,
                             json.dumps(data), json.dumps(options or {})], cwd=ROOT_DIR, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT_DIR, **env})


@pytest.fixture(params=["merge_on_read", "copy_on_write"])
def table(lake, request):
    """On both storages. A writer killed holding the lock holds it on an object store until its lease runs out
    (2 s here; 60 s by default)."""
    t = mt.Table.create(lake / "t", SCHEMA, "id", "p", "ts", table_type=request.param,
                        index=mt.IndexConfig(num_buckets=1), options={"lock.lease_s": 2.0})
    t.upsert(pa.Table.from_pylist(rows(range(5), "a", "seed") + rows(range(5), "b", "seed"), schema=SCHEMA))
    return t


@pytest.mark.slow
@pytest.mark.parametrize("retries", [0, 5])
def test_writers_of_the_same_file_group(table, tmp_path, retries):
    """Copy-on-write: the first to commit wins; the loser's files are gone, and it runs again from the new
    snapshot (`write.conflict_retries`) or, with no retries, fails with the conflict. Merge-on-read on a bucket
    index: both commit (non-blocking). Either way a tie on the ordering field goes to the later completed
    commit (the slow one)."""
    go = tmp_path / "go"
    slow = start(table.path, "upsert", rows([1, 7], "a", "slow", 5), {"write.conflict_retries": retries},
                 **held_at("table.write.files", go))
    wait_held(slow, go)
    fast = start(table.path, "upsert", rows([1, 8], "a", "fast", 5))
    assert fast.wait(60) == 0, fast.stderr.read()
    go.touch()
    model = TableModel(True)
    model.apply("upsert", rows(range(5), "a", "seed") + rows(range(5), "b", "seed"))
    model.apply("upsert", rows([1, 8], "a", "fast", 5))
    if table.config.merge_on_read or retries:
        assert slow.wait(60) == 0, slow.stdout.read() + slow.stderr.read()
        model.apply("upsert", rows([1, 7], "a", "slow", 5))
    else:
        assert slow.wait(60) == 3, slow.stdout.read() + slow.stderr.read()
        assert "conflicts with" in slow.stdout.read()
    reopened = mt.Table.open(table.path)
    assert sort_rows(reopened.to_arrow().to_pylist()) == model.expected()
    check_metadata(reopened)  # the loser's files are gone from disk too
    assert not reopened.context.timeline.pending()


@pytest.mark.parametrize("table_type,index", [("merge_on_read", "bucket"), ("copy_on_write", "bucket"),
                                              ("copy_on_write", "bloom"), ("merge_on_read", "record")])
def test_a_delete_of_a_key_that_a_write_completing_first_stored_removes_it(tmp_path, table_type, index):
    """A delete of key 9 begins while the table does not hold it, and stops (SIGSTOP) after writing its files
    (none); an upsert then stores 9 and commits. The delete completes last, so 9 is gone. Merge-on-read on a
    bucket index writes the delete marker of 9 all the same (logs are ordered by completion); elsewhere the
    delete wrote nothing that would order it after the upsert (copy-on-write, or an index that found 9
    nowhere), its commit finds 9 stored by the concurrent write and fails, and its retry deletes 9. A chaos
    run found such a delete dropped as a delete of an absent key, and the key stored. The record index (kept
    by every commit here) says 9 is nowhere: its entries merge in completion order, as the data does."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", table_type=table_type,
                            index=mt.IndexConfig(type=index, num_buckets=1),
                            metadata_indexes=["column_stats", "record_index",
                                              *(["bloom_filter"] if index == "bloom" else [])])
    seed = rows(range(5), "a", "seed")
    table.upsert(pa.Table.from_pylist(seed, schema=SCHEMA))
    delete = start(table.path, "delete", rows([9], "a", "gone"), METATABLE_STOP_AT="table.write.files")
    wait_until_stopped(delete)
    upsert = start(table.path, "upsert", rows([9], "a", "stored", 5))
    assert upsert.wait(60) == 0, upsert.stderr.read()
    while delete.poll() is None:  # a retry stops at the same point again
        if stopped(delete.pid):
            os.kill(delete.pid, signal.SIGCONT)
        time.sleep(0.05)
    assert delete.returncode == 0, delete.stdout.read() + delete.stderr.read()
    model = TableModel(True)
    model.apply("upsert", seed)
    model.apply("upsert", rows([9], "a", "stored", 5))
    model.apply("delete", rows([9], "a", "gone"))
    reopened = mt.Table.open(table.path)
    assert sort_rows(reopened.to_arrow().to_pylist()) == model.expected()
    check_metadata(reopened)
    keys = pa.table({"id": pa.array([9, 4], SCHEMA.field("id").type), "p": ["a", "a"]})
    assert [f is not None for f in reopened.lookup(keys, using="metadata")["file_id"].to_pylist()] == [False, True]


@pytest.mark.slow
def test_disjoint_writers_both_commit(table, tmp_path):
    go = tmp_path / "go"
    a = start(table.path, "upsert", rows([1, 7], "a", "A", 5), **held_at("table.write.files", go))
    wait_held(a, go)
    b = start(table.path, "upsert", rows([2, 9], "b", "B", 5))
    assert b.wait(60) == 0, b.stderr.read()
    go.touch()
    assert a.wait(60) == 0, a.stderr.read()
    got = {(r["p"], r["id"]): r["v"] for r in mt.Table.open(table.path).to_arrow().to_pylist()}
    assert got[("a", 1)] == "A" and got[("a", 7)] == "A" and got[("b", 2)] == "B" and got[("b", 9)] == "B"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["table.write.files", "table.commit.metadata", "metadata.write.log"])
def test_killed_writer_is_rolled_back_by_the_next(table, point):
    before = sort_rows(table.to_arrow().to_pylist())
    files_before = data_files_on_disk(table)
    victim = start(table.path, "upsert", rows([1, 2, 3, 40], "a", "dead", 9), {"changes.before_images": True},
                   METATABLE_CRASH_AT=point)
    assert victim.wait(60) == -signal.SIGKILL
    assert sort_rows(mt.Table.open(table.path).to_arrow().to_pylist()) == before  # nothing half-visible
    time.sleep(0.3)
    survivor = mt.Table.open(table.path, options=FAST)
    survivor.upsert(pa.Table.from_pylist(rows([4], "b", "after", 9), schema=SCHEMA))
    assert not survivor.context.timeline.pending()
    got = sort_rows(survivor.to_arrow().to_pylist())
    assert [r for r in got if r["v"] == "dead"] == []
    assert {(r["p"], r["id"]): r["v"] for r in got}[("b", 4)] == "after"
    check_metadata(survivor)
    assert data_files_on_disk(survivor) - files_before, "the next writer's files"
    assert any(i.action.value == "rollback" for i in survivor.timeline())
    assert instants_with_images(survivor.context.storage, survivor.context.paths) == [], "the rollback removed them"
