"""The shared pool of short parallel steps: results in order, errors only once every task ended, maps from
inside the pool and from a forked child that finish, small work in the calling thread."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, strategies as st

from metatable.parallel import arrow_threads, thread_map, worker_pool


@given(st.lists(st.integers()), st.booleans())
def test_results_come_in_the_items_order(items: list[int], parallel: bool) -> None:
    assert thread_map(lambda x: x * 3 - 1, items, parallel) == [x * 3 - 1 for x in items]


def test_small_work_runs_in_the_calling_thread() -> None:
    caller = threading.get_ident()
    assert set(thread_map(lambda _: threading.get_ident(), range(4), parallel=False)) == {caller}
    assert caller not in thread_map(lambda _: time.sleep(0.02) or threading.get_ident(), range(4))


def test_the_first_error_is_raised_after_every_task_ended() -> None:
    ended: list[int] = []

    def step(i: int) -> int:
        if i in (1, 3):
            raise ValueError(f"step {i}")
        time.sleep(0.05)
        ended.append(i)
        return i

    with pytest.raises(ValueError, match="step 1"):
        thread_map(step, range(6))
    assert sorted(ended) == [0, 2, 4, 5]


def test_a_map_inside_a_task_of_the_pool_does_not_wait_on_the_pool() -> None:
    """Every thread of the pool runs an outer task at once; each maps again. On the shared pool they would
    wait for each other forever."""
    barrier = threading.Barrier(2, timeout=10)

    def outer(i: int) -> list[int]:
        barrier.wait()  # both of the pool's threads are busy here
        return thread_map(lambda j: i * 10 + j, range(3))

    assert thread_map(outer, range(2)) == [[0, 1, 2], [10, 11, 12]]


def test_a_forked_child_maps_on_a_pool_of_its_own() -> None:
    barrier = threading.Barrier(2, timeout=10)
    thread_map(lambda x: barrier.wait(), [1, 2])  # the parent's pool has started both its threads, now idle
    pid = os.fork()
    if pid == 0:  # the parent's threads are gone here: a pool they were part of would never run a task
        os._exit(0 if thread_map(abs, [-3, -4, -5]) == [3, 4, 5] else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the forked child's map did not finish")


def test_only_threads_outside_our_pools_decode_on_arrows_threads() -> None:
    assert arrow_threads()
    assert thread_map(lambda _: arrow_threads(), range(4)) == [False] * 4
    assert thread_map(lambda _: thread_map(lambda _: arrow_threads(), range(2)), range(2)) == [[False] * 2] * 2
    with worker_pool(2, "metatable-test") as pool:
        assert list(pool.map(lambda _: arrow_threads(), range(3))) == [False] * 3
    with ThreadPoolExecutor(2) as pool:  # a user's own threads are not ours
        assert list(pool.map(lambda _: arrow_threads(), range(3))) == [True] * 3
