"""Short parallel steps (the pages of a `get`, the slices of a lookup) on one pool of threads per process.

A pool started for each call costs its threads' start and join: ~0.75 ms for two threads and four trivial
tasks against ~0.06 ms on a pool kept (this machine), and a `get_by` of ~30 rows started three or four
pools (py-spy: 11% of its main thread in `Thread.start` and the joins). So these steps share one pool,
started on first use and forgotten in a forked child, whose threads do not survive the fork.

A task of the pool that maps on the pool would wait for threads that are all waiting like it: a map called
from one of the pool's threads gets a pool of its own, as every call did before. Long jobs (a write's file
groups, a compaction, a streamed scan) keep their own pools; they pay the start once for seconds of work.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterable, TypeVar

from metatable.config import THREADS

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_inside = threading.local()  # `worker` set in the shared pool's threads


def thread_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`[fn(item) for item in items]`, THREADS at a time. Every task has ended when it returns or raises (the
    first error in the items' order is raised): a task left running could use what the caller closes next."""
    items = list(items)
    if len(items) < 2 or THREADS < 2:
        return [fn(item) for item in items]
    if getattr(_inside, "worker", False):
        with ThreadPoolExecutor(THREADS, thread_name_prefix="metatable-nested") as pool:
            return list(pool.map(fn, items))
    futures = [_shared().submit(fn, item) for item in items]
    wait(futures)
    return [future.result() for future in futures]


def _shared() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="metatable-pool", initializer=_mark_worker)
        return _pool


def _mark_worker() -> None:
    _inside.worker = True


def _forget_in_child() -> None:
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
