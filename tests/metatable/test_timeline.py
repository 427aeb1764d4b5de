import multiprocessing as mp
import os
import tempfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metatable.errors import TimelineError
from metatable.storage.local import LocalStorage
from metatable.timeline.instant import Action
from metatable.timeline.timeline import Timeline


def make(path, **kw):
    return Timeline(LocalStorage(), str(path), **kw)


def test_transitions_and_metadata(tmp_path):
    tl = make(tmp_path)
    i = tl.request(Action.COMMIT, plan={"a": 1})
    assert tl.pending() == [i]
    with pytest.raises(TimelineError):
        tl.complete(i)  # requested -> completed skips inflight
    i = tl.start(i)
    c = tl.complete(i, {"written": 3})
    assert tl.completed() == [c]
    assert tl.read_json(c) == {"written": 3}
    assert tl.plan(c) == {"a": 1}
    names = sorted(os.listdir(tmp_path / ".metatable" / "timeline"))
    assert names == [f"{c.time}.commit", f"{c.time}.commit.inflight", f"{c.time}.commit.requested"]


def test_stray_file_is_named(tmp_path):
    tl = make(tmp_path)
    tl.request(Action.COMMIT)
    (tmp_path / ".metatable" / "timeline" / "garbage.commit").write_text("")
    with pytest.raises(TimelineError, match="garbage.commit"):
        tl.instants()


def test_a_future_dated_instant_is_refused(tmp_path):
    """A forged file would date every later instant after it: it is named and nothing of it is read."""
    tl = make(tmp_path)
    tl.complete(tl.start(tl.request(Action.COMMIT)))
    forged = tmp_path / ".metatable" / "timeline" / "20991231235959999.commit"
    forged.write_text("{}")
    with pytest.raises(TimelineError, match="20991231235959999.commit.*dated 20991231235959999"):
        tl.instants()
    with pytest.raises(TimelineError, match="forged"):
        tl.request(Action.COMMIT)
    forged.unlink()
    later = tl.request(Action.COMMIT)
    assert later.time < "2099" and len(tl.instants()) == 2


def _make_instants(path, n, out):
    tl = make(path)
    out.put([tl.request(Action.DELTACOMMIT).time for _ in range(n)])


def test_instant_times_unique_across_processes(tmp_path):
    q = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=_make_instants, args=(str(tmp_path), 30, q)) for _ in range(3)]
    for p in procs:
        p.start()
    times = [t for _ in procs for t in q.get(timeout=60)]
    for p in procs:
        p.join()
    assert len(set(times)) == 90
    assert [i.time for i in make(tmp_path).instants()] == sorted(times)


def test_heartbeat_expiry(tmp_path):
    """Expiry after 10 missed beats of 0.1 s: a 0.1 s window failed once in a fresh-clone run whose machine ran
    another test session beside it (the beating thread did not run for 100 ms)."""
    tl = make(tmp_path, heartbeat_interval_s=0.1, heartbeat_misses=10)
    i = tl.request(Action.COMMIT)
    with tl.heartbeat(i):
        time.sleep(1.5)  # longer than the window: only beats keep it alive
        assert not tl.is_expired(i)
    assert tl.is_expired(i)  # stopped: the file is gone
    j = tl.request(Action.COMMIT)
    assert not tl.is_expired(j)  # request() beats once
    time.sleep(1.3)
    assert tl.is_expired(j)


def test_remove(tmp_path):
    tl = make(tmp_path)
    i = tl.start(tl.request(Action.COMMIT))
    tl.remove(i)
    assert tl.instants() == []
    assert tl.get(i.time) is None


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["request", "start", "complete", "remove"]), st.integers(0, 1),
                                st.integers(0, 7), st.booleans()), max_size=25))
def test_two_timelines_on_one_directory_list_what_the_other_did(steps):
    """Each Timeline reuses its last listing while the directory is unchanged: every change made through the
    other one is seen, however many came between its listings, against a plain dict of time -> state."""
    with tempfile.TemporaryDirectory() as root:
        timelines = [make(root), make(root)]
        model: dict[str, str] = {}
        for op, who, pick, look in steps:
            tl = timelines[who]
            live = sorted(model)
            chosen = live[pick % len(live)] if live else None
            current = tl.get(chosen) if chosen else None
            if op == "request":
                model[tl.request(Action.DELTACOMMIT).time] = "requested"
            elif op == "start" and current is not None and model[chosen] == "requested":
                model[chosen] = tl.start(current).state.value
            elif op == "complete" and current is not None and model[chosen] == "inflight":
                model[chosen] = tl.complete(current, {}).state.value
            elif op == "remove" and current is not None:
                tl.remove(current)
                del model[chosen]
            for each in timelines if look else [tl]:
                assert {i.time: i.state.value for i in each.instants()} == model
