"""The transaction and the service lifecycle at their own level: a bare timeline, a recording undo."""
from __future__ import annotations

import os
import time

import pytest

from metatable.errors import TimelineError
from metatable.storage.local import LocalStorage
from metatable.timeline.instant import Action, State
from metatable.timeline.lifecycle import Service, run_due, run_scheduled
from metatable.timeline.timeline import Timeline
from metatable.timeline.transaction import Transactions


class RecordingUndo:
    def __init__(self):
        self.undone = []

    def describe(self, target):
        return {"committed": False, "state": target.state.value}

    def undo(self, plan, by):
        self.undone.append(plan["target"])
        return {"undone": True}


@pytest.fixture
def tx(tmp_path):
    # A live writer's beats may stall for a few hundred milliseconds on a loaded machine (CI, with Spark beside):
    # expiry at 0.5 s, not 0.1 s (CI's run of 2026-12-02 had a beating instant judged dead at 0.1 s).
    timeline = Timeline(LocalStorage(), str(tmp_path / "t"), heartbeat_interval_s=0.1, heartbeat_misses=5)
    finished = []
    t = Transactions(timeline, RecordingUndo(), name="test", writes=[Action.COMMIT], services=[Action.COMPACTION],
                     roll_forward={Action.CLEAN: lambda i: (finished.append(i.time), timeline.complete(
                         timeline.start(i) if i.state is State.REQUESTED else i, {}))})
    t.finished = finished
    return t


def expire():
    time.sleep(0.6)


def test_begin_and_commit(tx):
    instant = tx.begin(Action.COMMIT, {"operation": "upsert"})
    assert instant.state is State.INFLIGHT and tx.timeline.plan(instant) == {"operation": "upsert"}
    done = tx.commit(instant, content={"files": ["a"]})
    assert done.is_completed and tx.timeline.read_json(done) == {"files": ["a"]}
    with pytest.raises(TimelineError, match="already completed"):
        tx.commit(instant)


def test_failure_inside_running_rolls_back(tx):
    instant = tx.begin(Action.COMMIT)
    with pytest.raises(RuntimeError):
        with tx.running(instant):
            raise RuntimeError("boom")
    assert tx.timeline.get(instant.time, Action.COMMIT) is None
    assert tx.undo.undone == [instant.time]
    rollback = tx.timeline.completed([Action.ROLLBACK])[0]
    assert tx.timeline.read_json(rollback)["target"] == instant.time
    with pytest.raises(TimelineError, match="gone"):
        tx.commit(instant)


def test_recover_rolls_back_dead_writes_only(tx):
    dead = tx.begin(Action.COMMIT)
    expire()
    alive = tx.begin(Action.COMMIT)  # begin recovers first: `dead` is rolled back
    assert tx.timeline.get(dead.time) is None and tx.undo.undone == [dead.time]
    with tx.running(alive):
        expire()
        assert tx.recover() == {}  # still beating
    assert tx.timeline.get(alive.time).state is State.INFLIGHT


def test_recover_finishes_an_interrupted_rollback(tx):
    target = tx.begin(Action.COMMIT)
    tx.timeline.request(Action.ROLLBACK, plan={"target": target.time, "action": "commit", "committed": False})
    tx.recover()
    assert tx.timeline.get(target.time, Action.COMMIT) is None and tx.undo.undone == [target.time]
    assert not tx.timeline.pending()


def test_dead_service_goes_back_to_requested_and_roll_forward_finishes(tx):
    service = tx.schedule(Action.COMPACTION, {"file_groups": ["g"]})
    assert tx.claim(service).state is State.INFLIGHT
    clean = tx.begin(Action.CLEAN, {"delete": ["x"]})
    expire()
    tx.recover()
    assert tx.timeline.get(service.time).state is State.REQUESTED
    assert tx.timeline.plan(service) == {"file_groups": ["g"]}, "the plan is kept"
    assert tx.undo.undone == [service.time], "its partial work is undone"
    assert tx.finished == [clean.time] and tx.timeline.get(clean.time).is_completed


def test_a_scheduled_plan_is_claimed_once(tx):
    instant = tx.schedule(Action.COMPACTION, {"g": 1})
    assert tx.timeline.get(instant.time).state is State.REQUESTED
    assert tx.claim(instant) is not None
    assert tx.claim(instant) is None, "inflight: another process runs it"
    expire()
    tx.recover()  # its process died: back to requested; the late process may no longer commit it
    with pytest.raises(TimelineError, match="back to requested"):
        tx.commit(instant.to(State.INFLIGHT))


def service(tx, plans, executed, out_dir):
    """A service whose execution writes a file named by its plan (idempotent) and commits; its planning only
    reads (`run_due` plans once without the lock, then under it), what is due goes when it is executed."""
    def execute(instant, plan):
        if plan in plans:
            plans.remove(plan)
        executed.append(instant.time)
        path = os.path.join(out_dir, f"{plan['name']}-{instant.time}")
        with open(path, "w") as f:
            f.write("done")
        return tx.commit(instant, content={"wrote": path}).time

    return Service(Action.COMPACTION, lambda: plans[0] if plans else None, execute)


def test_run_due_plans_runs_and_skips(tx, tmp_path):
    executed = []
    plans = [{"name": "a"}]
    run = run_due(tx, service(tx, plans, executed, tmp_path))
    assert run.instant is not None and run.result == run.instant.time and executed == [run.instant.time]
    assert run_due(tx, service(tx, plans, executed, tmp_path)).instant is None  # nothing due
    other = tx.schedule(Action.COMPACTION, {"name": "b"})
    tx.claim(other)  # another process runs it, beating
    with tx.running(other):
        skipped = run_due(tx, service(tx, [{"name": "c"}], executed, tmp_path))
        assert skipped.instant is None and skipped.running_elsewhere.time == other.time
    assert len(executed) == 1


def test_an_interrupted_service_runs_again_idempotently(tx, tmp_path):
    executed = []
    instant = tx.schedule(Action.COMPACTION, {"name": "x"})
    claimed = tx.claim(instant)
    path = os.path.join(tmp_path, f"x-{instant.time}")
    open(path, "w").write("half")  # its process wrote part of its output, then died
    expire()
    run = run_scheduled(tx, service(tx, [], executed, tmp_path), claimed)
    assert run.instant.time == instant.time and executed == [instant.time]
    assert open(path).read() == "done" and sorted(os.listdir(tmp_path)).count(f"x-{instant.time}") == 1
    assert tx.timeline.get(instant.time).is_completed


def test_a_failed_service_is_rolled_back(tx, tmp_path):
    def fail(instant, plan):
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        run_due(tx, Service(Action.COMPACTION, lambda: {"n": 1}, fail))
    assert not tx.timeline.pending([Action.COMPACTION])
    assert len(tx.timeline.completed([Action.ROLLBACK])) == 1 and len(tx.undo.undone) == 1
