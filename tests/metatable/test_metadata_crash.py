"""SIGKILL a separate process mid-commit, mid-compaction and mid-rollback; nothing committed is lost."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from metatable.metadata.table import MetadataTable
from metatable.timeline.instant import Action

from .crash_child import batch
from .models import Model

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTITIONS = {"files": 3, "column_stats": 2}
FAST = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2}


def spawn(root, journal, n, crash_at=None, mode=""):
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}
    env.pop("METATABLE_CRASH_AT", None)
    if crash_at:
        env["METATABLE_CRASH_AT"] = crash_at
    return subprocess.Popen([sys.executable, "-m", "tests.metatable.crash_child", root, journal, str(n), *([mode] if mode else [])],
                            env=env, cwd=ROOT_DIR)


def model_of_completed(root, journal) -> Model:
    mdt = MetadataTable.open(root)
    done = {i.time for i, _ in mdt.timeline.history([Action.DELTACOMMIT])}  # archived ones too
    model = Model()
    for line in open(journal).read().split("\n"):
        if line:
            i, t = line.split()
            if t in done:
                model.commits[t] = batch(int(i))
    return model


def check(mdt, model):
    for partition in PARTITIONS:
        assert dict(mdt.scan(partition)) == model.expected(partition), partition


def recover_and_continue(root, journal):
    model = model_of_completed(root, journal)
    check(MetadataTable.open(root, options=FAST), model)  # before any recovery: only completed commits
    time.sleep(0.2)  # let the dead writer's heartbeat expire
    mdt = MetadataTable.open(root, options=FAST)
    extra = batch(99)
    model.commits[mdt.commit(extra)] = extra  # recovers (rolls back the dead instant), then commits
    assert not mdt.timeline.pending([Action.DELTACOMMIT, Action.ROLLBACK, Action.CLEAN])
    check(mdt, model)
    mdt.compact(force=True)  # resumes or redoes whatever compaction was cut short
    assert not mdt.timeline.pending()
    check(mdt, model)
    check(MetadataTable.open(root), model)


@pytest.fixture
def table(tmp_path):
    root = str(tmp_path / "m")
    MetadataTable.create(root, PARTITIONS, options={"metadata.compact.max_delta_commits": 3})
    return root, str(tmp_path / "journal")


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", [
    "metadata.write.log:1", "metadata.write.log:4", "metadata.write.log:9",
    "metadata.complete:1", "metadata.complete:4",
    "metadata.compaction.file_group:1", "metadata.compaction.file_group:3",
    "metadata.compaction.file_group:6",
])
def test_kill_at_crash_point(table, crash_at):
    root, journal = table
    proc = spawn(root, journal, 8, crash_at)
    assert proc.wait(timeout=120) == -signal.SIGKILL, "the crash point was never reached"
    recover_and_continue(root, journal)


@pytest.mark.slow
def test_kill_mid_rollback(table):
    root, journal = table
    proc = spawn(root, journal, 6, "metadata.rollback:1", mode="rollback")
    assert proc.wait(timeout=120) == -signal.SIGKILL
    recover_and_continue(root, journal)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_kill_at_random_moments(table, seed):
    root, journal = table
    proc = spawn(root, journal, 10_000)
    deadline = time.monotonic() + 60
    while not os.path.exists(journal):  # the child has begun its first commit (its start-up takes its time)
        assert proc.poll() is None and time.monotonic() < deadline, "the child ended before its first commit"
        time.sleep(0.01)
    time.sleep(random.Random(seed).uniform(0.0, 1.7))
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    recover_and_continue(root, journal)
